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


def test_a_debt_below_a_double_s_resolution_is_a_microsecond_and_fails_nothing(valkey):
    """10^10 tokens per 5 ms: a token is 5 * 10^-7 us, so 10 of them are a debt that now + debt
    (about 1.7 * 10^15 us, resolved to a quarter of a microsecond) cannot tell from now. The
    bucket is written a microsecond in debt (rounded up, as every TAT), with a PX of at least
    1 ms: before, TAT = now and PX 0 (no spread under 10 ms), which SET refuses, failing the
    whole call, its other requests with it."""
    c = valkey.client
    fine = {"algorithm": "token_bucket", "limit": 10**10, "window_ms": 5, "burst": 10**10,
            "cost": 10}
    for i in range(20):
        requests = [[(f"fine:{i}", fine)], [("fine:other", {**TOKENS, "cost": 1})],
                    [(f"fine:{i}", fine)]]
        r = call(c, requests)
        assert [x[0] for x in r.results] == [1, 1, 1], r.results
        tat = stored(valkey, f"fine:{i}", "token_bucket")
        assert tat is None or r.time_us < tat <= r.time_us + 1, (tat, r.time_us)


def test_a_fine_grained_bucket_through_the_gateway_never_fails_closed(sluice_factory, upstream,
                                                                      valkey):
    """The same bucket in a configuration, on_error = "deny": every request is decided (a
    failed call would answer 503)."""
    gw = sluice_with_limits(
        sluice_factory, upstream, valkey,
        [limit_cfg("fine", "token_bucket", 10**10, "5ms", by=["header:X-Key"], cost=10,
                   on_error="deny")], workers=1)
    statuses = [gw.get("/status/200", headers=[("X-Key", f"k{i % 3}")]).status
                for i in range(30)]
    assert statuses == [200] * 30, statuses
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_denied") == 0


LOG = {"algorithm": "sliding_log", "limit": 10, "window_ms": 3_600_000, "keep": 10}


@pytest.mark.parametrize("cost", [2**32 + 5, 2**31 + 3, 10**15])
def test_a_huge_sliding_log_charge_adds_keep_plus_one_entries_and_refuses_for_the_window(
        valkey, cost):
    """A charge forced into debt (what a direct caller may send; the gateway's costs on a
    sliding_log are at most its limit) adds keep + 1 entries of its time: every quota on the
    key refuses until they age out, as the whole cost would. Before, string.rep took the low
    32 bits of the count: 2^32 + 5 added 5 entries (and the next request was allowed), 2^31 + 3
    none, and a count in range built gigabytes."""
    c = valkey.client
    key = f"log:{cost}"
    r = call(c, [[(key, {**LOG, "cost": 1})], [(key, {**LOG, "cost": cost, "charge": "forced"})],
                 [("log:other", {**LOG, "cost": 1})], [(key, {**LOG, "cost": 1})]])
    assert [x if isinstance(x, str) else x[0] for x in r.results] == [1, 1, 1, 0], r.results
    entries = stored(valkey, key, "sliding_log")
    assert len(entries) == 1 + 11, len(entries)
    assert entries.count(r.time_us) == 12
    retry_ms = r.results[3][1][0][3]
    assert 3_599_000 <= retry_ms <= 3_600_000, retry_ms
    # The next call is refused as well, and adds nothing (count_denied is off here).
    again = call(c, [[(key, {**LOG, "cost": 1})]])
    assert again.results[0][0] == 0
    assert len(stored(valkey, key, "sliding_log")) == 12


def test_a_sliding_log_charge_beyond_its_key_s_ceiling_fails_alone(valkey):
    """A limit of 10^15 (the library's range; the configuration keeps a sliding_log's at
    10^6): a charge of 10^8 entries is past its log's 8 Mi entries. That request fails with its
    own error, before anything is charged; the call's other requests are decided."""
    c = valkey.client
    big = {"algorithm": "sliding_log", "limit": TOP, "window_ms": 60_000, "keep": TOP}
    r = call(c, [[("huge:a", {**big, "cost": 1})], [("huge:a", {**big, "cost": 10**8})],
                 [("huge:b", {**LOG, "cost": 1})], [("huge:a", {**big, "cost": 1})]])
    assert isinstance(r.results[1], str) and "longer than 8388608 entries" in r.results[1], \
        r.results
    assert [r.results[i][0] for i in (0, 2, 3)] == [1, 1, 1], r.results
    assert len(stored(valkey, "huge:a", "sliding_log")) == 2


def test_a_bucket_value_that_is_no_number_fails_every_request_on_it(valkey):
    """Two requests of one call on a key whose value is not a number: both fail (before, the
    first marked the key's index as read before it failed, and the second decided on the state
    an earlier call left at that index, then wrote that earlier call's key, one this call does
    not name)."""
    c = valkey.client
    earlier = call(c, [[("nan:earlier", {**TOKENS, "cost": 500})]])
    assert earlier.results[0][0] == 1
    before = c.get("nan:earlier")
    c.set("nan:bad", "not a number")
    r = call(c, [[("nan:bad", {**TOKENS, "cost": 1})], [("nan:bad", {**TOKENS, "cost": 1})],
                 [("nan:fine", {**TOKENS, "cost": 1})]])
    assert isinstance(r.results[0], str) and isinstance(r.results[1], str), r.results
    assert r.results[2][0] == 1
    assert c.get("nan:earlier") == before, "a key the call does not name was written"
    assert c.get("nan:bad") == "not a number"


@pytest.mark.parametrize("d", ["1000000000000000", "3"])
def test_a_definition_count_past_the_arguments_decides_nothing_at_once(valkey, d):
    """D (ARGV[1]) larger than the arguments hold: the reply is the call's time alone, at once
    (before, the Lua library copied 7 * D fields, most of them nil: 10^15 of them would hold
    Valkey for days; the gateway never writes it, a direct caller could)."""
    import time
    function = decide_library()[1]
    started = time.monotonic()
    reply = decide_call(valkey.client, ["FCALL", function, 1, "d:k", d, "1:1"])
    assert time.monotonic() - started < 2
    assert isinstance(reply, list) and len(reply) == 1, reply
    assert valkey.client.exists("d:k") == 0
