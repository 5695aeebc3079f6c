"""The four algorithms through the gateway, on a real redis-server: exactness under concurrency
(two workers, several client processes), window boundaries, recovery after Retry-After, and
all-or-nothing between the limits of a route."""

import math
import time
from collections import Counter

import pytest

from conftest import (avoid_window_boundary, limit_cfg, limit_keys, parallel_requests,
                      parse_rl_list, server_time, sleep_until_window_offset, sluice_with_limits,
                      stored, used)
from rawhttp import RawClient, build_request

ALGORITHMS = ["fixed_window", "sliding_log", "sliding_window", "token_bucket"]


def burst(gw, n, target="/status/200", headers=()):
    """n pipelined requests on one connection; their responses, in order."""
    with RawClient(gw.port, timeout=10) as c:
        c.send(b"".join(build_request("GET", target, headers) for _ in range(n)))
        return [c.read_response() for _ in range(n)]


def check_refusal(r, names):
    """A 429 as the contract says; returns Retry-After."""
    assert r.status == 429, r
    ra = r.header("retry-after")
    assert ra is not None and ra.isdigit() and int(ra) >= 1, f"Retry-After {ra!r}"
    state = parse_rl_list(r.header("ratelimit"))
    for name in names:
        assert name in state, f"refusing limit {name} not described in RateLimit: {r.headers}"
        assert state[name]["r"] == 0
        assert int(ra) >= state[name]["t"], f"Retry-After {ra} earlier than t of {name}: {state}"
    body = r.json()
    assert sorted(body["violated-policies"]) == sorted(names), body
    return int(ra)


# ------------------------------------------------------------------------------ 1. concurrency

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_concurrent_requests_exactly_the_limit_passes(sluice_factory, upstream, valkey, algorithm):
    limit = 50
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("conc", algorithm, limit, "1h")], workers=2)
    avoid_window_boundary(valkey.client, 3600, 30)
    raw = build_request("GET", "/status/200", [("Connection", "close")])
    results = parallel_requests(gw.port, [raw] * (2 * limit), processes=5)
    statuses = Counter(s for s, _ in results)
    assert statuses == {200: limit, 429: limit}, f"{algorithm}: {dict(statuses)}"
    (key,) = limit_keys(valkey.client, "rl:v2:conc:*")
    c = valkey.client
    assert key == "rl:v2:conc:{127.0.0.1}"
    if algorithm == "sliding_log":  # (count_denied: the newest `keep` + a refused one's cost)
        assert used(valkey, key, algorithm, 3600) == limit + 1
    elif algorithm != "token_bucket":
        assert used(valkey, key, algorithm, 3600) == limit
    else:  # TAT: the bucket is empty, a whole burst (the hour) from now
        empty_us = stored(valkey, key, algorithm) - server_time(c) * 1e6
        assert 3600e6 - 72e6 < empty_us <= 3600e6, empty_us
    assert upstream.request_count == limit, "only the allowed requests reach the upstream"


# ------------------------------------------------------------------------------ 2. boundaries

WINDOW_S = 2.0


def statuses(responses):
    return [r.status for r in responses]


def test_fixed_window_boundary_lets_both_bursts_through(sluice_factory, upstream, valkey):
    limit = 10
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("fw", "fixed_window", limit, "2s")])
    c = valkey.client
    n = sleep_until_window_offset(c, WINDOW_S, WINDOW_S - 0.35, min_lead=0.05)
    first = burst(gw, limit)
    key = "rl:v2:fw:{127.0.0.1}"
    assert stored(valkey, key, "fixed_window") == (n, limit)
    assert math.floor(server_time(c) / WINDOW_S) == n, "first burst crossed the boundary"
    sleep_until_window_offset(c, WINDOW_S, 0.05, min_lead=0.0)
    second = burst(gw, limit + 1)
    assert statuses(first) == [200] * limit
    assert statuses(second) == [200] * limit + [429], "a new window is a new budget"
    assert stored(valkey, key, "fixed_window") == (n + 1, limit), "the new window's count"
    assert 0 < c.pttl(key) <= 3000, "expires at the end of the new window (and a spread)"


def test_sliding_log_boundary_refuses_the_second_burst(sluice_factory, upstream, valkey):
    limit = 10
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("sl", "sliding_log", limit, "2s")])
    c = valkey.client
    sleep_until_window_offset(c, WINDOW_S, WINDOW_S - 0.35, min_lead=0.05)
    first = burst(gw, limit)
    sleep_until_window_offset(c, WINDOW_S, 0.05, min_lead=0.0)
    second = burst(gw, limit)
    assert statuses(first) == [200] * limit
    assert statuses(second) == [429] * limit, "the log has no boundary: the whole second burst is refused"
    # (count_denied: the newest `keep` + the refused request's cost)
    assert len(stored(valkey, "rl:v2:sl:{127.0.0.1}", "sliding_log")) <= limit + 1


