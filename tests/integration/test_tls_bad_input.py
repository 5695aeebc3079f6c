"""Bad input on the TLS port: plain HTTP, aborted handshakes, garbage, clients that stall in
the handshake (closed after handshake_timeout), an unknown SNI name, a client that leaves in
the middle of a response. Each must fail cleanly and leave every other connection alone: a
good HTTPS client (HttpsProbe: keep-alive and new connections) keeps getting 200s the whole
time, and afterwards no connection is left open in the gateway.

Every test runs against SLUICE_BIN and, when SLUICE_ASAN_BIN is set, against that
ASan/UBSan build too (the sluice_binary fixture): a memory error kills it and a leak makes its
exit code non-zero, which the sluice_factory teardown reports."""

from __future__ import annotations

import signal
import socket
import ssl
import struct
import subprocess
import time

import pytest

from conftest import (OPENSSL, TIMER_SLACK_S, HttpsProbe, RawClient, TlsRawClient, client_hello,
                      https_request, metric_sum, tls_client_context, tls_server_toml)
from rawhttp import build_request

HANDSHAKE_TIMEOUT = 1.0


@pytest.fixture
def tls_gw(sluice_binary, sluice_factory, upstream, tls_pki):
    return sluice_factory(upstream, extra_toml=tls_server_toml(
        tls_pki.certs["default"], [tls_pki.certs["api"]],
        handshake_timeout=f"{int(HANDSHAKE_TIMEOUT * 1000)}ms"))


@pytest.fixture
def probe(tls_gw, tls_pki):
    return HttpsProbe(tls_gw.port, tls_client_context(tls_pki.certs["root"]))


def closed_within(sock: socket.socket, timeout: float) -> tuple:
    """(closed, seconds, bytes received before the close): waits for EOF or a reset."""
    t0 = time.monotonic()
    data = b""
    sock.settimeout(0.05)
    while time.monotonic() - t0 < timeout:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True, time.monotonic() - t0, data
        if not chunk:
            return True, time.monotonic() - t0, data
        data += chunk
    return False, time.monotonic() - t0, data


