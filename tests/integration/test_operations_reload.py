"""Operations: hot reload on SIGHUP. New limits apply to new requests; a bad file is refused
(counted as a failure, FILE:LINE in the log) and the old configuration keeps serving; requests
in flight finish on the configuration they started with; server.listen and admin.listen are
rebound; the log level follows."""

import json
import re
import signal
import socket
import time

import pytest

from conftest import (connection_refused, free_port, limit_cfg, metric_sum, route_cfg,
                      sluice_with_limits)
from rawhttp import RawClient
from test_operations_metrics import scrape


def reloads(gw, admin_port=None):
    port = admin_port or gw.admin_port
    saved, gw.admin_port = gw.admin_port, port
    try:
        return (metric_sum(gw, "sluice_config_reloads_total", result="success"),
                metric_sum(gw, "sluice_config_reloads_total", result="failure"))
    finally:
        gw.admin_port = saved


def reload(gw, new_text, expect="success", admin_port=None, timeout=5.0):
    """Writes the configuration file, sends SIGHUP, and waits until the reload counter of
    `expect` grows by one (and the other one does not)."""
    ok0, bad0 = reloads(gw)
    gw.config_path.write_text(new_text)
    gw.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    ok, bad = ok0, bad0
    while time.monotonic() < deadline:
        try:
            ok, bad = reloads(gw, admin_port)
        except OSError:
            pass
        if (ok, bad) != (ok0, bad0):
            break
        time.sleep(0.02)
    want = (ok0 + 1, bad0) if expect == "success" else (ok0, bad0 + 1)
    assert (ok, bad) == want, \
        f"reload: success/failure {ok0}/{bad0} -> {ok}/{bad}, wanted {expect}\n{gw.stderr()[-3000:]}"
    time.sleep(0.1)  # the workers pick the new snapshot up from their own loops


def edit(gw, old, new, count=1):
    text = gw.config_path.read_text()
    assert text.count(old) == count, f"{old!r} appears {text.count(old)} times in\n{text}"
    return text.replace(old, new)


def statuses(gw, n, client, **kw):
    return [gw.get("/status/200", [("X-Client", client)], **kw).status for _ in range(n)]


# ------------------------------------------------------------------ (a) limits

