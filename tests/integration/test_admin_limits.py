"""Operations: the admin's /limits. GET /limits/NAME?PART=VALUE shows one client's counter (the
key the request path charges, what the next request would be told, nothing charged); DELETE
resets it; 400 / 404 / 405 for bad queries; [admin] token_env guards it with a bearer token;
503 within the Valkey deadline when Valkey is down or late; IPv6 clients per prefix; a Valkey
Cluster routes by the key's slot."""

import os
import subprocess
import time

import pytest

from conftest import (limit_cfg, limit_keys, parse_rl_list, route_cfg, sluice_bin,
                      sluice_with_limits, ratelimit_toml)
from rawhttp import RawClient, build_request
from test_valkey_cluster import Cluster

ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket", "sliding_log"]


def admin(gw, method, target, headers=()):
    """One request to the admin listener on a fresh connection: the Response."""
    with RawClient(gw.admin_port, timeout=5) as c:
        c.request(method, target, headers)
        return c.read_response(method)


def peek(gw, target, headers=()):
    r = admin(gw, "GET", target, headers)
    assert r.status == 200, (r.status, r.body)
    assert r.header("Content-Type") == "application/json"
    return r.json()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_get_shows_the_request_paths_counter_and_delete_resets_it(sluice_factory, upstream, valkey,
                                                                 algorithm):
    """After 3 requests of a client, GET shows remaining = 5 - 3 (what the last response's
    RateLimit header said), the key the request path wrote, and a reset in seconds; GETs
    charge nothing. DELETE (204) deletes the key: the quota is whole again, and a client that
    was refused is allowed at once."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("lim", algorithm, 5, "1h")])
    for _ in range(3):
        r = gw.get("/echo")
        assert r.status == 200
    header = parse_rl_list(r.header("RateLimit"))["lim"]
    keys = limit_keys(valkey.client, "rl:*")
    assert len(keys) == 1, keys

    got = peek(gw, "/limits/lim?ip=127.0.0.1")
    assert got == {"limit": "lim", "key": keys[0], "algorithm": algorithm, "quota": 5,
                   "remaining": 2, "reset": got["reset"]}
    assert got["remaining"] == header["r"]
    assert isinstance(got["reset"], int)
    if algorithm == "token_bucket":
        assert 2159 <= got["reset"] <= 2160  # 3 tokens of 720 s each to refill
    elif algorithm == "sliding_log":
        assert 3595 <= got["reset"] <= 3600  # until the first entry leaves the hour
    elif algorithm == "fixed_window":
        assert 1 <= got["reset"] <= 3600  # the end of the window
    else:
        assert 3600 < got["reset"] <= 7200  # the current window's counts weigh on the next
    assert got["reset"] <= header["t"] + 1
    for _ in range(3):  # GET charges nothing
        assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 2
    assert gw.get("/echo").status == 200  # (the 4th)
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 1

    r = admin(gw, "DELETE", "/limits/lim?ip=127.0.0.1")
    assert r.status == 204, r.body
    assert r.body == b"" and r.header("Content-Length") is None
    assert limit_keys(valkey.client, "rl:*") == []
    after = peek(gw, "/limits/lim?ip=127.0.0.1")
    assert after["remaining"] == 5 and after["key"] == keys[0]
    if algorithm != "fixed_window":  # (its reset is the end of the window, whatever the count)
        assert after["reset"] == 0, after

    statuses = [gw.get("/echo").status for _ in range(6)]
    assert statuses == [200] * 5 + [429], statuses
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 0
    assert admin(gw, "DELETE", "/limits/lim?ip=127.0.0.1").status == 204
    assert gw.get("/echo").status == 200
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 4


def test_two_parts_plans_and_bad_queries(sluice_factory, upstream, valkey):
    """A limit by api_key and header:X-User: the parts in any order, `header:X-User` escaped or
    not; a configured tenant's API key shows its plan's quota. A missing or unknown part is a
    400 that lists the expected names, an unknown limit a 404, another method a 405."""
    limits = [limit_cfg("two", "fixed_window", 10, "1h", by=["api_key", "header:X-User"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            plans=[{"name": "pro", "limits": {"two": 50}}],
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": ["key_abc"]}])
    for key, user, n in (("k1", "alice", 2), ("key_abc", "bob", 3)):
        for _ in range(n):
            assert gw.get("/echo", [("X-API-Key", key), ("X-User", user)]).status == 200

    keys = limit_keys(valkey.client, "rl:*")
    got = peek(gw, "/limits/two?api_key=k1&header%3AX-User=alice")
    assert got["key"] in keys and got["quota"] == 10 and got["remaining"] == 8
    assert peek(gw, "/limits/two?header:X-User=alice&api_key=k1") == got
    tenant = peek(gw, "/limits/two?api_key=key_abc&header:X-User=bob")
    assert tenant["key"] in keys and tenant["key"] != got["key"]
    assert tenant["quota"] == 50 and tenant["remaining"] == 47
    # A client that made no request: the whole quota, no key written.
    fresh = peek(gw, "/limits/two?api_key=k1&header:X-User=carol")
    assert fresh["remaining"] == 10 and fresh["key"] not in keys
    assert limit_keys(valkey.client, "rl:*") == keys

    r = admin(gw, "GET", "/limits/two?api_key=k1")
    assert r.status == 400
    assert r.json()["expected"] == ["api_key", "header:X-User"]
    assert "header:X-User" in r.json()["error"]
    r = admin(gw, "GET", "/limits/two?api_key=k1&header:X-User=alice&ip=127.0.0.1")
    assert r.status == 400 and r.json()["expected"] == ["api_key", "header:X-User"]
    r = admin(gw, "DELETE", "/limits/two?api_key=k1&header:x-user=alice")  # names are exact
    assert r.status == 400
    assert admin(gw, "GET", "/limits/two?api_key=k1&header:X-User=%zz").status == 400
    r = admin(gw, "GET", "/limits/nope?ip=127.0.0.1")
    assert r.status == 404 and "nope" in r.json()["error"]
    assert admin(gw, "GET", "/limits").status == 404
    assert admin(gw, "GET", "/limits/two/x?api_key=k1").status == 404
    r = admin(gw, "POST", "/limits/two?api_key=k1&header:X-User=alice")
    assert r.status == 405 and r.header("Allow") == "GET, HEAD, DELETE"
    r = admin(gw, "DELETE", "/metrics")
    assert r.status == 405 and r.header("Allow") == "GET, HEAD"
    assert limit_keys(valkey.client, "rl:*") == keys  # nothing of this changed a counter
    assert peek(gw, "/limits/two?api_key=k1&header:X-User=alice")["remaining"] == 8


def test_token_guards_limits_only(sluice_factory, upstream, valkey, monkeypatch):
    monkeypatch.setenv("SLUICE_TEST_ADMIN_TOKEN", "s3cret-t0ken")
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("lim", "fixed_window", 5, "1h")],
                            admin={"token_env": "SLUICE_TEST_ADMIN_TOKEN"})
    target = "/limits/lim?ip=127.0.0.1"
    for headers in ([], [("Authorization", "Bearer wrong")], [("Authorization", "s3cret-t0ken")],
                    [("Authorization", "Basic s3cret-t0ken")]):
        for method in ("GET", "DELETE"):
            r = admin(gw, method, target, headers)
            assert r.status == 401, (headers, r.status, r.body)
            assert r.header("WWW-Authenticate").startswith("Bearer")
    assert gw.get("/echo").status == 200
    good = [("Authorization", "Bearer s3cret-t0ken")]
    assert peek(gw, target, good)["remaining"] == 4
    assert admin(gw, "DELETE", target, good).status == 204
    assert peek(gw, target, good)["remaining"] == 5
    for path in ("/metrics", "/healthz", "/ready"):
        assert gw.admin_get(path)[0] == 200, path


def test_check_config_refuses_a_token_env_that_is_not_set(tmp_path):
    p = tmp_path / "sluice.toml"
    p.write_text('[admin]\nlisten = "127.0.0.1:9901"\ntoken_env = "SLUICE_TEST_NO_SUCH_TOKEN"\n')
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_TEST_NO_SUCH_TOKEN"}
    r = subprocess.run([str(sluice_bin()), "--check-config", "-c", str(p)], capture_output=True,
                       text=True, timeout=10, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"{p}:3:13: admin.token_env:" in r.stderr, r.stderr
    assert "SLUICE_TEST_NO_SUCH_TOKEN" in r.stderr
    r = subprocess.run([str(sluice_bin()), "--check-config", "-c", str(p)], capture_output=True,
                       text=True, timeout=10, env={**env, "SLUICE_TEST_NO_SUCH_TOKEN": "x"},
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)


def test_valkey_late_or_down_is_503_within_the_deadline(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("lim", "fixed_window", 5, "1h")],
                            valkey_options={"timeout": "200ms"})
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 5
    valkey.pause()  # late: the calls are sent and never answered
    try:
        for method in ("GET", "DELETE"):
            t0 = time.monotonic()
            r = admin(gw, method, "/limits/lim?ip=127.0.0.1")
            took = time.monotonic() - t0
            assert r.status == 503, (method, r.status, r.body)
            assert "error" in r.json()
            assert took < 1.5, f"{method} took {took:.2f}s with a 200 ms deadline"
    finally:
        valkey.resume()
    valkey.stop()  # down: refused at once, or failed by the deadline
    for method in ("GET", "DELETE"):
        t0 = time.monotonic()
        r = admin(gw, method, "/limits/lim?ip=127.0.0.1")
        assert r.status == 503 and "error" in r.json(), (method, r.status, r.body)
        assert time.monotonic() - t0 < 1.5
    assert gw.admin_get("/healthz")[0] == 200
    valkey.start()
    deadline = time.monotonic() + 10
    while admin(gw, "GET", "/limits/lim?ip=127.0.0.1").status != 200:
        assert time.monotonic() < deadline, "/limits did not recover after Valkey came back"
        time.sleep(0.1)


def test_a_client_that_leaves_before_the_answer_and_pipelined_requests(sluice_factory, upstream,
                                                                       valkey):
    """Requests that wait for Valkey: a client that closes meanwhile leaves nothing behind (the
    call is cancelled; the gateway goes on), and pipelined requests are answered in order."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("lim", "fixed_window", 5, "1h")],
                            valkey_options={"timeout": "1s"})
    valkey.pause()
    try:
        for _ in range(5):
            c = RawClient(gw.admin_port, timeout=5)
            c.request("GET", "/limits/lim?ip=127.0.0.1")
            c.close()
        time.sleep(0.2)
    finally:
        valkey.resume()
    time.sleep(1.2)  # past the calls' deadline
    assert gw.alive()
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 5

    assert gw.get("/echo").status == 200
    with RawClient(gw.admin_port, timeout=5) as c:
        c.send(build_request("GET", "/limits/lim?ip=127.0.0.1") +
               build_request("DELETE", "/limits/lim?ip=127.0.0.1") +
               build_request("GET", "/healthz") +
               build_request("GET", "/limits/lim?ip=127.0.0.1"))
        first = c.read_response()
        assert first.status == 200 and first.json()["remaining"] == 4
        assert c.read_response("DELETE").status == 204
        assert c.read_response().status == 200
        last = c.read_response()
        assert last.status == 200 and last.json()["remaining"] == 5


