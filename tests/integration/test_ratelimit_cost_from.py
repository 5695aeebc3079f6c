"""cost_from = "response_header:NAME": a request is admitted while its limit has anything left,
and charged the integer the upstream reports in that response header (missing or malformed:
`cost`) when the response head arrives. The limit may go into debt; later requests wait until
it is repaid, and Retry-After says how long."""

import math
import time

import pytest

from conftest import limit_cfg, parse_rl_list, server_time, sluice_with_limits, stored, used

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


def test_no_response_head_charges_nothing(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [tokens("llm", "fixed_window", 10, "1h")])
    key = "rl:v2:llm:{127.0.0.1}"
    assert gw.get("/close-now").status == 502
    assert gw.get(reported(2)).status == 200
    assert wait_used(valkey, key, "fixed_window", 3600, 2) == 2
    time.sleep(0.2)
    assert used(valkey, key, "fixed_window", 3600) == 2


def test_cost_from_with_another_limit_all_or_nothing(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "fixed_window", 2, "1h"),
                             tokens("llm", "fixed_window", 100, "1h")])
    for _ in range(2):
        assert gw.get(reported(10)).status == 200
    r = gw.get(reported(10))
    assert r.status == 429 and r.json()["violated-policies"] == ["per_ip"]
    assert wait_used(valkey, "rl:v2:llm:{127.0.0.1}", "fixed_window", 3600, 20) == 20
