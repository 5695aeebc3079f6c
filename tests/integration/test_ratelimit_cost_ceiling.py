"""Costs and debts saturate at a ceiling, and no value one request brings fails another's
decision (issue 23, item 1).

Ceilings (README "Cost from the response", src/ratelimit/decision.h): a cost is at most 10^15
(a larger reported cost is charged 10^15); a wait or debt at most 2^31 - 1 seconds, so a
token bucket's TAT stays below now + 2^31 s (far below 2^53 us, where Lua's doubles stop being
exact) and Retry-After at most 2147483647. Limits, bursts and windows at the top of their
configuration ranges (10^15) are decided, and each value the scripts write is a whole number
(never the scientific notation that fails SET ... PX). A request whose value is out of range
answers its own error; the call's other requests are decided."""

import concurrent.futures
import json

import pytest

from conftest import (hashed_part, limit_cfg, metric_sum, server_time_us, sluice_with_limits,
                      stored)
from decide_codec import decide_call, decide_command, decide_library, decide_reply, engine_command

FIELD = "X-Tokens-Used"
MAX_WAIT_S = 2_147_483_647
MAX_WAIT_US = MAX_WAIT_S * 1_000_000
TOP = 10**15  # the configuration's largest count and window (ms)

TOKENS = {"algorithm": "token_bucket", "limit": 100_000, "window_ms": 3_600_000}


def call(client, requests, edit=None):
    command = decide_command(requests)
    if edit:
        command = [edit(a) if isinstance(a, str) else a for a in command]
    return decide_reply(decide_call(client, command), requests)


def assert_bounded_tat(valkey, key):
    tat = stored(valkey, key, "token_bucket")
    now = server_time_us(valkey.client)
    assert tat is not None
    assert now < tat <= now + MAX_WAIT_US, (tat, now)
    # (the expiry runs to TAT, plus a spread of up to 5 minutes: test_ratelimit_expiry_spread.py)
    assert 0 < valkey.client.pttl(key) <= MAX_WAIT_S * 1000 + 300_000 + 1


@pytest.mark.parametrize("cost", [300_000_000_000_000, 999_999_999_999_999, TOP])
def test_a_huge_forced_charge_saturates_and_the_call_s_other_requests_are_decided(valkey, cost):
    c = valkey.client
    requests = [[("t:a", {**TOKENS, "cost": 1})],
                [("t:a", {**TOKENS, "cost": cost, "charge": "forced"})],
                [("t:b", {**TOKENS, "cost": 1})],
                [("t:a", {**TOKENS, "cost": 1})]]
    r = call(c, requests)
    assert [x if isinstance(x, str) else x[0] for x in r.results] == [1, 1, 1, 0], r.results
    # The refused one waits until the saturated debt is down to burst - 1 tokens (an hour of
    # this bucket): the ceiling less an hour, never a wrapped TAT.
    retry_ms = r.results[3][1][0][3]
    assert (MAX_WAIT_S - 3600 - 10) * 1000 < retry_ms <= (MAX_WAIT_S - 3599) * 1000
    assert_bounded_tat(valkey, "t:a")
    # The next call reads the saturated debt: still refused, nothing wrapped.
    r = call(c, [[("t:a", {**TOKENS, "cost": 1})], [("t:a", {**TOKENS, "cost": cost,
                                                              "charge": "forced"})]])
    assert r.results[0][0] == 0 and r.results[1][0] == 1
    assert_bounded_tat(valkey, "t:a")
    assert stored(valkey, "t:b", "token_bucket") is not None


def test_an_out_of_range_value_fails_only_its_own_request(valkey):
    c = valkey.client
    requests = [[("o:a", {**TOKENS, "cost": 7})],
                [("o:b", {**TOKENS, "cost": 1})],
                [("o:c", {"algorithm": "fixed_window", "limit": 5, "window_ms": 60_000,
                          "cost": 3})]]
    # The codec never writes these: a cost beyond 10^15 (20 digits), a key index past KEYS.
    huge = call(c, requests, edit=lambda a: "1:99999999999999999999" if a == "1:7" else a)
    assert isinstance(huge.results[0], str) and "cost" in huge.results[0], huge.results
    assert huge.results[1][0] == 1 and huge.results[2][0] == 1
    assert stored(valkey, "o:a", "token_bucket") is None, "the failed request charged nothing"
    index = call(c, requests, edit=lambda a: "1:7@99" if a == "1:7" else a)
    assert isinstance(index.results[0], str), index.results
    assert index.results[1][0] == 1 and index.results[2][0] == 1


