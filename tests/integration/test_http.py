"""HTTP/1.1 through the gateway: keep-alive, pipelining, request bodies (Content-Length,
chunked, large, binary, streamed), Expect: 100-continue, HEAD, 204/304, Connection: close,
HTTP/1.0 clients."""

import base64
import hashlib
import http.client
import os
import threading
import time

from rawhttp import RawClient, build_request, chunked
from upstream import pattern_bytes


def hv(pairs, name):
    """Values of a header in an /echo header list ([[name, value], ...])."""
    return [v for n, v in pairs if n.lower() == name.lower()]


def echo_body(r):
    return base64.b64decode(r.json()["body_b64"])


# ------------------------------------------------------------------------------ keep-alive

def test_keep_alive_several_requests_one_connection(sluice, upstream):
    with sluice.client() as c:
        for i in range(5):
            c.request("GET", f"/echo?i={i}")
            r = c.read_response()
            assert r.status == 200
            assert r.json()["target"] == f"/echo?i={i}"
            assert "close" not in r.connection_tokens()
        assert not c.is_closed(0.2)
    # Sequential requests reuse one pooled upstream connection.
    assert upstream.request_count == 5
    assert upstream.connection_count == 1, upstream.stats()["connections"]


def test_keep_alive_with_http_client(sluice, upstream):
    conn = http.client.HTTPConnection("127.0.0.1", sluice.port, timeout=5)
    try:
        socks = set()
        for i in range(3):
            conn.request("POST", "/echo", body=b"x" * i)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200
            assert not resp.will_close
            socks.add(id(conn.sock))
            assert b'"body_len": %d' % i in body
        assert len(socks) == 1
    finally:
        conn.close()
    assert upstream.connection_count == 1


# ------------------------------------------------------------------------------ pipelining

def test_pipelined_requests_answered_in_order(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("GET", "/slow/300?n=1")
               + build_request("POST", "/echo?n=2", body=b"second")
               + build_request("GET", "/bytes/100?n=3")
               + build_request("GET", "/status/204?n=4")
               + build_request("GET", "/echo?n=5"))
        r1 = c.read_response()
        assert r1.status == 200 and r1.json()["target"] == "/slow/300?n=1"
        r2 = c.read_response()
        assert r2.status == 200 and r2.json()["target"] == "/echo?n=2"
        assert echo_body(r2) == b"second"
        r3 = c.read_response()
        assert r3.status == 200 and r3.body == pattern_bytes(100)
        r4 = c.read_response()
        assert r4.status == 204 and r4.body == b""
        r5 = c.read_response()
        assert r5.status == 200 and r5.json()["target"] == "/echo?n=5"
        assert not c.data_pending(0.2)
    targets = [r["target"] for r in upstream.requests]
    assert targets == ["/slow/300?n=1", "/echo?n=2", "/bytes/100?n=3", "/status/204?n=4", "/echo?n=5"]


def test_many_pipelined_requests_in_one_write(sluice, upstream):
    n = 30
    with sluice.client() as c:
        c.send(b"".join(build_request("GET", f"/echo?i={i}") for i in range(n)))
        for i in range(n):
            r = c.read_response()
            assert r.status == 200
            assert r.json()["target"] == f"/echo?i={i}"
    assert upstream.request_count == n


def test_pipelined_burst_larger_than_read_buffers(sluice, upstream):
    """~300 KB of pipelined requests: the gateway may stop reading while it catches up, but
    must answer all of them, in order."""
    n = 300
    pad = "p" * 1000
    with sluice.client(timeout=20) as c:
        data = b"".join(build_request("GET", f"/echo?i={i}", [("X-Pad", pad)]) for i in range(n))
        sender = threading.Thread(target=c.send, args=(data,))
        sender.start()
        for i in range(n):
            r = c.read_response()
            assert r.status == 200
            assert r.json()["target"] == f"/echo?i={i}"
        sender.join(10)
    assert upstream.request_count == n


# ------------------------------------------------------------------------------ request bodies

