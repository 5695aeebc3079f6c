"""Routes by path prefix, exact path, method and host; first match wins; no match -> 404."""

import json

import pytest

from conftest import limit_cfg, route_cfg, sluice_with_limits
from rawhttp import RawClient


@pytest.fixture
def routed(sluice_factory, upstream_factory):
    a, b, c, d = (upstream_factory(n) for n in ("A", "B", "C", "D"))
    gw = sluice_factory(
        upstreams=[{"name": n, "endpoints": [u]} for n, u in zip("abcd", (a, b, c, d))],
        routes=[
            {"name": "exact", "match": {"path": "/exact"}, "upstream": "a"},
            {"name": "api_post", "match": {"path_prefix": "/api/", "methods": ["POST", "PUT"]},
             "upstream": "b"},
            {"name": "api_host", "match": {"path_prefix": "/api/", "host": "api.example.com"},
             "upstream": "c"},
            {"name": "api", "match": {"path_prefix": "/api/"}, "upstream": "a"},
            {"name": "static", "match": {"path_prefix": "/static/", "methods": ["GET", "HEAD"]},
             "upstream": "d"},
            {"name": "host_only", "match": {"host": "only.example.com"}, "upstream": "d"},
        ])
    return gw, {"A": a, "B": b, "C": c, "D": d}


def route(gw, method, path, host="sluice.test"):
    """Which upstream served method path (None: the gateway answered 404 itself). The test
    upstreams answer these paths with their own 404, told apart by X-Upstream."""
    r = gw.request(method, path, host=host)
    up = r.header("x-upstream")
    if up is None:
        assert r.status == 404, r
        assert r.header("content-type").startswith("application/problem+json"), r
    else:
        assert r.status == 404 and (method == "HEAD" or r.body == b"upstream: no such endpoint\n"), r
    return up


def test_exact_path(routed):
    gw, _ = routed
    assert route(gw, "GET", "/exact") == "A"
    assert route(gw, "GET", "/exact?with=query") == "A"
    # exact means exact: a longer path is not matched by it (and nothing else matches)
    assert route(gw, "GET", "/exact/more") is None
    assert route(gw, "GET", "/exactly") is None


def test_path_prefix_and_method(routed):
    gw, ups = routed
    assert route(gw, "POST", "/api/users") == "B"
    assert route(gw, "PUT", "/api/users/1") == "B"
    assert route(gw, "GET", "/api/users") == "A"
    assert route(gw, "DELETE", "/api/x") == "A"
    # the prefix includes its slash: /api alone and /apix do not match it
    assert route(gw, "GET", "/api") is None
    assert route(gw, "GET", "/apix/y") is None


def test_host_match_first_match_wins(routed):
    gw, _ = routed
    # POST matches api_post before api_host
    assert route(gw, "POST", "/api/x", host="api.example.com") == "B"
    # GET with that host: api_host (before the general api route)
    assert route(gw, "GET", "/api/x", host="api.example.com") == "C"
    # port and case do not matter for the host
    assert route(gw, "GET", "/api/x", host="API.Example.COM:8080") == "C"
    # another host: the general route
    assert route(gw, "GET", "/api/x", host="other.example.com") == "A"


def test_host_only_route(routed):
    gw, _ = routed
    assert route(gw, "GET", "/anything", host="only.example.com") == "D"
    assert route(gw, "GET", "/anything", host="not.example.com") is None


def test_method_restricted_prefix(routed):
    gw, _ = routed
    assert route(gw, "GET", "/static/app.js") == "D"
    assert route(gw, "HEAD", "/static/app.js") == "D"
    assert route(gw, "POST", "/static/app.js") is None


def test_no_route_is_a_404_problem(routed):
    gw, ups = routed
    before = sum(u.request_count for u in ups.values())
    with RawClient(gw.port) as c:
        c.request("GET", "/nowhere")
        r = c.read_response()
        assert r.status == 404
        assert r.header("x-upstream") is None
        assert r.header("content-type").startswith("application/problem+json")
        problem = json.loads(r.body)
        assert problem["status"] == 404
        assert "title" in problem
        # a 404 from the gateway keeps the connection usable
        c.request("GET", "/exact")
        r2 = c.read_response()
        assert r2.header("x-upstream") == "A"
    assert sum(u.request_count for u in ups.values()) == before + 1


