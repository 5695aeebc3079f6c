"""Who the client is beyond its address: API keys, tenants and plans (TOML and Valkey), unknown
keys, form:/json: body fields (login limits per account), and keys that no value can bloat,
break or forge."""

import base64
import json
import time

import pytest

from conftest import (hashed_part, key_part, limit_cfg, limit_keys, parse_rl_list, route_cfg, used,
                      sluice_with_limits)
from rawhttp import RawClient, build_request, chunked

TRUSTED_LOOPBACK = {"trusted_proxies": ["127.0.0.1/32"]}


def quota(r, name):
    return parse_rl_list(r.header("ratelimit-policy")).get(name, {}).get("q")


def key_get(gw, key, n=1, target="/status/200"):
    return [gw.get(target, [("X-API-Key", key)]) for _ in range(n)]


# ------------------------------------------------------------------------------ API keys, tenants

def test_two_api_keys_have_separate_budgets(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_key", "fixed_window", 2, "1h", by=["api_key"])])
    assert [r.status for r in key_get(gw, "key-one", 3)] == [200, 200, 429]
    assert [r.status for r in key_get(gw, "key-two", 3)] == [200, 200, 429]
    parts = {key_part(k) for k in limit_keys(valkey.client, "rl:v2:per_key:*")}
    assert parts == {hashed_part("key-one"), hashed_part("key-two")}, "API keys are hashed"


PLAN_LIMITS = [limit_cfg("per_key", "fixed_window", 2, "1h", by=["api_key"]),
               limit_cfg("per_tenant", "fixed_window", 100, "1h", by=["tenant"]),
               limit_cfg("bucket", "token_bucket", 2, "1h", by=["api_key"])]
PLANS = [{"name": "pro", "limits": {"per_key": 5, "bucket": 4}}]


def test_tenant_on_a_plan_gets_the_plans_limit(sluice_factory, upstream, valkey):
    tenants = [{"name": "acme", "plan": "pro", "api_keys": ["acme-1", "acme-2"]},
               {"name": "small", "api_keys": ["small-1"]}]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, PLAN_LIMITS, plans=PLANS,
                            tenants=tenants)
    acme = key_get(gw, "acme-1", 6)
    assert [r.status for r in acme] == [200] * 4 + [429] * 2, \
        "pro: per_key 5, bucket 4 (an implicit burst follows the plan's limit)"
    assert quota(acme[0], "per_key") == 5 and quota(acme[0], "bucket") == 4
    assert quota(acme[0], "per_tenant") == 100
    small = key_get(gw, "small-1", 3)
    assert [r.status for r in small] == [200, 200, 429]
    assert quota(small[0], "per_key") == 2
    unknown = key_get(gw, "nobody", 1)[0]
    assert unknown.status == 200 and quota(unknown, "per_key") == 2
    assert "per_tenant" not in parse_rl_list(unknown.header("ratelimit-policy")), \
        "no tenant: the per-tenant limit does not apply"
    # Two keys of one tenant share the tenant's budget, not their per-key ones.
    assert key_get(gw, "acme-2", 1)[0].status == 200
    c = valkey.client
    assert limit_keys(c, "rl:v2:per_tenant:*") == ["rl:v2:per_tenant:{acme}",
                                                    "rl:v2:per_tenant:{small}"]
    assert used(valkey, "rl:v2:per_tenant:{acme}", "fixed_window", 3600) == 5


