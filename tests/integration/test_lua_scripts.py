"""The Lua scripts of lua/ run directly on a real redis-server: each algorithm standalone (EVAL
of the file, as its header documents) and the composed decide script (decide.lua's header).
Time is the server's (TIME), so the tests use short windows and sleep."""

import math
import time
import uuid

import pytest

from conftest import (avoid_window_boundary, decide_args, decide_batch, decide_script, limit_cfg, lua_source,
                      metric_sum, parse_decide_batch_reply, parse_decide_reply, ratelimit_toml, route_cfg,
                      script_sha1, server_time, server_time_us, sleep_until_window_offset, wait_admin)


def run(client, algorithm, key, limit, window_ms, burst=None, cost=1, count_denied=False,
        request_id=None):
    """EVAL lua/<algorithm>.lua standalone; returns its reply, layout checked."""
    reply = client.eval(lua_source(algorithm), 1, key, limit, window_ms,
                        limit if burst is None else burst, cost, 1 if count_denied else 0,
                        request_id or uuid.uuid4().hex)
    assert isinstance(reply, list) and len(reply) == 4 and all(isinstance(x, int) for x in reply), \
        f"reply layout {{allowed, remaining, reset_ms, retry_ms}}: {reply!r}"
    assert reply[0] in (0, 1)
    return reply


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
    keys = assert_every_key_has_ttl(c)
    assert keys == [f"t:fw:{n}"], "the window number (floor(now_us / window_us)) is in the key"
    assert c.get(f"t:fw:{n}") == "1"
    window_end_us = (n + 1) * 1_000_000
    pttl = c.pttl(f"t:fw:{n}")
    assert (window_end_us - server_time_us(c)) / 1000 - 5 <= pttl <= (window_end_us - t0) / 1000 + 1, \
        "the counter expires at the end of its window"
    assert r[0] == 1 and r[1] == 2 and r[3] == 0
    assert (window_end_us - t1) / 1000 - 1 <= r[2] <= (window_end_us - t0) / 1000 + 1, "reset_ms"

    assert run(c, "fixed_window", "t:fw", 3, 1000)[:2] == [1, 1]
    assert_every_key_has_ttl(c)
    assert run(c, "fixed_window", "t:fw", 3, 1000)[:2] == [1, 0]
    refused = run(c, "fixed_window", "t:fw", 3, 1000)
    assert refused[0] == 0 and refused[1] == 0
    assert refused[3] == refused[2] and 0 < refused[3] <= 1000, "retry_ms: until the window ends"
    assert c.get(f"t:fw:{n}") == "3", "count_denied = 0: a refused request is not counted"
    assert_every_key_has_ttl(c)

    # The next window is a new key; the old one expired with its window.
    sleep_until_window_offset(c, 1.0, 0.05, min_lead=0.01)
    r = run(c, "fixed_window", "t:fw", 3, 1000)
    assert r[:2] == [1, 2], "a new window starts from zero"
    keys = assert_every_key_has_ttl(c)
    assert keys == [f"t:fw:{n + 1}"], keys
    assert c.exists(f"t:fw:{n}") == 0


def test_fixed_window_count_denied_and_cost(valkey):
    c = valkey.client
    avoid_window_boundary(c, 2.0, 0.5)
    results = [run(c, "fixed_window", "t:cd", 2, 2000, count_denied=True)[0] for _ in range(5)]
    assert results == [1, 1, 0, 0, 0]
    (key,) = assert_every_key_has_ttl(c)
    assert c.get(key) == "5", "count_denied = 1: refused requests are counted too"

    # cost: 2 of 3 fits once; a refused cost is not charged without count_denied
    assert run(c, "fixed_window", "t:cost", 3, 2000, cost=2)[:2] == [1, 1]
    assert run(c, "fixed_window", "t:cost", 3, 2000, cost=2)[:2] == [0, 1]
    assert [c.get(k) for k in c.scan_iter("t:cost:*")] == ["2"]
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
        card = c.zcard("t:sl")
        assert card <= limit + 1, f"sliding_log holds {card} entries after request {i + 1}"
        pttl = c.pttl("t:sl")
        assert 0 < pttl <= 2000, f"TTL {pttl}"
        if i < limit:
            assert r[:2] == [1, limit - 1 - i]
            assert card == i + 1, "one unique member per accepted request"
        else:
            assert r[0] == 0 and r[1] == 0 and 0 < r[3] <= 2000
    assert allowed == limit
    members = c.zrange("t:sl", 0, -1)
    assert len(set(members)) == len(members)


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
            assert c.zcard(key) <= limit + 1
    assert sum(later["t:hammer"]) == 0, f"count_denied client got through: {later['t:hammer']}"
    assert sum(later["t:polite"]) >= 1, "the first entries aged out: the client gets through"


