"""The Lua library of lua/ run directly on a real redis-server: each algorithm alone (one
request of one limit) and the decide function with many, the library the gateway loads, called
and read by the gateway's own codec (decide_codec.py). Time is the server's (TIME), so
the tests use short windows and sleep."""

import math
import random
import struct
import time

import pytest

from conftest import (WINDOW_NUMBERS, avoid_window_boundary, limit_cfg, metric_sum,
                      ratelimit_toml, raw_value, route_cfg, server_time, server_time_us,
                      sleep_until_window_offset, stored, wait_admin)
from decide_codec import (decide_call, decide_command, decide_keys, decide_library, decide_reply,
                          decided, engine_command, undo_call)
from harness.valkey import ENGINE

# (the work is inside Valkey: once, not again on the sanitizer build; pytest.ini)
pytestmark = pytest.mark.once


def run(client, algorithm, key, limit, window_ms, burst=None, cost=1, count_denied=False,
        keep=None):
    """One request of one limit, through the library (and the codec): its reply as
    [allowed (1|0), remaining, reset_ms, retry_ms], layout checked by the codec."""
    lim = {"algorithm": algorithm, "limit": limit, "window_ms": window_ms,
           "burst": limit if burst is None else burst, "cost": cost,
           "count_denied": count_denied, "keep": limit if keep is None else keep}
    request = [(key, lim)]
    allowed, ((_, remaining, reset_ms, retry_ms),) = decided(
        decide_call(client, decide_command([request])), request)
    return [1 if allowed else 0, remaining, reset_ms, retry_ms]


def assert_every_key_has_ttl(client):
    keys = list(client.scan_iter("*"))
    for k in keys:
        pttl = client.pttl(k)
        assert pttl > 0, f"key {k!r} has no TTL (PTTL {pttl})"
    return keys


# ------------------------------------------------------------------------------ fixed_window

def test_fixed_window_counter_per_epoch_window(valkey):
    c = valkey.client
    n = sleep_until_window_offset(c, 1.0, 0.15, min_lead=0.05)
    t0 = server_time_us(c)
    r = run(c, "fixed_window", "t:fw", 3, 1000)
    t1 = server_time_us(c)
    assert t0 // 1_000_000 == t1 // 1_000_000 == n, "the test missed its window"
    assert assert_every_key_has_ttl(c) == ["t:fw"], "one key; the script touches no other"
    assert stored(valkey, "t:fw", "fixed_window") == (n % WINDOW_NUMBERS, 1), \
        "the window number (floor(now_us / window_us)) and the count"
    window_end_us = (n + 1) * 1_000_000
    pttl = c.pttl("t:fw")
    # (plus a spread of up to half the window, so that many keys do not expire at once)
    assert (window_end_us - server_time_us(c)) / 1000 - 5 <= pttl <= \
        (window_end_us - t0) / 1000 + 500 + 5, "the key expires at the end of its window"
    assert r[0] == 1 and r[1] == 2 and r[3] == 0
    assert (window_end_us - t1) / 1000 - 1 <= r[2] <= (window_end_us - t0) / 1000 + 1, "reset_ms"

    assert run(c, "fixed_window", "t:fw", 3, 1000)[:2] == [1, 1]
    assert 0 < c.pttl("t:fw") <= pttl, "a write in the same window keeps its expiry"
    assert run(c, "fixed_window", "t:fw", 3, 1000)[:2] == [1, 0]
    refused = run(c, "fixed_window", "t:fw", 3, 1000)
    assert refused[0] == 0 and refused[1] == 0
    assert refused[3] == refused[2] and 0 < refused[3] <= 1000, "retry_ms: until the window ends"
    assert stored(valkey, "t:fw", "fixed_window")[1] == 3, "count_denied = 0: not counted"
    assert_every_key_has_ttl(c)

    # The next window starts from zero, on the same key, with its own expiry.
    sleep_until_window_offset(c, 1.0, 0.05, min_lead=0.01)
    r = run(c, "fixed_window", "t:fw", 3, 1000)
    assert r[:2] == [1, 2], "a new window starts from zero"
    assert stored(valkey, "t:fw", "fixed_window") == ((n + 1) % WINDOW_NUMBERS, 1)
    assert 900 < c.pttl("t:fw") <= 1000 + 500  # (and a spread of up to half the window)


def test_fixed_window_an_earlier_window_counts_as_empty(valkey):
    """What says which window a count belongs to is the number stored with it, not the expiry:
    a key still holding an earlier window (its expiry not reached, as a script sees it) is
    read as empty and overwritten with this window and its expiry."""
    c = valkey.client
    avoid_window_boundary(c, 60.0, 2.0)
    n = math.floor(server_time(c) / 60)
    c.set("t:old", struct.pack("<Id", (n - 1) % WINDOW_NUMBERS, 7), px=600_000)
    assert run(c, "fixed_window", "t:old", 3, 60000)[:2] == [1, 2]
    assert stored(valkey, "t:old", "fixed_window") == (n % WINDOW_NUMBERS, 1)
    assert c.pttl("t:old") <= 60000 + 30000, "this window (and a spread of up to half of it)"


