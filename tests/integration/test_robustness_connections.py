"""Robustness: many connections at once. 10,000 idle keep-alive connections held open (after one
request each), and 1,000 clients that each send a malformed request. The gateway accepts and
answers them all, keeps answering a fresh client quickly, reports the connections it holds, and
its memory is back at its baseline once they are gone.

The clients are non-blocking sockets driven by selectors from the test process (the open-files
limits of the test process and of the gateway are raised for it: raise_nofile() and
sluice_factory(nofile=...)). Figures are printed (pytest -s) and summed up in README.md,
"Robustness: what was tried and what held"."""

import errno
import resource
import selectors
import socket
import time
from collections import Counter

import pytest

from conftest import (UNAFFECTED_MAX_S, Load, check_unaffected, metric_sum, raise_nofile,
                      report_figures, rss_tolerance_kb, scaled, settled_rss_kb,
                      wait_connections_open)

# Latency, memory and descriptor bounds under load: measured without other tests beside them.
pytestmark = pytest.mark.alone


@pytest.fixture(autouse=True)
def _asan_small_quarantine(asan_small_quarantine):
    """A smaller ASan quarantine for RSS checks (conftest.asan_small_quarantine)."""


RSS_TOLERANCE_KB = rss_tolerance_kb()  # see conftest.RSS_TOLERANCE_KB


@pytest.fixture
def nofile():
    """raise(n): raises this process's open-files soft limit (restored at teardown)."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield raise_nofile
    resource.setrlimit(resource.RLIMIT_NOFILE, old)


class Conn:
    def __init__(self, raw):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.raw = raw
        self.sent = 0
        self.buf = b""
        self.eof = False
        self.error = None


def response_status(buf):
    head = buf.split(b"\r\n\r\n", 1)[0]
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return -1


def head_of(buf):
    """The response head, each line ending in CRLF."""
    return buf.split(b"\r\n\r\n", 1)[0] + b"\r\n"


def response_complete(buf):
    """A whole response with a Content-Length (what the gateway and upstream.py send here)."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def drive(port, conns, *, until_eof, timeout=20.0, window=100):
    """For each Conn: connects (at most `window` connecting or waiting at once), sends its
    request and reads the response: until EOF (until_eof) or until the response is complete
    (the connection then stays open). The caller closes them (close_all)."""
    sel = selectors.DefaultSelector()
    pending = list(reversed(conns))
    active = 0
    deadline = time.monotonic() + timeout

    def finish(c):
        nonlocal active
        sel.unregister(c.sock)
        active -= 1

    while pending or active:
        while pending and active < window:
            c = pending.pop()
            err = c.sock.connect_ex(("127.0.0.1", port))
            assert err in (0, errno.EINPROGRESS), f"connect: {errno.errorcode.get(err, err)}"
            sel.register(c.sock, selectors.EVENT_WRITE, c)
            active += 1
        if time.monotonic() > deadline:
            left = [c for c in conns if c.sock.fileno() >= 0 and not c.eof and
                    (until_eof or not response_complete(c.buf))]
            pytest.fail(f"{active} connections still waiting after {timeout}s "
                        f"(e.g. {[(c.raw[:60], c.buf[:100]) for c in left[:3]]})")
        for key, events in sel.select(0.5):
            c = key.data
            if events & selectors.EVENT_WRITE:
                try:
                    c.sent += c.sock.send(c.raw[c.sent:])
                except OSError as e:
                    c.error = repr(e)  # the gateway may answer and close before reading it all
                    c.sent = len(c.raw)
                if c.sent >= len(c.raw):
                    sel.modify(c.sock, selectors.EVENT_READ, c)
                continue
            try:
                data = c.sock.recv(65536)
            except ConnectionResetError as e:
                c.error, data = repr(e), b""
            if not data:
                c.eof = True
                finish(c)
            else:
                c.buf += data
                if not until_eof and response_complete(c.buf):
                    finish(c)
    sel.close()
    return conns


def close_all(conns):
    for c in conns:
        c.sock.close()


def fresh_client_latencies(gw, n=20):
    out = []
    for i in range(n):
        t0 = time.monotonic()
        r = gw.get(f"/status/200?fresh={i}")
        out.append(time.monotonic() - t0)
        assert r.status == 200, r
    return out


# ------------------------------------------------------------------------------ 10,000 idle

