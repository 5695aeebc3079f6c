"""The decide library on a real server for concurrency slots (lua/concurrency.lua: take, free
with the undo and lease functions, renew, expiry) and for cost_from charges ("~": checked,
not charged; "!": charged into debt). Calls are written and read by Sluice's own codec."""

import time

import pytest

from conftest import avoid_window_boundary, server_time_us, stored
from decide_codec import (decide_call, decide_command, decide_reply, engine_command, lease_call,
                          undo_call)

# (the work is inside Valkey: once, not again on the sanitizer build; pytest.ini)
pytestmark = pytest.mark.once


def slots(limit, lease_ms=30000, name=None):
    out = {"algorithm": "concurrency", "limit": limit, "window_ms": lease_ms}
    if name is not None:
        out["lease"] = name
    return out


def call(client, requests):
    """One call of these requests ([[(key, limit)]]); per request (allowed, per limit)."""
    reply = decide_call(client, decide_command(requests))
    return decide_reply(reply, requests)


def test_slots_are_taken_until_full_and_named_by_their_requests(valkey):
    c = valkey.client
    requests = [[("s:k", slots(2, name=f"r{i}"))] for i in range(3)]
    decided = call(c, requests)
    assert [r[0] for r in decided.results] == [1, 1, 0]
    assert [r[1][0][1:] for r in decided.results] == [(1, 0, 0), (0, 1000, 0), (0, 1000, 1000)]
    members = dict(c.zrange("s:k", 0, -1, withscores=True))
    assert set(members) == {"r0", "r1"}, "the refused request took no slot"
    assert all(s == decided.time_us + 30_000_000 for s in members.values()), "lease end"
    assert 29_000 < c.pttl("s:k") <= 45_000, "a lease (and a spread of up to half of it)"


def test_a_name_already_held_is_refused_in_a_later_call_or_the_same_one(valkey):
    """A slot is one request's: a second take of a held name would hold nothing more (one
    member) and count nothing, so it is refused; once the name is freed, or its lease ended,
    it may be taken again."""
    c = valkey.client
    assert [r[0] for r in call(c, [[("s:k", slots(3, name="a"))]]).results] == [1]
    decided = call(c, [[("s:k", slots(3, name="a"))], [("s:k", slots(3, name="b"))],
                       [("s:k", slots(3, name="b"))]])
    assert [r[0] for r in decided.results] == [0, 1, 0]
    assert sorted(c.zrange("s:k", 0, -1)) == ["a", "b"]
    assert undo_call(c, [("s:k", slots(3, name="a"))], 0) == 1
    assert call(c, [[("s:k", slots(3, name="a"))]]).results[0][0] == 1
    c.zadd("s:k", {"b": server_time_us(c) - 1})  # b's lease ended
    assert call(c, [[("s:k", slots(3, name="b"))]]).results[0][0] == 1
    assert c.zcard("s:k") == 2


def test_a_refusing_limit_takes_no_slot_and_a_missing_slot_charges_nothing(valkey):
    c = valkey.client
    avoid_window_boundary(c, 60.0, 2.0)
    counter = {"algorithm": "fixed_window", "limit": 1, "window_ms": 60000}
    r = call(c, [[("s:k", slots(5, name="a")), ("s:c", counter)],
                 [("s:k", slots(5, name="b")), ("s:c", counter)]])
    assert [x[0] for x in r.results] == [1, 0]
    assert c.zrange("s:k", 0, -1) == ["a"], "refused by the counter: no slot"
    r = call(c, [[("s:full", slots(1, name="x")), ("s:d", counter)],
                 [("s:full", slots(1, name="y")), ("s:e", counter)]])
    assert [x[0] for x in r.results] == [1, 0]
    assert stored(valkey, "s:e", "fixed_window") is None, "no slot: the counter is not charged"


def test_undo_and_release_free_a_slot_renew_keeps_it(valkey):
    c = valkey.client
    limit = slots(3, lease_ms=2000, name="a")
    call(c, [[("s:k", limit)], [("s:k", {**limit, "lease": "b"})]])
    assert undo_call(c, [("s:k", limit)], 0) == 1
    assert c.zrange("s:k", 0, -1) == ["b"]
    b = {**limit, "lease": "b"}
    before = c.zscore("s:k", "b")
    time.sleep(0.05)
    assert lease_call(c, [("s:k", b)], renew=True) == 1
    assert c.zscore("s:k", "b") > before, "renewed: its lease ends later"
    assert lease_call(c, [("s:k", limit)], renew=True) == 0, "a freed slot is not taken again"
    assert lease_call(c, [("s:k", b)], renew=False) == 1
    assert c.exists("s:k") == 0, "the last slot freed: the key goes"