def test_sliding_log_retry_is_when_the_oldest_entry_leaves(valkey):
    c = valkey.client
    for _ in range(3):
        run(c, "sliding_log", "t:retry", 3, 1500)
    oldest = float(c.zrange("t:retry", 0, 0, withscores=True)[0][1])
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


# ------------------------------------------------------------------------------ sliding_window

def test_sliding_window_ttl_and_estimate(valkey):
    c = valkey.client
    limit, window_ms, w = 10, 1000, 1.0
    n = sleep_until_window_offset(c, w, 0.05, min_lead=0.02)
    results = [run(c, "sliding_window", "t:sw", limit, window_ms) for _ in range(limit + 1)]
    assert [r[0] for r in results] == [1] * limit + [0]
    assert c.get(f"t:sw:{n}") == str(limit)
    before = server_time_us(c)
    pttl = c.pttl(f"t:sw:{n}")
    after = server_time_us(c)
    # It expires at the end of the next window: PTTL is read between `before` and `after`.
    earliest, latest = [((n + 2) * 1_000_000 - t) / 1000 for t in (after, before)]
    assert window_ms < pttl <= 2 * window_ms and earliest - 5 <= pttl <= latest + 5, \
        f"a counter lives two windows: PTTL {pttl}, expected {earliest:.0f}-{latest:.0f}"

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
    assert c.get(f"t:sw:{n + 1}") == str(allowed)
    assert window_ms < c.pttl(f"t:sw:{n + 1}") <= 2 * window_ms
    assert 0 < c.pttl(f"t:sw:{n}") <= window_ms, "the previous counter lives to the end of this window"
    assert sorted(c.scan_iter("t:sw*")) == sorted([f"t:sw:{n}", f"t:sw:{n + 1}"])
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
    assert c.get(f"t:swcd:{n}") == "4"
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
    state = c.hgetall("t:tb")
    assert set(state) == {"tokens", "ts"}, state
    tokens, ts = float(state["tokens"]), int(state["ts"])  # as the last allowed call left them
    assert 0 <= tokens < 1
    assert t_start <= ts <= t_refused, "ts is the server's time (microseconds)"
    pttl = c.pttl("t:tb")
    t_pttl = server_time_us(c)
    full_ms = (burst - tokens) / rate / 1000
    # Bounds from the server's clock, not from how fast this machine makes the calls: the TTL was
    # set at ts and has run down since; the refused call computed its reset after ts.
    assert full_ms + 1000 - (t_pttl - ts) / 1000 - 1 <= pttl <= full_ms + 1000 + 1, \
        f"TTL = time to refill fully ({full_ms:.0f} ms) + a second: {pttl}"
    assert full_ms - (t_refused - ts) / 1000 - 1 <= refused[2] <= full_ms + 1, \
        "reset_ms: until the bucket is full"

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
    assert float(c.hget("t:tbh", "tokens")) == 0.0
    assert_every_key_has_ttl(c)


def test_standalone_scripts_charge_the_cost(valkey):
    c = valkey.client
    assert run(c, "sliding_log", "t:c", 5, 2000, cost=2)[:2] == [1, 3]
    assert c.zcard("t:c") == 2, "one member per unit of cost"
    assert run(c, "token_bucket", "t:ct", 10, 1000, 5, cost=3)[:2] == [1, 2]
    assert run(c, "token_bucket", "t:ct", 10, 1000, 5, cost=3)[0] == 0


# ------------------------------------------------------------------------------ decide

def decide(client, keys, limits, request_id=None):
    reply = client.eval(decide_script(), len(keys), *keys,
                        *decide_args(request_id or uuid.uuid4().hex, limits))
    return parse_decide_reply(reply, list(limits))


