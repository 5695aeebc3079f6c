"""Streaming with backpressure both ways (gateway memory stays far below the size of what goes
through), a client that leaves in the middle of a response, an upstream that closes in the
middle of one, a client that half-closes."""

import hashlib
import os
import threading
import time

from rawhttp import IncompleteResponse, build_request
from upstream import iter_pattern, pattern_bytes

MB = 1024 * 1024


def pattern_sha256(n):
    h = hashlib.sha256()
    for block in iter_pattern(n):
        h.update(block)
    return h.hexdigest()


def test_large_response_to_slow_reader_bounded_memory(sluice, upstream):
    n = 50 * MB
    base = sluice.rss_kb()
    peak = base
    h = hashlib.sha256()
    total = 0
    with sluice.client(timeout=20, rcvbuf=64 * 1024) as c:
        c.request("GET", f"/bytes/{n}")
        r = c.read_head()
        assert r.status == 200
        assert r.header("content-length") == str(n)
        # slow phase: ~2 MB over 1.5 s, while the upstream could send 50 MB in a fraction of it
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            data = c.recv_some(32 * 1024)
            assert data, "connection closed early"
            h.update(data)
            total += len(data)
            peak = max(peak, sluice.rss_kb())
            time.sleep(0.02)
        slow_total = total
        # fast phase: the rest
        while total < n:
            data = c.recv_some(1 * MB)
            assert data, f"connection closed after {total} bytes"
            h.update(data)
            total += len(data)
        assert total == n
        assert h.hexdigest() == pattern_sha256(n)
        # the connection is still good
        c.request("GET", "/echo?after")
        assert c.read_response().status == 200
    assert slow_total < 10 * MB, slow_total
    growth_mb = (peak - base) / 1024
    assert growth_mb < 16, f"gateway RSS grew by {growth_mb:.1f} MB during a 50 MB response to a slow reader"


def test_large_chunked_response_to_slow_reader_bounded_memory(sluice, upstream):
    n = 20 * MB
    base = sluice.rss_kb()
    peak = base
    with sluice.client(timeout=20, rcvbuf=64 * 1024) as c:
        c.request("GET", f"/chunked/{n}")
        r = c.read_head()
        assert r.status == 200
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            peak = max(peak, sluice.rss_kb())
            time.sleep(0.05)
        # then read everything, chunk-decoded
        c.buf[0:0] = b""
        body = bytearray()
        while True:
            line = c._read_line()
            size = int(line.split(b";")[0], 16)
            if size == 0:
                assert c._read_line() == b""
                break
            body += c.read_exact(size)
            assert c.read_exact(2) == b"\r\n"
    assert len(body) == n
    assert hashlib.sha256(body).hexdigest() == pattern_sha256(n)
    assert (peak - base) / 1024 < 12, (base, peak)