def test_an_ended_lease_frees_its_slot_and_is_not_renewed(valkey):
    c = valkey.client
    limit = slots(1, lease_ms=1000, name="dead")
    assert call(c, [[("s:k", limit)]]).results[0][0] == 1
    assert call(c, [[("s:k", {**limit, "lease": "other"})]]).results[0][0] == 0
    # The lease of "dead" ends (its gateway stopped renewing).
    c.zadd("s:k", {"dead": server_time_us(c) - 1})
    assert lease_call(c, [("s:k", limit)], renew=True) == 0, "an ended lease stays ended"
    c.zadd("s:k", {"dead": server_time_us(c) - 1})
    assert call(c, [[("s:k", {**limit, "lease": "other"})]]).results[0][0] == 1
    assert c.zrange("s:k", 0, -1) == ["other"]


def test_a_key_of_another_type_is_replaced(valkey):
    c = valkey.client
    c.set("s:k", "x")
    assert call(c, [[("s:k", slots(1, name="a"))]]).results[0][0] == 1
    assert c.zrange("s:k", 0, -1) == ["a"]


def test_later_is_checked_but_not_charged_and_forced_goes_into_debt(valkey):
    c = valkey.client
    avoid_window_boundary(c, 60.0, 2.0)
    for algorithm in ("fixed_window", "sliding_window"):
        key = f"s:{algorithm}"
        base = {"algorithm": algorithm, "limit": 10, "window_ms": 60000}
        later = {**base, "charge": "later"}
        r = call(c, [[(key, later)], [(key, later)]])
        assert [x[0] for x in r.results] == [1, 1]
        assert stored(valkey, key, algorithm) is None, "checked, charged nothing"
        r = call(c, [[(key, {**base, "charge": "forced", "cost": 25})]])
        assert r.results[0][0] == 1, "a forced charge is never refused"
        assert stored(valkey, key, algorithm)[1] == 25, "into debt"
        r = call(c, [[(key, later)]])
        assert r.results[0][0] == 0 and r.results[0][1][0][3] >= 1, "in debt: refused"
    key = "s:bucket"
    base = {"algorithm": "token_bucket", "limit": 10, "window_ms": 1000, "burst": 10}
    r = call(c, [[(key, {**base, "charge": "forced", "cost": 25})]])
    tat = stored(valkey, key, "token_bucket")
    assert tat == r.time_us + 2_500_000, "25 tokens of 100 ms"
    r = call(c, [[(key, {**base, "charge": "later"})]])
    allowed, ((_, remaining, reset_ms, retry_ms),) = r.results[0]
    assert allowed == 0 and remaining == 0
    # A token is there again when TAT - now = 9 tokens: 0.9 s before TAT.
    assert retry_ms == -(-(tat - 900_000 - r.time_us) // 1000), (retry_ms, tat - r.time_us)


def test_a_shadow_bucket_reply_names_the_debt_its_charge_added_and_the_undo_takes_it_back(valkey):
    """A shadow token bucket that counts denied requests (5 a day, 1 token left) refuses a
    request of cost 4: counting it empties the bucket, which adds 1 token of debt, not 4. Its
    reply's 4th value says how much (us), and an undo of that debt ("u<N>") restores TAT to what
    it was (less the time since the charge, the undo's rule); an undo of the cost (4 tokens)
    would give it 3 tokens it never had. The other limits' replies keep 3 values."""
    c = valkey.client
    token_us = 86_400_000_000 // 5
    bucket = {"algorithm": "token_bucket", "limit": 5, "window_ms": 86_400_000, "cost": 4,
              "shadow": True, "count_denied": True}
    counter = {"algorithm": "fixed_window", "limit": 9, "window_ms": 86_400_000}
    first = call(c, [[("d:b", bucket), ("d:c", counter)]])
    assert first.results[0][0] == 1 and first.added == [[4 * token_us, None]]
    tat = stored(valkey, "d:b", "token_bucket")
    second = call(c, [[("d:b", bucket)]])
    assert second.results[0] == (1, [(0, 0, 86_400_000, second.results[0][1][0][3])]), \
        "a shadow refusal never refuses the request"
    (added,) = second.added[0]
    # (1 token, and the refill since the first call, which the bucket had regained)
    assert token_us <= added <= token_us + 1_000_000, \
        f"emptying took 1 token ({token_us} us), the reply says {added}"
    assert stored(valkey, "d:b", "token_bucket") == second.time_us + 5 * token_us
    assert undo_call(c, [("d:b", {**bucket, "added_us": added})], second.time_us) == 1
    after = stored(valkey, "d:b", "token_bucket")
    assert tat <= after <= tat + 1_000_000, (tat, after)
    # A bad debt is an error of the undo, and changes nothing.
    import redis
    for bad in ("u", "u-1", "u1.5", "u2147483647000001", "uabc"):
        command = ["FCALL", first_function(c), "1", "d:b", "token_bucket", "5", "86400000", bad,
                   str(second.time_us)]
        try:
            c.execute_command(*engine_command(command))
            raise AssertionError(f"{bad} was taken")
        except redis.ResponseError as e:
            assert "bad debt" in str(e), e
    assert stored(valkey, "d:b", "token_bucket") == after


def first_function(client):
    """The undo function of the library the codec calls."""
    from decide_codec import decide_library
    return decide_library()[1] + "_undo"