def test_reload_changed_limit_applies_to_new_requests(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_client", "fixed_window", 5, "1h", by=["header:X-Client"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    assert statuses(gw, 6, "before") == [200] * 5 + [429]
    reload(gw, edit(gw, "limit = 5", "limit = 2"))
    assert statuses(gw, 3, "after") == [200, 200, 429]
    r = gw.get("/status/200", [("X-Client", "after2")])
    assert 'q=2' in r.header("ratelimit-policy"), r
    assert reloads(gw) == (1, 0)


# ------------------------------------------------------------------ (b) refused

def test_reload_bad_configuration_refused_old_one_keeps_serving(sluice_factory, upstream, valkey):
    limits = [limit_cfg("per_client", "fixed_window", 3, "1h", by=["header:X-Client"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    good = gw.config_path.read_text()
    path = str(gw.config_path)

    # A TOML syntax error on a known line.
    broken = good.replace("limit = 3", "limit = 1\nthis is not toml")
    bad_line = broken.splitlines().index("this is not toml") + 1
    reload(gw, broken, expect="failure")
    assert re.search(rf"{re.escape(path)}:{bad_line}:\d+:", gw.stderr()), gw.stderr()[-2000:]
    assert gw.alive()
    assert statuses(gw, 4, "syntax") == [200, 200, 200, 429], "not the old limit (3)"

    # An unknown key (with the right line and a suggestion).
    unknown = good.replace("idle_timeout = ", "idle_timeot = ").replace("limit = 3", "limit = 1")
    key_line = next(i for i, l in enumerate(unknown.splitlines(), 1) if l.startswith("idle_timeot"))
    reload(gw, unknown, expect="failure")
    err = gw.stderr()
    assert re.search(rf"{re.escape(path)}:{key_line}:\d+: .*idle_timeot", err), err[-2000:]
    assert "idle_timeout" in err.split("idle_timeot", 1)[1][:200]
    assert statuses(gw, 4, "unknown") == [200, 200, 200, 429]

    # A reference to an unknown upstream.
    dangling = good.replace('upstream = "app"\nlimits', 'upstream = "nowhere"\nlimits')
    assert dangling != good
    reload(gw, dangling, expect="failure")
    assert statuses(gw, 1, "dangling") == [200]
    assert reloads(gw) == (0, 3)

    # The process still reloads a good file afterwards.
    reload(gw, good.replace("limit = 3", "limit = 1"))
    assert statuses(gw, 2, "fixed") == [200, 429]
    assert reloads(gw) == (1, 3)


# ------------------------------------------------------------------ (c) in flight

def test_reload_requests_in_flight_finish_on_their_configuration(sluice_factory, upstream_factory):
    a, b = upstream_factory("a"), upstream_factory("b")
    gw = sluice_factory(upstreams=[{"name": "ua", "endpoints": [a]},
                                   {"name": "ub", "endpoints": [b]}],
                        routes=[route_cfg("all", upstream="ua")])
    kept = RawClient(gw.port)  # a keep-alive connection opened before the reload
    kept.request("GET", "/echo")
    assert kept.read_response().header("x-upstream") == "a"

    slow = RawClient(gw.port, timeout=10)
    slow.request("GET", "/slow/1500")
    assert a.wait_for(lambda u: u.request_count == 2, 3)
    t0 = time.monotonic()
    reload(gw, edit(gw, 'upstream = "ua"', 'upstream = "ub"'))
    assert time.monotonic() - t0 < 1.0

    fresh = gw.get("/echo")
    assert fresh.status == 200 and fresh.json()["upstream"] == "b", fresh
    kept.request("GET", "/echo")
    r = kept.read_response()
    assert r.status == 200 and r.header("x-upstream") == "b", "the next request on an old keep-alive connection"

    r = slow.read_response()
    assert r.status == 200, r
    assert r.json()["upstream"] == "a" and r.json()["slept_ms"] == 1500, r
    slow.request("GET", "/echo")
    assert slow.read_response().header("x-upstream") == "b"
    assert a.request_count == 2
    kept.close()
    slow.close()


# ------------------------------------------------------------------ (d) server.listen

def test_reload_new_listen_address(sluice_factory, upstream):
    gw = sluice_factory(upstream, workers=2)
    old_port = gw.port
    c = RawClient(old_port, timeout=10)
    c.request("GET", "/echo")
    assert c.read_response().status == 200
    c.request("GET", "/slow/1500")
    assert upstream.wait_for(lambda u: u.request_count == 2, 3)

    new_port = free_port()
    reload(gw, edit(gw, f'listen = "127.0.0.1:{old_port}"', f'listen = "127.0.0.1:{new_port}"'))
    gw.port = new_port

    # New connections work on the new port (every worker: 20 connections)...
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            if gw.get("/echo", timeout=1).status == 200:
                break
        except OSError:
            time.sleep(0.02)
    for i in range(20):
        assert gw.get(f"/echo?i={i}").status == 200
    # ...and the old port refuses them (every worker closed its socket).
    assert connection_refused(old_port, 2.0), "the old port still accepts connections"
    time.sleep(0.1)
    for _ in range(20):
        s = socket.socket()
        s.settimeout(1)
        with pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", old_port))
        s.close()

    # The request in flight on the old address completes.
    r = c.read_response()
    assert r.status == 200 and r.json()["slept_ms"] == 1500, r
    c.close()


# ------------------------------------------------------------------ (e) admin.listen

def test_reload_new_admin_listen_address(sluice_factory, upstream):
    gw = sluice_factory(upstream)
    old_admin = gw.admin_port
    new_admin = free_port()
    reload(gw, edit(gw, f'listen = "127.0.0.1:{old_admin}"', f'listen = "127.0.0.1:{new_admin}"'),
           admin_port=new_admin)
    gw.admin_port = new_admin
    assert gw.admin_get("/healthz")[0] == 200
    assert gw.admin_get("/ready")[0] == 200
    assert reloads(gw) == (1, 0)
    assert connection_refused(old_admin, 2.0), "the old admin port still accepts connections"
    assert gw.get("/echo").status == 200


# ------------------------------------------------------------------ (f) log level

def test_reload_log_level(sluice_factory, upstream):
    """The 400 of a malformed request is logged at debug level only."""
    gw = sluice_factory(upstream, log={"level": "info"})
    malformed = b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n"
    marker = "client request refused"

    def bad_request():
        with RawClient(gw.port) as c:
            c.send(malformed)
            assert c.read_response().status == 400

    def debug_lines():
        time.sleep(0.2)
        return [l for l in gw.stderr().splitlines() if "[debug]" in l]

    bad_request()
    assert debug_lines() == []
    reload(gw, edit(gw, 'level = "info"', 'level = "debug"'))
    bad_request()
    lines = debug_lines()
    assert len(lines) == 1 and marker in lines[0], lines
    reload(gw, edit(gw, 'level = "debug"', 'level = "warn"'))
    bad_request()
    assert debug_lines() == lines
    # warn also hides info: the reload's own info line is not written
    infos = [l for l in gw.stderr().splitlines() if "[info]" in l]
    reload(gw, gw.config_path.read_text())
    assert [l for l in gw.stderr().splitlines() if "[info]" in l] == infos


# ------------------------------------------------------------------ counters and the access log

def test_reload_counters_continue_in_the_same_series(sluice_factory, upstream, valkey):
    """A reload that moves the limits around (a new limit first) and adds a route: requests,
    decisions and latencies go on in the series they were in, never a second one."""
    limits = [limit_cfg("l1", "fixed_window", 100, "1h", by=["header:X-Client"],
                        count_denied=True)]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            [route_cfg("api", ["l1"], match={"path_prefix": "/echo"})])
    for _ in range(3):
        assert gw.get("/echo", [("X-Client", "c")]).status == 200
    text = gw.config_path.read_text()
    first_limit = text.index("[[limit]]")
    text = (text[:first_limit] +
            '[[limit]]\nname = "l0"\nalgorithm = "fixed_window"\nby = ["header:X-Other"]\n'
            'limit = 100\nwindow = "1h"\n\n' + text[first_limit:])
    first_route = text.index("[[route]]")
    text = (text[:first_route] +
            '[[route]]\nname = "status"\nmatch = { path_prefix = "/status/" }\nupstream = "app"\n\n'
            + text[first_route:]).replace('limits = ["l1"]', 'limits = ["l0", "l1"]')
    reload(gw, text)
    for _ in range(2):
        assert gw.get("/echo", [("X-Client", "c")]).status == 200
    assert gw.get("/echo", [("X-Client", "c"), ("X-Other", "o")]).status == 200
    assert gw.get("/status/200").status == 200

    m = scrape(gw, requests=7)  # strict: a series given twice fails here
    assert sorted(m.series("sluice_requests_total"), key=lambda s: s[0]["route"]) == \
        [({"route": "api", "status": "200"}, 6.0), ({"route": "status", "status": "200"}, 1.0)]
    assert m.get("sluice_ratelimit_decisions_total", limit="l1", outcome="allowed") == 6
    assert m.get("sluice_ratelimit_decisions_total", limit="l0", outcome="allowed") == 1
    assert m.check_histogram("sluice_upstream_latency_seconds", upstream="app")["count"] == 7
    assert m.check_histogram("sluice_valkey_latency_seconds")["count"] == 6
    assert m.get("sluice_config_reloads_total", result="success") == 1


def log_paths(path):
    return [json.loads(l)["path"] for l in path.read_text().splitlines()]


def test_reload_access_log_target(sluice_factory, upstream, tmp_path):
    """access_log off -> a file -> another file -> off: each request is logged, exactly once,
    where the configuration said when it started (a request in flight across the reload
    included)."""
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    gw = sluice_factory(upstream, log={"access_log": "off"})
    assert gw.get("/status/200").status == 200
    reload(gw, edit(gw, 'access_log = "off"', f'access_log = "{first}"'))
    assert gw.get("/status/201").status == 201
    slow = RawClient(gw.port, timeout=10)
    slow.request("GET", "/slow/600")
    assert upstream.wait_for(lambda u: u.request_count == 3, 3)
    reload(gw, edit(gw, f'access_log = "{first}"', f'access_log = "{second}"'))
    assert gw.get("/status/202").status == 202
    assert slow.read_response().status == 200
    slow.close()
    reload(gw, edit(gw, f'access_log = "{second}"', 'access_log = "off"'))
    assert gw.get("/status/203").status == 203
    time.sleep(0.3)
    assert log_paths(first) == ["/status/201", "/slow/600"]
    assert log_paths(second) == ["/status/202"]
    assert gw.stderr_path.with_suffix(".stdout").read_text() == ""


def test_reload_to_a_listen_address_in_use_is_refused(sluice_factory, upstream):
    gw = sluice_factory(upstream)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    try:
        reload(gw, edit(gw, f'listen = "127.0.0.1:{gw.port}"', f'listen = "127.0.0.1:{taken}"'),
               expect="failure")
        assert f"127.0.0.1:{taken}" in gw.stderr().split("reload refused", 1)[1], gw.stderr()[-2000:]
        assert gw.get("/echo").status == 200  # still on the old port
    finally:
        busy.close()