@pytest.mark.parametrize("limit", [
    {"algorithm": "fixed_window", "limit": TOP, "window_ms": TOP, "cost": TOP},
    {"algorithm": "sliding_window", "limit": TOP, "window_ms": TOP, "cost": TOP},
    {"algorithm": "token_bucket", "limit": 1, "window_ms": TOP, "burst": TOP, "cost": 1},
    {"algorithm": "token_bucket", "limit": TOP, "window_ms": TOP, "burst": TOP, "cost": TOP},
    {"algorithm": "token_bucket", "limit": 1, "window_ms": TOP, "burst": 1, "cost": 1000},
    {"algorithm": "sliding_log", "limit": TOP, "window_ms": TOP, "cost": 1},
    {"algorithm": "concurrency", "limit": TOP, "window_ms": TOP, "lease": "s1"},
])
def test_limits_and_windows_at_the_top_of_their_ranges_are_decided(valkey, limit):
    c = valkey.client
    key = "top:" + limit["algorithm"]
    for forced in ([False, True] if limit["algorithm"] in ("fixed_window", "sliding_window",
                                                           "token_bucket") else [False]):
        request = [(key, {**limit, "charge": "forced"} if forced else limit)]
        other = [("top:other", {**TOKENS, "cost": 1})]
        r = call(c, [request, other, request])
        assert not any(isinstance(x, str) for x in r.results), r.results
        assert r.results[1][0] == 1
        for result in r.results:
            for _, remaining, reset_ms, retry_ms in result[1]:
                assert 0 <= remaining <= TOP and 0 <= reset_ms and 0 <= retry_ms
        # Written with a whole-number expiry (anything else fails the write, and the call), or
        # not written: a bucket whose one token takes longer than the ceiling never admits.
        ttl = c.pttl(key)
        assert ttl > 0 or (ttl == -2 and not forced), ttl
    # The admin's peek of the same key (FCALL <function>_peek, the layout in decide.lua).
    function = decide_library()[1]
    fields = [limit["algorithm"], str(limit["limit"]), str(limit["window_ms"]),
              str(limit.get("burst", limit["limit"])), "0", "0", str(limit["limit"])]
    peek = c.execute_command(*engine_command(["FCALL", function + "_peek", 1, key, *fields]))
    assert len(peek) == 3 and all(isinstance(v, int) and v >= 0 for v in peek), peek


def tokens_gateway(sluice_factory, upstream, valkey, limit=100_000, **kw):
    return sluice_with_limits(
        sluice_factory, upstream, valkey,
        [limit_cfg("tokens", "token_bucket", limit, "1h", by=["header:X-Key"],
                   cost_from=f"response_header:{FIELD}", on_error="deny")], **kw)


@pytest.mark.parametrize("reported", ["300000000000000", "999999999999999",
                                      "1000000000000000", "123456789012345678901234567890"])
def test_a_huge_reported_cost_never_wraps_the_bucket(sluice_factory, upstream, valkey, reported):
    """The issue's case: token_bucket 100,000 / 1h with cost_from; an answer reporting 3 * 10^14
    tokens (or more: saturated at 10^15) leaves the client in debt for the ceiling (its next
    request of 1 token fits an hour before the debt is gone), not with a wrapped TAT that finds
    a full bucket. The admin's GET says the same wait."""
    gw = tokens_gateway(sluice_factory, upstream, valkey)
    key = "rl:v2:tokens:{" + hashed_part("a") + "}"
    r = gw.get(f"/response-headers?{FIELD}={reported}", headers=[("X-Key", "a")])
    assert r.status == 200
    for _ in range(100):
        if stored(valkey, key, "token_bucket") is not None:
            break
        import time
        time.sleep(0.02)
    assert_bounded_tat(valkey, key)
    r = gw.get("/status/200", headers=[("X-Key", "a")])
    assert r.status == 429, "in debt: never a full bucket"
    retry = int(r.header("retry-after"))
    assert MAX_WAIT_S - 3600 - 10 <= retry <= MAX_WAIT_S - 3600 + 1, retry
    status, body = gw.admin_get("/limits/tokens?header%3AX-Key=a")
    assert status == 200, body
    got = json.loads(body)
    assert got["remaining"] == 0 and abs(got["reset"] - retry) <= 10, got
    # Another client of the limit is untouched.
    assert gw.get("/status/200", headers=[("X-Key", "b")]).status == 200


def test_a_huge_cost_never_fails_another_client_decided_in_the_same_call(sluice_factory,
                                                                        upstream, valkey):
    """With on_error = "deny", another API key decided while huge costs are charged never gets
    503 (before: the charge's SET ... PX got a number of 19 digits, in scientific notation,
    which failed the whole call). 100 tokens an hour: 36 s a token."""
    gw = tokens_gateway(sluice_factory, upstream, valkey, limit=100, workers=1)

    def huge(i):
        return gw.get(f"/response-headers?{FIELD}=999999999999999",
                      headers=[("X-Key", f"h{i}")]).status

    def other(i):
        return gw.get("/status/200", headers=[("X-Key", f"o{i}")]).status

    statuses = []
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for round_ in range(20):
            futures = [pool.submit(huge, 8 * round_ + j) for j in range(8)]
            futures += [pool.submit(other, 8 * round_ + j) for j in range(8)]
            statuses += [f.result() for f in futures]
    assert statuses.count(503) == 0, statuses
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_denied") == 0
