"""Limits that cannot be side-stepped by spelling (issue 24): body fields read whatever the
media type says and in every form a framework reads, on_missing and fold per limit, repeated
cookies and headers refused, a tenant cache that random API keys cannot empty, a linear JSON
duplicate-key check, and identity values hashed in Valkey key names."""

import hashlib
import hmac
import json
import time

from conftest import (hashed_part, limit_cfg, limit_keys, metric_sum, route_cfg,
                      sluice_with_limits)

TRUSTED_LOOPBACK = {"trusted_proxies": ["127.0.0.1/32"]}


def post(gw, target, body, content_type=None, ip=None, extra=()):
    headers = [("Content-Type", content_type)] if content_type is not None else []
    headers += list(extra)
    if ip:
        headers.append(("X-Forwarded-For", ip))
    return gw.request("POST", target, headers, body)


def multipart(fields, boundary="sluice-b0undary"):
    body = b""
    for name, value in fields:
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                 .encode() + value.encode() + b"\r\n")
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# ------------------------------------------------------------------------------ body fields

FIELD_LIMITS = [
    limit_cfg("per_json_user", "fixed_window", 3, "1h", by=["json:email"], fold="lower",
              on_missing="deny"),
    limit_cfg("per_form_user", "fixed_window", 3, "1h", by=["form:username"], fold="lower",
              on_missing="deny"),
    limit_cfg("json_skip", "fixed_window", 1, "1h", by=["json:email"]),
    limit_cfg("json_shared", "fixed_window", 2, "1h", by=["json:email"], on_missing="shared"),
]
FIELD_ROUTES = [
    route_cfg("login_json", ["per_json_user"], match={"path": "/echo/login.json"}),
    route_cfg("login_form", ["per_form_user"], match={"path": "/echo/login"}),
    route_cfg("skip", ["json_skip"], match={"path": "/echo/skip"}),
    route_cfg("shared", ["json_shared"], match={"path": "/echo/shared"}),
    route_cfg("other", []),
]


def test_json_and_form_fields_cannot_be_sidestepped_by_spelling(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, FIELD_LIMITS, FIELD_ROUTES,
                            identity=TRUSTED_LOOPBACK)

    def j(email):
        return json.dumps({"email": email, "password": "guess"}).encode()

    # One account's budget, whatever the media type says and however the address is cased.
    got = [post(gw, "/echo/login.json", j("victim@example.com"), "application/json").status,
           post(gw, "/echo/login.json", j("Victim@Example.com"), "text/plain").status,
           post(gw, "/echo/login.json", j("VICTIM@EXAMPLE.COM"), None).status,
           post(gw, "/echo/login.json", j("victim@example.com"),
                "application/x-www-form-urlencoded").status]
    assert got == [200, 200, 200, 429], got
    # Arrays and other non-strings are refused, not passed uncounted.
    for value in (["victim@example.com"], {"v": 1}, 42, True, None):
        r = post(gw, "/echo/login.json", json.dumps({"email": value}).encode(), "application/json")
        assert r.status == 400, (value, r)
        assert "json:email must be a string" in r.json()["detail"]
    # Without the field (or with a body that is not JSON): refused under deny, naming the limit.
    for body in (b'{"user": "victim@example.com"}', b"email=victim@example.com", b""):
        r = post(gw, "/echo/login.json", body, "application/json")
        assert r.status == 400, (body, r)
        assert r.header("content-type").startswith("application/problem+json")
        assert "per_json_user" in r.json()["detail"] and "json:email" in r.json()["detail"]
    assert gw.get("/echo/login.json").status == 400, "a GET has no body field either"

    # form: urlencoded, multipart/form-data, and the query string: one budget.
    mp, mp_type = multipart([("username", "Alice"), ("password", "x")])
    got = [post(gw, "/echo/login", b"username=alice&password=x",
                "application/x-www-form-urlencoded").status,
           post(gw, "/echo/login", mp, mp_type).status,
           post(gw, "/echo/login?username=ALICE", b"password=x",
                "application/x-www-form-urlencoded").status,
           post(gw, "/echo/login", b"username=alice&password=x", "text/plain").status]
    assert got == [200, 200, 200, 429], got
    # The body's field and the query's must agree: a decoy in one, the target in the other.
    r = post(gw, "/echo/login?username=bob", b"username=decoy&password=x",
             "application/x-www-form-urlencoded")
    assert r.status == 400 and "form:username" in r.json()["detail"], r
    mp2, mp2_type = multipart([("username", "decoy"), ("username", "bob")])
    assert post(gw, "/echo/login", mp2, mp2_type).status == 400
    assert post(gw, "/echo/login", b"password=x", "application/x-www-form-urlencoded").status == 400
    assert post(gw, "/echo/login?username=bob", b"username=bob&password=x",
                "application/x-www-form-urlencoded").status == 200, "the same value twice is one"

    # The default (skip, the contract's): the limit does not apply, and each request is counted;
    # "shared": one budget for all without.
    assert [post(gw, "/echo/skip", b"{}", "application/json").status for _ in range(3)] == [200] * 3
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="json_skip",
                      outcome="skipped") == 3
    assert [post(gw, "/echo/shared", b"{}", "application/json", ip=f"203.0.113.{i}").status
            for i in range(1, 4)] == [200, 200, 429]
    assert post(gw, "/echo/shared", j("carol@example.com"), "application/json").status == 200
    assert gw.get("/echo/shared").status == 429, "no body: the same shared budget"


