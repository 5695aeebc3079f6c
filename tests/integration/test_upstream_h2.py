"""HTTP/2 to upstreams ([[upstream]] protocol = "h2c" | "h2"): plain HTTP traffic from HTTP/1.1
and HTTP/2 clients reaches a python3-h2 server (harness/h2server.py) in clear with prior
knowledge, and over TLS chosen by ALPN. Heads, bodies (byte for byte, both ways), HEAD, 204 and
304, trailers both ways on HTTP/2 clients, many streams multiplexed over few upstream
connections, an upstream RST_STREAM as a 502 for that stream only, a stream that never answers
as a 504 while its connection serves others, a dead endpoint as a 502, a GOAWAY that moves new
requests to a new connection (mid-load too), a slow client that stalls no other stream, a
client that goes away cancelling its stream; limits, concurrency slots and cost_from over it;
100 MiB down and up (once). Run time: some 9 s."""

from __future__ import annotations

import threading

import pytest

from conftest import limit_cfg, metric_sum, parse_rl_list, route_cfg, sluice_with_limits
from harness.h2client import open_h2
from harness.h2server import H2Server, pattern_bytes, wait_for


@pytest.fixture
def h2_upstream():
    servers = []

    def make(**kw) -> H2Server:
        s = H2Server(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def gateway(sluice_factory, server, protocol="h2c", *, server_options=None, **options):
    up = {"name": "app", "endpoints": [f"127.0.0.1:{server.port}"], "protocol": protocol,
          **options}
    return sluice_factory(upstreams=[up], server=server_options)


def test_http11_clients_to_an_h2c_upstream(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    r = gw.get("/status/200")
    assert r.status == 200 and r.body == b"status 200", r
    assert r.header("via") is not None and "sluice" in r.header("via"), r
    r = gw.request("HEAD", "/status/200")
    assert r.status == 200 and r.body == b"" and r.header("content-length") == "10", r
    for status in (204, 304):
        r = gw.get(f"/status/{status}")
        assert r.status == status and r.body == b"", r
    body = pattern_bytes(1 << 20)
    r = gw.request("POST", "/echo", [("Content-Type", "application/octet-stream")], body)
    assert r.status == 200 and r.body == body, (r.status, len(r.body))
    assert r.header("content-type") == "application/octet-stream"
    r = gw.get(f"/bytes/{3 << 20}")
    assert r.status == 200 and r.body == pattern_bytes(3 << 20), (r.status, len(r.body))
    # What went upstream: HTTP/2 pseudo-fields, the forwarding fields, no connection field.
    r = gw.get("/headers", [("Host", "api.example"), ("Connection", "keep-alive")])
    fields = dict(tuple(f) for f in r.json())
    assert fields[":authority"] == "api.example" and fields[":scheme"] == "http", fields
    assert fields[":path"] == "/headers" and fields[":method"] == "GET", fields
    assert "connection" not in fields and "host" not in fields, fields
    assert fields["x-forwarded-for"] == "127.0.0.1", fields
    assert srv.connections == 1, srv.connections  # every request on one connection


def test_an_http11_client_gets_an_h2_upstreams_trailers_only_with_te_trailers(
        sluice_factory, h2_upstream):
    # An HTTP/2 server sends trailers whatever the client said: an HTTP/1.1 client gets them in
    # the last chunk only when its TE named "trailers" (RFC 9110 10.1.4), as gRPC clients do.
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    with gw.client() as c:
        c.request("GET", "/trailers")
        r = c.read_response()
        assert r.status == 200 and r.body == b"ok" and r.framing == "chunked", r
        assert r.trailers == [], r.trailers
        c.request("GET", "/trailers", [("TE", "trailers")])
        r = c.read_response()
        assert r.status == 200 and r.body == b"ok" and r.framing == "chunked", r
        got = [(n.lower(), v) for n, v in r.trailers]
        assert ("grpc-status", "0") in got and ("x-checksum", "42") in got, got
        c.request("GET", "/trailers", [("TE", "deflate;q=0.5, Trailers")])
        r = c.read_response()
        assert len(r.trailers) == 2, r.trailers


def test_http2_clients_with_trailers_both_ways(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    with open_h2(gw.port) as c:
        sid = c.request("GET", "/trailers")
        s = c.response(sid)
        assert s.status == 200 and s.body == b"ok", s
        assert ("grpc-status", "0") in s.trailers and ("x-checksum", "42") in s.trailers, s
        # A request with trailers: they reach the upstream, which sends them back.
        sid = c.request("POST", "/echo", [("content-type", "text/plain"), ("te", "trailers")],
                        end_stream=False)
        c.send_data(sid, b"hello ", end_stream=False)
        c.send_data(sid, b"world", end_stream=False)
        c.send_headers(sid, [("x-sum", "11")], end_stream=True)
        s = c.response(sid)
        assert s.status == 200 and s.body == b"hello world", s
        assert s.header("x-request-trailers") == "yes", s
        assert ("x-sum", "11") in s.trailers, s
        body = pattern_bytes(2 << 20)
        sid = c.request("POST", "/echo", body=body)
        s = c.response(sid, timeout=20)
        assert s.status == 200 and s.body == body, (s.status, len(s.body))
    te = [h for (m, p, h) in srv.seen if p == "/echo"][0]
    assert ("te", "trailers") in te, te


def test_many_streams_share_few_upstream_connections(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    assert gw.get("/status/200").status == 200  # the connection is up
    clients = [open_h2(gw.port) for _ in range(2)]
    try:
        sids = [c.send_requests([("GET", "/slow/300")] * 100) for c in clients]
        for c, ids in zip(clients, sids):
            for s in c.responses(ids, timeout=20):
                assert s.status == 200 and s.body == b"status 200", s
    finally:
        for c in clients:
            c.close()
    assert srv.streams == 201, srv.streams
    # 100 streams is the python server's limit per connection: 200 at once need two.
    assert srv.connections <= 2, srv.connections
    # The metrics say the same: streams sent, connections made and still pooled.
    assert metric_sum(gw, "sluice_upstream_requests_total", upstream="app", protocol="h2c") == 201
    assert metric_sum(gw, "sluice_upstream_connections_total", upstream="app",
                      protocol="h2c") == srv.connections
    assert metric_sum(gw, "sluice_upstream_connections_open", upstream="app",
                      protocol="h2c") == srv.connections


def test_max_concurrent_streams_spreads_streams_over_more_connections(sluice_factory,
                                                                     h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv, max_concurrent_streams=20)
    assert gw.get("/status/200").status == 200  # the first connection is up, idle
    client = open_h2(gw.port)
    try:
        ids = client.send_requests([("GET", "/slow/500")] * 60)
        for s in client.responses(ids, timeout=20):
            assert s.status == 200 and s.body == b"status 200", s
    finally:
        client.close()
    # 60 at once, 20 per connection: three connections (the python server alone would take
    # 100 on one), the first with the request that opened it.
    assert srv.streams == 61, srv.streams
    assert sorted(c.streams for c in srv.conns) == [20, 20, 21], [c.streams for c in srv.conns]
    assert metric_sum(gw, "sluice_upstream_connections_total", upstream="app",
                      protocol="h2c") == 3


def test_a_reset_stream_is_a_502_and_a_silent_one_a_504_the_connection_goes_on(
        sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv, response_timeout="500ms")
    with open_h2(gw.port) as c:
        never = c.request("GET", "/never")
        reset = c.request("GET", "/reset")
        s = c.response(reset)
        assert s.status == 502, s
        ok = c.request("GET", "/status/200")
        assert c.response(ok).status == 200
        s = c.response(never, timeout=5)
        assert s.status == 504, s
        ok = c.request("GET", "/status/201")
        assert c.response(ok).status == 201
    assert srv.connections == 1, srv.connections


def test_a_dead_endpoint_is_a_502(sluice_factory, h2_upstream):
    srv = h2_upstream()
    port = srv.port
    srv.stop()
    gw = sluice_factory(upstreams=[{"name": "app", "endpoints": [f"127.0.0.1:{port}"],
                                    "protocol": "h2c"}])
    r = gw.get("/status/200")
    assert r.status == 502, r
    with open_h2(gw.port) as c:
        assert c.response(c.request("GET", "/status/200")).status == 502


def test_a_goaway_moves_new_requests_to_a_new_connection(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    assert gw.get("/status/200").status == 200
    r = gw.get("/goaway")
    assert r.status == 200 and r.body == b"bye", r
    assert wait_for(lambda: srv.goaways_sent == 1)
    for _ in range(5):
        r = gw.get("/status/200")
        assert r.status == 200, r
    assert srv.connections == 2, srv.connections
    assert metric_sum(gw, "sluice_upstream_connections_total", upstream="app", protocol="h2c") == 2
    # The connection that said GOAWAY closes once its streams ended: one is left open.
    assert wait_for(lambda: metric_sum(gw, "sluice_upstream_connections_open", upstream="app",
                                       protocol="h2c") == 1)


def test_concurrent_http11_clients_to_an_h2c_upstream(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    results = []

    def one(i):
        body = pattern_bytes(1000 + i)
        r = gw.request("POST", f"/echo?i={i}", [("Content-Type", "a/b")], body)
        results.append(r.status == 200 and r.body == body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 50


def test_h2_over_tls_with_alpn(sluice_factory, h2_upstream, tls_pki):
    cert = tls_pki.certs["upstream"]
    srv = h2_upstream(tls=(cert.cert, cert.key))
    gw = gateway(sluice_factory, srv, protocol="h2", tls=True, tls_server_name="upstream.test",
                 tls_ca_file=str(tls_pki.certs["root"].cert))
    r = gw.get("/headers")
    assert r.status == 200, r
    fields = dict(tuple(f) for f in r.json())
    assert fields[":scheme"] == "https", fields
    body = pattern_bytes(1 << 20)
    with open_h2(gw.port) as c:
        s = c.response(c.request("POST", "/echo", body=body), timeout=20)
        assert s.status == 200 and s.body == body, (s.status, len(s.body))
    assert srv.connections == 1, srv.connections


def test_h2_to_a_server_that_does_not_select_h2_is_a_502(sluice_factory, h2_upstream, tls_pki):
    # Prior knowledge is for h2c: over TLS an upstream that chose no protocol by ALPN (or
    # another one) is not spoken to in HTTP/2; the connection fails as a connect does.
    cert = tls_pki.certs["upstream"]
    srv = h2_upstream(tls=(cert.cert, cert.key), alpn=("http/1.1",))
    gw = gateway(sluice_factory, srv, protocol="h2", tls=True, tls_server_name="upstream.test",
                 tls_ca_file=str(tls_pki.certs["root"].cert))
    r = gw.get("/status/200")
    assert r.status == 502, r
    assert srv.streams == 0, srv.streams
    assert metric_sum(gw, "sluice_upstream_errors_total", upstream="app",
                      kind="connect_failed") >= 1
    assert "did not select h2 by ALPN" in gw.stderr()


def test_a_client_that_goes_away_cancels_its_upstream_stream(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    with open_h2(gw.port) as c:
        sid = c.request("GET", "/never")
        assert wait_for(lambda: any(p == "/never" for (_, p, _) in srv.seen))
        c.reset_stream(sid)
        assert wait_for(lambda: srv.resets_received == 1), srv.resets_received
        assert c.response(c.request("GET", "/status/200")).status == 200
    # An HTTP/1.1 client that resets its connection: the same. (One that only closes its side
    # still gets its response, README "HTTP behaviour".)
    client = gw.client()
    client.send(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wait_for(lambda: sum(p == "/never" for (_, p, _) in srv.seen) == 2)
    client.reset()
    assert wait_for(lambda: srv.resets_received == 2), srv.resets_received
    assert srv.connections == 1, srv.connections


def test_a_slow_client_does_not_stall_other_streams_of_its_upstream_connection(
        sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    # A client that reads nothing past its first window: its stream's DATA stops at the
    # gateway, and the upstream's window for that stream stays shut.
    with open_h2(gw.port, auto_window=False) as slow, open_h2(gw.port) as fast:
        stuck = slow.request("GET", f"/bytes/{64 << 20}")
        assert slow.wait(lambda: len(slow.streams[stuck].data) >= 65535, timeout=5)
        body = pattern_bytes(4 << 20)
        sid = fast.request("POST", "/echo", body=body)
        s = fast.response(sid, timeout=10)
        assert s.status == 200 and s.body == body, (s.status, len(s.body))
        sids = fast.send_requests([("GET", "/status/200")] * 20)
        assert all(r.status == 200 for r in fast.responses(sids, timeout=10))
        assert not slow.streams[stuck].done
    assert srv.connections == 1, srv.connections


def test_an_upstream_goaway_mid_load_loses_no_request(sluice_factory, h2_upstream):
    srv = h2_upstream()
    gw = gateway(sluice_factory, srv)
    with open_h2(gw.port) as c:
        slow = c.send_requests([("GET", "/slow/300")] * 30)
        assert wait_for(lambda: srv.streams >= 30)
        # A GOAWAY while 30 streams are in flight: they finish on the old connection.
        bye = c.request("GET", "/goaway")
        late = c.send_requests([("GET", "/status/200")] * 30)
        responses = c.responses(slow + [bye] + late, timeout=10)
    assert [r.status for r in responses] == [200] * 61, responses
    assert srv.goaways_sent == 1
    assert srv.connections == 2, srv.connections


def test_limits_over_an_h2c_upstream(sluice_factory, h2_upstream, valkey):
    """Every per-request feature over HTTP/2 to the upstream: a limit with its RateLimit fields
    on the upstream's response and a 429 past it, a concurrency slot held for the stream's
    life, cost_from read from the response head."""
    srv = h2_upstream()
    limits = [limit_cfg("per_ip", "fixed_window", 4, "1h"),
              {"name": "one_at_a_time", "algorithm": "concurrency", "by": ["ip"], "limit": 1},
              limit_cfg("tokens", "fixed_window", 100, "1h",
                        cost_from="response_header:X-Tokens-Used")]
    routes = [route_cfg("slow", ["one_at_a_time"], {"path_prefix": "/slow/"}),
              route_cfg("tokens", ["tokens"], {"path_prefix": "/response-headers"}),
              route_cfg("api", ["per_ip"])]
    gw = sluice_with_limits(sluice_factory, None, valkey, limits, routes,
                            upstreams=[{"name": "app", "endpoints": [f"127.0.0.1:{srv.port}"],
                                        "protocol": "h2c"}])
    r = gw.get("/status/200")
    assert r.status == 200 and parse_rl_list(r.header("ratelimit"))["per_ip"]["r"] == 3, r
    with open_h2(gw.port) as c:
        s = c.response(c.request("GET", "/status/200"))
        assert s.status == 200 and parse_rl_list(s.header("ratelimit"))["per_ip"]["r"] == 2, s
        sids = c.send_requests([("GET", "/status/200")] * 3)
        statuses = sorted(r.status for r in c.responses(sids))
        assert statuses == [200, 200, 429], statuses
        # The slot is held while the first stream lasts, and free once it ended.
        first = c.request("GET", "/slow/500")
        assert wait_for(lambda: any(p == "/slow/500" for (_, p, _) in srv.seen))
        assert c.response(c.request("GET", "/slow/1")).status == 429
        assert c.response(first, timeout=5).status == 200
        assert wait_for(lambda: c.response(c.request("GET", "/slow/1")).status == 200)
        # cost_from: the response head's count is charged.
        s = c.response(c.request("GET", "/response-headers?X-Tokens-Used=60"))
        assert s.status == 200 and s.header("x-tokens-used") == "60", s
        s = c.response(c.request("GET", "/response-headers?X-Tokens-Used=1"))
        assert s.status == 200 and parse_rl_list(s.header("ratelimit"))["tokens"]["r"] == 40, s


@pytest.mark.once
def test_100_mib_down_and_up_through_an_h2c_upstream(sluice_factory, h2_upstream):
    """100 MiB down and 100 MiB up, byte for byte, for an HTTP/1.1 client (chunked up) and an
    HTTP/2 one. (once: it moves 500 MiB through a Python server.)"""
    srv = h2_upstream()
    size = 100 << 20
    gw = gateway(sluice_factory, srv, server_options={"max_request_body_bytes": 2 * size})
    body = pattern_bytes(size)
    r = gw.get(f"/bytes/{size}", timeout=120)
    assert r.status == 200 and len(r.body) == size and r.body == body, (r.status, len(r.body))
    with gw.client(timeout=120) as client:
        client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, size, 1 << 20):
            client.send(b"%x\r\n" % (1 << 20) + body[i:i + (1 << 20)] + b"\r\n")
        client.send(b"0\r\n\r\n")
        r = client.read_response()
    assert r.status == 200 and len(r.body) == size and r.body == body, (r.status, len(r.body))
    with open_h2(gw.port, timeout=120) as c:
        s = c.response(c.request("POST", "/echo", body=body), timeout=120)
        assert s.status == 200 and len(s.body) == size and s.body == body, (s.status, len(s.body))


def test_a_reset_stream_does_not_mark_its_endpoint_down(sluice_factory, h2_upstream):
    """RST_STREAM is the stream's: the endpoints stay in the round-robin (a connection that
    cannot be made marks its endpoint, as for HTTP/1.1)."""
    a, b = h2_upstream(), h2_upstream()
    gw = sluice_factory(upstreams=[{"name": "app", "protocol": "h2c", "fail_timeout": "60s",
                                    "endpoints": [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]}])
    assert gw.get("/reset").status == 502
    for _ in range(10):
        assert gw.get("/status/200").status == 200
    served = [sum(p == "/status/200" for (_, p, _) in s.seen) for s in (a, b)]
    assert served == [5, 5], served