def state_of(client, base):
    """Everything stored under a limit's base key (the key itself and base:*)."""
    out = {}
    for k in sorted({*client.scan_iter(base), *client.scan_iter(base + ":*")}):
        t = client.type(k)
        if t == "string":
            out[k] = client.get(k)
        elif t == "zset":
            out[k] = client.zrange(k, 0, -1, withscores=True)
        elif t == "hash":
            out[k] = client.hgetall(k)
    return out


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
    assert_every_key_has_ttl(c)


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
    before_a = state_of(c, "d:A")
    for _ in range(3):
        allowed, per = decide(c, ["d:A", "d:B"], [a, b])
        assert allowed == 0
        assert per[0][0] == 1 and per[0][1] == 98, "A would allow; its budget is unchanged"
        assert per[1][0] == 0 and per[1][3] > 0
    assert state_of(c, "d:A") == before_a, "a request refused by B costs A nothing"
    (bkey,) = state_of(c, "d:B")
    assert c.get(bkey) == ("5" if count_denied_b else "2")
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
    val = lambda base: [c.get(k) for k in c.scan_iter(base + ":*")]  # noqa: E731
    assert val("s:S") == ["2"], "charged like an enforced limit (its refusals not counted)"
    assert val("s:SC") == ["5"], "charged like an enforced limit that counts denied requests"
    assert val("s:E") == ["5"]

    # Another limit refuses: the shadow limits are not charged (all or nothing).
    tight = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    assert decide(c, ["s:S2", "s:T"], [shadow_cd, tight])[0] == 1
    assert decide(c, ["s:S2", "s:T"], [shadow_cd, tight])[0] == 0
    assert val("s:S2") == ["1"]


def decide_many(client, requests):
    """One call of decide for several requests: [(request_id, [(key, limit)])]."""
    keys, argv = decide_batch(requests)
    reply = client.eval(decide_script(), len(keys), *keys, *argv)
    return parse_decide_batch_reply(reply, [[l for _, l in limits] for _, limits in requests])


def test_decide_unknown_algorithm_fails_only_its_request(valkey):
    c = valkey.client
    leaky = {"algorithm": "leaky", "limit": 1, "window_ms": 1000}
    fixed = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    bad, good = decide_many(c, [("r1", [("u:x", leaky)]), ("r2", [("u:y", fixed)])])
    assert isinstance(bad, str) and "unknown algorithm" in bad
    assert good == (1, [(1, 0, good[1][0][2], 0)])
    assert [k for k in c.scan_iter("*")] == [k for k in c.scan_iter("u:y:*")], "u:x untouched"


