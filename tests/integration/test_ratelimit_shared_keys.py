"""Quotas that share a key (a plan that raises a per-address limit: one address with and without
the plan's API key) and what the deny cache answers, through the gateway on a real redis-server.
Each quota admits at most its own, whether the requests are decided in one call of the script
or in separate ones; a cached refusal announces the longest wait of the limits that refuse."""

import random
import socket

import pytest

from conftest import (ValkeyMonitor, limit_cfg, limit_keys, parse_rl_list, route_cfg,
                      sluice_with_limits, stored)
from harness.valkey import decide_calls
from rawhttp import build_request

PRO_KEY = "acme-1"
TENANTS = [{"name": "acme", "plan": "pro", "api_keys": [PRO_KEY]}]


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else -1


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def in_one_round(gw, raws: list) -> list:
    """Sends every request on its own connection while the gateway is stopped, so that each
    worker reads them in one round of events and decides them in one call; their statuses."""
    socks = []
    gw.pause()
    try:
        for raw in raws:
            s = socket.create_connection(("127.0.0.1", gw.port), timeout=15)
            s.sendall(raw)
            socks.append(s)
    finally:
        gw.resume()
    return [status_of(read_all(s)) for s in socks]


def one_by_one(gw, raws: list) -> list:
    """Each request after the answer to the one before: a call of its own."""
    out = []
    for raw in raws:
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=15)
        s.sendall(raw)
        out.append(status_of(read_all(s)))
    return out


SEND = {"one_call": in_one_round, "separate_calls": one_by_one}


def pro_and_free_rounds(gw, send, rounds: int = 5, pro: int = 40, seed: int = 0) -> tuple:
    """`rounds` times: `pro` requests with the plan's API key and one without, from one address,
    the one without at a random place. Returns (pro passed, free passed); every answer is 200
    or 429."""
    rng = random.Random(seed)
    pro_raw = build_request("GET", "/status/200", [("X-API-Key", PRO_KEY), ("Connection", "close")])
    free_raw = build_request("GET", "/status/200", [("Connection", "close")])
    passed = {"pro": 0, "free": 0}
    for _ in range(rounds):
        kinds = ["pro"] * pro
        kinds.insert(rng.randrange(pro + 1), "free")
        statuses = send(gw, [pro_raw if k == "pro" else free_raw for k in kinds])
        assert set(statuses) <= {200, 429}, statuses
        for kind, status in zip(kinds, statuses):
            passed[kind] += status == 200
    return passed["pro"], passed["free"]


@pytest.mark.parametrize("mode", list(SEND))
def test_token_bucket_plan_on_a_shared_key(sluice_factory, upstream, valkey, mode):
    """per_ip 5 an hour, plan pro 50 (bursts follow the limits). The bucket is shared in time:
    a pro request uses 72 s of the hour, one without the key 720 s, and each quota admits
    while the bucket holds its own burst. The first round fills it exactly (40 x 72 + 720 =
    3600 s), whatever the order; nothing refills in the seconds the rest take."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "token_bucket", 5, "1h")], workers=2,
                            plans=[{"name": "pro", "limits": {"per_ip": 50}}], tenants=TENANTS)
    pro, free = pro_and_free_rounds(gw, SEND[mode])
    assert (pro, free) == (40, 1), f"pro {pro} of at most 50, free {free} of at most 5"
    (key,) = limit_keys(valkey.client, "rl:v2:per_ip:*")
    assert valkey.client.type(key) == "string"
    assert 3590_000 <= valkey.client.pttl(key) <= 3900_000, \
        "empty: full again in an hour (and a spread of up to 5 minutes)"


@pytest.mark.parametrize("mode", list(SEND))
def test_sliding_log_plan_on_a_shared_key(sluice_factory, upstream, valkey, mode):
    """per_ip 5 a minute with count_denied (the default), plan pro 60. The log counts every
    request from the address; the pro quota admits while it holds fewer than 60, the free one
    while it holds fewer than 5. A refused request without the key is recorded, and the log
    keeps its newest 60 entries (the largest quota on the key; and the cost of the last refused
    request, which a take-back would remove), never the refused request's own 5: the pro
    tenant gets nothing more in the minute."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "sliding_log", 5, "1m")], workers=2,
                            plans=[{"name": "pro", "limits": {"per_ip": 60}}], tenants=TENANTS)
    pro, free = pro_and_free_rounds(gw, SEND[mode], seed=1)
    # Each of the 5 requests without the key takes at most one of the 60 entries.
    assert 55 <= pro and pro + free <= 60 and free <= 5, f"pro {pro}, free {free}"
    (key,) = limit_keys(valkey.client, "rl:v2:per_ip:*")
    assert len(stored(valkey, key, "sliding_log")) == 61, \
        "refused attempts recorded, the newest 60 kept (+ the last refused one's cost)"
    r = gw.get("/status/200", [("X-API-Key", PRO_KEY)])
    assert r.status == 429 and int(r.header("retry-after")) >= 50, r.headers