def test_routing_target_reaches_upstream_unchanged(sluice_factory, upstream_factory):
    a, b = upstream_factory("A"), upstream_factory("B")
    gw = sluice_factory(
        upstreams=[{"name": "a", "endpoints": [a]}, {"name": "b", "endpoints": [b]}],
        routes=[{"name": "echo_exact", "match": {"path": "/echo"}, "upstream": "b"},
                {"name": "rest", "match": {"path_prefix": "/"}, "upstream": "a"}])
    r = gw.get("/echo?q=1&q=2")
    assert r.status == 200 and r.header("x-upstream") == "B"
    assert r.json()["target"] == "/echo?q=1&q=2"
    # An exact path matches with a trailing slash too (as frameworks serve it), and the
    # upstream gets the path as normalized, slash kept.
    r = gw.get("/echo/")
    assert r.header("x-upstream") == "B" and r.json()["target"] == "/echo/"
    r = gw.get("/echo/x")
    assert r.header("x-upstream") == "A"
    r = gw.get("/status/201")
    assert (r.status, r.header("x-upstream")) == (201, "A")


def test_head_to_no_route_has_no_body(routed):
    gw, _ = routed
    with RawClient(gw.port) as c:
        c.request("HEAD", "/nowhere")
        r = c.read_response("HEAD")
        assert r.status == 404
        assert not c.data_pending(0.3), "a body after the head of a HEAD response"
        c.request("GET", "/exact")
        assert c.read_response().header("x-upstream") == "A"


