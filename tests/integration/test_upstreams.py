"""Upstream clusters: round-robin, failed endpoints skipped, 502 and 504, the keep-alive pool
(reuse, idle cap, idle timeout), upstreams that close without answering."""

import json
import socket
import threading
import time

from conftest import TIMER_SLACK_S, free_port


def problem(r, status):
    assert r.status == status, r
    assert r.header("content-type").startswith("application/problem+json"), r
    body = json.loads(r.body)
    assert body["status"] == status
    return body


# ------------------------------------------------------------------------------ round-robin

def test_round_robin_over_two_endpoints(sluice_factory, upstream_factory):
    a, b = upstream_factory("A"), upstream_factory("B")
    gw = sluice_factory([a, b])
    seen = [gw.get("/echo").header("x-upstream") for _ in range(8)]
    assert sorted(set(seen)) == ["A", "B"], seen
    assert all(x != y for x, y in zip(seen, seen[1:])), f"not alternating: {seen}"
    assert a.request_count == 4 and b.request_count == 4


def test_round_robin_on_one_client_connection(sluice_factory, upstream_factory):
    a, b = upstream_factory("A"), upstream_factory("B")
    gw = sluice_factory([a, b])
    with gw.client() as c:
        seen = []
        for _ in range(6):
            c.request("GET", "/echo")
            seen.append(c.read_response().header("x-upstream"))
    assert all(x != y for x, y in zip(seen, seen[1:])), seen
    # and each endpoint's requests came over one pooled connection
    assert a.connection_count == 1 and b.connection_count == 1


def test_three_endpoints_share_the_load(sluice_factory, upstream_factory):
    ups = [upstream_factory(n) for n in "ABC"]
    gw = sluice_factory(ups)
    for _ in range(9):
        assert gw.get("/echo").status == 200
    assert [u.request_count for u in ups] == [3, 3, 3]


# ------------------------------------------------------------------------------ failures

def test_endpoint_down_requests_still_succeed(sluice_factory, upstream_factory):
    a = upstream_factory("A")
    dead = free_port()  # nothing listens there: connection refused
    gw = sluice_factory([f"127.0.0.1:{dead}", a])
    for i in range(6):
        r = gw.get(f"/echo?i={i}")
        assert r.status == 200, r
        assert r.header("x-upstream") == "A"
    assert a.request_count == 6