def test_fixed_window_count_denied_and_cost(valkey):
    c = valkey.client
    avoid_window_boundary(c, 2.0, 0.5)
    results = [run(c, "fixed_window", "t:cd", 2, 2000, count_denied=True)[0] for _ in range(5)]
    assert results == [1, 1, 0, 0, 0]
    assert stored(valkey, "t:cd", "fixed_window")[1] == 5, "count_denied: refused ones counted"

    # cost: 2 of 3 fits once; a refused cost is not charged without count_denied
    assert run(c, "fixed_window", "t:cost", 3, 2000, cost=2)[:2] == [1, 1]
    assert run(c, "fixed_window", "t:cost", 3, 2000, cost=2)[:2] == [0, 1]
    assert stored(valkey, "t:cost", "fixed_window")[1] == 2
    # A request that is refused and not counted creates no key at all (so none without a TTL).
    assert run(c, "fixed_window", "t:none", 1, 2000, cost=2)[0] == 0
    assert list(c.scan_iter("t:none*")) == []
    assert_every_key_has_ttl(c)


# ------------------------------------------------------------------------------ sliding_log

@pytest.mark.parametrize("count_denied", [True, False], ids=["count_denied", "not_counted"])
def test_sliding_log_memory_bounded_while_hammering(valkey, count_denied):
    c = valkey.client
    limit = 5
    allowed = 0
    for i in range(60):
        r = run(c, "sliding_log", "t:sl", limit, 2000, count_denied=count_denied)
        allowed += r[0]
        entries = stored(valkey, "t:sl", "sliding_log")
        # (keep + cost: a refused request's entry, which a take-back may remove, pushes out none
        # of the `limit` that decide)
        bound = limit + 1 if count_denied else limit
        assert len(entries) <= bound, f"sliding_log holds {len(entries)} entries after {i + 1}"
        assert entries == sorted(entries), "oldest first"
        pttl = c.pttl("t:sl")
        assert 0 < pttl <= 2000 + 1000, f"TTL {pttl} (a window, and a spread of half of it)"
        if i < limit:
            assert r[:2] == [1, limit - 1 - i]
            assert len(entries) == i + 1, "one entry per accepted request"
        else:
            assert r[0] == 0 and r[1] == 0 and 0 < r[3] <= 2000
    assert allowed == limit


def test_sliding_log_keeps_the_largest_quota_on_its_key(valkey):
    """A refused request that is recorded trims the log to `keep` + its cost entries (keep: the
    largest limit of the quotas sharing the key), never to its own smaller limit: a plan of 8 on
    the same key still sees all 8 it counted, and a take-back of the refused request's entry
    leaves those 8 as they were."""
    c = valkey.client
    for _ in range(8):
        assert run(c, "sliding_log", "t:keep", 8, 60000, keep=8)[0] == 1
    first = stored(valkey, "t:keep", "sliding_log")
    for _ in range(3):
        assert run(c, "sliding_log", "t:keep", 2, 60000, count_denied=True, keep=8)[0] == 0
    log = stored(valkey, "t:keep", "sliding_log")
    assert len(log) == 9 and log[-9:-3] == first[-6:]
    assert run(c, "sliding_log", "t:keep", 8, 60000, keep=8)[0] == 0


def test_sliding_log_count_denied_keeps_a_hammering_client_blocked(valkey):
    """count_denied: refused requests are recorded, so a client that keeps hammering stays
    blocked past the window of its first requests; without it, it gets through once they age out."""
    c = valkey.client
    window_ms, limit = 1000, 3
    for key, cd in (("t:hammer", True), ("t:polite", False)):
        for _ in range(limit):
            assert run(c, "sliding_log", key, limit, window_ms, count_denied=cd)[0] == 1
    t0 = time.monotonic()
    later = {"t:hammer": [], "t:polite": []}
    while time.monotonic() - t0 < 1.6:
        time.sleep(0.1)
        for key, cd in (("t:hammer", True), ("t:polite", False)):
            r = run(c, "sliding_log", key, limit, window_ms, count_denied=cd)
            later[key].append(r[0])
            assert len(stored(valkey, key, "sliding_log")) <= limit + 1  # (keep + cost)
    assert sum(later["t:hammer"]) == 0, f"count_denied client got through: {later['t:hammer']}"
    assert sum(later["t:polite"]) >= 1, "the first entries aged out: the client gets through"


