"""Robustness: resources a hostile client must not hold without bound, on both listeners
(issue "one meaning per request, bounded resources"). Each test is named after what it bounds;
README.md, "Robustness", says what the gateway does with each."""

import socket
import time

import pytest

from conftest import (TIMER_SLACK_S, is_asan_build, metric_sum, rss_tolerance_kb, scaled,
                      settled_rss_kb)

# Latency, memory and descriptor bounds under load: measured without other tests beside them.
pytestmark = pytest.mark.alone


@pytest.fixture(autouse=True)
def _asan_small_quarantine(asan_small_quarantine):
    """A smaller ASan quarantine for RSS checks (conftest.asan_small_quarantine): freed memory
    waits there, and 40,000 answers free a lot of it."""


# What one client's unread answers may add to the gateway's memory (a few of its buffers; the
# ASan build keeps freed memory in its quarantine, hence its own tolerance).
RSS_BOUND_KB = scaled(4 * 1024, rss_tolerance_kb())


def small_receive_buffer_client(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


def answered_200(s: socket.socket, request: bytes = b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n"
                 ) -> bool:
    """Sends `request` on a keep-alive connection and reads its whole answer (head and
    Content-Length body, which may come in several reads): True when it is a 200."""
    s.settimeout(5)
    s.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            return False
        body += chunk
    return head.startswith(b"HTTP/1.1 200")


def send_without_reading(s: socket.socket, data: bytes, seconds: float = 5) -> int:
    """Writes as much of `data` as the peer takes within `seconds`, reading nothing back."""
    s.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += s.send(data[sent:sent + 65536])
        except BlockingIOError:
            time.sleep(0.01)
    return sent


def test_admin_pipelined_metrics_unread_stay_bounded(sluice_factory, upstream):
    """9,000 pipelined GET /metrics from a client that never reads: the admin listener stops
    reading once its unsent answers pass its high-water mark, so memory does not grow with the
    number of requests (before: +52 MB, linearly)."""
    gw = sluice_factory(upstream)
    base = settled_rss_kb(gw)
    s = small_receive_buffer_client(gw.admin_port)
    send_without_reading(s, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n" * 9000)
    grown = settled_rss_kb(gw, settle=1.0) - base
    s.close()
    # The kernel's socket buffers fill, then the gateway stops reading: far from 9,000 answers
    # held in its memory.
    assert grown < RSS_BOUND_KB, f"RSS grew by {grown} kB"
    assert gw.admin_get("/healthz")[0] == 200


def test_admin_trickled_head_hits_the_head_deadline(sluice_factory, upstream):
    """A client sending one byte of a head every 0.3 s is closed at request_header_timeout from
    its first byte (before: each byte reset a 30 s idle timer, so a byte every 20 s held the
    connection forever)."""
    gw = sluice_factory(upstream, server={"request_header_timeout": "1s", "idle_timeout": "10s"})
    s = socket.create_connection(("127.0.0.1", gw.admin_port))
    s.settimeout(0.3)
    start = time.monotonic()
    closed_at = None
    for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
        try:
            s.send(bytes([byte]))
            if s.recv(65536) == b"":
                closed_at = time.monotonic() - start
                break
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            closed_at = time.monotonic() - start
            break
    s.close()
    assert closed_at is not None, "the trickling client was never closed"
    assert 0.9 < closed_at < 1 + TIMER_SLACK_S + 0.5, closed_at


def test_admin_unread_answers_do_not_reset_the_idle_timer(sluice_factory, upstream):
    """A client that asks for /metrics again and again without reading the answers is closed
    idle_timeout after the first answer the kernel could not take, whatever it keeps sending
    (the kernel's buffers take a few megabytes of answers first; before, every request read
    reset a 30 s timer, so it stayed open)."""
    gw = sluice_factory(upstream, server={"idle_timeout": "1s", "request_header_timeout": "1s"})
    s = small_receive_buffer_client(gw.admin_port)
    s.setblocking(False)
    request = b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"
    start = time.monotonic()
    closed_at = None
    while time.monotonic() - start < 6:
        try:
            s.send(request * 20)
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            closed_at = time.monotonic() - start
            break
        time.sleep(0.1)
    s.close()
    assert closed_at is not None, "the client that never reads was never closed"
    assert closed_at < 5.5, closed_at
    assert gw.admin_get("/healthz")[0] == 200


def test_local_answers_on_a_pipelined_connection_wait_for_the_client(sluice_factory, upstream):
    """40,000 pipelined requests answered by the gateway itself (404: no route) from a client
    that never reads: the next request is parsed only once the answers before it have left, as
    for forwarded ones, so memory stays flat (before: +14 MB)."""
    gw = sluice_factory(upstream, routes=[{"name": "api", "match": {"path_prefix": "/echo"},
                                           "upstream": "app"}])
    request = b"GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n"
    base = settled_rss_kb(gw)
    s = small_receive_buffer_client(gw.port)
    send_without_reading(s, request * 10000)
    first = settled_rss_kb(gw, settle=1.0)
    send_without_reading(s, request * 30000)
    grown = settled_rss_kb(gw, settle=1.0) - base
    rest = settled_rss_kb(gw) - first
    s.close()
    # The 30,000 after the first 10,000 add nothing: nothing grows with the requests. (The ASan
    # build's RSS climbs by a plateau of its own over the first thousands of answers, whatever
    # they hold, so there only the growth after them is bounded.)
    assert rest < RSS_BOUND_KB, f"RSS grew by {rest} kB over the last 30,000 requests"
    if not is_asan_build():
        assert grown < RSS_BOUND_KB, f"RSS grew by {grown} kB"
    assert gw.get("/echo").status == 200


def test_send_timeout_closes_a_client_that_stops_reading(sluice_factory, upstream):
    """A client that stops reading a large answer (SO_RCVBUF 4096, never reads) is closed
    send_timeout after its bytes stopped leaving, with the upstream connection that fed it
    (before: both held for as long as the client stayed)."""
    gw = sluice_factory(upstream, server={"send_timeout": "1s", "idle_timeout": "30s"},
                        upstream_options={"response_timeout": "30s"})
    s = small_receive_buffer_client(gw.port)
    s.sendall(b"GET /bytes/200000000 HTTP/1.1\r\nHost: a\r\n\r\n")
    start = time.monotonic()
    time.sleep(0.5)
    assert upstream.open_connection_count == 1
    closed = None
    while time.monotonic() - start < 8:
        if upstream.open_connection_count == 0:
            closed = time.monotonic() - start
            break
        time.sleep(0.05)
    s.close()
    assert closed is not None, "the upstream connection of a stalled client stayed open"
    assert closed < 1 + TIMER_SLACK_S + 2.5, closed
    assert metric_sum(gw, "sluice_client_timeouts_total", kind="send") == 1
    assert gw.get("/echo").status == 200


def test_request_body_timeout_bounds_a_trickled_body(sluice_factory, upstream):
    """A request body that trickles in (a byte every 0.2 s, each resetting the idle timer) gets
    408 at request_body_timeout from its head, and its upstream connection is closed."""
    gw = sluice_factory(upstream, server={"request_body_timeout": "1s", "idle_timeout": "10s"})
    s = socket.create_connection(("127.0.0.1", gw.port))
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n")
    s.settimeout(0.2)
    start = time.monotonic()
    answer = b""
    while time.monotonic() - start < 6 and b"\r\n\r\n" not in answer:
        try:
            s.send(b"x")
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    took = time.monotonic() - start
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 0.9 < took < 1 + TIMER_SLACK_S + 0.5, took
    assert metric_sum(gw, "sluice_client_timeouts_total", kind="request_body") == 1
    deadline = time.monotonic() + 2
    while upstream.open_connection_count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.open_connection_count == 0


def refused_at_once(port: int) -> bool:
    """True when a new connection is closed by the gateway before it answers a request."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(2)
    try:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
        return s.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.close()


def test_max_connections_refuses_beyond_the_cap(sluice_factory, upstream):
    """max_connections = 5: the sixth client connection is closed at once and counted; once one
    of the five left, a new one is served; the admin listener keeps answering."""
    gw = sluice_factory(upstream, server={"max_connections": 5})
    held = []
    for _ in range(5):
        c = socket.create_connection(("127.0.0.1", gw.port))
        assert answered_200(c)
        held.append(c)
    assert refused_at_once(gw.port)
    assert metric_sum(gw, "sluice_connections_refused_total", reason="max_connections") == 1
    assert gw.admin_get("/healthz")[0] == 200
    held.pop().close()
    deadline = time.monotonic() + 2
    while metric_sum(gw, "sluice_connections_open") > 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.get("/echo").status == 200
    for c in held:
        c.close()


def test_max_connections_per_client_refuses_one_address_beyond_its_share(sluice_factory,
                                                                           upstream):
    """max_connections_per_client = 3: a fourth connection from 127.0.0.1 is refused, while
    another address (127.0.0.2) is still served."""
    gw = sluice_factory(upstream, server={"max_connections_per_client": 3})
    held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(3)]
    for c in held:
        assert answered_200(c)
    assert refused_at_once(gw.port)
    assert metric_sum(gw, "sluice_connections_refused_total",
                      reason="max_connections_per_client") == 1
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.connect(("127.0.0.1", gw.port))
    assert answered_200(other)
    other.close()
    for c in held:
        c.close()


def test_descriptor_reserve_keeps_admin_and_upstreams_working(sluice_factory, upstream):
    """With 256 open files, 400 client connections: those that would take the descriptors kept
    for the rest are closed at once and counted, and the admin listener and a forwarded request
    on a connection already open (it needs an upstream descriptor) keep working."""
    gw = sluice_factory(upstream, nofile=256)
    first = socket.create_connection(("127.0.0.1", gw.port))
    assert answered_200(first)
    crowd = []
    for _ in range(400):
        try:
            crowd.append(socket.create_connection(("127.0.0.1", gw.port), timeout=2))
        except OSError:
            break
    deadline = time.monotonic() + 3
    while (metric_sum(gw, "sluice_connections_refused_total", reason="descriptors") == 0
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert metric_sum(gw, "sluice_connections_refused_total", reason="descriptors") > 0
    assert metric_sum(gw, "sluice_connections_open") <= 256 - 64
    assert gw.admin_get("/metrics")[0] == 200
    assert answered_200(first, b"GET /echo?again HTTP/1.1\r\nHost: a\r\n\r\n")
    for c in crowd:
        c.close()
    first.close()