def test_sliding_window_boundary_stays_within_its_estimate(sluice_factory, upstream, valkey):
    limit = 20
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("sw", "sliding_window", limit, "2s")])
    c = valkey.client
    n = sleep_until_window_offset(c, WINDOW_S, WINDOW_S - 0.35, min_lead=0.05)
    first = burst(gw, limit)
    assert statuses(first) == [200] * limit
    assert math.floor(server_time(c) / WINDOW_S) == n

    def remaining_fraction(t):
        return (WINDOW_S - (t - math.floor(t / WINDOW_S) * WINDOW_S)) / WINDOW_S

    # Just after the boundary: the previous window weighs almost fully.
    sleep_until_window_offset(c, WINDOW_S, 0.05, min_lead=0.0)
    second = burst(gw, limit)
    frac = remaining_fraction(server_time(c))
    allowed2 = statuses(second).count(200)
    assert allowed2 <= limit - math.floor(limit * frac), \
        f"{allowed2} allowed just after the boundary; estimate allows {limit - math.floor(limit * frac)}"

    # Halfway: about half of the previous window still counts.
    sleep_until_window_offset(c, WINDOW_S, 1.0, min_lead=0.0)
    t_begin = server_time(c)
    third = burst(gw, limit)
    t_end = server_time(c)
    allowed3 = statuses(third).count(200)
    assert math.floor(t_begin / WINDOW_S) == math.floor(t_end / WINDOW_S) == n + 1
    upper = limit - math.floor(limit * remaining_fraction(t_end))
    lower = limit - math.ceil(limit * remaining_fraction(t_begin)) - 1
    assert lower <= allowed2 + allowed3 <= upper, \
        f"allowed {allowed2} + {allowed3} in the window, estimate bounds [{lower}, {upper}]"
    assert stored(valkey, "rl:v2:sw:{127.0.0.1}", "sliding_window") == \
        (n + 1, allowed2 + allowed3, limit), "this window's count, the previous one's"
    for r in second + third:
        if r.status == 429:
            check_refusal(r, ["sw"])


# ------------------------------------------------------------------------------ 3. recovery

# algorithm -> (limit config, requests that exhaust it, where in the (aligned) window to start)
RECOVERY = {
    # starts 0.3 s into a 3 s window: Retry-After 3 (2.7 s, rounded up)
    "fixed_window": (limit_cfg("rec", "fixed_window", 5, "3s"), 5, (3.0, 0.3)),
    # the oldest entry leaves 2 s after it came: Retry-After 2
    "sliding_log": (limit_cfg("rec", "sliding_log", 5, "2s"), 5, None),
    # starts 0.1 s into a 2 s window: this window's 5 decay enough 0.4 s into the next: 2.3 s -> 3
    "sliding_window": (limit_cfg("rec", "sliding_window", 5, "2s"), 5, (2.0, 0.1)),
    # 1 token every 3 s, 3 at most: the 4th request waits ~3 s
    "token_bucket": (limit_cfg("rec", "token_bucket", 1, "3s", burst=3), 3, None),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_recovery_after_retry_after(sluice_factory, upstream, valkey, algorithm):
    cfg, n, align = RECOVERY[algorithm]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [cfg])
    if align:
        sleep_until_window_offset(valkey.client, align[0], align[1], min_lead=0.05)
    for r in burst(gw, n):
        assert r.status == 200, r
        assert "rec" in parse_rl_list(r.header("ratelimit"))
    refused = gw.get("/status/200")
    t_refused = time.monotonic()
    ra = check_refusal(refused, ["rec"])
    assert ra >= 2, f"{algorithm}: the scenario expects a wait of 2 s or more, got {ra}"
    assert check_refusal(gw.get("/status/200"), ["rec"]) >= 1, "refused right away"
    time.sleep(max(0.0, t_refused + ra - 1 - 0.05 - time.monotonic()))
    check_refusal(gw.get("/status/200"), ["rec"])  # still refused one second before
    time.sleep(max(0.0, t_refused + ra - time.monotonic()))
    r = gw.get("/status/200")
    assert r.status == 200, f"{algorithm}: refused {time.monotonic() - t_refused:.3f}s after a " \
                            f"429 with Retry-After: {ra}: {r}"


# ------------------------------------------------------------------------------ 5. all-or-nothing

@pytest.mark.parametrize("b_algorithm", ["fixed_window", "sliding_log"],
                         ids=["b_cached_refusals", "b_counts_denied"])
@pytest.mark.parametrize("a_algorithm", ALGORITHMS)
def test_refused_by_one_limit_costs_the_others_nothing(sluice_factory, upstream, valkey,
                                                       a_algorithm, b_algorithm):
    big, small = 50, 3
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("A", a_algorithm, big, "1h"),
                             limit_cfg("B", b_algorithm, small, "1h")])
    c = valkey.client
    avoid_window_boundary(c, 3600, 5)
    for i in range(small):
        r = gw.get("/status/200")
        assert r.status == 200
        state = parse_rl_list(r.header("ratelimit"))
        assert state["A"]["r"] == big - 1 - i and state["B"]["r"] == small - 1 - i, state
    (a_key,) = limit_keys(c, "rl:v2:A:*")
    a_before = c.dump(a_key)
    for i in range(6):
        r = gw.get("/status/200")
        check_refusal(r, ["B"])
        state = parse_rl_list(r.header("ratelimit"))
        if i == 0 or b_algorithm == "sliding_log":
            # decided in Valkey (not from the per-worker memory of refusals): A is described
            assert state.get("A", {}).get("r") == big - small, \
                f"A's budget moved on a request B refused: {state}"
    after = c.dump(a_key)
    assert after == a_before, "A's key changed although every request since was refused by B"
    if a_algorithm != "token_bucket":
        assert used(valkey, a_key, a_algorithm, 3600) == small
