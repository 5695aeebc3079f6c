"""Client-side limits and protocol errors: 431, 413, 408, idle_timeout, malformed requests
(400 and close), request smuggling attempts (Content-Length with Transfer-Encoding, two
Content-Lengths)."""

import json
import time

import pytest

from conftest import TIMER_SLACK_S
from rawhttp import build_request


def assert_problem(r, status):
    assert r.status == status, r
    assert r.header("content-type").startswith("application/problem+json"), r
    assert json.loads(r.body)["status"] == status


def refused_and_closed(gw, raw, status, upstream=None, timeout=3.0):
    """Sends raw bytes; expects `status` (problem+json), then the connection closed."""
    with gw.client(timeout=timeout + 2) as c:
        c.send(raw)
        r = c.read_response()
        assert_problem(r, status)
        assert "close" in r.connection_tokens(), r.headers
        assert c.is_closed(timeout), "the connection stayed open after the error response"
    if upstream is not None:
        assert upstream.request_count == 0, upstream.stats()["requests"]
    return r


# ------------------------------------------------------------------------------ 431

@pytest.fixture
def small_head(sluice_factory, upstream):
    return sluice_factory(upstream, server={"max_request_header_bytes": 2048})


def test_header_too_large_431(small_head, upstream):
    refused_and_closed(small_head, build_request("GET", "/echo", [("X-Big", "a" * 4000)]), 431,
                       upstream)


def test_many_headers_too_large_431(small_head, upstream):
    headers = [(f"X-H{i}", "v" * 40) for i in range(60)]
    refused_and_closed(small_head, build_request("GET", "/echo", headers), 431, upstream)


def test_request_line_too_large_431(small_head, upstream):
    refused_and_closed(small_head, build_request("GET", "/echo?" + "q" * 4000), 431, upstream)


def test_header_under_limit_passes(small_head, upstream):
    r = small_head.get("/echo", [("X-Big", "a" * 1000)])
    assert r.status == 200
    assert ["X-Big", "a" * 1000] in r.json()["headers"]


# ------------------------------------------------------------------------------ 413

@pytest.fixture
def small_body(sluice_factory, upstream):
    return sluice_factory(upstream, server={"max_request_body_bytes": 1000})


def test_body_too_large_content_length_413(small_body, upstream):
    # answered from the head alone: the body is never sent
    refused_and_closed(small_body, build_request("POST", "/echo", [("Content-Length", "2000")]),
                       413, upstream)


def test_body_too_large_content_length_with_body_413(small_body, upstream):
    refused_and_closed(small_body, build_request("POST", "/echo", body=b"x" * 2000), 413)


def test_body_too_large_chunked_413(small_body, upstream):
    raw = build_request("POST", "/echo", [("Transfer-Encoding", "chunked")])
    raw += b"".join(b"1f4\r\n" + b"y" * 500 + b"\r\n" for _ in range(3)) + b"0\r\n\r\n"
    with small_body.client() as c:
        c.send(raw)
        r = c.read_response()
        assert_problem(r, 413)
        assert c.is_closed(3)
    # an upstream connection that got part of the body cannot be reused: it is closed
    assert upstream.wait_for(lambda u: all(not c.open for c in u.connections if c.requests), 3)


def test_body_too_large_with_expect_gets_no_100(small_body, upstream):
    with small_body.client() as c:
        c.send(build_request("PUT", "/echo", [("Content-Length", "5000"), ("Expect", "100-continue")]))
        r = c.read_response()
        assert r.status == 413, r  # not 100 Continue first
        assert c.is_closed(3)