def test_content_length_body_binary(sluice, upstream):
    body = os.urandom(1000) + b"\x00\r\n\r\n" + bytes(range(256))
    with sluice.client() as c:
        c.request("POST", "/echo", [("Content-Type", "application/octet-stream")], body)
        r = c.read_response()
    assert r.status == 200
    info = r.json()
    assert info["method"] == "POST"
    assert info["body_len"] == len(body)
    assert echo_body(r) == body
    assert hv(info["headers"], "content-length") == [str(len(body))]


def test_chunked_body(sluice, upstream):
    body = os.urandom(3000)
    with sluice.client() as c:
        c.request("PUT", "/echo", [("Transfer-Encoding", "chunked")],
                  chunked(body, [1, 10, 1000, 5, 700]), content_length=False)
        r = c.read_response()
    assert r.status == 200
    info = r.json()
    assert info["method"] == "PUT"
    assert echo_body(r) == body
    assert info["body_len"] == 3000
    # Either framing is correct towards the upstream, but never both.
    assert not (hv(info["headers"], "content-length") and hv(info["headers"], "transfer-encoding"))


def test_chunked_body_sent_slowly(sluice, upstream):
    pieces = [os.urandom(n) for n in (100, 1, 5000, 33)]
    with sluice.client() as c:
        c.send(build_request("POST", "/echo", [("Transfer-Encoding", "chunked")]))
        for p in pieces:
            time.sleep(0.05)
            c.send(b"%x\r\n" % len(p) + p + b"\r\n")
        time.sleep(0.05)
        c.send(b"0\r\n\r\n")
        r = c.read_response()
    assert r.status == 200
    assert echo_body(r) == b"".join(pieces)