def fcall_calls(valkey) -> int:
    return decide_calls(valkey.client)


@pytest.mark.parametrize("count_denied", [False, True])
def test_cached_refusal_announces_the_longest_wait(sluice_factory, upstream, valkey, count_denied):
    """fixed_window 2 a minute and sliding_log 2 in 15 minutes on one route, both refusing:
    Valkey says 900 s. The next refusals say so too: from the deny cache, which holds both
    (the longest of their waits), or, while the log counts denied requests, from Valkey, which
    records each attempt (such a limit is never answered by the cache)."""
    limits = [limit_cfg("minute", "fixed_window", 2, "1m"),
              limit_cfg("quarter", "sliding_log", 2, "15m", count_denied=count_denied)]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    assert [gw.get("/status/200").status for _ in range(2)] == [200, 200]
    first = gw.get("/status/200")
    assert first.status == 429
    assert 895 <= int(first.header("retry-after")) <= 900, first.headers
    assert sorted(first.json()["violated-policies"]) == ["minute", "quarter"]
    calls = fcall_calls(valkey)
    for _ in range(5):
        r = gw.get("/status/200")
        assert r.status == 429
        assert 890 <= int(r.header("retry-after")) <= 900, r.headers
        state = parse_rl_list(r.header("ratelimit"))
        assert state["quarter"]["r"] == 0 and state["quarter"]["t"] <= int(r.header("retry-after"))
    asked = fcall_calls(valkey) - calls
    if count_denied:
        assert asked == 5, "each refusal reaches Valkey, which records it"
        (log,) = limit_keys(valkey.client, "rl:v2:quarter:*")
        assert len(stored(valkey, log, "sliding_log")) == 3, \
            "recorded, and the newest 2 kept (+ the last refused one's cost)"
    else:
        assert asked == 0, "answered from the deny cache"


def test_a_route_with_only_the_short_limit_is_not_refused_longer(sluice_factory, upstream, valkey):
    """The cache keeps each limit's own wait: a route with only the minute limit, on the same
    key, is refused until that minute's end, not for the other route's 15 minutes."""
    limits = [limit_cfg("minute", "fixed_window", 2, "1m"),
              limit_cfg("quarter", "sliding_log", 2, "15m", count_denied=False)]
    routes = [route_cfg("short", ["minute"], match={"path_prefix": "/status/204"}),
              route_cfg("both", ["minute", "quarter"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes)
    assert [gw.get("/status/200").status for _ in range(3)] == [200, 200, 429]
    with ValkeyMonitor(valkey) as mon:
        r = gw.get("/status/204")
    assert r.status == 429 and int(r.header("retry-after")) <= 60, r.headers
    assert mon.commands() == [], "answered from the cache"
    assert list(parse_rl_list(r.header("ratelimit"))) == ["minute"]


def test_token_bucket_remaining_never_above_its_quota(sluice_factory, upstream, valkey):
    """A bucket whose burst is above its limit: RateLimit-Policy announces q = limit per window
    (the refill), so the remaining r that RateLimit reports is never above it."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("b", "token_bucket", 5, "1m", burst=10)])
    for expected in (5, 5, 5, 5, 5, 4, 3, 2, 1, 0):
        r = gw.get("/status/200")
        assert r.status == 200
        assert parse_rl_list(r.header("ratelimit-policy"))["b"]["q"] == 5
        assert parse_rl_list(r.header("ratelimit"))["b"]["r"] == expected, r.headers
    assert gw.get("/status/200").status == 429