def test_large_upload_to_slow_upstream_bounded_memory(sluice_factory, upstream):
    """Backpressure the other way: the upstream does not read the body for 2 s; the gateway
    neither buffers the 40 MB body nor keeps reading it from the client."""
    gw = sluice_factory(upstream, server={"max_request_body_bytes": 100 * MB})
    n = 40 * MB
    body = os.urandom(n)
    sent = [0]
    errors = []
    c = gw.client(timeout=20)

    def send():
        try:
            c.send(build_request("POST", "/drain-after/2000", [("Content-Length", str(n))]))
            for i in range(0, n, 256 * 1024):
                c.send(body[i:i + 256 * 1024])
                sent[0] += len(body[i:i + 256 * 1024])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    base = gw.rss_kb()
    t = threading.Thread(target=send)
    t.start()
    try:
        peak = base
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            peak = max(peak, gw.rss_kb())
            time.sleep(0.05)
        sent_while_stalled = sent[0]
        t.join(20)
        assert not t.is_alive()
        assert errors == []
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200
    assert r.json()["body_len"] == n
    assert r.json()["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert sent_while_stalled < 20 * MB, f"the client could send {sent_while_stalled} bytes to a stalled upstream"
    assert (peak - base) / 1024 < 16, f"gateway RSS grew by {(peak - base) / 1024:.1f} MB"


def test_client_leaves_in_the_middle_of_a_large_response(sluice, upstream):
    for how in ("close", "reset"):
        with sluice.client(timeout=10) as c:
            c.request("GET", f"/bytes/{50 * MB}")
            r = c.read_head()
            assert r.status == 200
            got = 0
            while got < 200 * 1024:
                data = c.recv_some(65536)
                assert data
                got += len(data)
            if how == "reset":
                c.reset()
            else:
                c.close()
        # the upstream connection that was streaming it is given up
        streaming = upstream.connections[-1]
        assert upstream.wait_for(lambda u: not streaming.open, 5), f"{how}: upstream connection left open"
        assert sluice.alive()
        r = sluice.get("/echo?after")
        assert r.status == 200 and r.json()["target"] == "/echo?after"
        assert sluice.get(f"/bytes/{MB}").body == pattern_bytes(MB)


def test_client_leaves_while_waiting_for_the_upstream(sluice, upstream):
    """A client that resets its connection while its request is at the upstream: the gateway
    gives up the upstream request (closes that connection) and keeps serving."""
    with sluice.client() as c:
        c.request("GET", "/slow/3000")
        assert upstream.wait_for(lambda u: u.request_count == 1, 3)
        c.reset()
    waiting = upstream.connections[-1]
    assert upstream.wait_for(lambda u: not waiting.open, 1.5), "upstream request not given up"
    assert sluice.get("/echo").status == 200


def test_client_half_closes_while_waiting_for_the_upstream(sluice, upstream):
    """A FIN after a complete request is a half-close: the response is still delivered."""
    with sluice.client() as c:
        c.request("GET", "/slow/300")
        assert upstream.wait_for(lambda u: u.request_count == 1, 3)
        c.shutdown_write()
        r = c.read_response()
        assert r.status == 200 and r.json()["slept_ms"] == 300
        assert c.is_closed(3)


def test_client_leaves_in_the_middle_of_an_upload(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("POST", "/echo", [("Content-Length", str(10 * MB))]))
        c.send(os.urandom(MB))
        assert upstream.wait_for(lambda u: u.progress() > 0, 3)
    uploading = upstream.connections[-1]
    assert upstream.wait_for(lambda u: not uploading.open, 3)
    r = sluice.request("POST", "/echo", body=b"fine")
    assert r.status == 200 and r.json()["body_text"] == "fine"


def test_upstream_closes_in_the_middle_of_a_response(sluice, upstream):
    with sluice.client(timeout=5) as c:
        c.request("GET", "/close-mid")
        r = c.read_response(allow_incomplete=True)
        assert r.status == 200
        assert r.header("content-length") == "100000"
        assert not r.complete, "the client was told the truncated response is complete"
        assert len(r.body) < 100000
        assert r.body == pattern_bytes(len(r.body))
        assert c.is_closed(3)
    # the gateway keeps serving
    assert sluice.get("/echo").status == 200
    assert sluice.get("/bytes/5000").body == pattern_bytes(5000)


def test_upstream_closes_in_the_middle_of_a_chunked_response(sluice, upstream):
    """The client must not receive the last chunk: that would turn the truncation into a
    complete-looking response."""
    with sluice.client(timeout=5) as c:
        c.request("GET", "/close-mid?chunked=1")
        try:
            r = c.read_response()
        except IncompleteResponse as e:
            r = e.response
        except EOFError:
            r = None
        assert r is not None
        assert r.status == 200
        assert not r.complete, f"truncated upstream response delivered as complete: {r}"
        assert c.is_closed(3)
    assert sluice.get("/echo").status == 200


def test_upstream_closes_mid_response_on_kept_alive_connection(sluice, upstream):
    with sluice.client(timeout=5) as c:
        c.request("GET", "/echo?first")
        assert c.read_response().status == 200
        c.request("GET", "/close-mid")
        r = c.read_response(allow_incomplete=True)
        assert r.status == 200 and not r.complete
        assert c.is_closed(3)