def test_ipv6_client_counted_per_prefix(sluice_factory, upstream, valkey):
    """A client at 2001:db8:1:2::7 behind a trusted proxy: GET with any address of its /64
    (escaped or not) shows its counter; IPv4-mapped addresses are IPv4 clients; a value that
    is not an address is a 400."""
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("lim", "sliding_window", 10, "1h")],
                            identity={"trusted_proxies": ["127.0.0.1/32"], "ipv6_prefix": 64})
    for ip, n in (("2001:db8:1:2::7", 3), ("203.0.113.9", 2)):
        for _ in range(n):
            assert gw.get("/echo", [("X-Forwarded-For", ip)]).status == 200
    keys = limit_keys(valkey.client, "rl:*")
    assert len(keys) == 2
    v6 = peek(gw, "/limits/lim?ip=2001:db8:1:2:ffff::1")
    assert v6["key"] in keys and v6["key"].endswith("{2001:db8:1:2::/64}")
    assert v6["remaining"] == 7
    assert peek(gw, "/limits/lim?ip=2001%3Adb8%3A1%3A2%3A%3A7") == v6
    other = peek(gw, "/limits/lim?ip=2001:db8:1:3::7")
    assert other["key"] not in keys and other["remaining"] == 10
    v4 = peek(gw, "/limits/lim?ip=::ffff:203.0.113.9")
    assert v4["key"] in keys and v4["remaining"] == 8
    for bad in ("2001:db8::1::2", "203.0.113", "localhost", "[2001:db8::1]"):
        r = admin(gw, "GET", f"/limits/lim?ip={bad}")
        assert r.status == 400 and r.json()["expected"] == ["ip"], (bad, r.status, r.body)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def test_cluster_get_and_delete_reach_the_node_of_the_keys_slot(sluice_factory, upstream,
                                                               cluster):
    """Three primaries, keys spread by their own parts: for clients whose keys live on
    different nodes, GET shows each counter and DELETE removes the key from its owner."""
    limits = [limit_cfg("lim", "fixed_window", 10, "1h")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["lim"])],
                        extra_toml=ratelimit_toml(
                            None, limits=limits,
                            identity={"trusted_proxies": ["127.0.0.1/32"]},
                            valkey_options={"nodes": [f"127.0.0.1:{cluster.ports[0]}"],
                                            "key_prefix": "rl:v2"}))
    deadline = time.monotonic() + 10
    while gw.admin_get("/ready")[0] != 200:
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.05)
    owners = {}
    for i in range(1, 40):
        ip = f"198.51.100.{i}"
        key = f"rl:v2:lim:{{{ip}}}"
        owner = cluster.owner(int(cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", key)))
        owners.setdefault(owner, (ip, key))
        if len(owners) == 3:
            break
    assert len(owners) == 3, owners
    for n, (owner, (ip, key)) in enumerate(owners.items(), start=1):
        for _ in range(n):
            assert gw.get("/echo", [("X-Forwarded-For", ip)]).status == 200
        assert cluster.cli(owner, "EXISTS", key) == "1"
        got = peek(gw, f"/limits/lim?ip={ip}")
        assert got["key"] == key and got["remaining"] == 10 - n
    for owner, (ip, key) in owners.items():
        assert admin(gw, "DELETE", f"/limits/lim?ip={ip}").status == 204
        assert cluster.cli(owner, "EXISTS", key) == "0"
        assert peek(gw, f"/limits/lim?ip={ip}")["remaining"] == 10


def test_reload_moves_limits_to_the_new_valkey_and_token(sluice_factory, upstream, valkey_factory,
                                                          monkeypatch):
    """SIGHUP with another [valkey] address: /limits reads the new server (the main loop's
    store follows the configuration); a token_env added by the reload applies at once (its
    variable is read when the file is loaded)."""
    from test_operations_reload import reload
    first, second = valkey_factory(), valkey_factory()
    monkeypatch.setenv("SLUICE_TEST_ADMIN_TOKEN", "t0k")  # in the gateway's environment
    gw = sluice_with_limits(sluice_factory, upstream, first,
                            [limit_cfg("lim", "fixed_window", 5, "1h")])
    for _ in range(2):
        assert gw.get("/echo").status == 200
    assert peek(gw, "/limits/lim?ip=127.0.0.1")["remaining"] == 3

    text = gw.config_path.read_text().replace(first.address, second.address)
    text = text.replace("[admin]\n", '[admin]\ntoken_env = "SLUICE_TEST_ADMIN_TOKEN"\n')
    assert second.address in text and "token_env" in text
    reload(gw, text)
    assert admin(gw, "GET", "/limits/lim?ip=127.0.0.1").status == 401
    good = [("Authorization", "Bearer t0k")]
    deadline = time.monotonic() + 5
    while True:  # the new store connects
        r = admin(gw, "GET", "/limits/lim?ip=127.0.0.1", good)
        if r.status == 200:
            break
        assert time.monotonic() < deadline, (r.status, r.body)
        time.sleep(0.05)
    assert r.json()["remaining"] == 5
    assert gw.get("/echo").status == 200
    assert peek(gw, "/limits/lim?ip=127.0.0.1", good)["remaining"] == 4
    assert limit_keys(second.client, "rl:*") == [r.json()["key"]]


def test_remaining_is_what_the_header_says_and_one_quota_for_both_paths(sluice_factory, upstream,
                                                                        valkey):
    """Issue 23, item 4. A token bucket whose burst (50) is above its limit (10): GET never
    shows `remaining` above `quota`, and shows what the RateLimit header said (before: 50 of
    10). A plan's quota, found through an API key's tenant or a tenant part, is the same on
    the request path (RateLimit-Policy) and in /limits: one function resolves it."""
    limits = [limit_cfg("tb", "token_bucket", 10, "1h", by=["api_key"], burst=50),
              limit_cfg("per_tenant", "fixed_window", 10, "1h", by=["tenant"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            plans=[{"name": "pro", "limits": {"tb": 20, "per_tenant": 30}}],
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": ["key_pro"]}])
    fresh = peek(gw, "/limits/tb?api_key=k1")
    assert fresh["quota"] == 10 and fresh["remaining"] == 10, fresh
    for _ in range(3):
        r = gw.get("/echo", [("X-API-Key", "k1")])
        assert r.status == 200
        header = parse_rl_list(r.header("RateLimit"))["tb"]
        assert header["r"] == 10, header  # 47 tokens and more left: never above q
        got = peek(gw, "/limits/tb?api_key=k1")
        assert got["quota"] == 10 and got["remaining"] == header["r"], got

    r = gw.get("/echo", [("X-API-Key", "key_pro")])
    assert r.status == 200
    policy = r.header("RateLimit-Policy").split(", ")
    assert '"tb";q=20;w=3600' in policy and '"per_tenant";q=30;w=3600' in policy, policy
    state = parse_rl_list(r.header("RateLimit"))
    tb = peek(gw, "/limits/tb?api_key=key_pro")
    assert tb["quota"] == 20 and tb["remaining"] == state["tb"]["r"] == 20, (tb, state)
    tenant = peek(gw, "/limits/per_tenant?tenant=acme")
    assert tenant["quota"] == 30 and tenant["remaining"] == state["per_tenant"]["r"] == 29
