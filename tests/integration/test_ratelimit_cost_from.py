"""cost_from = "response_header:NAME": a request is admitted while its limit has anything left,
and charged the integer the upstream reports in that response header (missing or malformed:
`cost`) when the response head arrives, and `cost` when it went upstream and no head came. The
limit may go into debt; later requests wait until it is repaid, and Retry-After says how long."""

import math
import time

import pytest

from conftest import (RawClient, free_port, limit_cfg, parse_rl_list, server_time,
                      sluice_with_limits, stored, used)
from harness.gateway import wait_until
from harness.h2client import open_h2

FIELD = "X-Tokens-Used"


def tokens(name, algorithm, limit, window, **kw):
    return limit_cfg(name, algorithm, limit, window, cost_from=f"response_header:{FIELD}", **kw)


def reported(n):
    return f"/response-headers?{FIELD}={n}"


def wait_used(valkey, key, algorithm, window_s, value, timeout=2.0):
    deadline = time.monotonic() + timeout
    while True:
        got = used(valkey, key, algorithm, window_s)
        if got == value or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_the_reported_cost_is_charged_and_the_limit_goes_into_debt(sluice_factory, upstream,
                                                                   valkey, algorithm):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", algorithm, 10, "1h")])
    key = "rl:v2:llm:{127.0.0.1}"
    r = gw.get(reported(9))
    assert r.status == 200
    assert r.header(FIELD) == "9", "the field reaches the client unchanged"
    # What was left when it was admitted (the cost is known only from its response).
    assert parse_rl_list(r.header("ratelimit"))["llm"]["r"] == 10
    assert wait_used(valkey, key, algorithm, 3600, 9) == 9
    # 1 left: admitted, and its response reports 5 more than that: debt.
    r = gw.get(reported(6))
    assert r.status == 200
    assert parse_rl_list(r.header("ratelimit"))["llm"]["r"] == 1
    assert wait_used(valkey, key, algorithm, 3600, 15) == 15
    r = gw.get(reported(1))
    assert r.status == 429
    assert r.json()["violated-policies"] == ["llm"]
    assert int(r.header("retry-after")) >= 1
    assert used(valkey, key, algorithm, 3600) == 15, "a refused request is charged nothing"
    assert upstream.request_count == 2


def test_token_bucket_debt_is_waited_out_to_the_millisecond(sluice_factory, upstream, valkey):
    # 10 tokens a second (one per 100 ms), capacity 10. A response that reports 25 leaves the
    # bucket 15 tokens in debt: the next request (1 token) fits only 1.6 s later.
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", "token_bucket", 10, "1s")])
    key = "rl:v2:llm:{127.0.0.1}"
    assert gw.get(reported(25)).status == 200
    deadline = time.monotonic() + 2
    while stored(valkey, key, "token_bucket") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    tat_s = stored(valkey, key, "token_bucket") / 1e6
    now = server_time(valkey.client)
    assert 2.3 < tat_s - now <= 2.5, "25 tokens of 100 ms charged"
    fits_at = tat_s - 0.9  # when a whole token is there again
    r = gw.get("/status/200")
    assert r.status == 429
    asked = server_time(valkey.client)
    retry = int(r.header("retry-after"))
    assert retry == math.ceil(fits_at - asked) or retry == math.ceil(fits_at - asked + 0.05), \
        (retry, fits_at - asked)
    time.sleep(max(0.0, fits_at - server_time(valkey.client) - 0.15))
    assert gw.get("/status/200").status == 429, "still in debt just before it is repaid"
    time.sleep(max(0.0, fits_at - server_time(valkey.client) + 0.02))
    assert gw.get("/status/200").status == 200, "repaid: admitted again"


def test_missing_or_malformed_values_charge_the_cost(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", "fixed_window", 1000, "1h", cost=3)])
    key = "rl:v2:llm:{127.0.0.1}"
    expected = 0
    for target, charge in [("/status/200", 3), (reported("abc"), 3), (reported("-5"), 3),
                           (reported("1.5"), 3), (reported("0"), 0), (reported("7"), 7),
                           (reported("99999999999999999999"), 10**15)]:
        assert gw.get(target).status == 200
        expected += charge
        assert wait_used(valkey, key, "fixed_window", 3600, expected) == expected, target


def test_a_forwarded_request_without_a_response_head_is_charged_its_cost(sluice_factory,
                                                                         upstream, valkey):
    """The upstream did the work, whatever the client does: a request that went upstream and
    ended with no response head (the upstream closed: 502; the client closed, or reset its
    HTTP/2 stream, while waiting; its grpc-timeout passed: DEADLINE_EXCEEDED) is charged the
    limit's `cost`. Cancelling before the head no longer makes a cost_from limit free."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", "fixed_window", 100, "1h", cost=3)])
    key = "rl:v2:llm:{127.0.0.1}"

    def reached_upstream(n):
        assert wait_until(lambda: upstream.request_count, lambda c: c >= n, 3) >= n

    assert gw.get("/close-now").status == 502
    assert wait_used(valkey, key, "fixed_window", 3600, 3) == 3, "the upstream closed"
    with RawClient(gw.port, timeout=5) as c:
        c.request("GET", "/slow/3000")
        reached_upstream(2)
    # (Charged its cost when the gateway sees the close, or when the head comes: 3 either way.)
    assert wait_used(valkey, key, "fixed_window", 3600, 6, timeout=5) == 6, "the client closed"
    with open_h2(gw.port, timeout=5) as c:
        sid = c.request("GET", "/slow/3000")
        reached_upstream(3)
        time.sleep(0.1)
        c.reset_stream(sid)
        assert wait_used(valkey, key, "fixed_window", 3600, 9) == 9, "RST_STREAM"
        grpc = [("content-type", "application/grpc"), ("te", "trailers"),
                ("grpc-timeout", "300m")]
        s = c.response(c.request("POST", "/slow/3000", grpc, b"\x00" * 5), timeout=5)
        assert s.header("grpc-status") == "4", s
    assert wait_used(valkey, key, "fixed_window", 3600, 12) == 12, "the grpc-timeout passed"
    # A response head: its reported cost, not `cost` on top of it.
    assert gw.get(reported(5)).status == 200
    assert wait_used(valkey, key, "fixed_window", 3600, 17) == 17
    time.sleep(0.3)
    assert used(valkey, key, "fixed_window", 3600) == 17
    assert upstream.request_count == 5


def test_a_request_that_never_went_upstream_is_charged_nothing(sluice_factory, upstream, valkey):
    """An upstream that cannot be reached (502 before any byte was sent) did no work."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", "fixed_window", 10, "1h")],
                            upstreams=[{"name": "app", "endpoints": [f"127.0.0.1:{free_port()}"],
                                        "connect_timeout": "300ms"}])
    key = "rl:v2:llm:{127.0.0.1}"
    assert gw.get("/echo").status == 502
    time.sleep(0.3)
    assert used(valkey, key, "fixed_window", 3600) == 0


def test_cost_from_with_another_limit_all_or_nothing(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "fixed_window", 2, "1h"),
                             tokens("llm", "fixed_window", 100, "1h")])
    for _ in range(2):
        assert gw.get(reported(10)).status == 200
    r = gw.get(reported(10))
    assert r.status == 429 and r.json()["violated-policies"] == ["per_ip"]
    assert wait_used(valkey, "rl:v2:llm:{127.0.0.1}", "fixed_window", 3600, 20) == 20