# ------------------------------------------------------------------------------ repeated parts

def test_duplicate_cookies_and_keyed_headers_are_refused(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_session", "fixed_window", 2, "1h", by=["session"]),
              limit_cfg("per_cart", "fixed_window", 2, "1h", by=["cookie:cart"]),
              limit_cfg("per_user", "fixed_window", 2, "1h", by=["header:X-User"])]
    routes = [route_cfg("s", ["per_session"], match={"path_prefix": "/echo/s"}),
              route_cfg("c", ["per_cart"], match={"path_prefix": "/echo/c"}),
              route_cfg("u", ["per_user"], match={"path_prefix": "/echo/u"}),
              route_cfg("other", [])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes)

    def get(target, headers):
        return gw.get(target, headers)

    # The decoy first (what this gateway used to key on), the real one last (what Django and
    # Python's http.cookies read): refused, in one field or in two.
    for headers in ([("Cookie", "session=decoy; session=real")],
                    [("Cookie", "session=decoy"), ("Cookie", "a=1; session=real")]):
        r = get("/echo/s", headers)
        assert r.status == 400, (headers, r)
        assert r.header("content-type").startswith("application/problem+json")
        assert "session" in r.json()["detail"]
    for headers in ([("Cookie", "cart=decoy; cart=real")],
                    [("Cookie", "cart=decoy"), ("Cookie", "cart=real")]):
        r = get("/echo/c", headers)
        assert r.status == 400 and "cookie:cart" in r.json()["detail"], (headers, r)
    r = get("/echo/u", [("X-User", "decoy"), ("X-User", "real")])
    assert r.status == 400 and "header:X-User" in r.json()["detail"], r
    assert upstream.request_count == 0, "nothing refused reached the upstream"
    # The same value twice is one value, counted once per request.
    same = [("Cookie", "session=real; session=real")]
    assert [get("/echo/s", same).status for _ in range(3)] == [200, 200, 429]
    assert [get("/echo/u", [("X-User", "bob"), ("X-User", "bob")]).status
            for _ in range(3)] == [200, 200, 429]
    # A cookie no limit of the route is keyed on is the application's business.
    assert get("/echo/other", [("Cookie", "session=decoy; session=real")]).status == 200


# ------------------------------------------------------------------------------ tenant cache

def hmget_calls(valkey):
    return valkey.client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)