@pytest.mark.parametrize("api_key", [
    "vk-new-1",
    # A realistic long key (72 characters, all of them safe in a key)
    "sk_live_" + "0123456789abcdef" * 4,
], ids=["short_key", "long_key"])
def test_tenant_added_in_valkey_gets_its_plan_without_reload(sluice_factory, upstream, valkey,
                                                             api_key):
    limits = [limit_cfg("per_key", "fixed_window", 50, "1h", by=["api_key"]),
              limit_cfg("per_tenant", "fixed_window", 100, "1h", by=["tenant"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            plans=[{"name": "pro", "limits": {"per_key": 500}}],
                            identity={"tenant_cache_ttl": "1s"})
    first = key_get(gw, api_key)[0]
    assert first.status == 200 and quota(first, "per_key") == 50
    assert valkey.client.hset(f"sluice:apikey:{api_key}", mapping={"tenant": "newco", "plan": "pro"})
    # Seen 1.01-1.18 s after the HSET (tenant_cache_ttl 1 s, then the next request): 0.5 s of
    # margin for a loaded machine, still short of a cache that keeps an entry twice its TTL.
    deadline = time.monotonic() + 1.0 + 0.5
    while True:
        r = key_get(gw, api_key)[0]
        assert r.status == 200
        if quota(r, "per_key") == 500:
            break
        assert time.monotonic() < deadline, \
            f"HSET sluice:apikey:<key> tenant newco plan pro not seen after tenant_cache_ttl: {r}"
        time.sleep(0.1)
    assert quota(r, "per_tenant") == 100
    assert "rl:v2:per_tenant:{newco}" in limit_keys(valkey.client)


def test_tenant_key_prefix(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, PLAN_LIMITS, plans=PLANS,
                            identity={"tenant_key_prefix": "acct:keys"})
    valkey.client.hset("acct:keys:k-7", mapping={"tenant": "t7", "plan": "pro"})
    valkey.client.hset("sluice:apikey:k-8", mapping={"tenant": "t8", "plan": "pro"})
    assert quota(key_get(gw, "k-7")[0], "per_key") == 5
    assert quota(key_get(gw, "k-8")[0], "per_key") == 2, "the default prefix is not used"


def test_reject_unknown_api_keys(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, PLAN_LIMITS, plans=PLANS,
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": ["acme-1"]}],
                            identity={"reject_unknown_api_keys": True})
    valkey.client.hset("sluice:apikey:vk-2", mapping={"tenant": "vkco"})
    r = key_get(gw, "who-knows")[0]
    assert r.status == 401, r
    assert r.header("content-type").startswith("application/problem+json")
    assert key_get(gw, "acme-1")[0].status == 200
    ok = key_get(gw, "vk-2")[0]
    assert ok.status == 200 and quota(ok, "per_key") == 2, "a tenant from Valkey, no plan"
    assert gw.get("/status/200").status == 200, "no API key: not rejected"
    assert upstream.request_count == 3
    assert not [k for k in limit_keys(valkey.client, "rl:*") if "who-knows" in k]


# ------------------------------------------------------------------------------ body fields

LOGIN_ROUTES = [route_cfg("login_form", ["per_user", "per_ip"],
                          match={"path": "/echo/login", "methods": ["POST"]}),
                route_cfg("login_json", ["per_json_user", "per_ip"],
                          match={"path": "/echo/login.json", "methods": ["POST"]}),
                route_cfg("small", ["per_user"], match={"path": "/echo/small"},
                          max_buffered_body_bytes=1024),
                route_cfg("other", [])]
LOGIN_LIMITS = [limit_cfg("per_user", "sliding_log", 3, "1h", by=["form:username"]),
                limit_cfg("per_json_user", "sliding_log", 3, "1h", by=["json:user"]),
                limit_cfg("per_ip", "fixed_window", 100, "1h")]


def login_gateway(sluice_factory, upstream, valkey):
    return sluice_with_limits(sluice_factory, upstream, valkey, LOGIN_LIMITS, LOGIN_ROUTES,
                              identity=TRUSTED_LOOPBACK)


def post(gw, target, body, content_type, ip=None, extra=()):
    headers = [("Content-Type", content_type)] + list(extra)
    if ip:
        headers.append(("X-Forwarded-For", ip))
    return gw.request("POST", target, headers, body)


@pytest.mark.parametrize("kind", ["form", "json"])
def test_login_limit_per_account_across_addresses(sluice_factory, upstream, valkey, kind):
    gw = login_gateway(sluice_factory, upstream, valkey)
    if kind == "form":
        target, ctype, limit = "/echo/login", "application/x-www-form-urlencoded", "per_user"
        body = lambda user, i: f"username={user}&password=guess{i}".encode()  # noqa: E731
    else:
        target, ctype, limit = "/echo/login.json", "application/json", "per_json_user"
        body = lambda user, i: json.dumps({"user": user, "password": f"guess{i}"}).encode()  # noqa: E731
    got = [post(gw, target, body("alice", i), ctype, ip=f"203.0.113.{i + 1}").status
           for i in range(8)]
    assert got == [200] * 3 + [429] * 5, "many addresses, one account: one budget"
    assert post(gw, target, body("bob", 0), ctype, ip="203.0.113.1").status == 200
    c = valkey.client
    assert sorted(key_part(k) for k in limit_keys(c, f"rl:v2:{limit}:*")) == \
        sorted([hashed_part("alice"), hashed_part("bob")])
    # all or nothing: the refused attempts cost their addresses nothing
    assert len(limit_keys(c, "rl:v2:per_ip:*")) == 3
    assert used(valkey, "rl:v2:per_ip:{203.0.113.1}", "fixed_window", 3600) == 2


def test_bodies_read_for_keys_arrive_byte_for_byte(sluice_factory, upstream, valkey):
    gw = login_gateway(sluice_factory, upstream, valkey)
    form = "username=%C3%A9lise+m&password=p%26ss%3D%20w+rd&x=%00%FF&&=&empty=".encode()
    js = '{ "user" : "h\\u00e9l\\u00e8ne",\n  "password": "p\\"w",  "n": [1, 2.50, null] }\n'.encode()
    cases = [
        ("/echo/login", form, "application/x-www-form-urlencoded", False),
        ("/echo/login", form, "application/x-www-form-urlencoded; charset=utf-8", True),
        ("/echo/login.json", js, "application/json", False),
        ("/echo/login.json", js, "application/vnd.api+json", True),
    ]
    for target, body, ctype, use_chunked in cases:
        if use_chunked:
            with RawClient(gw.port) as cl:
                cl.send(build_request("POST", target, [("Content-Type", ctype),
                                                       ("Transfer-Encoding", "chunked")],
                                      chunked(body, [7, 3, 11])))
                r = cl.read_response()
        else:
            r = post(gw, target, body, ctype)
        assert r.status == 200, r
        echo = r.json()
        assert base64.b64decode(echo["body_b64"]) == body, (target, ctype, use_chunked)
        assert [v for n, v in echo["headers"] if n.lower() == "content-type"] == [ctype]
    users = {key_part(k) for k in limit_keys(valkey.client, "rl:v2:per_*user:*")}
    assert users == {hashed_part("élise m".encode()), hashed_part("hélène".encode())}, \
        "the decoded values, hashed in keys (UTF-8, a space)"


def test_body_larger_than_max_buffered_body_bytes_is_413(sluice_factory, upstream, valkey):
    gw = login_gateway(sluice_factory, upstream, valkey)
    ctype = "application/x-www-form-urlencoded"
    fits = b"username=u1&pad=" + b"a" * (1024 - 16)
    assert len(fits) == 1024
    assert post(gw, "/echo/small", fits, ctype).status == 200
    r = post(gw, "/echo/small", fits + b"a", ctype)
    assert r.status == 413, r
    with RawClient(gw.port) as cl:
        cl.send(build_request("POST", "/echo/small", [("Content-Type", ctype),
                                                      ("Transfer-Encoding", "chunked")],
                              chunked(fits + b"a" * 500, [600, 600])))
        assert cl.read_response().status == 413
    # default: 8 KiB
    big = b"username=u2&pad=" + b"a" * 9000
    assert post(gw, "/echo/login", big, ctype).status == 413
    assert post(gw, "/echo/login", big[:8192], ctype).status == 200
    # a route whose limits read no body takes any size
    assert post(gw, "/echo/other", big * 10, ctype).status == 200


# ------------------------------------------------------------------------------ key safety

SAFE_LIMITS = [limit_cfg("by_user", "fixed_window", 2, "1h", by=["header:X-User"]),
               limit_cfg("by_pair", "fixed_window", 2, "1h", by=["header:X-A", "header:X-B"]),
               limit_cfg("by_query", "fixed_window", 2, "1h", by=["query:u"]),
               limit_cfg("by_key", "fixed_window", 2, "1h", by=["api_key"])]
SAFE_ROUTES = [route_cfg("user", ["by_user"], match={"path_prefix": "/echo/user"}),
               route_cfg("pair", ["by_pair"], match={"path_prefix": "/echo/pair"}),
               route_cfg("query", ["by_query"], match={"path_prefix": "/echo/query"}),
               route_cfg("key", ["by_key"], match={"path_prefix": "/echo/key"})]


def test_key_values_cannot_collide_bloat_or_forge(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, SAFE_LIMITS, SAFE_ROUTES)
    c = valkey.client

    def three(target, headers):
        return [gw.get(target, headers).status for _ in range(3)]

    huge = "v" * 10240
    assert three("/echo/user", [("X-User", huge)]) == [200, 200, 429]
    assert three("/echo/key", [("X-API-Key", "k" * 10240)]) == [200, 200, 429]
    a, b = "x" * 64 + "A", "x" * 64 + "B"
    assert three("/echo/user", [("X-User", a)]) == [200, 200, 429]
    assert three("/echo/user", [("X-User", b)]) == [200, 200, 429], "values that differ after 64 bytes"
    exact64 = "y" * 64
    assert three("/echo/user", [("X-User", exact64)]) == [200, 200, 429]
    # ':' cannot forge the two-part key of another client: (x:y, z) vs (x, y:z)
    assert three("/echo/pair", [("X-A", "x:y"), ("X-B", "z")]) == [200, 200, 429]
    assert three("/echo/pair", [("X-A", "x"), ("X-B", "y:z")]) == [200, 200, 429]
    assert three("/echo/pair", [("X-A", "x"), ("X-B", "y"), ]) == [200, 200, 429]
    # separators, glob characters, spaces
    assert three("/echo/user", [("X-User", "a b*c?[d]")]) == [200, 200, 429]
    assert three("/echo/user", [("X-User", "a b*c?[e]")]) == [200, 200, 429]
    # binary (through %-decoding of the query)
    assert three("/echo/query?u=%00%FF%FE%0D%0A", []) == [200, 200, 429]
    assert three("/echo/query?u=%00%FF%FE%0D%0B", []) == [200, 200, 429]
    # the hashed form of a value, sent as a value, is not that value's key
    victim = "victim@example.com"
    assert three("/echo/user", [("X-User", victim)]) == [200, 200, 429]
    assert three("/echo/user", [("X-User", hashed_part(victim))]) == [200, 200, 429]
    assert three("/echo/user", [("X-User", "~" + "0" * 32)]) == [200, 200, 429]

    keys = limit_keys(c)
    assert len(keys) == 15, keys
    for k in keys:
        assert len(k.encode()) < 200, f"key of {len(k)} bytes"
        assert all(0x21 <= ord(ch) < 0x7f for ch in k), f"unsafe byte in key {k!r}"
        assert "*" not in k and "?" not in k and "[" not in k and " " not in k
        assert c.pttl(k) > 0
    user_parts = {key_part(k) for k in keys if k.startswith("rl:v2:by_user:")}
    assert hashed_part(huge) in user_parts
    assert hashed_part(exact64) in user_parts, "a header value is hashed, even a short safe one"
    assert hashed_part(victim) in user_parts
    assert hashed_part(a) in user_parts and hashed_part(b) in user_parts
    assert hashed_part(hashed_part(victim)) in user_parts
    pair_keys = {k for k in keys if k.startswith("rl:v2:by_pair:")}
    assert len(pair_keys) == 3, pair_keys
    query_parts = {key_part(k) for k in keys if k.startswith("rl:v2:by_query:")}
    assert query_parts == {hashed_part(b"\x00\xff\xfe\r\n"), hashed_part(b"\x00\xff\xfe\r\x0b")}


def test_api_key_with_unsafe_characters_is_a_tenants_key(sluice_factory, upstream, valkey):
    """A TOML tenant whose key is long or has characters a key part cannot hold raw still gets
    its plan: the tenant is looked up by the key itself, not by its encoding."""
    long_key = "Zm9vYmFyYmF6cXV4" * 6 + "=="
    gw = sluice_with_limits(sluice_factory, upstream, valkey, PLAN_LIMITS, plans=PLANS,
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": [long_key]}])
    r = key_get(gw, long_key)[0]
    assert r.status == 200 and quota(r, "per_key") == 5
    assert f"rl:v2:per_key:{{{hashed_part(long_key)}}}" in limit_keys(valkey.client,
                                                                       "rl:v2:per_key:*")


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log"])
def test_plan_raised_limit_on_a_shared_key(sluice_factory, upstream, valkey, algorithm):
    """A per-address limit that a plan raises: anonymous requests from one address use up the
    default limit; a tenant on the plan, from the same address, still has its higher limit.
    The counter is compared with each request's own limit: 3 of the tenant's 10, and a
    sliding_log (count_denied by default) also recorded the refused fourth."""
    limits = [limit_cfg("per_ip", algorithm, 3, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            plans=[{"name": "pro", "limits": {"per_ip": 10}}],
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": ["acme-1"]}])
    assert [gw.get("/status/200").status for _ in range(4)] == [200, 200, 200, 429]
    r = key_get(gw, "acme-1")[0]
    assert r.status == 200, f"the pro tenant was refused at the default limit: {r}"
    assert quota(r, "per_ip") == 10
    used = 4 if algorithm == "sliding_log" else 3
    assert parse_rl_list(r.header("ratelimit"))["per_ip"]["r"] == 10 - used - 1


def test_plan_raised_token_bucket_on_a_shared_key(sluice_factory, upstream, valkey):
    """A token bucket that a plan raises is shared in time (GCRA): each request uses cost /
    limit of the window under its own quota, and each quota admits while the bucket holds its
    own burst. Three anonymous requests (limit 3 an hour) use the whole hour, so the pro
    tenant (10 an hour) on the same address waits for one of its tokens (6 minutes); a fresh
    address gives it all 10."""
    limits = [limit_cfg("per_ip", "token_bucket", 3, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, identity=TRUSTED_LOOPBACK,
                            plans=[{"name": "pro", "limits": {"per_ip": 10}}],
                            tenants=[{"name": "acme", "plan": "pro", "api_keys": ["acme-1"]}])
    assert [gw.get("/status/200").status for _ in range(4)] == [200, 200, 200, 429]
    r = key_get(gw, "acme-1")[0]
    assert r.status == 429, r
    assert 355 <= int(r.header("retry-after")) <= 360, r.headers
    fresh = [("X-Forwarded-For", "203.0.113.9")]
    statuses = [gw.get("/status/200", [("X-API-Key", "acme-1")] + fresh).status
                for _ in range(11)]
    assert statuses == [200] * 10 + [429]


def test_session_cookie_header_and_method_parts(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_session", "fixed_window", 2, "1h", by=["session"]),
              limit_cfg("per_cart", "fixed_window", 2, "1h", by=["cookie:cart", "method"])]
    routes = [route_cfg("s", ["per_session"], match={"path_prefix": "/echo/s"}),
              route_cfg("c", ["per_cart"], match={"path_prefix": "/echo/c"})]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes,
                            identity={"session_cookie": "sid"})

    def three(target, cookie, method="GET"):
        h = [("Cookie", cookie)] if cookie else []
        return [gw.request(method, target, h).status for _ in range(3)]

    assert three("/echo/s", "a=1; sid=S1; b=2") == [200, 200, 429]
    assert three("/echo/s", 'sid="S2"') == [200, 200, 429], "a quoted cookie value"
    assert three("/echo/s", "session=S1") == [200] * 3, "not the session cookie: does not apply"
    assert three("/echo/s", None) == [200] * 3
    assert three("/echo/c", "cart=C1") == [200, 200, 429]
    assert three("/echo/c", "cart=C1", "POST") == [200, 200, 429], "method is part of the key"
    keys = limit_keys(valkey.client)
    c1 = hashed_part("C1")
    assert keys == sorted([f"rl:v2:per_cart:{{{c1}:GET}}", f"rl:v2:per_cart:{{{c1}:POST}}",
                           f"rl:v2:per_session:{{{hashed_part('S1')}}}",
                           f"rl:v2:per_session:{{{hashed_part('S2')}}}"])
