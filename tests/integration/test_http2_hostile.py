"""HTTP/2 clients that attack the gateway's worker rather than the upstream (issue: closed to a
hostile HTTP/2 client).

- An HPACK bomb: one header block of some 147 KB (HEADERS + 8 CONTINUATION frames: a
  4,000-byte literal put in the dynamic table, then the one-byte reference to it, over and
  over), which decodes to some 590 MB. The gateway stops decoding a block once its decoded size
  is well past max_request_header_bytes (the stream is reset), and a client that sends a second
  one gets GOAWAY ENHANCE_YOUR_CALM. Measured: the worker's CPU per block, and the latency of
  another client's HTTP/1.1 requests on the same worker meanwhile.
- A header block that nghttp2 refuses (an uppercase field name) resets its stream and ends
  the request_header_timeout wait it started: the connection's other streams go on.

The bomb's test is marked alone: CPU and latency are measured, which other tests beside it
would disturb.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from hpack import Encoder
from hyperframe.frame import ContinuationFrame, HeadersFrame

from conftest import RawClient, metric_sum, scaled
from harness.h2client import ENHANCE_YOUR_CALM, PROTOCOL_ERROR, open_h2

FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's default
CONTINUATIONS = 8  # nghttp2 refuses a block of more CONTINUATION frames


def bomb_frames(sid: int, authority: str) -> bytes:
    """One request whose header block fills HEADERS and 8 CONTINUATION frames: the pseudo
    fields, x-bomb with a 4,000-byte value added to the dynamic table (index 62, the newest
    entry), then the indexed reference to it (0xBE) to the end of the block."""
    head = Encoder().encode([(":method", "GET"), (":scheme", "http"), (":path", "/echo"),
                             (":authority", authority), ("x-bomb", "a" * 4000)])
    block = head + b"\xbe" * (FRAME * (CONTINUATIONS + 1) - len(head))
    out = bytearray()
    pieces = [block[i:i + FRAME] for i in range(0, len(block), FRAME)]
    for i, piece in enumerate(pieces):
        f = HeadersFrame(sid) if i == 0 else ContinuationFrame(sid)
        f.data = piece
        if i == 0:
            f.flags.add("END_STREAM")
        if i == len(pieces) - 1:
            f.flags.add("END_HEADERS")
        out += f.serialize()
    return bytes(out)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (every thread), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Prober(threading.Thread):
    """HTTP/1.1 GETs one after the other on one keep-alive connection; their latencies."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.latencies: list = []
        self.errors: list = []
        self.stop = threading.Event()

    def run(self) -> None:
        with RawClient(self.port, timeout=10) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    c.request("GET", "/status/200")
                    r = c.read_response()
                except Exception as e:  # noqa: BLE001 - reported by the test
                    self.errors.append(repr(e))
                    return
                self.latencies.append(time.monotonic() - t0)
                if r.status != 200:
                    self.errors.append(f"status {r.status}")
                time.sleep(0.002)


def p99(values: list) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@pytest.mark.alone
def test_an_hpack_bomb_costs_its_sender_not_the_worker(sluice_factory, upstream):
    gw = sluice_factory(upstream, workers=1)
    authority = f"127.0.0.1:{gw.port}"
    with RawClient(gw.port) as warm:  # the upstream pool and the worker's buffers
        warm.request("GET", "/status/200")
        assert warm.read_response().status == 200

    prober = Prober(gw.port)
    prober.start()
    time.sleep(0.3)
    connections, blocks = 6, 0
    cpu0 = cpu_seconds(gw.pid)
    for _ in range(connections):
        with open_h2(gw.port, timeout=10) as c:
            assert c.wait_settings(5)
            # Block after block until the gateway ends the connection (or 4 went through).
            for _ in range(4):
                if c.closed or c.goaways:
                    break
                sid = c.new_stream_id()
                try:
                    c.send_raw(bomb_frames(sid, authority))
                except OSError:
                    break
                blocks += 1
                c.wait(lambda: (sid in c.streams and c.streams[sid].done) or bool(c.goaways)
                       or c.closed, 5)
            c.wait(lambda: bool(c.goaways) or c.closed, 5)
            assert c.goaways and c.goaways[0][0] == ENHANCE_YOUR_CALM, c.describe()
    cpu = cpu_seconds(gw.pid) - cpu0
    time.sleep(0.3)
    prober.stop.set()
    prober.join(10)

    per_block_ms = cpu * 1000 / blocks
    print(f"[hpack bomb] {blocks} blocks on {connections} connections: worker CPU "
          f"{cpu * 1000:.0f} ms, {per_block_ms:.1f} ms per block; other client p99 "
          f"{p99(prober.latencies) * 1000:.1f} ms over {len(prober.latencies)} requests")
    assert blocks <= 2 * connections, "a second bomb ends its connection"
    assert per_block_ms < scaled(10, 30), f"{per_block_ms:.1f} ms of the worker's CPU per block"
    assert not prober.errors, prober.errors
    assert len(prober.latencies) >= 20
    assert p99(prober.latencies) < scaled(0.1, 0.2), \
        f"another client's p99 {p99(prober.latencies) * 1000:.0f} ms while the bombs came"
    assert gw.alive()
    assert metric_sum(gw, "sluice_http2_goaways_total", reason="enhance_your_calm") == connections


