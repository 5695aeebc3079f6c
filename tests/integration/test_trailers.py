"""Trailer fields (RFC 9110 6.5) carried where the other side can take them: the trailers of a
chunked HTTP/1.1 body go on after the last chunk to an HTTP/1.1 peer that gets the body chunked,
and in a HEADERS frame that ends the stream to an HTTP/2 client; an HTTP/2 request's trailers go
upstream after the last chunk when its body has no content-length. Where the other side cannot
take them (a Content-Length body, an HTTP/1.0 client) they are dropped, never merged into the
head. Fields the gateway controls in a head (framing, routing, hop-by-hop, X-Forwarded-*,
Forwarded, X-Real-IP, Via) never go on in a trailer section, so a backend that merged trailers
into its headers would still not see a forged client address.

Clients: rawhttp (HTTP/1.1, it keeps the trailers it reads), harness/h2client.py (frames over a
raw socket) and python3-h2 (a strict client state machine). Run time: about 2 s."""

from __future__ import annotations

import socket
import urllib.parse

import pytest

from harness.h2client import check_h2_response_fields, open_h2
from rawhttp import chunked
from upstream import pattern_bytes

# Trailer fields the upstream sends: two that go on, and some the gateway keeps to itself.
SENT = [("X-Sum", "42"), ("grpc-status", "0"), ("X-Forwarded-For", "203.0.113.66"),
        ("Content-Length", "7"), ("Via", "1.1 forged"), ("Host", "elsewhere.test")]
KEPT = [("X-Sum", "42"), ("grpc-status", "0")]


def lower(pairs):
    return [(n.lower(), v) for n, v in pairs]


def trailers_path(n):
    return f"/trailers/{n}?" + urllib.parse.urlencode(SENT)


# ------------------------------------------------------------------ responses

@pytest.mark.parametrize("size", [0, 100, 200_000])
def test_chunked_response_trailers_reach_an_http11_client(sluice, upstream, size):
    with sluice.client() as c:
        c.request("GET", trailers_path(size))
        r = c.read_response()
        assert r.status == 200 and r.framing == "chunked", r
        assert r.body == pattern_bytes(size)
        assert lower(r.trailers) == lower(KEPT), r.trailers
        # The announcement goes on with them (it is no hop-by-hop field).
        assert r.header("trailer") is not None, r.headers
        assert all(n.lower() not in ("x-sum", "grpc-status") for n, _ in r.headers), r.headers
        c.request("GET", "/echo?after=1")  # the connection goes on
        assert c.read_response().status == 200


def test_an_http10_client_gets_the_body_and_no_trailers(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", trailers_path(1000), version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200 and r.body == pattern_bytes(1000), r
        assert r.framing == "close" and not r.trailers, r
        assert all(n.lower() not in ("x-sum", "grpc-status") for n, _ in r.headers), r.headers


@pytest.mark.parametrize("size", [0, 100, 200_000])
def test_chunked_response_trailers_end_an_h2_stream(sluice, upstream, size):
    with open_h2(sluice.port) as c:
        s = c.response(c.request("GET", trailers_path(size)), timeout=10)
        assert s.status == 200 and s.ended, s
        check_h2_response_fields(s)
        assert s.body == pattern_bytes(size)
        assert s.trailers == lower(KEPT), s.trailers
        assert not c.protocol_errors and not c.goaways, c.describe()


def test_a_response_without_trailers_ends_with_its_data_on_h2(sluice, upstream):
    with open_h2(sluice.port) as c:
        s = c.response(c.request("GET", "/chunked/5000"))
        assert s.status == 200 and s.body == pattern_bytes(5000) and s.trailers == [], s


# ------------------------------------------------------------------ requests

def test_chunked_request_trailers_go_upstream(sluice, upstream):
    body = b"hello trailers"
    trailers = [("X-Checksum", "abc"), ("X-Forwarded-For", "203.0.113.66"),
                ("Content-Length", "3"), ("Host", "elsewhere.test"), ("X-Real-IP", "1.2.3.4")]
    with sluice.client() as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: sluice.test\r\nTransfer-Encoding: chunked\r\n"
               b"Trailer: X-Checksum\r\n\r\n" + chunked(body, [5], trailers))
        r = c.read_response()
        assert r.status == 200, r
        info = r.json()
        assert info["body_framing"] == "chunked" and info["body_text"] == body.decode(), info
        assert info["trailers"] == [["X-Checksum", "abc"]], info
        names = [n.lower() for n, _ in info["headers"]]
        assert names.count("x-forwarded-for") == 1 and "x-checksum" not in names, info
        assert [v for n, v in info["headers"] if n.lower() == "x-forwarded-for"] == ["127.0.0.1"]