def test_sliding_log_retry_is_when_the_oldest_entry_leaves(valkey):
    c = valkey.client
    for _ in range(3):
        run(c, "sliding_log", "t:retry", 3, 1500)
    oldest = stored(valkey, "t:retry", "sliding_log")[0]
    before = server_time_us(c)
    r = run(c, "sliding_log", "t:retry", 3, 1500, count_denied=False)
    now = server_time_us(c)
    assert r[0] == 0
    # The script's clock read is between `before` and `now` (however slow the machine).
    expected_ms = (oldest + 1_500_000 - now) / 1000
    latest_ms = (oldest + 1_500_000 - before) / 1000
    assert expected_ms - 1 <= r[3] <= latest_ms + 1, (r, expected_ms, latest_ms)
    time.sleep(r[3] / 1000 + 0.01)
    assert run(c, "sliding_log", "t:retry", 3, 1500)[0] == 1, "allowed once retry_ms passed"
    cutoff = server_time_us(c) - 1_500_000
    assert all(t > cutoff for t in stored(valkey, "t:retry", "sliding_log")), \
        "entries that aged out were dropped when the key was written"


# ------------------------------------------------------------------------------ sliding_window

def test_sliding_window_ttl_and_estimate(valkey):
    c = valkey.client
    limit, window_ms, w = 10, 1000, 1.0
    n = sleep_until_window_offset(c, w, 0.05, min_lead=0.02)
    results = [run(c, "sliding_window", "t:sw", limit, window_ms) for _ in range(limit + 1)]
    assert [r[0] for r in results] == [1] * limit + [0]
    assert stored(valkey, "t:sw", "sliding_window") == (n % WINDOW_NUMBERS, limit, 0)
    before = server_time_us(c)
    pttl = c.pttl("t:sw")
    after = server_time_us(c)
    # It expires at the end of the next window, plus a spread of up to half the window:
    # PTTL is read between `before` and `after`.
    earliest, latest = [((n + 2) * 1_000_000 - t) / 1000 for t in (after, before)]
    assert earliest - 5 <= pttl <= latest + window_ms / 2 + 5, \
        f"the key lives to the end of the next window: PTTL {pttl}, {earliest:.0f}-{latest:.0f}"

    # Halfway into the next window: estimate = current + previous * (window - elapsed) / window.
    sleep_until_window_offset(c, w, 0.5, min_lead=0.5)
    t_begin = server_time(c)
    first = run(c, "sliding_window", "t:sw", limit, window_ms)
    t_first = server_time(c)
    assert first[0] == 1
    weight = lambda t: (w - (t - math.floor(t / w) * w)) / w  # noqa: E731
    assert math.floor(limit - 1 - limit * weight(t_begin)) <= first[1] <= \
        math.floor(limit - 1 - limit * weight(t_first)), (first, weight(t_begin), weight(t_first))
    allowed = 1
    while True:
        r = run(c, "sliding_window", "t:sw", limit, window_ms)
        if not r[0]:
            break
        allowed += 1
        assert allowed <= limit
    t_end = server_time(c)
    assert math.floor(limit - limit * weight(t_begin)) <= allowed <= \
        math.floor(limit - limit * weight(t_end)), (allowed, weight(t_begin), weight(t_end))
    assert stored(valkey, "t:sw", "sliding_window") == ((n + 1) % WINDOW_NUMBERS, allowed, limit), \
        "this window's count, and the one before as previous"
    assert window_ms < c.pttl("t:sw") <= 2.1 * window_ms
    assert list(c.scan_iter("t:sw*")) == ["t:sw"]
    # retry_ms is exact: once it has passed (nothing else arriving) the request fits.
    assert r[3] > 0
    time.sleep(r[3] / 1000 + 0.01)
    assert run(c, "sliding_window", "t:sw", limit, window_ms)[0] == 1


def test_sliding_window_count_denied(valkey):
    c = valkey.client
    avoid_window_boundary(c, 2.0, 0.5)
    n = math.floor(server_time(c) / 2.0)
    results = [run(c, "sliding_window", "t:swcd", 2, 2000, count_denied=True)[0] for _ in range(4)]
    assert results == [1, 1, 0, 0]
    assert stored(valkey, "t:swcd", "sliding_window") == (n % WINDOW_NUMBERS, 4, 0)
    assert_every_key_has_ttl(c)


# ------------------------------------------------------------------------------ token_bucket