def test_empty_chunked_body(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("POST", "/echo", [("Transfer-Encoding", "chunked")]) + b"0\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        assert r.json()["body_len"] == 0
        c.request("GET", "/echo?after")
        assert c.read_response().json()["target"] == "/echo?after"


def _send_big(c, data, block=256 * 1024):
    for i in range(0, len(data), block):
        c.send(data[i:i + block])


def test_5mb_content_length_body(sluice, upstream):
    body = os.urandom(5 * 1024 * 1024)
    with sluice.client(timeout=20) as c:
        c.send(build_request("POST", "/echo", [("Content-Length", str(len(body)))]))
        _send_big(c, body)
        r = c.read_response()
    assert r.status == 200
    info = r.json()
    assert info["body_len"] == len(body)
    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_5mb_chunked_body(sluice, upstream):
    body = os.urandom(5 * 1024 * 1024)
    with sluice.client(timeout=20) as c:
        c.send(build_request("POST", "/echo", [("Transfer-Encoding", "chunked")]))
        _send_big(c, chunked(body, [65536] * 100 + [7, 100000]))
        r = c.read_response()
    assert r.status == 200
    info = r.json()
    assert info["body_len"] == len(body)
    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_request_body_streamed_before_it_is_complete(sluice, upstream):
    """The upstream receives the first part of a 5 MB body while the client still holds back the
    rest: the gateway does not wait for (or buffer) the whole body."""
    body = os.urandom(5 * 1024 * 1024)
    first = 1024 * 1024
    with sluice.client(timeout=20) as c:
        c.send(build_request("POST", "/echo", [("Content-Length", str(len(body)))]))
        _send_big(c, body[:first])
        seen = upstream.wait_for(lambda u: u.progress() >= 512 * 1024, timeout=5)
        got = upstream.progress()
        _send_big(c, body[first:])
        r = c.read_response()
    assert seen, f"upstream saw only {got} body bytes while the client had sent {first}"
    assert r.status == 200
    assert r.json()["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_chunked_body_streamed_before_it_is_complete(sluice, upstream):
    with sluice.client(timeout=20) as c:
        c.send(build_request("POST", "/echo", [("Transfer-Encoding", "chunked")]))
        part = os.urandom(400 * 1024)
        c.send(b"%x\r\n" % len(part) + part + b"\r\n")
        seen = upstream.wait_for(lambda u: u.progress() >= 200 * 1024, timeout=5)
        got = upstream.progress()
        c.send(b"0\r\n\r\n")
        r = c.read_response()
    assert seen, f"upstream saw only {got} body bytes of a chunk of {len(part)}"
    assert r.status == 200 and r.json()["body_len"] == len(part)


# ------------------------------------------------------------------------------ Expect

def test_expect_100_continue(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("POST", "/echo", [("Content-Length", "11"), ("Expect", "100-continue")]))
        interim = c.read_response()
        assert interim.status == 100, interim
        c.send(b"hello world")
        r = c.read_final_response()
    assert r.status == 200
    info = r.json()
    assert info["body_text"] == "hello world"
    assert hv(info["headers"], "expect") == []
    assert info["continue_sent"] is False  # the upstream never saw an Expect to answer


def test_expect_endpoint_never_sees_expect(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("PUT", "/expect", [("Content-Length", "3"), ("Expect", "100-continue")]))
        assert c.read_response().status == 100
        c.send(b"abc")
        r = c.read_final_response()
        assert r.status == 200
        assert r.json() == {"upstream": "up1", "expect": None, "body_len": 3, "continue_sent": False}
        # exactly one interim response, and the connection is still usable
        c.request("GET", "/echo?next")
        r2 = c.read_response()
        assert r2.status == 200 and r2.json()["target"] == "/echo?next"


def test_expect_100_continue_with_chunked_body(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("POST", "/echo", [("Transfer-Encoding", "chunked"),
                                                ("Expect", "100-continue")]))
        assert c.read_response().status == 100
        c.send(chunked(b"0123456789" * 100, [7, 300]))
        r = c.read_final_response()
    assert r.status == 200
    assert echo_body(r) == b"0123456789" * 100
    assert r.interim == []


# ------------------------------------------------------------------------------ HEAD, 204, 304

def test_head_keeps_content_length_and_has_no_body(sluice, upstream):
    with sluice.client() as c:
        c.request("HEAD", "/bytes/1234")
        r = c.read_response("HEAD")
        assert r.status == 200
        assert r.header("content-length") == "1234"
        assert not r.has("transfer-encoding")
        assert not c.data_pending(0.3), "bytes after the head of a HEAD response"
        c.request("GET", "/echo?after-head")
        r2 = c.read_response()
        assert r2.status == 200 and r2.json()["target"] == "/echo?after-head"
    assert [r["method"] for r in upstream.requests] == ["HEAD", "GET"]


def test_head_of_chunked_resource_has_no_body(sluice, upstream):
    with sluice.client() as c:
        c.request("HEAD", "/chunked/5000")
        r = c.read_response("HEAD")
        assert r.status == 200
        assert not c.data_pending(0.3), "bytes after the head of a HEAD response"
        c.request("GET", "/chunked/10")
        r2 = c.read_response()
        assert r2.status == 200 and r2.body == pattern_bytes(10)


def test_204_and_304_have_no_body(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("GET", "/status/204") + build_request("GET", "/status/304")
               + build_request("GET", "/echo?third"))
        r1 = c.read_response()
        assert r1.status == 204
        assert not r1.has("transfer-encoding")
        assert r1.header("content-length") in (None, "0")
        r2 = c.read_response()
        assert r2.status == 304
        assert not r2.has("transfer-encoding")
        r3 = c.read_response()
        assert r3.status == 200 and r3.json()["target"] == "/echo?third"
        assert not c.data_pending(0.2)


def test_status_codes_pass_through(sluice, upstream):
    for status in (201, 404, 418, 500, 503):
        r = sluice.get(f"/status/{status}")
        assert r.status == status
        assert r.body == f"status {status}\n".encode()
        assert r.header("x-upstream") == "up1"


# ------------------------------------------------------------------------------ response framing

def test_chunked_response_passes_through(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/chunked/100000")
        r = c.read_response()
        assert r.status == 200
        assert r.body == pattern_bytes(100000)
        c.request("GET", "/echo?after")
        assert c.read_response().status == 200


def test_close_delimited_response(sluice, upstream):
    """An upstream response framed by its close reaches an HTTP/1.1 client complete, with a
    framing the client can rely on."""
    with sluice.client() as c:
        c.request("GET", "/close-delimited/70000")
        r = c.read_response()
        assert r.status == 200
        assert r.complete
        assert r.body == pattern_bytes(70000)
        if r.framing == "close":
            assert c.is_closed(2)


# ------------------------------------------------------------------------------ Connection: close

def test_connection_close_from_client(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/echo", [("Connection", "close")])
        r = c.read_response()
        assert r.status == 200
        assert "close" in r.connection_tokens()
        assert hv(r.json()["headers"], "connection") == []
        assert c.is_closed(2), "the gateway kept the connection open after Connection: close"


def test_connection_close_after_pipelined_requests(sluice, upstream):
    """Requests after one with Connection: close are not answered."""
    with sluice.client() as c:
        c.send(build_request("GET", "/echo?a") + build_request("GET", "/echo?b", [("Connection", "close")])
               + build_request("GET", "/echo?c"))
        assert c.read_response().json()["target"] == "/echo?a"
        r = c.read_response()
        assert r.json()["target"] == "/echo?b"
        assert "close" in r.connection_tokens()
        assert c.is_closed(2)
        assert c.buf == b""
    assert [r["target"] for r in upstream.requests] == ["/echo?a", "/echo?b"]


# ------------------------------------------------------------------------------ HTTP/1.0

def test_http10_client_closes_by_default(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/echo", version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200
        assert r.json()["target"] == "/echo"
        assert c.is_closed(2), "an HTTP/1.0 request without keep-alive must end the connection"


def test_http10_client_without_host(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/echo?nohost", version="HTTP/1.0", host=None)
        r = c.read_response()
        assert r.status == 200
        assert r.json()["target"] == "/echo?nohost"


def test_http10_client_gets_no_chunked_encoding(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/chunked/50000", version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200
        assert not r.has("transfer-encoding"), r.headers
        assert r.framing in ("content-length", "close")
        assert r.body == pattern_bytes(50000)
        assert c.is_closed(2)


def test_http10_keep_alive(sluice, upstream):
    with sluice.client() as c:
        c.request("GET", "/bytes/100", [("Connection", "keep-alive")], version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200 and r.body == pattern_bytes(100)
        assert "keep-alive" in r.connection_tokens(), r.headers
        assert not c.is_closed(0.3)
        c.request("POST", "/echo", [("Connection", "keep-alive")], body=b"ten bytes!",
                  version="HTTP/1.0")
        r2 = c.read_response()
        assert r2.status == 200
        assert echo_body(r2) == b"ten bytes!"
        assert "keep-alive" in r2.connection_tokens()
        assert not c.is_closed(0.3)


def test_http10_keep_alive_with_unframed_body_closes(sluice, upstream):
    """A chunked upstream response to an HTTP/1.0 keep-alive client: without chunked coding its
    end can only be marked by the close (or by a Content-Length)."""
    with sluice.client() as c:
        c.request("GET", "/chunked/3000", [("Connection", "keep-alive")], version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200
        assert not r.has("transfer-encoding")
        assert r.body == pattern_bytes(3000)
        if r.framing == "close":
            assert "keep-alive" not in r.connection_tokens()


def test_http10_post_body(sluice, upstream):
    with sluice.client() as c:
        c.request("POST", "/echo", body=b"\x00\x01binary", version="HTTP/1.0")
        r = c.read_response()
        assert r.status == 200
        assert echo_body(r) == b"\x00\x01binary"


# ------------------------------------------------------------------------------ concurrency

def test_concurrent_clients(sluice, upstream):
    results = []
    errors = []

    def worker(i):
        try:
            with sluice.client(timeout=10) as c:
                for j in range(5):
                    c.request("GET", f"/echo?c={i}&r={j}")
                    r = c.read_response()
                    results.append((r.status, r.json()["target"] == f"/echo?c={i}&r={j}"))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    assert len(results) == 50
    assert all(s == 200 and ok for s, ok in results)