def test_decide_batch_requests_in_order_each_all_or_nothing(valkey):
    """A batch decides its requests one after the other, each as if alone: the second request
    on a 1-per-window key is refused, a request refused by its second limit costs its first
    nothing, and a later request still sees the budget that refusal left."""
    c = valkey.client
    one = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    many = {"algorithm": "fixed_window", "limit": 10, "window_ms": 60000}
    log = {"algorithm": "sliding_log", "limit": 10, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    results = decide_many(c, [
        ("a", [("b:many", many), ("b:one", one)]),
        ("b", [("b:many", many), ("b:one", one)]),
        ("c", [("b:many", many), ("b:log", log)]),
        ("d", [("b:log", log)]),
    ])
    assert [r[0] for r in results] == [1, 0, 1, 1]
    assert results[0][1][0][1] == 9 and results[1][1][0] == (1, 9, results[1][1][0][2], 0), \
        "the refused request did not charge b:many"
    assert results[2][1][0][1] == 8
    assert results[3][1][0][1] == 8, "two requests in one call are two sliding_log entries"
    assert len(c.zrange("b:log", 0, -1)) == 2
    assert_every_key_has_ttl(c)


@pytest.mark.parametrize("count_denied", [False, True], ids=["not_counting", "counting"])
def test_decide_batch_one_counter_many_requests(valkey, count_denied):
    """Many requests of one call on one fixed_window counter (charged in memory after the
    first, written back once): each sees the ones before it, exactly the limit passes, and the
    counter ends where one script per request would have left it, with its TTL."""
    c = valkey.client
    lim = {"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "count_denied": count_denied}
    costly = {**lim, "cost": 2}
    avoid_window_boundary(c, 60.0, 2.0)
    requests = [(str(i), [("o:k", costly if i == 2 else lim)]) for i in range(9)]
    results = decide_many(c, requests)
    assert [r[0] for r in results] == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert [r[1][0][1] for r in results] == [4, 3, 1, 0, 0, 0, 0, 0, 0]
    (key,) = assert_every_key_has_ttl(c)
    assert c.get(key) == ("10" if count_denied else "5")
    # The next call starts from what this one wrote.
    assert decide(c, ["o:k"], [lim])[0] == 0

    # Only refused requests touched a counter: without count_denied nothing is left behind.
    big = {**lim, "cost": 6}
    results = decide_many(c, [(str(i), [("o:none", big)]) for i in range(3)])
    assert [r[0] for r in results] == [0, 0, 0]
    left = list(c.scan_iter("o:none*"))
    if count_denied:
        assert len(left) == 1 and c.get(left[0]) == "18" and c.pttl(left[0]) > 0
    else:
        assert left == []


def wrong_type_counter(c, base):
    """A 5-per-minute fixed_window limit and the number of the current window, whose counter
    under `base` is a list (a key of the wrong type)."""
    fixed = {"algorithm": "fixed_window", "limit": 5, "window_ms": 60000}
    avoid_window_boundary(c, 60.0, 2.0)
    n = math.floor(server_time(c) / 60)
    c.rpush(f"{base}:{n}", "not a counter")
    c.expire(f"{base}:{n}", 60)
    return fixed, n


def test_decide_batch_a_failing_request_does_not_fail_the_others(valkey):
    """A key of the wrong type fails the request that uses it (the string is the error); the
    requests before and after it are decided and charged as usual."""
    c = valkey.client
    fixed, n = wrong_type_counter(c, "f:bad")
    results = decide_many(c, [("1", [("f:ok", fixed)]), ("2", [("f:bad", fixed)]),
                              ("3", [("f:ok", fixed)])])
    assert results[0][0] == 1 and results[0][1][0][1] == 4
    assert isinstance(results[1], str) and "WRONGTYPE" in results[1]
    assert results[2][0] == 1 and results[2][1][0][1] == 3
    assert c.get(f"f:ok:{n}") == "2"


def decide_raw(client, requests):
    keys, argv = decide_batch(requests)
    return client.eval(decide_script(), len(keys), *keys, *argv)


def comparable(results):
    """Results without reset_ms (from TIME, so it differs between two calls)."""
    return [r if isinstance(r, str) else (r[0], [(a, rem, retry > 0) for a, rem, _, retry in r[1]])
            for r in results]


def test_decide_requests_alike_as_one_after_the_other(valkey):
    """n requests alike ("<limits>*<n>", fixed_window decides them in one step) get exactly
    what n separate requests one after the other get, and leave the counter where they
    would: limits, costs (also one that never fits), counting denied or not, shadow, a
    counter already used up to and past its limit."""
    import random
    c = valkey.client
    rnd = random.Random(7)
    avoid_window_boundary(c, 60.0, 5.0)
    for case in range(80):
        lim = {"algorithm": "fixed_window", "limit": rnd.randint(1, 7), "window_ms": 60000,
               "cost": rnd.randint(1, 3), "count_denied": rnd.random() < 0.5,
               "shadow": rnd.random() < 0.2}
        before = rnd.randint(0, 9)
        n = rnd.randint(2, 12)
        a, b = f"g:a{case}", f"g:b{case}"
        for key in (a, b):  # the same history on both counters
            if before:
                decide_many(c, [(str(i), [(key, {**lim, "cost": 1})]) for i in range(before)])
        reply = decide_raw(c, [("x", [(a, lim)], n)])
        grouped = parse_decide_batch_reply(reply, [([lim], n)])
        separate = decide_many(c, [(str(i), [(b, lim)]) for i in range(n)])
        assert comparable(grouped) == comparable(separate), (lim, before, n, reply)
        assert len(reply) <= 14, f"at most two runs: {reply!r}"
        assert len({r[1][0][2] for r in grouped}) == 1, "one reset for one window"
        ka, kb = sorted(c.scan_iter(a + ":*")), sorted(c.scan_iter(b + ":*"))
        assert [c.get(k) for k in ka] == [c.get(k) for k in kb], (lim, before, n)
        assert all(c.pttl(k) > 0 for k in ka), "a counter never exists without a TTL"


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket", "two_limits"])
def test_decide_requests_alike_without_a_one_step_module(valkey, algorithm):
    """Requests alike whose limits have no one-step decision (another algorithm, or two
    limits) are decided one after the other, each a run of 1, exactly as separate requests."""
    c = valkey.client
    avoid_window_boundary(c, 60.0, 5.0)
    tight = {"algorithm": "fixed_window", "limit": 3, "window_ms": 60000}
    if algorithm == "two_limits":
        wide = {"algorithm": "fixed_window", "limit": 100, "window_ms": 60000}
        limits = lambda p: [(p + ":w", wide), (p + ":t", tight)]  # noqa: E731
    else:
        lim = {"algorithm": algorithm, "limit": 4, "window_ms": 60000, "burst": 4, "cost": 1}
        limits = lambda p: [(p + ":l", lim)]  # noqa: E731
    n = 6
    dicts = [l for _, l in limits("x")]
    reply = decide_raw(c, [("x", limits("m:a"), n)])
    assert len(reply) == n * (1 + 6 * len(dicts)), f"runs of one: {reply!r}"
    grouped = parse_decide_batch_reply(reply, [(dicts, n)])
    separate = decide_many(c, [(str(i), limits("m:b")) for i in range(n)])
    assert comparable(grouped) == comparable(separate)
    assert [r[0] for r in grouped] == ([1] * 3 + [0] * 3 if algorithm == "two_limits" else [1] * 4 + [0] * 2)


def test_decide_requests_alike_fail_alike(valkey):
    """A key of the wrong type fails each of the requests alike on it (one error string each);
    the requests around them are decided as usual. Requests alike cannot need a request id."""
    c = valkey.client
    fixed, n = wrong_type_counter(c, "e:bad")
    reply = decide_raw(c, [("1", [("e:ok", fixed)]), ("2", [("e:bad", fixed)], 3),
                           ("3", [("e:ok", fixed)], 2)])
    results = parse_decide_batch_reply(reply, [[fixed], ([fixed], 3), ([fixed], 2)])
    assert results[0][0] == 1 and results[0][1][0][1] == 4
    assert all(isinstance(r, str) and "WRONGTYPE" in r for r in results[1:4])
    assert [r[1][0][1] for r in results[4:]] == [3, 2]
    assert c.get(f"e:ok:{n}") == "3"

    log = {"algorithm": "sliding_log", "limit": 5, "window_ms": 60000}
    with pytest.raises(Exception, match="needs its id"):
        decide_raw(c, [("4", [("e:log", log)], 2)])


def test_decide_time_is_the_servers(valkey):
    """The same decision through decide and standalone: same window key, from TIME."""
    c = valkey.client
    avoid_window_boundary(c, 1.0, 0.2)
    n = math.floor(server_time(c))
    decide(c, ["w:k"], [{"algorithm": "fixed_window", "limit": 5, "window_ms": 1000}])
    assert n == math.floor(server_time(c))
    assert list(c.scan_iter("w:k*")) == [f"w:k:{n}"]


def test_composed_script_is_what_the_gateway_loads(sluice_factory, upstream, valkey):
    """decide_script() (decide.lua's header) gives the very script the gateway loads: its SHA-1
    is known to the server after the gateway connected, and the gateway's EVALSHA uses it."""
    sha = script_sha1(decide_script())
    assert valkey.client.script_exists(sha) == [False]
    gw = sluice_factory(upstream, routes=[route_cfg("r", ["l"])],
                        extra_toml=ratelimit_toml(valkey, limits=[
                            limit_cfg("l", "fixed_window", 5, "1m")]))
    # /healthz answers before the worker's Valkey connection is up, and a request that comes
    # before it is decided by on_error at once, without any EVALSHA (as documented): wait for
    # /ready, which says the connection is up and its SCRIPT LOAD answered.
    wait_admin(gw, "/ready", 200)
    assert valkey.client.script_exists(sha) == [True], \
        "the gateway loaded a script other than lua/decide.lua composed as documented"

    def decided_by_valkey(n):
        """The gateway's n requests so far were each decided by one EVALSHA, none by on_error."""
        stats = valkey.client.info("commandstats").get("cmdstat_evalsha", {})
        assert stats.get("calls") == n, stats
        assert stats.get("failed_calls", 0) == 0, \
            "the gateway's EVALSHA found the script loaded from the composed files"
        outcomes = {o: metric_sum(gw, "sluice_ratelimit_decisions_total", limit="l", outcome=o)
                    for o in ("allowed", "error_allowed")}
        assert outcomes == {"allowed": n, "error_allowed": 0}, outcomes

    assert gw.get("/status/200").status == 200
    decided_by_valkey(1)
    valkey.client.script_flush()
    valkey.client.script_load(decide_script())
    assert gw.get("/status/200").status == 200
    decided_by_valkey(2)
