"""What clients see of rate limits (429 problem+json, RateLimit / RateLimit-Policy syntax, legacy
X-RateLimit-*, none), which limits apply (absent key parts, shadow), and what Valkey sees (one
FCALL per request at most, concurrent requests sharing one, keys under key_prefix)."""

import re
import signal
import socket
import time

import pytest

from conftest import (ValkeyMonitor, hashed_part, limit_cfg, limit_keys, metric_sum, parse_rl_list,
                      sluice_with_limits, used)
from harness.valkey import DECIDE_VERB, decide_args, decide_calls

POLICY_RE = re.compile(r'^"[A-Za-z0-9_.-]+";q=\d+;w=\d+(, "[A-Za-z0-9_.-]+";q=\d+;w=\d+)*$')
STATE_RE = re.compile(r'^"[A-Za-z0-9_.-]+";r=\d+;t=\d+(, "[A-Za-z0-9_.-]+";r=\d+;t=\d+)*$')


def get(gw, headers=()):
    return gw.get("/status/200", headers)


# ------------------------------------------------------------------------------ the 429

def test_429_problem_json_names_exactly_the_refusing_limits(sluice_factory, upstream, valkey):
    limits = [limit_cfg("ip_a", "fixed_window", 2, "1h"),
              limit_cfg("ip_b", "sliding_window", 2, "1h"),
              limit_cfg("ip_big", "token_bucket", 100, "1h"),
              limit_cfg("key_small", "fixed_window", 3, "1h", by=["api_key"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    assert [get(gw).status for _ in range(2)] == [200, 200]
    r = get(gw)
    assert r.status == 429
    assert r.header("content-type").split(";")[0].strip() == "application/problem+json"
    body = r.json()
    assert body["type"].endswith("quota-exceeded"), body
    assert body["status"] == 429
    assert sorted(body["violated-policies"]) == ["ip_a", "ip_b"], body
    assert len(body["violated-policies"]) == 2
    state = parse_rl_list(r.header("ratelimit"))
    assert state["ip_a"]["r"] == 0 and state["ip_b"]["r"] == 0
    assert state["ip_big"]["r"] == 98, "the limit that allowed shows its (uncharged) budget"
    assert "key_small" not in state, "no API key: that limit does not apply"
    ra = int(r.header("retry-after"))
    assert ra >= max(state["ip_a"]["t"], state["ip_b"]["t"]) and ra >= 1
    assert str(ra) in body.get("detail", str(ra))


def test_429_names_only_the_limit_that_refused(sluice_factory, upstream, valkey):
    limits = [limit_cfg("small", "sliding_log", 2, "1h"),
              limit_cfg("large", "sliding_log", 10, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    for _ in range(2):
        assert get(gw).status == 200
    for _ in range(3):  # sliding_log counts denied requests: decided in Valkey every time
        r = get(gw)
        assert r.status == 429
        assert r.json()["violated-policies"] == ["small"]
        assert parse_rl_list(r.header("ratelimit"))["large"]["r"] == 8


# ------------------------------------------------------------------------------ header syntax

def test_ratelimit_header_syntax_on_allowed_and_refused(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_ip", "fixed_window", 3, "1m"),
              limit_cfg("per_ip_fast", "token_bucket", 50, "1500ms"),
              limit_cfg("per_day", "sliding_window", 1000, "1d")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    for i in range(4):
        r = get(gw)
        policy, state = r.header("ratelimit-policy"), r.header("ratelimit")
        assert len(r.header_values("ratelimit-policy")) == 1 and len(r.header_values("ratelimit")) == 1
        assert POLICY_RE.match(policy), policy
        assert STATE_RE.match(state), state
        if i < 3:
            assert r.status == 200
            assert policy == '"per_ip";q=3;w=60, "per_ip_fast";q=50;w=2, "per_day";q=1000;w=86400'
            s = parse_rl_list(state)
            assert s["per_ip"]["r"] == 2 - i and 0 < s["per_ip"]["t"] <= 60
            assert s["per_day"]["r"] == 999 - i
        else:
            assert r.status == 429
            assert policy.startswith('"per_ip";q=3;w=60')
            assert parse_rl_list(state)["per_ip"]["r"] == 0


@pytest.mark.parametrize("mode", ["legacy", "both", "none"])
def test_rate_limit_headers_modes(sluice_factory, upstream, valkey, mode):
    limits = [limit_cfg("lim", "fixed_window", 2, "1h"),
              limit_cfg("wide", "fixed_window", 100, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            server={"rate_limit_headers": mode})
    responses = [get(gw) for _ in range(3)]
    assert [r.status for r in responses] == [200, 200, 429]
    for i, r in enumerate(responses):
        ietf = r.has("ratelimit") or r.has("ratelimit-policy")
        legacy = [r.header("x-ratelimit-limit"), r.header("x-ratelimit-remaining"),
                  r.header("x-ratelimit-reset")]
        assert ietf == (mode == "both"), r
        if mode == "none":
            assert legacy == [None, None, None], r
            continue
        assert all(v is not None and v.isdigit() for v in legacy), r
        # the tightest limit: "lim"
        assert legacy[0] == "2" and legacy[1] == str(max(0, 1 - i)), r
        if r.status == 429:
            assert int(r.header("retry-after")) >= int(legacy[2]) >= 1
        if mode == "both":
            assert parse_rl_list(r.header("ratelimit"))["lim"]["r"] == max(0, 1 - i)
    assert responses[2].header("retry-after").isdigit(), "Retry-After whatever the mode"
    assert responses[2].json()["violated-policies"] == ["lim"]


def test_allowed_responses_carry_the_headers_of_the_limits_that_applied(sluice_factory, upstream,
                                                                         valkey):
    limits = [limit_cfg("per_ip", "sliding_window", 10, "1h"),
              limit_cfg("per_key", "token_bucket", 5, "1h", by=["api_key"]),
              limit_cfg("per_team", "fixed_window", 7, "1h", by=["header:X-Team"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    r = get(gw)
    assert r.status == 200
    assert list(parse_rl_list(r.header("ratelimit-policy"))) == ["per_ip"]
    r = get(gw, [("X-API-Key", "k1")])
    assert list(parse_rl_list(r.header("ratelimit-policy"))) == ["per_ip", "per_key"]
    assert parse_rl_list(r.header("ratelimit"))["per_key"]["r"] == 4
    r = get(gw, [("X-API-Key", "k1"), ("X-Team", "blue")])
    assert list(parse_rl_list(r.header("ratelimit"))) == ["per_ip", "per_key", "per_team"]
    assert parse_rl_list(r.header("ratelimit")) ["per_team"]["r"] == 6
    assert parse_rl_list(r.header("ratelimit"))["per_ip"]["r"] == 7


# ------------------------------------------------------------------------------ which limits apply

def test_limit_with_absent_key_part_does_not_apply(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_key", "fixed_window", 1, "1h", by=["api_key"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    c = valkey.client
    before = decide_calls(c)
    for _ in range(5):
        r = get(gw)
        assert r.status == 200 and not r.has("ratelimit") and not r.has("ratelimit-policy"), r
        r = get(gw, [("X-API-Key", "")])
        assert r.status == 200 and not r.has("ratelimit"), "an empty API key is no API key"
    assert limit_keys(c) == []
    assert decide_calls(c) == before, \
        "a limit that does not apply costs no round trip"
    assert [get(gw, [("X-API-Key", "k")]).status for _ in range(2)] == [200, 429]


@pytest.mark.parametrize("count_denied", [False, True])
def test_shadow_limit_never_refuses_but_counts(sluice_factory, upstream, valkey, count_denied):
    limits = [limit_cfg("shadowed", "fixed_window", 3, "1h", shadow=True, count_denied=count_denied),
              limit_cfg("enforced", "fixed_window", 100, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    responses = [get(gw) for _ in range(8)]
    assert [r.status for r in responses] == [200] * 8, "shadow = true never refuses"
    for r in responses:
        state = parse_rl_list(r.header("ratelimit"))
        assert list(state) == ["enforced"], "a shadow limit is not shown to clients"
    (key,) = limit_keys(valkey.client, "rl:v2:shadowed:*")
    assert used(valkey, key, "fixed_window", 3600) == (8 if count_denied else 3), \
        "decided and counted in Valkey"
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="shadowed",
                      outcome="shadow_denied") == 5
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="shadowed",
                      outcome="allowed") == 3
    assert upstream.request_count == 8


# ------------------------------------------------------------------------------ what Valkey sees

def test_one_fcall_per_request_one_at_a_time(sluice_factory, upstream, valkey):
    limits = [limit_cfg("a", "fixed_window", 100, "1h"),
              limit_cfg("b", "sliding_log", 100, "1h"),
              limit_cfg("c", "sliding_window", 100, "1h", by=["ip", "method"]),
              limit_cfg("d", "token_bucket", 100, "1h", by=["route"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, workers=2)
    c = valkey.client
    n = 25
    before = decide_calls(c)
    with ValkeyMonitor(valkey) as mon:
        for _ in range(n):
            assert get(gw).status == 200
    after = decide_calls(c)
    assert after - before == n, f"{after - before} {DECIDE_VERB} for {n} requests"
    sent = [cmd[0].upper() for cmd in mon.commands()]
    assert sent == [DECIDE_VERB] * n, f"commands the gateway sent for {n} requests: {sent}"
    # Every limit of a request in the one script call: 4 keys each.
    assert all(decide_args(cmd)[0] == "4" for cmd in mon.commands()), mon.commands()[:2]


@pytest.mark.parametrize("n,calls", [(20, [20]), (70, [64, 6])], ids=["20", "70"])
@pytest.mark.parametrize("alike", [True, False], ids=["one_client", "one_key_each"])
def test_requests_of_one_round_of_events_share_one_fcall(sluice_factory, upstream, valkey,
                                                           n, calls, alike):
    """Requests that reach the worker together (sent while the gateway is stopped with SIGSTOP,
    then it continues: one epoll round reads them all) are decided in one FCALL, 64 requests
    at most per call; each is still decided on its own and exactly (limit 15: 15 pass, the
    others get 429, each with its own RateLimit remaining). Requests on keys of their own carry
    a key each; one client's requests carry their key once per call, then name it
    ("1:1@1")."""
    by = ["ip"] if alike else ["header:X-Id"]
    limit = limit_cfg("a", "fixed_window", 15, "1h", by=by)
    if not alike:
        limit["limit"] = 1000
        limit_b = limit_cfg("b", "fixed_window", 15, "1h")  # the one that refuses
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit] if alike else [limit, limit_b], workers=1)
    c = valkey.client
    before = decide_calls(c)
    socks = []
    with ValkeyMonitor(valkey) as mon:
        gw.pause()
        try:
            for i in range(n):  # the kernel completes the handshakes and buffers the requests
                request = (f"GET /status/200 HTTP/1.1\r\nHost: t\r\nX-Id: c{i}\r\n"
                           "Connection: close\r\n\r\n").encode()
                s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
                s.sendall(request)
                socks.append(s)
        finally:
            gw.send_signal(signal.SIGCONT)
        answers = []
        for s in socks:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            answers.append(data)
    statuses = sorted(int(a.split(b" ", 2)[1]) for a in answers)
    assert statuses == [200] * 15 + [429] * (n - 15)
    name = b"a" if alike else b"b"
    remaining = sorted(int(re.search(rb'[ ,]"' + name + rb'";r=(\d+)', a).group(1)) for a in answers)
    assert remaining == [0] * (n - 14) + list(range(1, 15)), "each request saw the ones before it"
    after = decide_calls(c)
    sent = mon.commands()
    assert [cmd[0].upper() for cmd in sent] == [DECIDE_VERB] * len(calls) and \
        after - before == len(calls), sent
    if alike:
        assert [int(decide_args(cmd)[0]) for cmd in sent] == [1] * len(calls), \
            "the key once per call"
        assert [decide_args(cmd)[2:] for cmd in sent] == [["1", "fixed_window", "15", "3600000", "15", "0",
                                              "0", "15", "1:1"] + ["1:1@1"] * (k - 1)
                                             for k in calls], [cmd[-1] for cmd in sent]
    else:
        # 1 key of b (every request from 127.0.0.1), then one of a per request
        assert [int(decide_args(cmd)[0]) for cmd in sent] == [1 + k for k in calls], "a's key per request"
    if not alike:  # a request refused by b cost a nothing
        assert sorted(used(valkey, k, "fixed_window", 3600) for k in limit_keys(c, "*:a:*")) == \
            [1] * 15



def test_clients_that_leave_before_their_decision(sluice_factory, upstream, valkey):
    """Requests of one client queued in one call while Valkey is paused; most of the clients
    leave before the reply. Their decisions were sent, so the script still counts them; the
    reply reaches only the requests still there, each with its own remaining, and the gateway
    goes on."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("a", "fixed_window", 100, "1h")], workers=1,
                            valkey_options={"timeout": "3s"})
    request = b"GET /status/200 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    with ValkeyMonitor(valkey) as mon:
        valkey.pause()
        try:
            socks = []
            gw.pause()  # so that one round of events reads all six
            try:
                for _ in range(6):
                    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
                    s.sendall(request)
                    socks.append(s)
            finally:
                gw.send_signal(signal.SIGCONT)
            time.sleep(0.3)  # read, and the call written to the paused server
            for s in socks[:4]:
                s.close()
            time.sleep(0.2)
        finally:
            valkey.resume()
        answers = []
        for s in socks[4:]:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            answers.append(data)
    # Usually one call of six requests on one key (a connection handed to a later round of
    # events goes in a call of its own).
    parts = [p for cmd in mon.commands()
             for p in decide_args(cmd)[1 + int(decide_args(cmd)[0]) + 1 + 7:]]
    assert len(parts) == 6 and all(p.startswith("1:1") for p in parts), parts
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200"], answers
    remaining = sorted(int(re.search(rb'\r\nRateLimit: "a";r=(\d+)', a).group(1)) for a in answers)
    assert len(set(remaining)) == 2 and all(94 <= r <= 99 for r in remaining), remaining
    r = gw.get("/status/200")
    assert r.status == 200
    assert parse_rl_list(r.header("ratelimit"))["a"]["r"] == 93, "the 6 queued ones counted"


def test_keys_start_with_key_prefix_and_scan_finds_them(sluice_factory, upstream, valkey):
    limits = [limit_cfg("one", "fixed_window", 10, "1h"),
              limit_cfg("two", "sliding_log", 10, "1h", by=["ip", "api_key"]),
              limit_cfg("three", "sliding_window", 10, "1h", by=["header:X-Team", "method"]),
              limit_cfg("four", "token_bucket", 10, "1h", by=["route", "query:user"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            valkey_options={"key_prefix": "rl:test"})
    assert gw.get("/status/200?user=ann", [("X-API-Key", "k9"), ("X-Team", "red")]).status == 200
    c = valkey.client
    every = limit_keys(c)
    assert sorted(limit_keys(c, "rl:*")) == every and len(every) == 4
    assert [k for k in every if not k.startswith("rl:test:")] == []
    assert {k.split(":")[2] for k in every} == {"one", "two", "three", "four"}
    h = hashed_part
    assert sorted(every) == sorted([f"rl:test:four:{{api:{h('ann')}}}", "rl:test:one:{127.0.0.1}",
                                    f"rl:test:three:{{{h('red')}:GET}}",
                                    f"rl:test:two:{{127.0.0.1:{h('k9')}}}"]), \
        "key_prefix:limit:{parts}: the parts are the key's hash tag (identity values hashed)"
    for k in every:
        assert c.pttl(k) > 0, f"{k} without TTL"