def rst_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def assert_no_connection_left(gw, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = metric_sum(gw, "sluice_connections_open")
        if left == 0:
            return
        assert time.monotonic() < deadline, f"{left} connections still open in the gateway"
        time.sleep(0.05)


def still_serving(gw, tls_pki) -> None:
    r = https_request(gw.port, "GET", "/echo", context=tls_client_context(tls_pki.certs["root"]),
                      server_hostname="default.test")
    assert r.status == 200, r
    assert gw.alive(), gw.stderr()[-5000:]


# ------------------------------------------------------------------------ plain HTTP

def test_plain_http_to_tls_port(tls_gw, probe, tls_pki):
    """A plain HTTP request gets a plain-text 400 that says so, then the connection closes; a
    request whose first segment is too short to recognise is closed (no hang)."""
    with probe:
        for _ in range(3):
            with RawClient(tls_gw.port, timeout=5) as c:
                c.request("GET", "/echo")
                r = c.read_response()
                assert r.status == 400, r
                assert (r.header("content-type") or "").startswith("text/plain"), r
                assert b"HTTPS" in r.body, r
                assert c.is_closed(2.0)
        with RawClient(tls_gw.port, timeout=5) as c:  # POST with a body, then more requests
            c.send(build_request("POST", "/echo", body=b"x" * 5000) * 3)
            r = c.read_response()
            assert r.status == 400, r
            assert c.is_closed(3.0)
        s = connect(tls_gw.port)
        try:
            s.sendall(b"GE")
            time.sleep(0.2)
            s.sendall(b"T /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            closed, took, data = closed_within(s, 3.0)
            assert closed, f"not closed after {took:.1f}s"
            assert not data.startswith(b"HTTP/1.1 200"), data[:100]
            assert data == b"" or data.startswith(b"HTTP/1.1 400") or data[:1] == b"\x15", data
        finally:
            s.close()
        time.sleep(0.2)
    probe.check()
    still_serving(tls_gw, tls_pki)
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ aborted handshakes

def test_aborted_handshakes(tls_gw, probe, tls_pki):
    """Half a ClientHello then FIN, half then RST, a whole ClientHello then FIN before the end
    of the handshake, connect-and-close, garbage bytes, a huge record length: each connection
    is closed by the gateway (or was closed by the client) and nothing else notices."""
    hello = client_hello("default.test")
    with probe:
        s = connect(tls_gw.port)  # half a ClientHello, then FIN
        s.sendall(hello[: len(hello) // 2])
        s.shutdown(socket.SHUT_WR)
        closed, took, _ = closed_within(s, 2.0)
        s.close()
        assert closed and took < HANDSHAKE_TIMEOUT * 0.6, \
            f"half hello + FIN: closed={closed} after {took:.2f}s (should not need the timeout)"

        s = connect(tls_gw.port)  # half a ClientHello, then RST
        s.sendall(hello[: len(hello) // 2])
        time.sleep(0.05)
        rst_close(s)

        s = connect(tls_gw.port)  # a whole ClientHello, read the ServerHello, then FIN
        s.sendall(hello)
        s.settimeout(2)
        first = s.recv(5)
        assert first[:1] == b"\x16", first  # a handshake record: the ServerHello
        s.shutdown(socket.SHUT_WR)
        closed, took, _ = closed_within(s, 2.0)
        s.close()
        assert closed, "whole hello + FIN: not closed"

        s = connect(tls_gw.port)  # a whole ClientHello, then RST
        s.sendall(hello)
        time.sleep(0.05)
        rst_close(s)

        connect(tls_gw.port).close()  # connect and close at once

        for junk in (bytes(range(256)) * 8,                 # garbage (starts with 0x00)
                     b"\x16\x03\x01\xff\xff" + b"\x00" * 100,  # a record claiming 64 KiB
                     b"\x16\x03\x03\x00\x05\x01\x00\x00\x01\x00"):  # a hello of length 1
            s = connect(tls_gw.port)
            s.sendall(junk)
            closed, took, data = closed_within(s, 2.0)
            s.close()
            # refused at once: none of these needs the handshake timeout
            assert closed and took < HANDSHAKE_TIMEOUT * 0.6, \
                f"{junk[:10]!r}: closed={closed} after {took:.2f}s"
            assert not data.startswith(b"HTTP/1.1 2"), data[:50]
        time.sleep(0.2)
    probe.check()
    still_serving(tls_gw, tls_pki)
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ stalled handshakes

def test_stalled_handshakes_closed_after_handshake_timeout(tls_gw, probe, tls_pki):
    """handshake_timeout = 1s (request_header_timeout is 3s): a client that sends nothing, one
    that sends half a ClientHello and one that stops after the ClientHello are all closed after
    about 1 s. A connection whose handshake is done is not subject to it."""
    hello = client_hello("default.test")
    ctx = tls_client_context(tls_pki.certs["root"])
    with probe:
        done = TlsRawClient(tls_gw.port, context=ctx, server_hostname="default.test")
        opened = {}
        silent = connect(tls_gw.port)
        opened["silent"] = time.monotonic()
        half = connect(tls_gw.port)
        half.sendall(hello[:40])
        opened["half hello"] = time.monotonic()
        whole = connect(tls_gw.port)
        whole.sendall(hello)  # and never sends its Finished
        opened["whole hello"] = time.monotonic()
        try:
            for name, s in (("silent", silent), ("half hello", half), ("whole hello", whole)):
                closed, _, data = closed_within(s, 4.0)
                took = time.monotonic() - opened[name]
                assert closed, f"{name}: still open after {took:.1f}s"
                # closed at handshake_timeout: not before, and not at request_header_timeout
                assert HANDSHAKE_TIMEOUT * 0.9 <= took < HANDSHAKE_TIMEOUT + TIMER_SLACK_S, \
                    f"{name}: closed after {took:.2f}s"
                assert not data.startswith(b"HTTP/"), (name, data[:100])
            time.sleep(HANDSHAKE_TIMEOUT * 0.6)  # `done` is now past the handshake timeout
            done.request("GET", "/echo")
            r = done.read_response()
            assert r.status == 200, r
            assert not done.is_closed(0.1)
        finally:
            for s in (silent, half, whole):
                s.close()
            done.close()
    probe.check()
    assert_no_connection_left(tls_gw)


def test_handshake_timeout_started_at_accept(tls_gw, tls_pki):
    """Bytes that trickle in (a ClientHello byte by byte, slower than the timeout allows) do
    not extend the handshake deadline."""
    hello = client_hello("default.test")
    s = connect(tls_gw.port)
    t0 = time.monotonic()
    try:
        closed = False
        for b in hello:
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - t0 > HANDSHAKE_TIMEOUT + 1.5:
                break
        if not closed:
            closed, _, _ = closed_within(s, 0.5)
        took = time.monotonic() - t0
        # + 0.1 s: the close is seen at the next byte sent, one every 0.1 s.
        assert closed and took < HANDSHAKE_TIMEOUT + 0.1 + TIMER_SLACK_S, \
            f"closed={closed} after {took:.2f}s"
    finally:
        s.close()
    still_serving(tls_gw, tls_pki)
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ unknown SNI

def test_unknown_sni_gets_default_certificate_and_fails_verification(tls_gw, probe, tls_pki):
    ctx = tls_client_context(tls_pki.certs["root"])
    lax = tls_client_context(verify=False)
    with probe:
        for _ in range(3):
            with pytest.raises(ssl.SSLCertVerificationError) as e:
                TlsRawClient(tls_gw.port, context=ctx, server_hostname="unknown.test").close()
            assert "Hostname mismatch" in str(e.value) or "hostname" in str(e.value).lower(), e.value
            with TlsRawClient(tls_gw.port, context=lax, server_hostname="unknown.test") as c:
                assert c.peer_der() == tls_pki.certs["default"].der, tls_pki.which(c.peer_der())
                c.request("GET", "/echo", host="unknown.test")
                assert c.read_response().status == 200
        # odd SNI values: a trailing dot, 63-character labels, a 253-character name
        for name in ("api.test.", "a" * 63 + ".wild.test", ".".join(["b" * 60] * 4) + ".test"):
            with TlsRawClient(tls_gw.port, context=lax, server_hostname=name) as c:
                assert c.peer_der() in (tls_pki.certs["default"].der, tls_pki.certs["api"].der)
                c.request("GET", "/echo")
                assert c.read_response().status == 200
        time.sleep(0.2)
    probe.check()
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ leaving early

def test_client_leaves_mid_response(tls_gw, probe, tls_pki):
    """A TLS client resets the connection in the middle of a 20 MB response, or closes right
    after sending a request: the gateway cleans up and goes on."""
    ctx = tls_client_context(tls_pki.certs["root"])
    with probe:
        for _ in range(2):
            c = TlsRawClient(tls_gw.port, context=ctx, server_hostname="default.test")
            c.request("GET", "/bytes/20000000")
            got = 0
            while got < 200_000:
                got += len(c.sock.recv(65536))
            c.reset()
        c = TlsRawClient(tls_gw.port, context=ctx, server_hostname="default.test")
        c.request("GET", "/slow/300")
        c.close()
        time.sleep(0.5)
    probe.check()
    still_serving(tls_gw, tls_pki)
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ renegotiation, KeyUpdate

def s_client_session(port, lines, *args):
    """openssl s_client -crlf: each line is sent after a short pause (R: ask for a
    renegotiation, K: a TLS 1.3 KeyUpdate asking for the peer's; s_client obeys these only
    without -ign_eof, so stdin stays open until s_client exits: the server closes after a
    `Connection: close` response). (rc, output)."""
    p = subprocess.Popen([OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}", "-crlf",
                          "-servername", "default.test", *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in lines:
            time.sleep(0.2)
            try:
                p.stdin.write(line.encode() + b"\n")
                p.stdin.flush()
            except BrokenPipeError:
                break
        p.wait(timeout=10)
        out = p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
        try:
            p.stdin.close()
        except BrokenPipeError:
            pass
        p.stdout.close()
    return p.returncode, out.decode(errors="replace")


REQUEST_LINES = ["GET /echo HTTP/1.1", "Host: default.test", "Connection: close", ""]


def test_renegotiation_refused_and_key_update_honoured(tls_gw, probe, tls_pki):
    """TLS 1.2 renegotiation (a DoS lever) is refused; a TLS 1.3 KeyUpdate (update_requested)
    is answered and the connection goes on."""
    with probe:
        rc, out = s_client_session(tls_gw.port, ["R"] + REQUEST_LINES, "-tls1_2")
        assert "RENEGOTIATING" in out, out
        assert "no renegotiation" in out, out
        assert "HTTP/1.1 200" not in out, out
        rc, out = s_client_session(tls_gw.port, ["K"] + REQUEST_LINES + ["K"], "-tls1_3")
        assert "KEYUPDATE" in out, out
        assert "HTTP/1.1 200 OK" in out and '"x-forwarded-proto", "https"' in out.lower(), out
    probe.check()
    still_serving(tls_gw, tls_pki)
    assert_no_connection_left(tls_gw)


# ------------------------------------------------------------------------ shutdown

def test_sigterm_with_handshakes_in_progress(sluice_binary, sluice_factory, upstream, tls_pki):
    """SIGTERM while one client is stalled in its handshake, one is half-way through its
    ClientHello and one is kept alive after a request: the gateway exits 0 at once (these are
    not requests in flight), long before drain_timeout (5 s) or handshake_timeout (10 s)."""
    gw = sluice_factory(upstream, extra_toml=tls_server_toml(tls_pki.certs["default"],
                                                             handshake_timeout="10s"))
    silent = connect(gw.port)
    half = connect(gw.port)
    half.sendall(client_hello("default.test")[:60])
    kept = TlsRawClient(gw.port, context=tls_client_context(tls_pki.certs["root"]),
                        server_hostname="default.test")
    try:
        kept.request("GET", "/echo")
        assert kept.read_response().status == 200
        deadline = time.monotonic() + 5
        while metric_sum(gw, "sluice_connections_open") < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        gw.send_signal(signal.SIGTERM)
        rc = gw.wait(10)
        took = time.monotonic() - t0
        assert rc == 0, f"exit code {rc}:\n{gw.stderr()[-5000:]}"
        assert took < 2.5, f"exit took {took:.2f}s"
        for s in (silent, half):
            closed, _, _ = closed_within(s, 1.0)
            assert closed
        assert kept.is_closed(1.0)
    finally:
        silent.close()
        half.close()
        kept.close()