def test_no_route_with_request_body(routed):
    """The body of a request answered 404 by the gateway is never read as the next request."""
    gw, ups = routed
    with RawClient(gw.port) as c:
        body = b"GET /exact?smuggled HTTP/1.1\r\nHost: y\r\n\r\n"
        c.send(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
               + body + b"GET /exact?next HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 404 and r.header("x-upstream") is None
        if "close" in r.connection_tokens():
            assert c.is_closed(3)
        else:
            r2 = c.read_response()
            assert r2.header("x-upstream") == "A", r2
    assert all("smuggled" not in req["target"] for u in ups.values() for req in u.requests)


def test_absolute_form_target_authority_replaces_host(sluice_factory, upstream, valkey):
    """RFC 9112 3.2.2: the authority of an absolute-form target replaces Host. The route, the
    limits, the Host sent upstream and X-Forwarded-Host all read that one authority: a client
    cannot route by one host (a catch-all without limits) and be served as the other."""
    gw = sluice_with_limits(
        sluice_factory, upstream, valkey,
        [limit_cfg("api_ip", "fixed_window", 2, "1h")],
        routes=[route_cfg("api", ["api_ip"], match={"host": "api.example"}),
                route_cfg("rest", [])])

    def send(target, host):
        with gw.client() as c:
            c.send(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            return c.read_response()

    # Routed by bypass.invalid (no limits): then it is also served as bypass.invalid.
    for _ in range(5):
        r = send("http://bypass.invalid/echo", "api.example")
        assert r.status == 200 and not r.has("ratelimit"), r
        h = r.json()["headers"]
        hosts = [v for n, v in h if n.lower() in ("host", "x-forwarded-host")]
        assert hosts == ["bypass.invalid", "bypass.invalid"], h
    # Routed by api.example: limited like GET /echo with Host: api.example, and served as it.
    statuses = []
    for _ in range(3):
        r = send("http://API.example:8080/echo?x=1", "bypass.invalid")
        statuses.append(r.status)
        if r.status == 200:
            assert r.has("ratelimit"), r
            h = r.json()["headers"]
            assert [v for n, v in h if n.lower() == "host"] == ["API.example:8080"], h
            assert [v for n, v in h if n.lower() == "x-forwarded-host"] == ["API.example:8080"]
            assert r.json()["target"] == "/echo?x=1"
    assert statuses == [200, 200, 429], statuses
    assert send("/echo", "api.example").status == 429
    # An authority that is no host is refused, as such a Host is.
    assert send("http://a\"b/echo", "api.example").status == 400


def test_path_spellings_match_the_normalized_route(sluice_factory, upstream, valkey):
    """//formlogin, /formlogin;jsessionid=1, /formlogin/, /./formlogin, /%66ormlogin are
    /formlogin to common upstream frameworks: they all match a path = "/formlogin" route and
    share its limit instead of falling to a route without one. /FormLogin too on a route with
    case_insensitive = true. The upstream gets the normalized path by default (parameters and
    a trailing slash kept: they may mean something there) or, with forward_path = "original",
    the path as the client sent it."""
    gw = sluice_with_limits(
        sluice_factory, upstream, valkey,
        [limit_cfg("login_ip", "fixed_window", 100, "1h"),
         limit_cfg("admin_ip", "fixed_window", 100, "1h")],
        routes=[route_cfg("login", ["login_ip"], match={"path": "/formlogin"}),
                route_cfg("admin", ["admin_ip"],
                          match={"path_prefix": "/admin/", "case_insensitive": True},
                          forward_path="original"),
                route_cfg("rest", [])])

    def policy(r):
        return (r.header("ratelimit-policy") or "").split(";")[0]

    spellings = {
        "/formlogin": "/formlogin",
        "//formlogin": "/formlogin",
        "/formlogin;jsessionid=1": "/formlogin;jsessionid=1",
        "/formlogin/": "/formlogin/",
        "/./formlogin": "/formlogin",
        "/x/../formlogin": "/formlogin",
        "/%66ormlogin?q=1": "/formlogin?q=1",
        "/x/..;/formlogin": "/x/..;/formlogin",
    }
    wrong = []
    for sent, forwarded in spellings.items():
        r = gw.get(sent)
        got = (r.header("x-upstream"), policy(r), upstream.requests[-1]["target"])
        if got != (upstream.name, '"login_ip"', forwarded):
            wrong.append((sent, got))
    assert not wrong, wrong
    # Other paths are not /formlogin: exact still means exact, and case counts by default.
    for other in ("/formlogin/x", "/formloginx", "/FormLogin", "/form%2Flogin"):
        r = gw.get(other)
        assert policy(r) == "", (other, r)
    # case_insensitive: /ADMIN/ and //Admin/ match "/admin/"; the upstream gets the original.
    for sent in ("/admin/x", "/ADMIN/Users", "//Admin//x;a=1", "/admin%2F"):
        r = gw.get(sent)
        want = '"admin_ip"' if sent != "/admin%2F" else ""
        assert policy(r) == want, (sent, r)
        if want:
            assert upstream.requests[-1]["target"] == sent, r


def test_path_match_keys_validated_by_the_loader(sluice_factory, upstream, tmp_path):
    """case_insensitive is a boolean, forward_path is normalized | original, and a path written
    in a form requests are never matched in is an error (FILE:LINE:COL: key: what)."""
    import subprocess
    from conftest import sluice_bin
    cases = [
        ('match = { path = "//formlogin" }', "route[0].match.path", "write '/formlogin'"),
        ('match = { path_prefix = "/a;x/" }', "route[0].match.path_prefix", "write '/a/'"),
        ('match = { path = "/a/../b" }', "route[0].match.path", "write '/b'"),
        ('match = { path = "/%61" }', "route[0].match.path", "write '/a'"),
        ('match = { path = "/a", case_insensitive = "yes" }', "route[0].match.case_insensitive",
         "boolean"),
        ('match = { path = "/a" }\nforward_path = "raw"', "route[0].forward_path",
         "normalized"),
    ]
    for line, key, what in cases:
        cfg = tmp_path / "bad.toml"
        cfg.write_text('[[upstream]]\nname = "app"\nendpoints = ["127.0.0.1:9000"]\n\n'
                       f'[[route]]\nname = "r"\n{line}\nupstream = "app"\n')
        r = subprocess.run([str(sluice_bin()), "--check-config", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 1, (line, r.stdout)
        assert f"{cfg}:7:" in r.stderr or f"{cfg}:8:" in r.stderr, (line, r.stderr)
        assert key in r.stderr and what in r.stderr, (line, r.stderr)
    cfg = tmp_path / "good.toml"
    cfg.write_text('[[upstream]]\nname = "app"\nendpoints = ["127.0.0.1:9000"]\n\n'
                   '[[route]]\nname = "r"\nmatch = { path_prefix = "/Admin/", '
                   'case_insensitive = true }\nforward_path = "original"\nupstream = "app"\n')
    r = subprocess.run([str(sluice_bin()), "--check-config", "-c", str(cfg)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
