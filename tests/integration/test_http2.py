"""HTTP/2 downstream ([server] http2 = true, the default; max_concurrent_streams): h2c with prior
knowledge on a plain listener and ALPN h2 on a TLS one, each beside HTTP/1.1 on the same port;
methods, bodies, 204/304/HEAD; many streams on a connection and the stream limit; rate limits
decided per stream; the header-list bound (431); connection-specific fields refused; :authority
as Host; stream floods (Rapid Reset, MadeYouReset) answered with GOAWAY ENHANCE_YOUR_CALM, and
streams that end at once not worth an upstream connection each; idle GOAWAY; the drain on
SIGTERM; "protocol" in the access log; the http2 metrics; a reader that never opens its window;
big bodies both ways on concurrent streams.

Run time: some 25 s in all. Marked slow (pytest.ini should register the marker): the slow
reader (100 MiB, some 5 s), 100 MiB up and down over h2c and h2 (some 4 s each; marked once
too: the normal build only, the big-body paths run under ASan in the other tests) and the
rate-limit test (up to 8 s more when it starts near a minute's boundary).

Clients: harness/h2client.py (frames and HPACK over a raw socket, no state machine: it can send
what a client must not), python3-h2 (a strict client state machine), curl --http2 /
--http2-prior-knowledge and h2load. The HTTP/1.1 half of each "same port" test runs first, so
that a gateway without HTTP/2 fails it on the HTTP/2 half."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import (EXIT_SLACK_S, TIMER_SLACK_S, RawClient, https_request, limit_cfg,
                      metric_sum, parse_rl_list, route_cfg, settled_rss_kb, sluice_with_limits,
                      tls_client_context, tls_server_toml, wait_metric)
from harness.h2client import (CANCEL, ENHANCE_YOUR_CALM, INITIAL_WINDOW_SIZE,
                              MAX_CONCURRENT_STREAMS, MAX_WINDOW, NO_ERROR, PREFACE,
                              PROTOCOL_ERROR, REFUSED_STREAM, STREAM_CLOSED, H2Client, H2Stream,
                              check_h2_response_fields, open_h2)
from hyperframe.frame import DataFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame
from upstream import pattern_bytes

MIB = 1 << 20


def hv(pairs, name):
    """Values of a field in an /echo header list ([[name, value], ...])."""
    return [v for n, v in pairs if n.lower() == name.lower()]


def h2_ok(c, path="/echo", **kw):
    """GET on an open connection; asserts 200 and well-formed fields; returns the stream."""
    s = c.response(c.request("GET", path, **kw))
    assert s.status == 200, s
    check_h2_response_fields(s)
    return s


def assert_upstream_request_is_plain_http11(info):
    """What /echo saw: an HTTP/1.1 request without pseudo-header fields."""
    names = [n for n, _ in info["headers"]]
    assert not [n for n in names if n.startswith(":")], f"pseudo-header fields upstream: {names}"
    assert info["version"] == "HTTP/1.1", info


def metric_samples(gw, name):
    """[(labels text, value)] of every sample of `name` in /metrics."""
    status, text = gw.admin_get("/metrics")
    assert status == 200, text
    out = []
    for line in text.splitlines():
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$', line)
        if m and m.group(1) == name:
            out.append((m.group(2) or "", float(m.group(3))))
    return out


def curl(*args, timeout=20):
    p = subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


# ------------------------------------------------------------------------ 1. h2c

def test_h2c_prior_knowledge_methods_bodies_and_http11_on_the_same_port(sluice, upstream):
    """GET, HEAD, POST with bodies of 0, 1 byte and 1 MiB, a 1 MiB response, 204 and 304, all
    on one h2c connection; HTTP/1.1 before and after on the same port."""
    r = sluice.get("/echo?h1=before")
    assert r.status == 200 and r.version == "HTTP/1.1", r

    with open_h2(sluice.port) as c:
        assert c.server_settings.get(MAX_CONCURRENT_STREAMS) == 100, c.server_settings
        s = h2_ok(c, "/echo?q=1", headers=[("x-test", "One")])
        assert s.header("x-upstream") == "up1", s
        assert s.header("content-type") == "application/json", s
        info = s.json()
        assert info["method"] == "GET" and info["target"] == "/echo?q=1", info
        assert hv(info["headers"], "x-test") == ["One"], info
        assert hv(info["headers"], "host") == ["sluice.test"], info
        assert hv(info["headers"], "x-forwarded-proto") == ["http"], info
        assert_upstream_request_is_plain_http11(info)

        s = c.response(c.request("HEAD", "/bytes/100"))
        assert s.status == 200 and s.body == b"" and s.ended, s
        check_h2_response_fields(s)
        assert s.header("content-length") in (None, "100"), s
        assert upstream.requests[-1]["method"] == "HEAD"

        bodies = {"zero": b"", "one": b"\x00", "mib": pattern_bytes(MIB)}
        for name, body in bodies.items():
            headers = [("content-length", str(len(body)))] if name == "mib" else []
            s = c.response(c.request("POST", f"/echo?body={name}", headers, body), timeout=15)
            assert s.status == 200, (name, s)
            check_h2_response_fields(s)
            info = s.json()
            assert info["method"] == "POST" and info["body_len"] == len(body), (name, info)
            assert info["body_sha256"] == hashlib.sha256(body).hexdigest(), name
        sid = c.request("POST", "/echo?body=empty_data", end_stream=False)
        c.end_stream(sid)  # an empty DATA frame ends the request
        s = c.response(sid)
        assert s.status == 200 and s.json()["body_len"] == 0, s

        s = c.response(c.request("GET", f"/bytes/{MIB}"), timeout=15)
        assert s.status == 200 and len(s.body) == MIB and s.body == pattern_bytes(MIB), \
            (s.status, len(s.body))
        assert s.header("content-type") == "application/octet-stream", s

        for code in (204, 304):
            s = c.response(c.request("GET", f"/status/{code}"))
            assert s.status == code and s.body == b"", s
            check_h2_response_fields(s)
            assert s.header("x-upstream") == "up1", s
        s = c.response(c.request("GET", "/status/418"))
        assert s.status == 418 and s.body == b"status 418\n", s
        # upstream framing (chunked, delimited by the close) and hop-by-hop fields do not
        # leak into HTTP/2 (check_h2_response_fields)
        for path in ("/chunked/100000", "/close-delimited/5000"):
            s = c.response(c.request("GET", path), timeout=10)
            n = int(path.rsplit("/", 1)[1])
            assert s.status == 200 and s.body == pattern_bytes(n), (path, s)
            check_h2_response_fields(s)
        s = c.response(c.request("GET", "/response-headers?Keep-Alive=timeout%3D5&Upgrade=foo"
                                 "&Proxy-Connection=keep-alive&X-Kept=Yes"))
        assert s.status == 200 and s.header("x-kept") == "Yes" and s.body == b"ok\n", s
        check_h2_response_fields(s)
        assert not c.goaways and not c.protocol_errors, c.describe()

    r = sluice.get("/echo?h1=after")
    assert r.status == 200 and r.json()["target"] == "/echo?h1=after", r


def test_upstream_failures_end_only_their_stream(sluice, upstream):
    """An upstream that closes without answering: 502 on that stream. One that cuts its
    response after the head: the stream is reset, never ended as if complete (a client would
    take the truncated body for the whole). The connection serves the next stream."""
    with open_h2(sluice.port) as c:
        s = c.response(c.request("GET", "/close-now"))
        assert s.status == 502, s
        for path in ("/close-mid", "/close-mid?chunked=1"):
            s = c.response(c.request("GET", path), timeout=5)
            assert s.reset is not None and not s.ended, f"{path}: {s!r}"
            assert s.status in (None, 200) and len(s.body) <= 1000, s
            h2_ok(c, f"/echo?after={path}")
        assert not c.goaways, c.describe()


def test_curl_http2_prior_knowledge(sluice, upstream, tmp_path):
    body = pattern_bytes(300_000)
    (tmp_path / "body.bin").write_bytes(body)
    rc, out, err = curl("--http2-prior-knowledge", "-w", "\n%{http_version} %{http_code}",
                        "--data-binary", f"@{tmp_path / 'body.bin'}",
                        f"http://127.0.0.1:{sluice.port}/echo")
    assert rc == 0, err
    payload, _, tail = out.rpartition(b"\n")
    assert tail == b"2 200", (tail, err[-2000:])
    info = json.loads(payload)
    assert info["body_len"] == len(body)
    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.slow
@pytest.mark.once
@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "h2"])
def test_a_100_mib_upload_and_download_whole_both_ways(sluice_factory, upstream, tls_pki,
                                                       tmp_path, tls):
    """curl over h2c (prior knowledge) and h2 (TLS, ALPN): 100 MiB up to /echo and 100 MiB
    down from /bytes, every byte right (flow control of both directions over a long run)."""
    n = 100 * MIB
    server = {"max_request_body_bytes": 2 * n}
    if tls:
        gw = sluice_factory(upstream, server=server,
                            extra_toml=tls_server_toml(tls_pki.certs["default"]))
        base = f"https://default.test:{gw.port}"
        opts = ["--http2", "--cacert", str(tls_pki.certs["root"].cert), "--resolve",
                f"default.test:{gw.port}:127.0.0.1"]
    else:
        gw = sluice_factory(upstream, server=server)
        base = f"http://127.0.0.1:{gw.port}"
        opts = ["--http2-prior-knowledge"]
    up = tmp_path / "up.bin"
    up.write_bytes(pattern_bytes(n, offset=3))
    rc, out, err = curl(*opts, "-w", "\n%{http_version} %{http_code}", "--data-binary",
                        f"@{up}", f"{base}/echo", timeout=120)
    assert rc == 0, err[-2000:]
    payload, _, tail = out.rpartition(b"\n")
    assert tail == b"2 200", (tail, err[-2000:])
    info = json.loads(payload)
    assert info["body_len"] == n, info["body_len"]
    assert info["body_sha256"] == hashlib.sha256(up.read_bytes()).hexdigest()
    down = tmp_path / "down.bin"
    rc, out, err = curl(*opts, "-o", str(down), "-w", "%{http_version} %{http_code}",
                        f"{base}/bytes/{n}", timeout=120)
    assert rc == 0 and out == b"2 200", (out, err[-2000:])
    assert down.stat().st_size == n
    assert hashlib.sha256(down.read_bytes()).digest() == \
        hashlib.sha256(pattern_bytes(n)).digest()


def test_http2_false_preface_not_served_as_http2(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"http2": False})
    assert gw.get("/echo").status == 200
    f = SettingsFrame(0)
    with RawClient(gw.port, timeout=3) as c:
        c.send(PREFACE + f.serialize())
        data = b""
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                chunk = c.sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    # An HTTP/2 server's first bytes are its SETTINGS frame: type 0x4 on stream 0.
    assert not (len(data) >= 9 and data[3] == 0x4 and data[5:9] == b"\0\0\0\0"), \
        f"an HTTP/2 SETTINGS frame came back with http2 = false: {data[:60]!r}"
    assert data == b"" or re.match(rb"HTTP/1\.[01] 400 ", data), data[:200]
    assert upstream.request_count == 1


class H2cUpgradeUpstream:
    """An upstream that takes `Upgrade: h2c` (as h2c-capable servers do): 101, then whatever
    it sends is the other protocol. It records each request head it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.heads = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()

    def _run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(5)
        with conn:
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                self.heads.append(head)
                if b"\r\nupgrade: h2c" in head.lower():
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                                 b"Upgrade: h2c\r\n\r\nSMUGGLED: the upstream speaks to the client")
                    time.sleep(0.5)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except OSError:
                pass