def test_token_bucket_refill_and_ttl(valkey):
    c = valkey.client
    limit, window_ms, burst = 10, 1000, 5  # 10 tokens a second, 5 at most
    rate = limit / window_ms / 1000  # per microsecond
    t_start = server_time_us(c)
    for i in range(burst):
        r = run(c, "token_bucket", "t:tb", limit, window_ms, burst)
        assert r[0] == 1 and r[1] == burst - 1 - i, r
    refused = run(c, "token_bucket", "t:tb", limit, window_ms, burst)
    t_refused = server_time_us(c)  # the refused call ran before this
    assert refused[0] == 0 and refused[1] == 0
    assert 0 < refused[3] <= 100, "retry_ms: the time one token takes (100 ms) at most"
    assert c.type("t:tb") == "string"
    tat = int(c.get("t:tb"))  # GCRA: when the bucket is full again (server time, microseconds)
    assert t_start <= tat - burst / rate <= t_refused, "empty: TAT a whole burst after a charge"
    pttl = c.pttl("t:tb")
    t_pttl = server_time_us(c)
    # Bounds from the server's clock, not from how fast this machine makes the calls: the TTL
    # runs to TAT (PX rounded up to the millisecond), and the refused call computed its reset
    # between t_start and t_refused.
    assert (tat - t_pttl) / 1000 - 1 <= pttl <= (tat - t_start) / 1000 + 1 + window_ms / 2, \
        f"TTL = until full again (and a spread of up to half the window): {pttl}"
    assert (tat - t_refused) / 1000 - 1 <= refused[2] <= (tat - t_start) / 1000 + 1, \
        "reset_ms: until the bucket is full"
    now = server_time_us(c)
    tokens, ts = burst - (tat - now) * rate, now

    time.sleep(0.35)
    t_begin = server_time_us(c)
    allowed = 0
    while run(c, "token_bucket", "t:tb", limit, window_ms, burst)[0]:
        allowed += 1
        assert allowed <= burst
    t_end = server_time_us(c)
    at = lambda t: min(burst, tokens + (t - ts) * rate)  # noqa: E731
    assert math.ceil(at(t_begin) - 1) <= allowed <= math.floor(at(t_end)), (allowed, at(t_begin), at(t_end))

    time.sleep(0.6)
    assert run(c, "token_bucket", "t:tb", limit, window_ms, burst)[:2] == [1, burst - 1], \
        "refilled up to burst, never above"


def test_token_bucket_count_denied_empties_the_bucket(valkey):
    """Two tokens a second, two at most, both spent; then each client sends a request every
    50 ms or so for 1.2 s. With count_denied every refused request empties the bucket, which
    would need 500 ms without a request to hold a token again: a client that keeps hammering
    stays blocked. Without it the bucket refills (2.4 tokens in 1.2 s). The 500 ms leave room
    for a loaded machine: with 10 tokens a second (100 ms each) this test once saw a gap of
    more than 100 ms between two requests, and a token."""
    c = valkey.client
    limit, window_ms, burst = 2, 1000, 2
    for key, cd in (("t:tbh", True), ("t:tbp", False)):
        for _ in range(2):
            assert run(c, "token_bucket", key, limit, window_ms, burst, count_denied=cd)[0] == 1
    got = {"t:tbh": [], "t:tbp": []}
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.2:
        time.sleep(0.05)
        for key, cd in (("t:tbh", True), ("t:tbp", False)):
            got[key].append(run(c, "token_bucket", key, limit, window_ms, burst, count_denied=cd)[0])
    assert sum(got["t:tbh"]) == 0, f"count_denied: a client that keeps hammering stays blocked {got}"
    assert sum(got["t:tbp"]) >= 2, f"without count_denied it refills: {got}"
    # Empty: TAT a whole burst (2 tokens of 500 ms) after the last refusal.
    assert 500_000 < int(c.get("t:tbh")) - server_time_us(c) <= 1_000_000
    assert_every_key_has_ttl(c)


def test_each_algorithm_charges_the_cost(valkey):
    c = valkey.client
    assert run(c, "sliding_log", "t:c", 5, 2000, cost=2)[:2] == [1, 3]
    assert len(stored(valkey, "t:c", "sliding_log")) == 2, "one entry per unit of cost"
    assert run(c, "token_bucket", "t:ct", 10, 1000, 5, cost=3)[:2] == [1, 2]
    assert run(c, "token_bucket", "t:ct", 10, 1000, 5, cost=3)[0] == 0


# ------------------------------------------------------------------------------ decide

def decide(client, keys, limits):
    request = list(zip(keys, limits))
    return decided(decide_call(client, decide_command([request])), request)


def test_decide_reply_layout(valkey):
    c = valkey.client
    limits = [{"algorithm": a, "limit": 10, "window_ms": 60000, "burst": 10}
              for a in ("fixed_window", "sliding_log", "sliding_window", "token_bucket")]
    allowed, per = decide(c, ["d:a", "d:b", "d:c", "d:d"], limits)
    assert allowed == 1
    for limit, (a, remaining, reset_ms, retry_ms) in zip(limits, per):
        # reset: until the quota is whole again (sliding_window: this window's count has decayed
        # at the end of the next window)
        longest = 120000 if limit["algorithm"] == "sliding_window" else 60000
        assert a == 1 and remaining == 9 and retry_ms == 0 and 0 < reset_ms <= longest, (limit, per)
    assert sorted(assert_every_key_has_ttl(c)) == ["d:a", "d:b", "d:c", "d:d"], \
        "every key the script touches is one of KEYS"