def test_body_at_limit_passes(small_body, upstream):
    r = small_body.request("POST", "/echo", body=b"z" * 1000)
    assert r.status == 200 and r.json()["body_len"] == 1000
    with small_body.client() as c:
        c.request("POST", "/echo", [("Transfer-Encoding", "chunked")],
                  b"1f4\r\n" + b"a" * 500 + b"\r\n1f4\r\n" + b"b" * 500 + b"\r\n0\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.json()["body_len"] == 1000


# ------------------------------------------------------------------------------ 408

@pytest.fixture
def quick_header(sluice_factory, upstream):
    return sluice_factory(upstream, server={"request_header_timeout": "500ms", "idle_timeout": "5s"})


def test_partial_head_408(quick_header, upstream):
    with quick_header.client(timeout=5) as c:
        t0 = time.monotonic()
        c.send(b"GET /echo HTTP/1.1\r\nHost: sluice.test\r\nX-Partial: ")
        r = c.read_response()
        elapsed = time.monotonic() - t0
        assert_problem(r, 408)
        assert 0.4 <= elapsed < 0.5 + TIMER_SLACK_S, elapsed
        assert c.is_closed(3)
    assert upstream.request_count == 0


def test_slowloris_head_408(quick_header, upstream):
    """Bytes that keep trickling in do not extend request_header_timeout."""
    head = b"GET /echo HTTP/1.1\r\nHost: sluice.test\r\n" + b"".join(
        b"X-Slow-%d: %d\r\n" % (i, i) for i in range(50))
    with quick_header.client(timeout=5) as c:
        t0 = time.monotonic()
        got = None
        for i in range(0, len(head), 10):
            try:
                c.send(head[i:i + 10])
            except OSError:
                break
            if c.data_pending(0.1):
                break
            if time.monotonic() - t0 > 4:
                break
        r = c.read_response()
        elapsed = time.monotonic() - t0
        assert_problem(r, 408)
        assert elapsed < 0.5 + TIMER_SLACK_S, elapsed
    assert upstream.request_count == 0


def test_header_timeout_on_second_request_of_connection(quick_header, upstream):
    with quick_header.client(timeout=5) as c:
        c.request("GET", "/echo")
        assert c.read_response().status == 200
        time.sleep(0.7)  # idle (idle_timeout 5s) longer than request_header_timeout: fine
        c.send(b"GET /echo?second HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        r = c.read_response()
        assert_problem(r, 408)
        assert 0.4 <= time.monotonic() - t0 < 0.5 + TIMER_SLACK_S


def test_silent_connection_closed(quick_header, upstream):
    with quick_header.client(timeout=5) as c:
        assert c.is_closed(3), "a connection that never sent a byte was kept open"


# ------------------------------------------------------------------------------ idle_timeout

def test_idle_timeout_closes_idle_keep_alive_connection(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"idle_timeout": "500ms"})
    with gw.client() as c:
        c.request("GET", "/echo")
        assert c.read_response().status == 200
        t0 = time.monotonic()
        assert c.is_closed(0.5 + TIMER_SLACK_S), "idle connection not closed"
        assert time.monotonic() - t0 >= 0.35
        assert c.buf == b""


def test_idle_timeout_does_not_close_active_connection(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"idle_timeout": "500ms"})
    with gw.client() as c:
        for i in range(5):  # 1.25 s in all, never 500 ms idle
            c.request("GET", f"/echo?i={i}")
            assert c.read_response().status == 200
            time.sleep(0.25)


def test_idle_timeout_does_not_cut_slow_upstream(sluice_factory, upstream):
    """A request waiting for its response is not idle."""
    gw = sluice_factory(upstream, server={"idle_timeout": "500ms"})
    with gw.client() as c:
        c.request("GET", "/slow/1000")
        r = c.read_response()
        assert r.status == 200 and r.json()["slept_ms"] == 1000


# ------------------------------------------------------------------------------ malformed

MALFORMED = {
    "header_without_colon": b"GET /echo HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    "space_in_header_name": b"GET /echo HTTP/1.1\r\nHost: x\r\nX Y: z\r\n\r\n",
    "garbage_request_line": b"HELLO\r\n\r\n",
    "bad_version": b"GET /echo HTTP/1.x\r\nHost: x\r\n\r\n",
    "bad_content_length": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "negative_content_length": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "bad_chunk_size": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "http11_without_host": b"GET /echo HTTP/1.1\r\nX-A: b\r\n\r\n",
    "two_hosts": b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "nul_in_header": b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "bare_lf_in_header_value": b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_request_400_and_close(sluice, upstream, name):
    refused_and_closed(sluice, MALFORMED[name], 400, upstream)


def test_malformed_after_good_pipelined_request(sluice, upstream):
    with sluice.client() as c:
        c.send(build_request("GET", "/echo?good") + b"GET /echo HTTP/1.1\r\nHost: x\r\nBroken\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.json()["target"] == "/echo?good"
        r2 = c.read_response()
        assert_problem(r2, 400)
        assert c.is_closed(3)
    assert upstream.request_count == 1


def test_gateway_serves_after_errors(sluice, upstream):
    for raw in MALFORMED.values():
        with sluice.client() as c:
            c.send(raw)
            c.is_closed(3)
    assert sluice.get("/echo").status == 200


# ------------------------------------------------------------------------------ smuggling

def test_content_length_with_transfer_encoding_400(sluice, upstream):
    raw = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
    refused_and_closed(sluice, raw, 400, upstream)


def test_transfer_encoding_before_content_length_400(sluice, upstream):
    raw = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
           b"0\r\n\r\n")
    refused_and_closed(sluice, raw, 400, upstream)


def test_two_different_content_lengths_400(sluice, upstream):
    raw = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"
           b"hello!")
    refused_and_closed(sluice, raw, 400, upstream)


def test_content_length_list_400(sluice, upstream):
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!"
    refused_and_closed(sluice, raw, 400, upstream)


def test_transfer_encoding_not_ending_in_chunked_400(sluice, upstream):
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"
    refused_and_closed(sluice, raw, 400, upstream)