def test_h2_request_trailers_go_upstream_after_the_last_chunk(sluice, upstream):
    with open_h2(sluice.port) as c:
        sid = c.request("POST", "/echo?t=1", end_stream=False)
        c.send_data(sid, b"abc", end_stream=False)
        c.send_data(sid, b"def", end_stream=False)
        c.send_headers(sid, [("x-checksum", "abc"), ("x-forwarded-for", "203.0.113.66")],
                       end_stream=True)
        s = c.response(sid)
        assert s.status == 200, s
        info = s.json()
        assert info["body_framing"] == "chunked" and info["body_text"] == "abcdef", info
        assert info["trailers"] == [["x-checksum", "abc"]], info
        assert not c.protocol_errors and not c.goaways, c.describe()


def test_h2_request_trailers_with_a_content_length_body_are_dropped(sluice, upstream):
    with open_h2(sluice.port) as c:
        sid = c.request("POST", "/echo?t=2", [("content-length", "3")], end_stream=False)
        c.send_data(sid, b"abc", end_stream=False)
        c.send_headers(sid, [("x-checksum", "abc")], end_stream=True)
        s = c.response(sid)
        assert s.status == 200, s
        info = s.json()
        assert info["body_framing"] == "content-length" and info["body_text"] == "abc", info
        assert info["trailers"] == [], info


def test_h2_request_trailers_too_large_get_431(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"max_request_header_bytes": 4096})
    with open_h2(gw.port) as c:
        sid = c.request("POST", "/echo?t=big", end_stream=False)
        c.send_data(sid, b"abc", end_stream=False)
        c.send_headers(sid, [("x-big", "b" * 5000)], end_stream=True)
        s = c.response(sid)
        assert s.status == 431, f"{s!r} ({c.describe()})"
        s = c.response(c.request("GET", "/echo?next=1"))
        assert s.status == 200, s
        assert not c.goaways, c.describe()


def test_python_h2_sends_and_receives_trailers(sluice, upstream):
    """python3-h2 checks every frame: the trailing HEADERS of the response end the stream,
    and a request's trailers are taken."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    sock = socket.create_connection(("127.0.0.1", sluice.port), timeout=10)
    got = {}
    try:
        conn.initiate_connection()
        get = conn.get_next_available_stream_id()
        conn.send_headers(get, [(":method", "GET"), (":scheme", "http"),
                                (":authority", "sluice.test"), (":path", trailers_path(3000))],
                          end_stream=True)
        post = conn.get_next_available_stream_id()
        conn.send_headers(post, [(":method", "POST"), (":scheme", "http"),
                                 (":authority", "sluice.test"), (":path", "/echo?py=1")])
        conn.send_data(post, b"xyz")
        conn.send_headers(post, [("x-checksum", "py")], end_stream=True)
        sock.sendall(conn.data_to_send())
        ended = set()
        while len(ended) < 2:
            data = sock.recv(65536)
            assert data, f"the gateway closed; so far {got}"
            for ev in conn.receive_data(data):
                s = got.setdefault(getattr(ev, "stream_id", 0), {"body": b""})
                if isinstance(ev, h2.events.ResponseReceived):
                    s["status"] = dict(ev.headers)[":status"]
                elif isinstance(ev, h2.events.DataReceived):
                    s["body"] += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    s["trailers"] = list(ev.headers)
                elif isinstance(ev, h2.events.StreamEnded):
                    ended.add(ev.stream_id)
                elif isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    pytest.fail(f"{ev!r}")
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    assert got[get]["status"] == "200" and got[get]["body"] == pattern_bytes(3000), got[get]
    assert got[get]["trailers"] == lower(KEPT), got[get]
    import json
    info = json.loads(got[post]["body"])
    assert info["trailers"] == [["x-checksum", "py"]] and info["body_text"] == "xyz", info