def test_http11_upgrade_h2c_is_not_tunnelled_to_the_upstream(sluice_factory):
    """h2c is spoken by prior knowledge only (RFC 9113 dropped the Upgrade: h2c dance): the
    gateway neither forwards `Upgrade: h2c` nor tunnels an upstream's 101 for it, else a client
    gets a raw HTTP/2 connection to the upstream past routing and rate limits (h2c
    smuggling). The request is answered as plain HTTP/1.1 (or upgraded by the gateway
    itself)."""
    with H2cUpgradeUpstream() as up:
        gw = sluice_factory(upstreams=[{"name": "app", "endpoints": [up.port]}])
        with RawClient(gw.port, timeout=5) as c:
            c.request("GET", "/", [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
                                   ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")])
            r = c.read_final_response()
            rest = c.recv_some() if c.data_pending(0.3) else b""
        assert b"SMUGGLED" not in rest + r.body, f"the upstream's h2c tunnelled to the client: {r!r}"
        assert not [h for h in up.heads if b"\r\nupgrade: h2c" in h.lower()], up.heads
        # plain HTTP/1.1, or an upgrade the gateway makes itself (RFC 7540 3.2; HTTP/2 follows)
        assert (r.status == 200 and r.body == b"ok") or (r.status == 101 and rest[3:4] == b"\x04"), \
            (r, rest[:40])


# ------------------------------------------------------------------------ 2. TLS and ALPN

def test_tls_alpn_h2_and_http11_on_the_same_port(sluice_factory, upstream, tls_pki):
    gw = sluice_factory(upstream, extra_toml=tls_server_toml(tls_pki.certs["default"]))
    root = tls_pki.certs["root"]
    r = https_request(gw.port, "GET", "/echo?alpn=h1", context=tls_client_context(
        root, alpn=["http/1.1"]), server_hostname="default.test")
    assert r.status == 200 and r.alpn == "http/1.1" and r.version == "HTTP/1.1", r
    r = https_request(gw.port, "GET", "/echo?alpn=none", context=tls_client_context(root),
                      server_hostname="default.test")
    assert r.status == 200 and r.alpn is None, r

    ctx = tls_client_context(root, alpn=["h2", "http/1.1"])
    c = H2Client(gw.port, context=ctx, server_hostname="default.test", authority="default.test")
    with c:
        assert c.alpn == "h2", f"ALPN chose {c.alpn!r} for a client offering h2, http/1.1"
        assert c.wait_settings(3), c.describe()
        s = h2_ok(c, "/echo?alpn=h2")
        info = s.json()
        assert hv(info["headers"], "x-forwarded-proto") == ["https"], info
        assert hv(info["headers"], "host") == ["default.test"], info
        s = c.response(c.request("POST", "/echo", body=b"over tls" * 10000), timeout=10)
        assert s.status == 200 and s.json()["body_len"] == 80000, s
        s = c.response(c.request("GET", f"/bytes/{MIB}"), timeout=10)
        assert s.status == 200 and s.body == pattern_bytes(MIB), (s.status, len(s.body))
    # http/1.1 again after an h2 connection
    r = https_request(gw.port, "GET", "/echo", context=tls_client_context(root, alpn=["http/1.1"]),
                      server_hostname="default.test")
    assert r.status == 200 and r.alpn == "http/1.1", r


def test_curl_http2_over_tls(sluice_factory, upstream, tls_pki):
    gw = sluice_factory(upstream, extra_toml=tls_server_toml(tls_pki.certs["default"]))
    base = ["--cacert", str(tls_pki.certs["root"].cert), "--resolve",
            f"default.test:{gw.port}:127.0.0.1", "-o", "/dev/null", "-w", "%{http_version} %{http_code}"]
    rc, out, err = curl("--http1.1", *base, f"https://default.test:{gw.port}/echo")
    assert rc == 0 and out == b"1.1 200", (out, err)
    rc, out, err = curl("--http2", *base, f"https://default.test:{gw.port}/echo")
    assert rc == 0, err
    assert out == b"2 200", (out, err[-2000:])


# ------------------------------------------------------------------------ 3. many streams

def test_fifty_concurrent_streams_with_python_h2(sluice, upstream):
    """50 GETs of /slow/300 on one connection (python3-h2, which checks every frame it gets):
    all answered, together (one after another would take 15 s)."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    sock = socket.create_connection(("127.0.0.1", sluice.port), timeout=10)
    statuses, bodies, resets, terminated = {}, {}, {}, []
    ended = set()
    first = b""
    try:
        conn.initiate_connection()
        t0 = time.monotonic()
        sids = []
        for i in range(50):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"),
                                    (":authority", "sluice.test"), (":path", f"/slow/300?i={i}")],
                              end_stream=True)
            sids.append((sid, i))
        sock.sendall(conn.data_to_send())
        while len(ended) + len(resets) < 50 and not terminated:
            data = sock.recv(65536)
            if not data:
                break
            first = first or data
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                pytest.fail(f"python3-h2 rejected what the gateway sent: {e!r} ({data[:80]!r})")
            for ev in events:
                if isinstance(ev, h2.events.ResponseReceived):
                    statuses[ev.stream_id] = dict(ev.headers)[":status"]
                elif isinstance(ev, h2.events.DataReceived):
                    bodies[ev.stream_id] = bodies.get(ev.stream_id, b"") + ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    ended.add(ev.stream_id)
                elif isinstance(ev, h2.events.StreamReset):
                    resets[ev.stream_id] = ev.error_code
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    terminated.append(ev)
            sock.sendall(conn.data_to_send())
        elapsed = time.monotonic() - t0
    finally:
        sock.close()
    assert not terminated and not resets, (terminated, resets)
    assert len(ended) == 50, f"{len(ended)} of 50 streams ended; the gateway's first bytes: {first[:100]!r}"
    for sid, i in sids:
        assert statuses[sid] == "200", (sid, statuses.get(sid))
        assert json.loads(bodies[sid])["target"] == f"/slow/300?i={i}"
    assert elapsed < 5, f"50 concurrent 300 ms requests took {elapsed:.1f}s"
    assert upstream.request_count == 50


def test_concurrent_big_bodies_both_ways_on_one_connection(sluice, upstream):
    """8 uploads of 1 MiB sent interleaved, DATA frame by DATA frame as the windows allow, and
    8 downloads of 2 MiB at once: every body whole and right (flow control of each stream and
    of the connection, both ways)."""
    with open_h2(sluice.port, timeout=20) as c:
        down = c.send_requests([("GET", f"/bytes/{2 * MIB}?d={i}") for i in range(8)])
        bodies = {}
        for i in range(8):
            body = pattern_bytes(MIB, offset=i * 7)
            sid = c.request("POST", f"/echo?u={i}", [("content-length", str(MIB))],
                            end_stream=False)
            bodies[sid] = [body, 0]
        while any(pos < len(b) for b, pos in bodies.values()):
            progressed = False
            for sid, entry in bodies.items():
                body, pos = entry
                n = min(16384, len(body) - pos, c.conn_send_window,
                        c.stream_send_windows.get(sid, 0))
                if n <= 0:
                    continue
                f = DataFrame(sid)
                f.data = body[pos:pos + n]
                entry[1] = pos + n
                if entry[1] == len(body):
                    f.flags.add("END_STREAM")
                c.conn_send_window -= n
                c.stream_send_windows[sid] -= n
                c.send_frame(f)
                progressed = True
            c.pump(0 if progressed else 0.2)
            assert not c.closed and not c.goaways, c.describe()
        for s in c.responses(down, timeout=20):
            assert s.status == 200 and s.body == pattern_bytes(2 * MIB), (s.id, s.status, len(s.body))
        for sid, (body, _) in bodies.items():
            s = c.response(sid, timeout=20)
            assert s.status == 200, s
            assert s.json()["body_sha256"] == hashlib.sha256(body).hexdigest(), sid


def test_h2load_many_streams(sluice, upstream):
    p = subprocess.run(["h2load", "-n", "300", "-c", "2", "-m", "50", "-t", "1",
                        f"http://127.0.0.1:{sluice.port}/echo"],
                       capture_output=True, timeout=60)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out + p.stderr.decode(errors="replace")
    assert "Application protocol: h2c" in out, out
    assert re.search(r"requests: 300 total, 300 started, 300 done, 300 succeeded, 0 failed", out), out
    assert re.search(r"status codes: 300 2xx, 0 3xx, 0 4xx, 0 5xx", out), out
    assert upstream.request_count == 300


def test_max_concurrent_streams_advertised_and_enforced(sluice_factory, upstream):
    """SETTINGS says 5; a sixth stream while five are open is refused and never reaches the
    upstream: RST_STREAM REFUSED_STREAM or PROTOCOL_ERROR (RFC 9113 5.1.2: a stream error; the
    five streams in flight then complete), or else a GOAWAY PROTOCOL_ERROR that leaves it out
    (what libnghttp2 does once the client has acknowledged the SETTINGS)."""
    gw = sluice_factory(upstream, server={"max_concurrent_streams": 5})
    with open_h2(gw.port) as c:
        assert c.server_settings.get(MAX_CONCURRENT_STREAMS) == 5, c.server_settings
        assert c.wait(lambda: c.settings_acked, 2), "our SETTINGS were not acknowledged"
        sids = [c.request("GET", f"/slow/1000?i={i}") for i in range(5)]
        assert upstream.wait_for(lambda u: u.request_count == 5, 3), upstream.request_count
        extra = c.request("GET", "/echo?extra=1")
        c.wait(lambda: c.streams[extra].done or bool(c.goaways), 3)
        s6 = c.streams[extra]
        if c.goaways:
            code, last, _ = c.goaways[0]
            assert code == PROTOCOL_ERROR and last < extra, c.describe()
        else:
            assert s6.reset in (REFUSED_STREAM, PROTOCOL_ERROR) and s6.status is None, s6
            for s in c.responses(sids, timeout=5):
                assert s.status == 200, s
            h2_ok(c, "/echo?after=1")  # the connection goes on
    time.sleep(0.2)
    assert not [r for r in upstream.requests if "extra" in r["target"]], upstream.requests


def test_streams_past_the_limit_before_the_settings_ack_are_refused(sluice_factory, upstream):
    """A client that opens 8 streams with its preface, before it has seen the gateway's
    SETTINGS (it may assume no limit until then): 5 are served, 3 are refused with
    RST_STREAM (REFUSED_STREAM, safe to retry), never forwarded, and the connection goes on."""
    gw = sluice_factory(upstream, server={"max_concurrent_streams": 5})
    with H2Client(gw.port, preface=False) as c:
        f = SettingsFrame(0)
        f.settings[2] = 0  # ENABLE_PUSH
        sids = [c.new_stream_id() for _ in range(8)]
        c.send_raw(PREFACE + f.serialize() + b"".join(
            c.header_frames(sid, c.request_headers("GET", f"/slow/500?i={sid}"), True)
            for sid in sids))
        got = c.responses(sids, timeout=5)
        assert not c.goaways, c.describe()
        served = [s for s in got if s.status == 200]
        refused = [s for s in got if s.reset is not None]
        assert len(served) == 5 and len(refused) == 3, got
        assert all(s.reset == REFUSED_STREAM for s in refused), refused
        h2_ok(c, "/echo?after=1")
    targets = {r["target"] for r in upstream.requests}
    assert not [s for s in refused if f"/slow/500?i={s.id}" in targets], targets


# ------------------------------------------------------------------------ 4. rate limits

def _check_429(s, limit):
    assert s.status == 429, s
    check_h2_response_fields(s)
    assert s.header("content-type").split(";")[0].strip() == "application/problem+json", s
    body = s.json()
    assert body["status"] == 429 and body["violated-policies"] == [limit], body
    ra = s.header("retry-after")
    assert ra is not None and ra.isdigit() and 1 <= int(ra) <= 60, s
    assert parse_rl_list(s.header("ratelimit"))[limit]["r"] == 0, s
    assert parse_rl_list(s.header("ratelimit-policy"))[limit] == {"q": 10, "w": 60}, s


@pytest.mark.slow
def test_rate_limit_per_stream_one_connection_and_four(sluice_factory, upstream, valkey):
    """fixed_window 10 per minute by ip: 40 concurrent streams on one connection, then 10 on
    each of 4 connections (another limit): exactly 10 pass each time, the rest get 429 with
    Retry-After, RateLimit, RateLimit-Policy and problem+json."""
    limits = [limit_cfg("one_conn", "fixed_window", 10, "1m"),
              limit_cfg("four_conns", "fixed_window", 10, "1m")]
    routes = [route_cfg("one", ["one_conn"], match={"path_prefix": "/echo"}),
              route_cfg("four", ["four_conns"], match={"path_prefix": "/bytes/"})]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes)

    with open_h2(gw.port) as c:
        sids = c.send_requests([("GET", f"/echo?i={i}") for i in range(40)])
        got = c.responses(sids, timeout=10)
    ok = [s for s in got if s.status == 200]
    assert len(ok) == 10 and sum(1 for s in got if s.status == 429) == 30, \
        sorted(s.status for s in got)
    for s in ok:
        check_h2_response_fields(s)
        assert "one_conn" in parse_rl_list(s.header("ratelimit-policy")), s
    for s in got:
        if s.status != 200:
            _check_429(s, "one_conn")
    assert upstream.request_count == 10

    barrier = threading.Barrier(4)
    results, errors = [], []

    def one_client(k):
        try:
            with open_h2(gw.port) as c:
                barrier.wait(5)
                sids = c.send_requests([("GET", f"/bytes/10?c={k}&i={i}") for i in range(10)])
                results.extend(c.responses(sids, timeout=10))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one_client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    statuses = sorted(s.status for s in results)
    assert statuses == [200] * 10 + [429] * 30, statuses
    for s in results:
        if s.status == 429:
            _check_429(s, "four_conns")
        else:
            assert s.body == pattern_bytes(10), s


def test_concurrency_slots_freed_by_rst_stream_and_by_the_close(sluice_factory, upstream, valkey):
    """algorithm = "concurrency", 2 slots: two hanging streams hold both (a third stream gets
    429); RST_STREAM on them frees both at once, on the same connection; closing the
    connection frees the slot of the stream left open."""
    cfg = {"name": "in_flight", "algorithm": "concurrency", "by": ["ip"], "limit": 2}
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [cfg])
    with open_h2(gw.port) as c:
        hanging = [c.request("GET", "/hang"), c.request("GET", "/hang")]
        assert wait_metric(gw, "sluice_concurrency_slots_held", lambda v: v == 2) == 2
        s = c.response(c.request("GET", "/status/200"))
        assert s.status == 429, s
        for sid in hanging:
            c.reset_stream(sid, CANCEL)
        assert wait_metric(gw, "sluice_concurrency_slots_held", lambda v: v == 0) == 0, \
            "slots still held after RST_STREAM of their streams"
        h2_ok(c, "/status/200")
        c.request("GET", "/hang")
        assert wait_metric(gw, "sluice_concurrency_slots_held", lambda v: v == 1) == 1
    assert wait_metric(gw, "sluice_concurrency_slots_held", lambda v: v == 0) == 0, \
        "a slot still held after its connection closed"


# ------------------------------------------------------------------------ 5. header list bound

BIG_HEADERS = {
    "one_frame": [("x-big", "a" * 6000)],
    "continuation": [("x-big", "a" * 40000)],  # HEADERS + CONTINUATION
    # 9 KB decoded from a block of some 2.3 KB: HPACK refers to the dynamic table entry twice
    "hpack_indexed": [("x-rep", "r" * 3000)] * 3,
    "many_fields": [(f"x-h{i}", "v" * 40) for i in range(120)],
}


@pytest.mark.parametrize("kind", list(BIG_HEADERS))
def test_header_list_too_large_431_and_the_connection_goes_on(sluice_factory, upstream, kind):
    """max_request_header_bytes = 4096 bounds the decoded header list, whatever the size of
    the HPACK block that carries it."""
    gw = sluice_factory(upstream, server={"max_request_header_bytes": 4096})
    with open_h2(gw.port) as c:
        s = h2_ok(c, "/echo?small=1", headers=[("x-fits", "b" * 2000)])
        assert hv(s.json()["headers"], "x-fits") == ["b" * 2000]
        s = c.response(c.request("GET", "/echo?big=1", BIG_HEADERS[kind]))
        assert s.status == 431, f"{s!r} ({c.describe()})"
        h2_ok(c, "/echo?next=1")
        assert not c.goaways, c.describe()
    assert [r["target"] for r in upstream.requests] == ["/echo?small=1", "/echo?next=1"]


# ------------------------------------------------------------------------ 6. connection fields

@pytest.mark.parametrize("name,value", [("connection", "keep-alive"),
                                        ("transfer-encoding", "chunked"), ("upgrade", "x"),
                                        ("keep-alive", "timeout=5"),
                                        ("proxy-connection", "keep-alive"), ("te", "gzip")])
def test_connection_specific_field_refused_never_forwarded(sluice, upstream, name, value):
    with open_h2(sluice.port) as c:
        s = c.response(c.request("GET", "/echo?bad=1", [(name, value)]))
        assert s.reset == PROTOCOL_ERROR or s.status == 400, s
        if not c.closed and not c.goaways:
            h2_ok(c, "/echo?good=1")
    with open_h2(sluice.port) as c:
        h2_ok(c, "/echo?te=trailers", headers=[("te", "trailers")])  # the one value allowed
    assert not [r for r in upstream.requests if "bad=1" in r["target"]], upstream.requests


# Requests whose fields would change meaning once written as HTTP/1.1 upstream (request line
# or header injection, H2-to-HTTP/1.1 smuggling), or that RFC 9113 8.2/8.3 calls malformed.
MALFORMED = {
    "path_space": dict(path="/echo?a b"),
    "path_crlf": dict(path="/echo?a\r\nX-Injected: 1"),
    "path_request_line": dict(path="/echo HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /echo"),
    "path_not_origin_form": dict(path="echo"),
    "value_crlf": dict(headers=[("x-a", "1\r\nX-Injected: yes")]),
    "value_lf": dict(headers=[("x-a", "1\nX-Injected: yes")]),
    "value_nul": dict(headers=[("x-a", "1\x00b")]),
    "value_padded": dict(headers=[("x-a", " padded ")]),
    "name_upper_case": dict(headers=[("X-Upper", "1")]),
    "name_space": dict(headers=[("x a", "1")]),
    "name_colon": dict(headers=[("x:a", "1")]),
    "method_space": dict(method="GET /x"),
    "authority_crlf": dict(authority="a.test\r\nX-Injected: 1"),
    "authority_userinfo": dict(authority="user@a.test"),
    "two_content_lengths": dict(method="POST", headers=[("content-length", "5"),
                                                        ("content-length", "6")], body=b"hello"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_request_refused_never_forwarded(sluice, upstream, kind):
    case = MALFORMED[kind]
    with open_h2(sluice.port) as c:
        s = c.response(c.request(case.get("method", "GET"), case.get("path", "/echo?bad=1"),
                                 case.get("headers", []), case.get("body"),
                                 authority=case.get("authority")), timeout=3)
        assert s.reset == PROTOCOL_ERROR or s.status == 400, s
        if not c.goaways:
            h2_ok(c, "/echo?good=1")
    assert [r["target"] for r in upstream.requests] in ([], ["/echo?good=1"]), upstream.requests


# ------------------------------------------------------------------------ 7. :authority

def test_authority_is_the_host_upstream_and_routes(sluice_factory, upstream_factory):
    a, b = upstream_factory("A"), upstream_factory("B")
    gw = sluice_factory(upstreams=[{"name": "a", "endpoints": [a]}, {"name": "b", "endpoints": [b]}],
                        routes=[{"name": "a", "match": {"host": "a.test"}, "upstream": "a"},
                                {"name": "rest", "match": {"path_prefix": "/"}, "upstream": "b"}])
    r = gw.get("/echo", host="a.test")  # HTTP/1.1 control
    assert r.status == 200 and r.header("x-upstream") == "A", r
    with open_h2(gw.port) as c:
        s = h2_ok(c, "/echo?1", authority="a.test")
        assert s.header("x-upstream") == "A", s
        assert hv(s.json()["headers"], "host") == ["a.test"], s.json()["headers"]
        s = h2_ok(c, "/echo?2", authority="b.test")
        assert s.header("x-upstream") == "B", s
        assert hv(s.json()["headers"], "host") == ["b.test"], s.json()["headers"]
        s = h2_ok(c, "/echo?3", authority="a.test", headers=[("host", "a.test")])
        assert s.header("x-upstream") == "A" and hv(s.json()["headers"], "host") == ["a.test"], s
        s = h2_ok(c, "/echo?4", authority="A.Test:8443")  # case and port do not matter
        assert s.header("x-upstream") == "A", s
        assert hv(s.json()["headers"], "host") == ["A.Test:8443"], s.json()["headers"]
        s = c.response(c.request("GET", "/echo?mismatch", [("host", "b.test")], authority="a.test"))
        assert s.status == 400, s
    assert not [r for r in a.requests + b.requests if "mismatch" in r["target"]]


# ------------------------------------------------------------------------ 8. stream floods

class Http11Probe:
    """HTTP/1.1 GETs on fresh connections in a thread while another client floods."""

    def __init__(self, port):
        self.port = port
        self.results = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)

    def _run(self):
        while not self.stop.is_set():
            try:
                with RawClient(self.port, timeout=5) as c:
                    c.request("GET", "/echo?probe=1")
                    self.results.append(c.read_response().status)
            except Exception as e:  # noqa: BLE001 - every failure is a result
                self.results.append(repr(e))
            self.stop.wait(0.02)


def flood(c, frames_for, limit=2000, batch=20, paced=False):
    """Sends frames_for(stream id) for new streams, `batch` streams per write, until the
    gateway says GOAWAY or closes, or `limit` streams; returns how many were sent. paced: after
    each batch, wait until the gateway has answered or reset each of its streams (an attacker
    that stays within max_concurrent_streams)."""
    sent = 0
    try:
        while sent < limit and not c.goaways and not c.closed:
            sids = [c.new_stream_id() for _ in range(batch)]
            c.send_raw(b"".join(frames_for(sid) for sid in sids))
            sent += batch
            if paced:
                for sid in sids:
                    c.streams.setdefault(sid, H2Stream(sid))
                c.wait(lambda: c.goaways or all(c.streams[sid].done for sid in sids), 2)
            else:
                c.pump(0)
    except OSError:
        pass  # closed while we wrote: what it sent before is still read
    c.wait_goaway(3)
    c.wait_closed(3)
    return sent


def assert_upstream_spared(upstream, conns_before, sent):
    """Streams that ended at once (reset by the client, or by the gateway for what their own
    frames said) cost the upstream little: few requests, and few connections (a connect
    started for each stream and then dropped is a connection flood of its own, and other
    clients get 502 from an upstream whose accept queue it fills)."""
    time.sleep(0.3)  # connects still in flight arrive
    forwarded = sum(1 for r in upstream.requests if r["target"].startswith("/status/"))
    opened = upstream.connection_count - conns_before
    assert forwarded < max(2, sent // 20), f"{forwarded} of {sent} such streams reached the upstream"
    assert opened < max(5, sent // 20), \
        f"{opened} upstream connections opened for {sent} streams that ended at once " \
        f"({forwarded} of them forwarded)"


def assert_calmed(c, sent, first_is_fatal=()):
    """GOAWAY ENHANCE_YOUR_CALM and the connection closed; or, for `first_is_fatal` codes,
    a connection error at the first provocation, before the gateway reset any stream (what
    libnghttp2 does for WINDOW_UPDATE 0 and DATA after END_STREAM: nothing left to flood)."""
    resets = sum(1 for s in c.streams.values() if s.reset is not None)
    codes = [code for code, _, _ in c.goaways]
    at_once = bool(codes) and codes[0] in first_is_fatal and resets == 0
    assert ENHANCE_YOUR_CALM in codes or at_once, \
        f"after {sent} streams ({resets} reset by the gateway): {c.describe()}"
    assert c.closed, f"connection still open after GOAWAY: {c.describe()}"


def assert_gateway_fine(gw, c, probe):
    """The other clients: served during the flood (the probe) and after it; no connection left
    counted open."""
    assert gw.alive()
    with open_h2(gw.port) as other:
        h2_ok(other, "/echo?after_flood=1")
    assert gw.get("/echo").status == 200
    assert probe.results and all(r == 200 for r in probe.results), \
        f"a client served during the flood: {probe.results[:20]}"
    assert wait_metric(gw, "sluice_http2_connections_open", lambda v: v == 0) == 0, \
        "HTTP/2 connections still counted open after their clients left"
    if ENHANCE_YOUR_CALM in [code for code, _, _ in c.goaways]:
        assert metric_sum(gw, "sluice_http2_goaways_total", reason="enhance_your_calm") >= 1


def test_rapid_reset_gets_goaway_enhance_your_calm(sluice, upstream):
    with open_h2(sluice.port) as polite:  # a few cancelled streams are fine
        for _ in range(10):
            sid = polite.request("GET", "/slow/200")
            polite.reset_stream(sid, CANCEL)
        h2_ok(polite, "/echo?polite=1")
        assert not polite.goaways, polite.describe()

    with Http11Probe(sluice.port) as probe, open_h2(sluice.port) as c:
        sent = flood(c, lambda sid: provoking_frames(c, "rapid_reset", sid))
        time.sleep(0.2)
    assert_calmed(c, sent)
    assert_gateway_fine(sluice, c, probe)


# How each kind provokes a stream error (RFC 9113), and the connection error that libnghttp2
# raises instead for some of them at the first frame (nothing left to flood then).
PROVOCATIONS = {
    # WINDOW_UPDATE 0 on an open stream: a stream error PROTOCOL_ERROR (6.9); libnghttp2 makes
    # it a connection error
    "window_update_0": PROTOCOL_ERROR,
    # DATA on a half-closed (remote) stream: a stream error STREAM_CLOSED (5.1); libnghttp2
    # makes it a connection error
    "data_after_end_stream": STREAM_CLOSED,
    # a stream window past 2^31-1: a stream error FLOW_CONTROL_ERROR (6.9.1)
    "window_overflow": None,
    # a malformed request (a connection-specific field, 8.2.2): a stream error
    "connection_field": None,
    # more DATA than content-length: malformed (8.1.1), a stream error
    "content_length_exceeded": None,
}


def provoking_frames(c, kind, sid):
    """The frames of one stream of a flood: "rapid_reset" (HEADERS, then RST_STREAM CANCEL) or
    one of PROVOCATIONS."""
    get = c.request_headers("GET", "/status/200")
    if kind == "rapid_reset":
        return c.header_frames(sid, get, True) + RstStreamFrame(sid, error_code=CANCEL).serialize()
    if kind == "window_update_0":
        return c.header_frames(sid, get, False) + WindowUpdateFrame(sid, window_increment=0).serialize()
    if kind == "window_overflow":
        return (c.header_frames(sid, get, False)
                + WindowUpdateFrame(sid, window_increment=MAX_WINDOW).serialize())
    if kind == "connection_field":
        return c.header_frames(sid, get + [("connection", "keep-alive")], True)
    data = DataFrame(sid)
    data.data = b"xx"
    data.flags.add("END_STREAM")
    if kind == "content_length_exceeded":
        post = c.request_headers("POST", "/status/200", [("content-length", "1")])
        return c.header_frames(sid, post, False) + data.serialize()
    assert kind == "data_after_end_stream", kind
    return c.header_frames(sid, get, True) + data.serialize()


@pytest.mark.parametrize("kind", list(PROVOCATIONS))
def test_made_you_reset_gets_goaway_enhance_your_calm(sluice, upstream, kind):
    """A client whose frames make the gateway reset stream after stream (MadeYouReset) gets
    GOAWAY ENHANCE_YOUR_CALM and is closed; where the first such frame is already a
    connection error, that GOAWAY will do. Another client is served meanwhile and after."""
    with Http11Probe(sluice.port) as probe, open_h2(sluice.port) as c:
        sent = flood(c, lambda sid: provoking_frames(c, kind, sid), paced=True)
        time.sleep(0.2)
    fatal = PROVOCATIONS[kind]
    assert_calmed(c, sent, first_is_fatal=(fatal,) if fatal is not None else ())
    assert_gateway_fine(sluice, c, probe)


@pytest.mark.parametrize("kind", ["rapid_reset", "window_overflow", "content_length_exceeded"])
def test_streams_that_end_at_once_cost_the_upstream_little(sluice, upstream, kind):
    """Streams reset in the same read that opened them (by the client, or by the gateway for
    what their own frames said) are not worth an upstream connection each: a connect started
    per stream and then dropped is a connection flood of its own (one client's 400 streams,
    some 130 connects here), and other clients get 502 (connect_timeout) from an upstream
    whose accept queue it fills. At most one in 20 may open one; few are forwarded."""
    conns = upstream.connection_count
    with open_h2(sluice.port) as c:
        sent = flood(c, lambda sid: provoking_frames(c, kind, sid), limit=400,
                     paced=kind != "rapid_reset")
    assert_upstream_spared(upstream, conns, sent)


# ------------------------------------------------------------------------ 9. idle

def test_idle_h2_connection_gets_goaway_no_error(sluice_factory, upstream):
    """idle_timeout 1s: a connection whose last stream has ended gets GOAWAY NO_ERROR after
    1 s and is closed. One that never opened a stream is closed the same way after
    idle_timeout or request_header_timeout (2 s here: an HTTP/1.1 connection that never sent
    a request waits that long), not later. One whose stream waits 1.6 s for the upstream is
    not idle."""
    gw = sluice_factory(upstream, server={"idle_timeout": "1s", "request_header_timeout": "2s"})
    results = {}

    def watch(name, with_request):
        try:
            with open_h2(gw.port) as c:
                if with_request:
                    h2_ok(c, "/echo")
                t0 = time.monotonic()
                c.wait_goaway(4)
                c.wait_closed(2)
                results[name] = (c.goaways, c.goaway_at and c.goaway_at - t0,
                                 c.closed_at and c.closed_at - t0, c.describe())
        except BaseException as e:  # noqa: BLE001 - reported below
            results[name] = ([], None, None, f"{type(e).__name__}: {e}")

    def busy():
        try:
            with open_h2(gw.port) as c:
                s = c.response(c.request("GET", "/slow/1600"), timeout=4)
                results["busy"] = (s.status, c.goaways_text())
        except BaseException as e:  # noqa: BLE001 - reported below
            results["busy"] = (None, f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=watch, args=("fresh", False)),
               threading.Thread(target=watch, args=("after_request", True)),
               threading.Thread(target=busy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 3, results
    assert results.pop("busy") == (200, "none"), "a stream in flight for 1.6 s is not idle"
    for name, (goaways, at, closed_at, text) in results.items():
        assert goaways and goaways[0][0] == NO_ERROR, (name, text)
        assert closed_at is not None and closed_at - at < 1.0, (name, closed_at, text)
    at = results["after_request"][1]
    assert 0.9 <= at < 1.0 + TIMER_SLACK_S, f"GOAWAY {at:.2f}s after the last stream (idle_timeout 1s)"
    at = results["fresh"][1]
    assert 0.9 <= at < 2.0 + TIMER_SLACK_S, f"GOAWAY {at:.2f}s after the preface (idle_timeout 1s)"
    assert metric_sum(gw, "sluice_http2_goaways_total", reason="idle") == 2


# ------------------------------------------------------------------------ 10. drain

def test_sigterm_goaway_then_the_stream_in_flight_completes_and_exit_0(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"drain_timeout": "5s"})
    c = open_h2(gw.port, timeout=10)
    with c:
        sid = c.request("GET", "/slow/1500")
        assert upstream.wait_for(lambda u: u.request_count == 1, 3)
        t0 = time.monotonic()
        gw.send_signal(signal.SIGTERM)
        assert c.wait_goaway(1.0), f"no GOAWAY within 1 s of SIGTERM: {c.describe()}"
        assert c.goaways[0][0] == NO_ERROR, c.describe()
        late = c.request("GET", "/echo?late=1")  # opened after the GOAWAY
        s = c.response(sid, timeout=5)
        assert s.status == 200 and s.json()["slept_ms"] == 1500, s
        last = c.goaways[-1][1]
        assert last >= sid, f"the final GOAWAY leaves stream {sid} out: {c.describe()}"
        assert c.wait_closed(2), f"connection open after its last stream in a drain: {c.describe()}"
        # the late stream: served, refused, or left out by the final GOAWAY; never dropped
        # once accepted
        ls = c.streams[late]
        served = ls.status == 200 and ls.ended
        assert served or ls.reset == REFUSED_STREAM or late > last, (ls, c.describe())
        if not served:
            assert not [r for r in upstream.requests if "late=1" in r["target"]], upstream.requests
    rc = gw.wait(6)
    elapsed = time.monotonic() - t0
    assert rc == 0, gw.stderr()[-3000:]
    assert elapsed < 1.5 + EXIT_SLACK_S + 0.5, f"exit {elapsed:.2f}s after SIGTERM"


def test_reload_applies_to_new_streams_of_an_open_connection(sluice_factory, upstream_factory):
    """SIGHUP: new requests take the new configuration; on HTTP/2 the next stream of a
    connection opened before the reload is a new request (one kept for hours must not keep
    old routes), while a stream in flight finishes on the old one."""
    from test_operations_reload import edit, reload
    a, b = upstream_factory("A"), upstream_factory("B")
    gw = sluice_factory(upstreams=[{"name": "a", "endpoints": [a]}, {"name": "b", "endpoints": [b]}],
                        routes=[{"name": "all", "match": {"path_prefix": "/"}, "upstream": "a"}])
    with open_h2(gw.port, timeout=10) as c:
        assert h2_ok(c, "/echo?before=1").header("x-upstream") == "A"
        in_flight = c.request("GET", "/slow/1000")
        assert a.wait_for(lambda u: any("/slow/" in r["target"] for r in u.requests), 3)
        reload(gw, edit(gw, 'upstream = "a"', 'upstream = "b"'))
        s = h2_ok(c, "/echo?after=1")
        assert s.header("x-upstream") == "B", "a stream opened after the reload took the old route"
        s = c.response(in_flight, timeout=5)
        assert s.status == 200 and s.header("x-upstream") == "A", s
        assert not c.goaways, c.describe()


# ------------------------------------------------------------------------ 11. access log

def test_access_log_protocol_field(sluice_factory, upstream, tmp_path):
    log_path = tmp_path / "access.jsonl"
    gw = sluice_factory(upstream, log={"access_log": str(log_path)})
    assert gw.get("/echo/h1").status == 200
    with open_h2(gw.port) as c:
        h2_ok(c, "/echo/h2")
    deadline = time.monotonic() + 5
    recs = []
    while time.monotonic() < deadline:
        text = log_path.read_text() if log_path.exists() else ""
        recs = [json.loads(line) for line in text.splitlines()]
        if len(recs) >= 2:
            break
        time.sleep(0.05)
    by_path = {r["path"]: r for r in recs}
    assert set(by_path) == {"/echo/h1", "/echo/h2"}, recs
    assert by_path["/echo/h1"].get("protocol") == "http/1.1", by_path["/echo/h1"]
    assert by_path["/echo/h2"].get("protocol") == "h2", by_path["/echo/h2"]
    assert by_path["/echo/h2"]["status"] == 200


# ------------------------------------------------------------------------ 12. metrics

def test_http2_metrics(sluice, upstream):
    gw = sluice
    streams0 = metric_sum(gw, "sluice_http2_streams_total")
    resets0 = metric_sum(gw, "sluice_http2_streams_reset_total")
    goaways0 = metric_sum(gw, "sluice_http2_goaways_total")
    with open_h2(gw.port) as c:
        assert wait_metric(gw, "sluice_http2_connections_open", lambda v: v == 1) == 1
        for i in range(5):
            h2_ok(c, f"/echo?m={i}")
        assert wait_metric(gw, "sluice_http2_streams_total",
                           lambda v: v - streams0 >= 5) - streams0 == 5
        sid = c.request("GET", "/slow/2000")
        assert upstream.wait_for(lambda u: any("/slow/" in r["target"] for r in u.requests), 3)
        c.reset_stream(sid, CANCEL)
        assert wait_metric(gw, "sluice_http2_streams_reset_total",
                           lambda v: v > resets0) > resets0, "a stream reset by the client"
        assert metric_sum(gw, "sluice_http2_streams_total") - streams0 == 6
        resets1 = metric_sum(gw, "sluice_http2_streams_reset_total")
        s = c.response(c.request("GET", "/echo", [("connection", "close")]))
        if s.reset is not None:  # reset by the gateway (else answered 400)
            assert wait_metric(gw, "sluice_http2_streams_reset_total",
                               lambda v: v > resets1) > resets1, "a stream reset by the gateway"
    assert wait_metric(gw, "sluice_http2_connections_open", lambda v: v == 0) == 0
    with open_h2(gw.port) as c:  # DATA on stream 0: a connection error, GOAWAY PROTOCOL_ERROR
        c.send_raw(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00")
        assert c.wait_goaway(2), c.describe()
        assert c.goaways[0][0] == PROTOCOL_ERROR, c.describe()
    assert wait_metric(gw, "sluice_http2_goaways_total", lambda v: v > goaways0) > goaways0
    for name in ("sluice_http2_streams_total", "sluice_http2_streams_reset_total",
                 "sluice_http2_goaways_total", "sluice_http2_connections_open"):
        assert metric_samples(gw, name), f"{name} not in /metrics"
    assert all('reason="' in labels for labels, _ in metric_samples(gw, "sluice_http2_goaways_total"))


# ------------------------------------------------------------------------ 13. slow reader

@pytest.mark.slow
@pytest.mark.alone  # RSS bounds, measured without other tests beside it
def test_reader_that_never_opens_its_window(sluice_factory, upstream, asan_small_quarantine):
    """100 MiB from the upstream to a stream whose window stays at 65535: the gateway holds back
    (RSS grows < 64 MiB) and, once the connection window is wide open, a second stream on the
    same connection still gets its small response while the first stays shut."""
    gw = sluice_factory(upstream)
    with open_h2(gw.port) as warm:  # pools, buffers, arenas
        assert len(warm.response(warm.request("GET", f"/bytes/{4 * MIB}"), timeout=15).body) == 4 * MIB
    baseline = settled_rss_kb(gw)

    c = open_h2(gw.port, auto_window=False, settings={INITIAL_WINDOW_SIZE: 65535}, timeout=10)
    with c:
        big = c.request("GET", f"/bytes/{100 * MIB}")
        s1 = c.streams[big]
        assert c.wait(lambda: len(s1.data) >= 65535, 5), f"{len(s1.data)} bytes: {c.describe()}"
        time.sleep(2)
        grown = settled_rss_kb(gw) - baseline
        assert grown < 64 * 1024, f"RSS grew {grown // 1024} MiB behind a shut window"
        c.pump(0.2)
        assert len(s1.data) == 65535 and not s1.done, f"stream window overrun: {len(s1.data)}"

        c.window_update(0, MAX_WINDOW - (65535 - c.conn_recv_consumed))
        small = c.request("GET", "/bytes/1000")
        s3 = c.response(small, timeout=5)
        assert s3.status == 200 and s3.body == pattern_bytes(1000), s3
        time.sleep(1)
        c.pump(0.2)
        assert len(s1.data) == 65535 and not s1.done, f"stream window overrun: {len(s1.data)}"
        grown = settled_rss_kb(gw) - baseline
        assert grown < 64 * 1024, f"RSS grew {grown // 1024} MiB behind a shut stream window"
        cid = int(s1.header("x-upstream-conn"))
    assert gw.alive()
    # the client left: the upstream connection that was sending the 100 MiB is closed
    assert upstream.wait_for(lambda u: not [k for k in u.connections if k.id == cid and k.open], 3)
    assert wait_metric(gw, "sluice_http2_connections_open", lambda v: v == 0) == 0


def test_send_timeout_ends_a_stream_whose_window_stays_shut(sluice_factory, upstream):
    """send_timeout (README: a response the client takes no byte of for this long is ended,
    with the upstream connection feeding it): on HTTP/2, a stream whose window stays shut gets
    RST_STREAM (or its connection GOAWAY) within send_timeout, instead of holding its upstream
    connection as long as the client likes."""
    gw = sluice_factory(upstream, server={"send_timeout": "1s"})
    with open_h2(gw.port, auto_window=False, timeout=10) as c:
        sid = c.request("GET", f"/bytes/{10 * MIB}")
        s = c.streams[sid]
        assert c.wait(lambda: len(s.data) >= 65535, 3), c.describe()
        t0 = time.monotonic()
        c.wait(lambda: s.reset is not None or bool(c.goaways), 1.0 + TIMER_SLACK_S + 1.0)
        waited = time.monotonic() - t0
        assert s.reset is not None or c.goaways, \
            f"stream {sid} still open {waited:.1f}s after its window shut (send_timeout 1s): {c.describe()}"
        cid = int(s.header("x-upstream-conn"))
    assert upstream.wait_for(lambda u: not [k for k in u.connections if k.id == cid and k.open], 3)