def test_a_refused_header_block_does_not_cut_the_other_streams(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"request_header_timeout": "1s"})
    with open_h2(gw.port, timeout=10) as c:
        slow = c.request("GET", "/slow/2500")
        time.sleep(0.2)
        bad = c.request("GET", "/echo?bad=1", [("X-Upper", "1")])  # malformed: a capital
        s = c.response(bad, timeout=3)
        assert s.reset == PROTOCOL_ERROR or s.status == 400, s
        s = c.response(slow, timeout=6)
        assert s.status == 200, f"{s!r} ({c.describe()})"
        assert not c.goaways, c.describe()
        s = c.response(c.request("GET", "/echo?next=1"), timeout=3)
        assert s.status == 200, s
    assert not [r for r in upstream.requests if "bad=1" in r["target"]]


# One meaning per method and path: what HTTP/1.1 refuses, HTTP/2 refuses alike (one validation).
BAD_METHODS = ["post", "Post", "pOST", "FOO", "PRI", "QUERY"]
BAD_PATHS = [b"/login\xa0", b"/login\x80", b"/l\xc3\xa9gin", b"/login\xff?a=1", b"/?q=\xa0"]


def h1_status(port: int, request_line: bytes) -> int:
    with RawClient(port, timeout=5) as c:
        c.send(request_line + b"\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
        return c.read_response().status


def test_methods_and_targets_mean_one_thing_on_both_protocols(sluice_factory, upstream):
    """A lowercase, mixed-case or unknown method and a target with bytes 0x80-0xFF get 400 on
    HTTP/2 as on HTTP/1.1, and never reach the upstream (`:method: post` would miss a
    methods = ["POST"] route and its limits, and be served as POST upstream)."""
    gw = sluice_factory(upstream, routes=[
        {"name": "login", "match": {"path": "/login", "methods": ["POST"]}, "upstream": "app"},
        {"name": "rest", "match": {"path_prefix": "/"}, "upstream": "app"}])
    with open_h2(gw.port, timeout=10) as c:
        for method in BAD_METHODS:
            assert h1_status(gw.port, method.encode() + b" /login HTTP/1.1") == 400, method
            s = c.response(c.request(method, "/login"), timeout=3)
            assert s.status == 400, (method, s)
        for path in BAD_PATHS:
            assert h1_status(gw.port, b"GET " + path + b" HTTP/1.1") == 400, path
            s = c.response(c.request("GET", path), timeout=3)
            assert s.status == 400, (path, s)
        assert upstream.requests == [], upstream.requests
        # The canonical spellings go through, on both.
        for method in ("POST", "PURGE", "M-SEARCH"):
            assert h1_status(gw.port, method.encode() + b" /echo HTTP/1.1") == 200, method
            assert c.response(c.request(method, "/echo"), timeout=3).status == 200, method
        assert not c.goaways, c.describe()
    assert [r["method"] for r in upstream.requests] == ["POST", "POST", "PURGE", "PURGE",
                                                        "M-SEARCH", "M-SEARCH"]