def test_all_endpoints_down_502(sluice_factory):
    gw = sluice_factory([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
    problem(gw.get("/echo"), 502)
    # and again (both endpoints now marked failed): still a clean 502, the gateway keeps serving
    problem(gw.get("/echo"), 502)
    with gw.client() as c:
        c.request("GET", "/echo")
        problem(c.read_response(), 502)
        c.request("GET", "/echo")
        problem(c.read_response(), 502)


def test_connect_timeout_502(sluice_factory, blackhole):
    port = blackhole()
    gw = sluice_factory([f"127.0.0.1:{port}"], upstream_options={"connect_timeout": "300ms"})
    t0 = time.monotonic()
    r = gw.get("/echo", timeout=10)
    elapsed = time.monotonic() - t0
    problem(r, 502)
    assert 0.25 <= elapsed < 0.3 + TIMER_SLACK_S, elapsed


def test_connect_timeout_falls_over_to_next_endpoint(sluice_factory, upstream_factory, blackhole):
    a = upstream_factory("A")
    gw = sluice_factory([f"127.0.0.1:{blackhole()}", a],
                        upstream_options={"connect_timeout": "300ms", "fail_timeout": "10s"})
    durations = []
    for _ in range(6):
        t0 = time.monotonic()
        r = gw.get("/echo", timeout=10)
        durations.append(time.monotonic() - t0)
        assert r.status == 200 and r.header("x-upstream") == "A", r
    # at most one request paid the connect timeout: the failed endpoint is then skipped
    slow = [d for d in durations if d >= 0.25]
    assert len(slow) <= 1, durations


def test_failed_endpoint_retried_without_fail_timeout(sluice_factory, upstream_factory, blackhole):
    """Control for the test above: with fail_timeout = 0 the endpoint is never skipped, so
    every other request pays the connect timeout (the timing above is meaningful)."""
    a = upstream_factory("A")
    gw = sluice_factory([f"127.0.0.1:{blackhole()}", a],
                        upstream_options={"connect_timeout": "300ms", "fail_timeout": "0s"})
    durations = []
    for _ in range(4):
        t0 = time.monotonic()
        r = gw.get("/echo", timeout=10)
        durations.append(time.monotonic() - t0)
        assert r.status == 200, r
    assert len([d for d in durations if d >= 0.25]) >= 2, durations


def test_failed_endpoint_comes_back_after_fail_timeout(sluice_factory, upstream_factory):
    a = upstream_factory("A")
    port = free_port()
    gw = sluice_factory([f"127.0.0.1:{port}", a], upstream_options={"fail_timeout": "500ms"})
    for _ in range(4):
        assert gw.get("/echo").header("x-upstream") == "A"
    b = upstream_factory("B", port=port)  # the endpoint comes up
    time.sleep(0.7)
    seen = [gw.get("/echo").header("x-upstream") for _ in range(4)]
    assert "B" in seen, seen


def test_response_timeout_504(sluice_factory, upstream):
    gw = sluice_factory(upstream, upstream_options={"response_timeout": "300ms"})
    t0 = time.monotonic()
    r = gw.get("/hang", timeout=10)
    elapsed = time.monotonic() - t0
    problem(r, 504)
    assert 0.25 <= elapsed < 0.3 + TIMER_SLACK_S, elapsed
    # a response within the timeout is fine
    r = gw.get("/slow/100")
    assert r.status == 200 and r.json()["slept_ms"] == 100
    # the hung upstream connection was closed, not pooled
    assert upstream.wait_for(lambda u: u.connections[0].open is False, 3)


def test_response_timeout_keeps_client_connection_usable(sluice_factory, upstream):
    gw = sluice_factory(upstream, upstream_options={"response_timeout": "300ms"})
    with gw.client(timeout=10) as c:
        c.request("GET", "/hang")
        problem(c.read_response(), 504)
        c.request("GET", "/echo?after")
        r = c.read_response()
        assert r.status == 200 and r.json()["target"] == "/echo?after"


def test_upstream_closes_without_answering_502(sluice, upstream):
    problem(sluice.get("/close-now"), 502)
    problem(sluice.request("POST", "/close-now", body=b"x" * 5000), 502)
    assert sluice.get("/echo").status == 200


def test_upstream_closes_without_answering_after_pooled_request(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/echo")
        assert c.read_response().status == 200
        c.request("GET", "/close-now")
        problem(c.read_response(), 502)
        c.request("GET", "/echo?after")
        assert c.read_response().status == 200


# ------------------------------------------------------------------------------ pool

def test_pool_reuses_connections_across_clients(sluice, upstream):
    for i in range(5):
        assert sluice.get(f"/echo?i={i}").status == 200
    assert upstream.connection_count == 1, upstream.stats()["connections"]
    assert upstream.connections[0].requests == 5


def test_pool_idle_cap(sluice_factory, upstream):
    gw = sluice_factory(upstream, upstream_options={"max_idle_connections": 1})
    results = []

    def slow(i):
        results.append(gw.get(f"/slow/400?i={i}", timeout=10).status)

    def burst(first):
        threads = [threading.Thread(target=slow, args=(i,)) for i in range(first, first + 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)

    burst(0)
    assert results == [200] * 3
    assert upstream.connection_count == 3
    # More concurrent requests than the cap right after: the three freed connections were kept
    # (closing them at once would cost a new connection per request under such a load).
    started = time.monotonic()
    burst(3)
    assert results == [200] * 6
    # All three at once (0.4 s): two of them one after the other would take 0.8 s.
    assert time.monotonic() - started < 0.4 + TIMER_SLACK_S
    assert upstream.connection_count == 3, upstream.stats()["connections"]
    # Once they stay unused (about a second), only one of the three is kept idle.
    assert upstream.open_connection_count == 3
    assert upstream.wait_for(lambda u: u.open_connection_count == 1, 3), upstream.stats()["connections"]
    for i in range(3):
        assert gw.get(f"/echo?i={i}").status == 200
    assert upstream.connection_count == 3  # served by the pooled one


def test_pool_disabled_with_zero_idle(sluice_factory, upstream):
    gw = sluice_factory(upstream, upstream_options={"max_idle_connections": 0})
    with gw.client() as c:
        for i in range(3):
            c.request("GET", f"/echo?i={i}")
            assert c.read_response().status == 200
    assert upstream.connection_count == 3


def test_pool_idle_timeout(sluice_factory, upstream):
    gw = sluice_factory(upstream, upstream_options={"idle_timeout": "300ms"})
    assert gw.get("/echo").status == 200
    assert upstream.wait_for(lambda u: u.open_connection_count == 0, 3), \
        "the pooled connection outlived the upstream idle_timeout"
    assert gw.get("/echo").status == 200
    assert upstream.connection_count == 2


def test_pooled_connection_closed_by_upstream_is_not_used(upstream_factory, sluice_factory):
    """The upstream closes its idle keep-alive connection (a restart, its own idle timeout);
    the next request is still served."""
    up = upstream_factory("X")
    gw = sluice_factory(up)
    assert gw.get("/echo").status == 200
    # the upstream drops every connection it has
    with up._lock:
        live = list(up._live.values())
    for s in live:
        s.shutdown(socket.SHUT_RDWR)
    assert up.wait_for(lambda u: u.open_connection_count == 0, 3)
    time.sleep(0.1)
    r = gw.get("/echo")
    assert r.status == 200, r


def test_upstream_connection_close_is_not_pooled(sluice, upstream):
    """An upstream response with Connection: close ends that upstream connection; the next
    request opens a new one instead of writing into a closing socket."""
    r = sluice.get("/response-headers?Connection=close")
    assert r.status == 200 and r.body == b"ok\n"
    assert upstream.wait_for(lambda u: not u.connections[0].open, 3), \
        "the gateway kept an upstream connection that announced its close"
    r = sluice.get("/echo")
    assert r.status == 200
    assert upstream.connection_count == 2