def test_tenant_cache_random_api_keys_do_not_evict_real_tenants(sluice_factory, upstream, valkey):
    """A cache full of live entries used to be wiped whole: a client sending random API keys
    made every real tenant a Valkey lookup again (and, with a slow Valkey, a request without its
    plan). Now the least recently used entry goes: tenants in use stay cached."""
    limits = [limit_cfg("per_key", "fixed_window", 1000, "1h", by=["api_key"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            plans=[{"name": "pro", "limits": {"per_key": 5000}}],
                            identity={"tenant_cache_ttl": "1h", "tenant_cache_entries": 32})
    real = [f"real-{i}" for i in range(4)]
    for key in real:
        valkey.client.hset(f"sluice:apikey:{key}", mapping={"tenant": key, "plan": "pro"})
    before = hmget_calls(valkey)
    randoms = 0
    for round_ in range(40):
        for key in real:
            r = gw.get("/status/200", [("X-API-Key", key)])
            assert r.status == 200 and "q=5000" in r.header("ratelimit-policy"), r
        for _ in range(8):  # a quarter of the cache per round: a wipe every fourth round
            randoms += 1
            assert gw.get("/status/200", [("X-API-Key", f"rnd-{round_}-{randoms}")]).status == 200
    lookups = hmget_calls(valkey) - before
    assert lookups == len(real) + randoms, \
        f"{lookups} lookups: the real tenants were looked up again ({lookups - randoms} times)"


# ------------------------------------------------------------------------------ JSON keys

def test_json_duplicate_key_check_is_linear(sluice_factory, upstream, valkey):
    """The duplicate-key check of a JSON body compared every key with every earlier one of its
    object: 4,000 keys cost the loop 27 ms, 60,000 about 3 s, during which the worker answered
    nobody. Linear, 20 times the keys take 20 to 30 times as long (measured: 28x, and 23x on
    the sanitizer build: a larger body has more to move, and every request a fixed cost);
    quadratic, hundreds of times. What is checked is that growth, not a time, which depends on
    the build (several times slower under the sanitizers) and the machine. A duplicate is
    still found."""
    limits = [limit_cfg("per_user", "fixed_window", 100, "1h", by=["json:user"])]
    routes = [route_cfg("login", ["per_user"], match={"path": "/echo/login"},
                        max_buffered_body_bytes=2 * 1024 * 1024),
              route_cfg("other", [])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes)

    def body(last, keys=60000):
        return ("{" + "".join(f'"k{i}":{i},' for i in range(keys)) + last + "}").encode()

    def best_of_two(keys):
        data = body('"user":"alice"', keys)
        best = None
        for _ in range(2):
            start = time.monotonic()
            # (A 60 s read timeout, not 5: the sanitizer build under the parallel suite once
            # took longer than 5 s for the 60,000 keys; the growth is what is checked.)
            r = gw.request("POST", "/echo/login", [("Content-Type", "application/json")], data,
                           timeout=60)
            elapsed = time.monotonic() - start
            assert r.status == 200, r
            best = elapsed if best is None else min(best, elapsed)
        return best

    assert len(body('"user":"alice"')) > 800_000
    small, large = best_of_two(3000), best_of_two(60000)
    assert large < 100 * small, \
        f"3,000 keys took {small * 1e3:.0f} ms and 60,000 keys {large * 1e3:.0f} ms"
    r = gw.request("POST", "/echo/login", [("Content-Type", "application/json")],
                   body('"k0":"again","user":"alice"'), timeout=60)
    assert r.status == 400 and "json:user" in r.json()["detail"], r


# ------------------------------------------------------------------------------ key hashing

SECRET = "k3y-secr3t-for-tests"


def hmac_part(value: str) -> str:
    return "~" + hmac.new(SECRET.encode(), value.encode(), hashlib.sha256).hexdigest()[:32]


HASH_LIMITS = [limit_cfg("by_key", "fixed_window", 10, "1h", by=["api_key"]),
               limit_cfg("by_session", "fixed_window", 10, "1h", by=["session"]),
               limit_cfg("by_cookie", "fixed_window", 10, "1h", by=["cookie:cart"]),
               limit_cfg("by_header", "fixed_window", 10, "1h", by=["header:X-User", "method"]),
               limit_cfg("by_query", "fixed_window", 10, "1h", by=["query:u"]),
               limit_cfg("by_tenant", "fixed_window", 10, "1h", by=["tenant", "route"]),
               limit_cfg("by_ip", "fixed_window", 10, "1h", by=["ip"])]
HASH_BODY_LIMITS = [limit_cfg("by_form", "fixed_window", 10, "1h", by=["form:email"]),
                    limit_cfg("by_json", "fixed_window", 10, "1h", by=["json:email"])]


def hashing_gateway(sluice_factory, upstream, valkey, **kw):
    routes = [route_cfg("form", ["by_form"], match={"path": "/echo/form"}),
              route_cfg("json", ["by_json"], match={"path": "/echo/json"}),
              route_cfg("api", [l["name"] for l in HASH_LIMITS])]
    return sluice_with_limits(sluice_factory, upstream, valkey, HASH_LIMITS + HASH_BODY_LIMITS,
                              routes, tenants=[{"name": "acme", "api_keys": ["sk_live_Secret1"]}],
                              **kw)


def send_identities(gw):
    r = gw.get("/status/200?u=victim@example.com",
               [("X-API-Key", "sk_live_Secret1"), ("Cookie", "session=sess-Secret2; cart=cart-3"),
                ("X-User", "alice@example.com")])
    assert r.status == 200, r
    assert post(gw, "/echo/form", b"email=form@example.com",
                "application/x-www-form-urlencoded").status == 200
    r = post(gw, "/echo/json", b'{"email": "json@example.com"}', "application/json")
    assert r.status == 200, r


RAW = ["sk_live_Secret1", "sess-Secret2", "cart-3", "alice@example.com", "victim@example.com",
       "form@example.com", "json@example.com"]


def test_identity_values_are_hashed_in_valkey_key_names(sluice_factory, upstream, valkey,
                                                       monkeypatch):
    """API keys, sessions, cookies, headers, query and body fields never appear in Valkey key
    names (SCAN, MONITOR and SLOWLOG would hand them to anyone who can read Valkey): SHA-256 by
    default, HMAC-SHA256 with [valkey] key_secret_env. ip, route, method and tenant stay
    readable. /limits builds the same keys and echoes no raw value."""
    gw = hashing_gateway(sluice_factory, upstream, valkey)
    send_identities(gw)
    keys = limit_keys(valkey.client, "rl:*")
    assert all(k.startswith("rl:v2:") for k in keys), keys
    for raw in RAW:
        assert not [k for k in keys if raw in k], (raw, keys)
    h = hashed_part
    assert keys == sorted([
        f"rl:v2:by_key:{{{h('sk_live_Secret1')}}}", f"rl:v2:by_session:{{{h('sess-Secret2')}}}",
        f"rl:v2:by_cookie:{{{h('cart-3')}}}", f"rl:v2:by_header:{{{h('alice@example.com')}:GET}}",
        f"rl:v2:by_query:{{{h('victim@example.com')}}}", "rl:v2:by_tenant:{acme:api}",
        "rl:v2:by_ip:{127.0.0.1}", f"rl:v2:by_form:{{{h('form@example.com')}}}",
        f"rl:v2:by_json:{{{h('json@example.com')}}}"]), keys
    # /limits names the same key, without echoing the value it was given.
    status, body = gw.admin_get("/limits/by_key?api_key=sk_live_Secret1")
    assert status == 200, body
    assert json.loads(body)["key"] == f"rl:v2:by_key:{{{h('sk_live_Secret1')}}}"
    assert json.loads(body)["remaining"] == 9
    assert "sk_live" not in body
    gw.stop()

    # With a secret: HMAC-SHA256, so a dictionary of e-mail addresses finds nothing.
    valkey.client.flushall()
    monkeypatch.setenv("SLUICE_TEST_KEY_SECRET", SECRET)
    gw = hashing_gateway(sluice_factory, upstream, valkey,
                         valkey_options={"key_secret_env": "SLUICE_TEST_KEY_SECRET"})
    send_identities(gw)
    keys = limit_keys(valkey.client, "rl:*")
    assert f"rl:v2:by_key:{{{hmac_part('sk_live_Secret1')}}}" in keys, keys
    assert f"rl:v2:by_json:{{{hmac_part('json@example.com')}}}" in keys, keys
    assert f"rl:v2:by_header:{{{hmac_part('alice@example.com')}:GET}}" in keys, keys
    assert "rl:v2:by_ip:{127.0.0.1}" in keys and "rl:v2:by_tenant:{acme:api}" in keys
    assert not [k for k in keys if h("json@example.com") in k], "plain SHA-256 is not used"
    status, body = gw.admin_get("/limits/by_json?json:email=json@example.com")
    assert status == 200 and json.loads(body)["key"] == \
        f"rl:v2:by_json:{{{hmac_part('json@example.com')}}}", body
    assert json.loads(body)["remaining"] == 9 and "json@example.com" not in body