@pytest.mark.parametrize("algorithm_a", ["fixed_window", "sliding_log", "sliding_window", "token_bucket"])
@pytest.mark.parametrize("count_denied_b", [False, True], ids=["b_not_counting", "b_counting"])
def test_decide_all_or_nothing(valkey, algorithm_a, count_denied_b):
    """B refuses: A (which would allow) is not charged, whatever A's count_denied; B records the
    attempt only when it counts denied requests."""
    c = valkey.client
    a = {"algorithm": algorithm_a, "limit": 100, "window_ms": 60000, "count_denied": True}
    b = {"algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "count_denied": count_denied_b}
    avoid_window_boundary(c, 60.0, 2.0)
    for i in range(2):
        allowed, per = decide(c, ["d:A", "d:B"], [a, b])
        assert allowed == 1 and per[0][:2] == (1, 99 - i) and per[1][:2] == (1, 1 - i)
    before_a = raw_value(valkey, "d:A")
    for _ in range(3):
        allowed, per = decide(c, ["d:A", "d:B"], [a, b])
        assert allowed == 0
        assert per[0][0] == 1 and per[0][1] == 98, "A would allow; its budget is unchanged"
        assert per[1][0] == 0 and per[1][3] > 0
    assert raw_value(valkey, "d:A") == before_a, "a request refused by B costs A nothing"
    assert stored(valkey, "d:B", "fixed_window")[1] == (5 if count_denied_b else 2)
    assert_every_key_has_ttl(c)


def test_decide_shadow_never_refuses_but_is_charged(valkey):
    c = valkey.client
    shadow = {"algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "shadow": True}
    shadow_cd = {**shadow, "count_denied": True}
    enforced = {"algorithm": "fixed_window", "limit": 100, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    flags = []
    for _ in range(5):
        allowed, per = decide(c, ["s:S", "s:SC", "s:E"], [shadow, shadow_cd, enforced])
        assert allowed == 1, "a shadow limit never refuses"
        flags.append((per[0][0], per[1][0]))
    assert flags == [(1, 1)] * 2 + [(0, 0)] * 3, "the shadow limit is decided"
    count = lambda key: stored(valkey, key, "fixed_window")[1]  # noqa: E731
    assert count("s:S") == 2, "charged like an enforced limit (its refusals not counted)"
    assert count("s:SC") == 5, "charged like an enforced limit that counts denied requests"
    assert count("s:E") == 5

    # Another limit refuses: the shadow limits are not charged (all or nothing).
    tight = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    assert decide(c, ["s:S2", "s:T"], [shadow_cd, tight])[0] == 1
    assert decide(c, ["s:S2", "s:T"], [shadow_cd, tight])[0] == 0
    assert count("s:S2") == 1


def decide_many(client, requests):
    """One call of decide for several requests: [[(key, limit)]]."""
    return decide_reply(decide_call(client, decide_command(requests)), requests).results


def test_decide_unknown_algorithm_fails_only_its_request(valkey):
    c = valkey.client
    leaky = {"algorithm": "leaky", "limit": 1, "window_ms": 1000}
    fixed = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    bad, good = decide_many(c, [[("u:x", leaky)], [("u:y", fixed)]])
    assert isinstance(bad, str) and "unknown algorithm" in bad
    assert good == (1, [(1, 0, good[1][0][2], 0)])
    assert list(c.scan_iter("*")) == ["u:y"], "u:x untouched"


def test_decide_batch_requests_in_order_each_all_or_nothing(valkey):
    """A batch decides its requests one after the other, each as if alone: the second request
    on a 1-per-window key is refused, a request refused by its second limit costs its first
    nothing, and a later request still sees the budget that refusal left. A key used by several
    requests is sent once."""
    c = valkey.client
    one = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    many = {"algorithm": "fixed_window", "limit": 10, "window_ms": 60000}
    log = {"algorithm": "sliding_log", "limit": 10, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    requests = [
        [("b:many", many), ("b:one", one)],
        [("b:many", many), ("b:one", one)],
        [("b:many", many), ("b:log", log)],
        [("b:log", log)],
    ]
    assert decide_keys(requests) == ["b:many", "b:one", "b:log"]
    results = decide_many(c, requests)
    assert [r[0] for r in results] == [1, 0, 1, 1]
    assert results[0][1][0][1] == 9 and results[1][1][0] == (1, 9, results[1][1][0][2], 0), \
        "the refused request did not charge b:many"
    assert results[2][1][0][1] == 8
    assert results[3][1][0][1] == 8, "two requests in one call are two sliding_log entries"
    assert len(stored(valkey, "b:log", "sliding_log")) == 2
    assert_every_key_has_ttl(c)


@pytest.mark.parametrize("count_denied", [False, True], ids=["not_counting", "counting"])
def test_decide_batch_one_counter_many_requests(valkey, count_denied):
    """Many requests of one call on one fixed_window key (read once, counted in memory, written
    once): each sees the ones before it, exactly the limit passes, and the key ends where one
    script per request would have left it, with its TTL."""
    c = valkey.client
    lim = {"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "count_denied": count_denied}
    costly = {**lim, "cost": 2}
    avoid_window_boundary(c, 60.0, 2.0)
    requests = [[("o:k", costly if i == 2 else lim)] for i in range(9)]
    results = decide_many(c, requests)
    assert [r[0] for r in results] == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert [r[1][0][1] for r in results] == [4, 3, 1, 0, 0, 0, 0, 0, 0]
    assert assert_every_key_has_ttl(c) == ["o:k"]
    assert stored(valkey, "o:k", "fixed_window")[1] == (10 if count_denied else 5)
    # The next call starts from what this one wrote.
    assert decide(c, ["o:k"], [lim])[0] == 0

    # Only refused requests touched a key: without count_denied nothing is left behind.
    big = {**lim, "cost": 6}
    results = decide_many(c, [[("o:none", big)] for _ in range(3)])
    assert [r[0] for r in results] == [0, 0, 0]
    if count_denied:
        assert stored(valkey, "o:none", "fixed_window")[1] == 18 and c.pttl("o:none") > 0
    else:
        assert c.exists("o:none") == 0


def test_decide_a_key_of_another_type_is_replaced(valkey):
    """Values are read with one MGET, which sees a key of another type as absent: the limit
    starts afresh on it and the write replaces it. The other requests are decided as usual."""
    c = valkey.client
    fixed = {"algorithm": "fixed_window", "limit": 5, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    c.rpush("f:bad", "not a counter")
    results = decide_many(c, [[("f:ok", fixed)], [("f:bad", fixed)], [("f:ok", fixed)]])
    assert [r[1][0][1] for r in results] == [4, 4, 3]
    assert c.type("f:bad") == "string" and c.pttl("f:bad") > 0


def test_decide_time_is_the_servers(valkey):
    """The same decision through decide and standalone: the window number is the server's."""
    c = valkey.client
    avoid_window_boundary(c, 1.0, 0.2)
    n = math.floor(server_time(c))
    decide(c, ["w:k"], [{"algorithm": "fixed_window", "limit": 5, "window_ms": 1000}])
    assert n == math.floor(server_time(c))
    assert stored(valkey, "w:k", "fixed_window") == (n % WINDOW_NUMBERS, 1)


ALL = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"]


def comparable(results):
    """Results without reset_ms and with retry only as refused or not (both from TIME, so
    they differ between two calls a few milliseconds apart)."""
    return [r if isinstance(r, str) else (r[0], [(a, rem, retry > 0) for a, rem, _, retry in r[1]])
            for r in results]


def test_token_bucket_admits_its_whole_burst_at_one_instant(valkey):
    """`burst` requests of one call (one instant) on a fresh bucket all fit, and one more does
    not, for every burst up to 40 and windows up to 30 days. A 7-per-day bucket used to admit
    6: seven tokens of 8.64e10 / 7 us added one by one came to one step of a double above
    7 * T, beyond the microsecond of slack (found by the batch test below, seed 3686638562)."""
    c = valkey.client
    wrong = []
    for window_ms in (1000, 60_000, 3_600_000, 86_400_000, 7 * 86_400_000, 30 * 86_400_000):
        for limit in range(1, 41):
            for cost in {1, 2, 3} & set(range(1, limit + 1)):
                tb = {"algorithm": "token_bucket", "limit": limit, "burst": limit,
                      "window_ms": window_ms, "cost": cost}
                key = f"tb:{window_ms}:{limit}:{cost}"
                fits = limit // cost
                results = decide_many(c, [[(key, tb)] for _ in range(fits + 1)])
                admitted = [r[0] for r in results]
                if admitted != [1] * fits + [0]:
                    wrong.append((window_ms, limit, cost, admitted.count(1)))
    assert not wrong, f"(window_ms, limit, cost, admitted): {wrong[:10]} ({len(wrong)} in all)"


@pytest.mark.parametrize("algorithm", ALL)
def test_decide_batches_decide_as_one_request_at_a_time(valkey, algorithm):
    """Random sequences of requests (one or two limits, a few keys shared between them, random
    limits, costs, count_denied and shadow) decided one request per call on some keys and in
    random batches on copies of them: the same answers, and the keys hold the same counts."""
    c = valkey.client
    seed = random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    window_ms = 3_600_000 if algorithm != "token_bucket" else 86_400_000
    avoid_window_boundary(c, window_ms / 1000, 10.0)
    for case in range(12):
        limits = [{"algorithm": algorithm, "limit": rnd.randint(2, 9), "window_ms": window_ms,
                   "cost": rnd.randint(1, 2), "count_denied": rnd.random() < 0.5,
                   "shadow": rnd.random() < 0.15} for _ in range(2)]
        for l in limits:
            l["burst"] = l["limit"]
        sequence = []
        for _ in range(rnd.randint(5, 40)):
            which = rnd.sample(range(2), rnd.randint(1, 2))
            sequence.append([(f"{i}:{rnd.randint(0, 2)}", limits[i]) for i in sorted(which)])
        one = [decide_many(c, [[(f"a{case}:{k}", l) for k, l in request]])[0]
               for request in sequence]
        batched, at = [], 0
        while at < len(sequence):
            size = rnd.randint(1, 12)
            part = [[(f"b{case}:{k}", l) for k, l in request] for request in sequence[at:at + size]]
            batched += decide_many(c, part)
            at += size
        assert comparable(batched) == comparable(one), (seed, case, limits, sequence)
        for key in {k for request in sequence for k, _ in request}:
            a, b = stored(valkey, f"a{case}:{key}", algorithm), stored(valkey, f"b{case}:{key}", algorithm)
            if algorithm == "sliding_log":
                assert (a and len(a)) == (b and len(b)), (seed, case, key)
            elif algorithm == "token_bucket":  # TAT, a few milliseconds of TIME apart at most
                assert (a is None) == (b is None) and (a is None or abs(a - b) < 2_000_000), \
                    (seed, case, key, a, b)
            else:
                assert a == b, (seed, case, key, a, b)


def library_names(client) -> list:
    return sorted(entry[1] for entry in client.function_list())


@pytest.mark.skipif(ENGINE == "module", reason="the functions' library: the lua engine's run")
def test_composed_library_is_what_the_gateway_loads(sluice_factory, upstream, valkey):
    """decide_library() (the codec tool's, these tests' library) is the very library the
    gateway loads: named "sluice_<hash>" for its function "sluice_decide_<hash>", it is on the
    server after the gateway connected, and the gateway's FCALL finds its function in that
    library loaded by the test."""
    source, function = decide_library()
    library = "sluice_" + function.rsplit("_", 1)[1]
    valkey.client.function_flush()
    assert library_names(valkey.client) == []
    gw = sluice_factory(upstream, routes=[route_cfg("r", ["l"])],
                        extra_toml=ratelimit_toml(valkey, limits=[
                            limit_cfg("l", "fixed_window", 5, "1m")]))
    # /healthz answers before the worker's Valkey connection is up, and a request that comes
    # before it is decided by on_error at once, without any FCALL (as documented): wait for
    # /ready, which says the connection is up and its FUNCTION LOAD answered.
    wait_admin(gw, "/ready", 200)
    assert library_names(valkey.client) == [library], \
        "the gateway loaded a library other than the one these tests call"

    def decided_by_valkey(n):
        """The gateway's n requests so far were each decided by one FCALL, none by on_error."""
        stats = valkey.client.info("commandstats").get("cmdstat_fcall", {})
        assert stats.get("calls") == n, stats
        assert stats.get("failed_calls", 0) == 0, \
            "the gateway's FCALL found its function in the library the test loaded"
        outcomes = {o: metric_sum(gw, "sluice_ratelimit_decisions_total", limit="l", outcome=o)
                    for o in ("allowed", "error_allowed")}
        assert outcomes == {"allowed": n, "error_allowed": 0}, outcomes

    assert gw.get("/status/200").status == 200
    decided_by_valkey(1)
    valkey.client.function_flush()
    valkey.client.function_load(source)
    assert gw.get("/status/200").status == 200
    decided_by_valkey(2)


# ------------------------------------------------------------------------------ retry exactness

# A limit and how many requests fill it. Windows are short: the retry is due within them.
RETRY_CASES = {
    "fixed_window": ({"algorithm": "fixed_window", "limit": 1, "window_ms": 400}, 1),
    "sliding_window": ({"algorithm": "sliding_window", "limit": 2, "window_ms": 400}, 2),
    "sliding_log": ({"algorithm": "sliding_log", "limit": 2, "window_ms": 400}, 2),
    "token_bucket": ({"algorithm": "token_bucket", "limit": 1, "window_ms": 400, "burst": 2}, 2),
}


def timed_decision(client, command, request):
    """One decision between two TIMEs in one MULTI (run back to back): the function's clock is
    within [before, after] (us). Returns (before, after, allowed, retry_ms)."""
    pipe = client.pipeline(transaction=True)
    pipe.time()
    pipe.execute_command(*engine_command(command))
    pipe.time()
    before, reply, after = pipe.execute()
    allowed, ((_, _, _, retry_ms),) = decided(reply, request)
    return before[0] * 1_000_000 + before[1], after[0] * 1_000_000 + after[1], allowed, retry_ms


@pytest.mark.parametrize("algorithm", list(RETRY_CASES))
def test_retry_ms_is_exact_to_the_millisecond(valkey, algorithm):
    """A refusal announces retry_ms R; nothing else arrives. Then every attempt made 1 ms or more
    before the announced time is refused, and an attempt at the announced time or later is
    allowed: attempts are made every fraction of a millisecond from a few ms before until one
    is allowed, each in MULTI between two TIMEs, so when each was decided is known to the
    microsecond. (Refused attempts are not counted: count_denied is off.)"""
    c = valkey.client
    limit, fill = RETRY_CASES[algorithm]
    for scenario in range(5):  # again if the machine stalled over the last milliseconds
        key = f"retry:{algorithm}:{scenario}"
        request = [(key, limit)]
        command = decide_command([request])
        decide_call(c, command)  # (loads the library when the server lacks it)
        c.delete(key)
        avoid_window_boundary(c, limit["window_ms"] / 1000, 0.1)
        for _ in range(fill):
            assert timed_decision(c, command, request)[2] == 1
        lo, hi, allowed, retry = timed_decision(c, command, request)
        assert allowed == 0 and retry >= 1
        early = lo + (retry - 1) * 1000  # attempts decided before it: refused
        due = hi + retry * 1000          # attempts decided from it on: allowed
        offset = hi - time.monotonic() * 1e6  # server clock - local clock (us)
        time.sleep(max(0.0, (early - 5000 - offset) / 1e6 - time.monotonic()))
        attempts = []
        while not attempts or not attempts[-1][2]:
            attempts.append(timed_decision(c, command, request))
            assert attempts[-1][0] < due + 1_000_000, f"still refused 1 s after it was due: {attempts[-3:]}"
        for a, b, ok, r in attempts:
            if b < early:
                assert not ok, f"{algorithm}: allowed {(early - b) / 1000:.3f} ms before retry_ms - 1 " \
                               f"(retry_ms {retry})"
            if a >= due:
                assert ok, f"{algorithm}: refused {(a - due) / 1000:.3f} ms after the announced time"
        # The last milliseconds before were probed (else the machine stalled: once more).
        if any(not ok and early - 3000 <= b < early for _, b, ok, _ in attempts):
            return
    pytest.fail(f"{algorithm}: no attempt fell in the 3 ms before retry_ms - 1 in 5 tries")


# ------------------------------------------------------------------------------ undo

@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket"])
def test_undo_takes_back_exactly_what_a_call_charged(valkey, algorithm):
    """Two calls charge a key (cost 3 each); undoing the second with its time leaves the key as
    the first left it: the count, the log's entries (the other call's stay), the bucket's TAT
    (less only the refill time between the charge and the undo, see token_bucket.lua)."""
    c = valkey.client
    limit = {"algorithm": algorithm, "limit": 20, "window_ms": 60_000, "cost": 3}
    key = f"undo:{algorithm}"
    avoid_window_boundary(c, 60.0, 5.0)
    request = [(key, limit)]
    command = decide_command([request])
    decide_call(c, command)
    after_first = stored(valkey, key, algorithm)
    second = decide_call(c, command)
    at = decide_reply(second, [request]).time_us
    assert decided(second, request)[0] == 1
    assert undo_call(c, [(key, limit)], at) == 1
    elapsed = server_time_us(c) - at
    got = stored(valkey, key, algorithm)
    if algorithm == "token_bucket":
        # TAT back by 3 tokens (3 s of a 60 s / 20 window), less the time since the charge.
        assert after_first + 1 <= got <= after_first + elapsed + 1, (after_first, got, elapsed)
        assert got >= after_first, "never below what the first call left"
    else:
        assert got == after_first, (after_first, got)
    assert c.pttl(key) > 0, "the key keeps its expiry"


def test_undo_of_a_window_that_is_over_takes_nothing(valkey):
    """A fixed_window charge of an earlier window is gone with its window: nothing to take
    back; a sliding_window charge of the window before counts as previous and is taken from
    there."""
    c = valkey.client
    for algorithm in ("fixed_window", "sliding_window"):
        limit = {"algorithm": algorithm, "limit": 10, "window_ms": 60_000, "cost": 2}
        key = f"undo-over:{algorithm}"
        avoid_window_boundary(c, 60.0, 5.0)
        request = [(key, limit)]
        at = decide_reply(decide_call(c, decide_command([request])), [request]).time_us
        n, count = stored(valkey, key, algorithm)[:2]
        earlier = at - 60_000_000  # a call of the window before
        if algorithm == "fixed_window":
            assert undo_call(c, [(key, limit)], earlier) == 0
            assert stored(valkey, key, algorithm) == (n, count)
        else:
            # Make the stored window the one after `at`: `at`'s charge is now its previous.
            raw = struct.pack("<Idd", (n + 1) % WINDOW_NUMBERS, 1, 2)
            valkey.new_client(decode_responses=False).set(key, raw, keepttl=True)
            assert undo_call(c, [(key, limit)], at) == 1
            assert stored(valkey, key, algorithm) == ((n + 1) % WINDOW_NUMBERS, 1, 0)


def test_undo_of_a_log_takes_only_that_calls_entries(valkey):
    c = valkey.client
    limit = {"algorithm": "sliding_log", "limit": 10, "window_ms": 60_000, "cost": 2}
    key = "undo-log"
    two = [[(key, limit)], [(key, limit)]]  # one call, two requests
    at = decide_reply(decide_call(c, decide_command(two)), two).time_us
    one = [[(key, limit)]]
    other = decide_reply(decide_call(c, decide_command(one)), one).time_us
    assert stored(valkey, key, "sliding_log") == [at] * 4 + [other] * 2
    assert undo_call(c, [(key, limit)], at) == 1
    assert stored(valkey, key, "sliding_log") == [at] * 2 + [other] * 2, "cost 2: two entries"
    assert undo_call(c, [(key, {**limit, "cost": 5})], other) == 1
    assert stored(valkey, key, "sliding_log") == [at] * 2
    assert undo_call(c, [(key, {**limit, "cost": 2})], at) == 1
    assert c.exists(key) == 0, "an empty log is deleted"