def test_ten_thousand_idle_keepalive_connections(sluice_factory, upstream_process_factory, nofile):
    """10,000 connections, one request each (GET through the gateway to the upstream, at most 100
    in flight), then held open idle; twice (the first round is the warm-up). The gateway (2
    workers) accepts them all, sluice_connections_open says 10,000, a fresh client is answered
    at once, and once they are closed connections_open is 0 and RSS is back at the baseline."""
    n = 10_000
    need = n + 1000
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= need, \
        f"the open-files hard limit ({hard}) is below {need}: raise it (ulimit -Hn) to run this"
    nofile(need + 1000)  # this process: 10,000 clients, the fixtures' sockets
    up = upstream_process_factory("app")
    gw = sluice_factory(up.address, workers=2, nofile=need + 1000,
                        server={"idle_timeout": "120s"})
    with open(f"/proc/{gw.pid}/limits") as f:
        limits = [l for l in f if l.startswith("Max open files")][0].split()
    assert int(limits[3]) >= need, f"the gateway's open-files limit: {limits}"
    assert fresh_client_latencies(gw, 5)
    idle_kb = settled_rss_kb(gw)
    req = b"GET /status/200 HTTP/1.1\r\nHost: many.test\r\n\r\n"

    def round_trip():
        conns = [Conn(req) for _ in range(n)]
        try:
            t0 = time.monotonic()
            drive(gw.port, conns, until_eof=False, timeout=scaled(60, 180))
            opened_s = time.monotonic() - t0
            got = Counter(response_status(c.buf) for c in conns)
            assert got == {200: n}, got
            assert not any(c.eof for c in conns), "a connection was closed after its response"
            seen_open = wait_connections_open(gw, n, timeout=5)
            fresh = fresh_client_latencies(gw)
            peak = gw.rss_kb()
            assert gw.alive()
        finally:
            t1 = time.monotonic()
            close_all(conns)
        left = wait_connections_open(gw, 0, timeout=scaled(10, 30))
        closed_s = time.monotonic() - t1
        return dict(opened_s=round(opened_s, 2), open_metric=seen_open,
                    fresh_ms=latency_summary_s(fresh), peak_kb=peak, closed_s=round(closed_s, 2),
                    open_after_close=left)

    first = round_trip()  # warm-up: the allocator's arenas grow to what 10,000 connections need
    base_kb = settled_rss_kb(gw)
    second = round_trip()
    after_kb = settled_rss_kb(gw)
    figures = dict(first=first, second=second, rss_idle_kb=idle_kb, rss_base_kb=base_kb,
                   rss_after_kb=after_kb,
                   kb_per_connection=round((second["peak_kb"] - idle_kb) / n, 1))
    report_figures("10,000 idle connections", **figures)
    for r in (first, second):
        assert r["open_metric"] == n, figures
        assert r["open_after_close"] == 0, figures
        assert r["fresh_ms"]["max"] <= UNAFFECTED_MAX_S * 1000, figures
    assert after_kb <= base_kb + RSS_TOLERANCE_KB, figures


def latency_summary_s(seconds):
    ds = sorted(seconds)
    return {"n": len(ds), "p50": round(ds[len(ds) // 2] * 1000, 1), "max": round(ds[-1] * 1000, 1)}


# ------------------------------------------------------------------------------ 1,000 malformed

MAX_HEAD = 4096
MAX_BODY = 1000

MALFORMED = {
    # name: (raw request, status)
    "garbage": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400),
    "no_method": (b" / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "bad_chunk_size": (b"POST /status/200 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\nabc\r\n0\r\n\r\n", 400),
    "cl_and_te": (b"POST /status/200 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    "head_too_large": (b"GET /status/200 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD)
                       + b"\r\n\r\n", 431),
    "body_too_large": (b"POST /status/200 HTTP/1.1\r\nHost: x\r\nContent-Length: "
                       + str(10 * MAX_BODY).encode() + b"\r\n\r\n" + b"b" * 100, 413),
    "nul_in_value": (b"GET /status/200 HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    "nul_in_target": (b"GET /status/2\x0000 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "bare_cr": (b"GET /status/200 HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400),
    "two_content_lengths": (b"POST /status/200 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                            b"Content-Length: 2\r\n\r\nab", 400),
}


def test_thousand_malformed_clients(sluice_factory, upstream_process_factory, nofile):
    """1,000 clients (200 at a time), each with one malformed request from MALFORMED, while a
    good client keeps sending requests: each malformed one gets its 4xx with Connection: close
    and then the close; the good client sees only 200s at its usual latency; twice (the first
    round is the warm-up), then RSS is back at the baseline."""
    n = 1000
    nofile(4096)
    up = upstream_process_factory("app")
    gw = sluice_factory(up.address, workers=2, nofile=4096,
                        server={"max_request_header_bytes": MAX_HEAD,
                                "max_request_body_bytes": MAX_BODY})
    names = sorted(MALFORMED)
    plan = [names[i % len(names)] for i in range(n)]
    kinds = {"good": (b"GET /status/200 HTTP/1.1\r\nHost: good.test\r\nX-N: {n}\r\n\r\n", 2)}

    def one_round(count):
        load = Load(gw.port, kinds, duration=30).start()
        time.sleep(0.1)
        t0 = time.monotonic()
        conns = [Conn(MALFORMED[p][0]) for p in plan[:count]]
        try:
            drive(gw.port, conns, until_eof=True, window=200)
        finally:
            close_all(conns)
        took = time.monotonic() - t0
        load.end_at(time.monotonic() + 0.1)
        recs = load.results()
        wrong = [(p, response_status(c.buf), c.buf[:120], c.error)
                 for p, c in zip(plan, conns) if response_status(c.buf) != MALFORMED[p][1]]
        assert not wrong, f"{len(wrong)} of {count} wrong answers, e.g. {wrong[:5]}"
        not_closing = [p for p, c in zip(plan, conns)
                       if b"\r\nconnection: close\r\n" not in head_of(c.buf).lower()]
        assert not not_closing, f"answered without Connection: close: {Counter(not_closing)}"
        assert all(c.eof for c in conns)
        return dict(seconds=round(took, 2), good=check_unaffected(recs, "good", 200))

    first = one_round(n)  # warm-up: the same round
    assert wait_connections_open(gw, 0) == 0
    base_kb = settled_rss_kb(gw)
    second = one_round(n)
    assert wait_connections_open(gw, 0) == 0
    after_kb = settled_rss_kb(gw)
    assert gw.alive()
    statuses = dict(Counter(MALFORMED[p][1] for p in plan))
    figures = dict(clients=n, statuses=statuses, warm_up=first, measured=second,
                   rss_base_kb=base_kb, rss_after_kb=after_kb,
                   requests_400=metric_sum(gw, "sluice_requests_total", status="400"))
    report_figures("1,000 malformed clients", **figures)
    assert after_kb <= base_kb + RSS_TOLERANCE_KB, figures
