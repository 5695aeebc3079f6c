"""TLS termination ([server.tls]): certificate chain and key, TLS 1.2 and 1.3 only, modern
TLS 1.2 ciphers only, ALPN http/1.1, certificates chosen by SNI, X-Forwarded-Proto: https,
certificates reloaded on SIGHUP. Certificates come from the tls_pki fixture (openssl command);
clients are Python's ssl module, curl and openssl s_client.

Refusals are checked against a positive control: the same legacy client really negotiates
TLS 1.0/1.1 or the weak cipher with a server that allows them, so a refusal comes from the
gateway and not from the client's own OpenSSL defaults."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import warnings

import pytest

from conftest import (OPENSSL, TlsRawClient, https_request, legacy_client_context, metric_sum,
                      tls_client_context, tls_server_toml)
from rawhttp import build_request
from upstream import iter_pattern, pattern_bytes

MODERN_TLS12 = {
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
}


def tls_gateway(sluice_factory, upstream, pki, *, sni=("api",), **kw):
    return sluice_factory(upstream, extra_toml=tls_server_toml(
        pki.certs["default"], [pki.certs[n] for n in sni], **kw))


def hv(pairs, name):
    return [v for n, v in pairs if n.lower() == name.lower()]


def s_client(port, *args, timeout=10):
    """openssl s_client against 127.0.0.1:port; stdin closed at once. (rc, stdout + stderr)."""
    p = subprocess.run([OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}", *args],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


class LegacyTlsServer:
    """A Python ssl server that accepts TLS 1.0 to 1.3 and every cipher (security level 0): the
    positive control of the refusal tests. Records the version and cipher of each handshake."""

    def __init__(self, cert):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.set_ciphers("ALL:@SECLEVEL=0")
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
        self.ctx = ctx
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.results = []
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
            conn.settimeout(5)
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as s:
                    self.results.append((s.version(), s.cipher()[0]))
            except (ssl.SSLError, OSError) as e:
                self.results.append(("error", str(e)))
                conn.close()


def handshake(port, ctx, server_hostname=None):
    """(version, cipher) or the exception the handshake raised; fails on a timeout (a refusal
    must be an answer, not silence)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=server_hostname) as s:
                return s.version(), s.cipher()[0]
    except socket.timeout:
        pytest.fail(f"handshake timed out after {time.monotonic() - t0:.1f}s instead of being "
                    f"refused")
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        return e


# ------------------------------------------------------------------------ basics

def test_https_request_forwarded_with_x_forwarded_proto_https(sluice_factory, upstream, tls_pki):
    """The chain is sent (the client trusts only the root; the leaf is signed by an
    intermediate), requests go upstream with X-Forwarded-Proto: https, keep-alive works."""
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    ctx = tls_client_context(tls_pki.certs["root"])
    with TlsRawClient(gw.port, context=ctx, server_hostname="default.test") as c:
        assert c.peer_der() == tls_pki.certs["default"].der, tls_pki.which(c.peer_der())
        for i in range(3):
            c.request("GET", f"/echo?i={i}", [("X-Forwarded-Proto", "http")], host="default.test")
            r = c.read_response()
            assert r.status == 200, r
            h = r.json()["headers"]
            assert hv(h, "x-forwarded-proto") == ["https"], h
            assert hv(h, "x-forwarded-for") == ["127.0.0.1"], h
            assert r.json()["target"] == f"/echo?i={i}"
        body = b"tls body " * 1000
        c.request("POST", "/echo", body=body)
        r = c.read_response()
        assert r.status == 200 and r.json()["body_sha256"] == hashlib.sha256(body).hexdigest(), r
    assert upstream.request_count == 4
    # one client connection carried the four requests
    assert metric_sum(gw, "sluice_connections_total") == 1


@pytest.mark.parametrize("http2", [True, False], ids=["http2", "http1-only"])
def test_curl_https(sluice_factory, upstream, tls_pki, http2):
    """curl (which offers h2 and http/1.1 by ALPN) verifies the chain and gets h2, or HTTP/1.1
    where [server] http2 = false."""
    gw = sluice_factory(upstream, server={"http2": http2}, extra_toml=tls_server_toml(
        tls_pki.certs["default"], [tls_pki.certs["api"]]))
    p = subprocess.run(["curl", "-sS", "-v", "--cacert", str(tls_pki.certs["root"].cert),
                        "--resolve", f"default.test:{gw.port}:127.0.0.1",
                        "-w", "\n%{http_code} %{http_version}",
                        f"https://default.test:{gw.port}/echo"],
                       capture_output=True, timeout=20)
    out, err = p.stdout.decode(), p.stderr.decode(errors="replace")
    assert p.returncode == 0, err
    assert out.rsplit("\n", 1)[1] == ("200 2" if http2 else "200 1.1"), out
    assert ("ALPN: server accepted h2" if http2 else "ALPN: server accepted http/1.1") in err, err
    assert "SSL certificate verify ok" in err, err
    assert '"x-forwarded-proto", "https"' in out.lower().replace("'", '"'), out


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=["tls1.2", "tls1.3"])
def test_tls12_and_tls13_accepted_with_modern_ciphers(sluice_factory, upstream, tls_pki, version):
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    for name in ("default", "api"):  # an RSA and an ECDSA certificate
        ctx = tls_client_context(tls_pki.certs["root"], minimum=version, maximum=version)
        r = https_request(gw.port, "GET", "/echo", context=ctx, server_hostname=f"{name}.test")
        assert r.status == 200, r
        assert r.tls_version == ("TLSv1.2" if version == ssl.TLSVersion.TLSv1_2 else "TLSv1.3")
        assert r.peer_der == tls_pki.certs[name].der, tls_pki.which(r.peer_der)
        if version == ssl.TLSVersion.TLSv1_2:
            assert r.cipher in MODERN_TLS12, r.cipher
            assert ("ECDSA" in r.cipher) == (name == "api"), r.cipher
        else:
            assert r.cipher.startswith("TLS_"), r.cipher


@pytest.mark.parametrize("name", ["TLSv1", "TLSv1.1"], ids=["tls1.0", "tls1.1"])
def test_old_tls_versions_refused(sluice_factory, upstream, tls_pki, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        version = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1}[name]
    ctx = legacy_client_context(maximum=version)
    with LegacyTlsServer(tls_pki.certs["default"]) as control:
        got = handshake(control.port, ctx)
        assert isinstance(got, tuple) and got[0] == name, (got, control.results)  # it speaks it
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    result = handshake(gw.port, ctx, "default.test")
    assert isinstance(result, ssl.SSLError), f"{name} was accepted: {result}"
    assert "PROTOCOL_VERSION" in str(result).upper() or "UNSUPPORTED" in str(result).upper(), result
    # and with openssl s_client -tls1 / -tls1_1 (security level 0 so that it sends the hello)
    flag = {"TLSv1": "-tls1", "TLSv1.1": "-tls1_1"}[name]
    rc, out = s_client(gw.port, flag, "-cipher", "DEFAULT@SECLEVEL=0", "-servername",
                       "default.test")
    assert rc != 0 and "protocol version" in out, out
    # a modern client on the same gateway is fine
    r = https_request(gw.port, "GET", "/echo", context=tls_client_context(tls_pki.certs["root"]),
                      server_hostname="default.test")
    assert r.status == 200, r


@pytest.mark.parametrize("cipher", [
    "AES128-SHA",            # RSA key exchange (no forward secrecy), CBC, SHA-1
    "AES256-GCM-SHA384",     # RSA key exchange (no forward secrecy), even with an AEAD
    "ECDHE-RSA-AES128-SHA",  # forward secrecy, but CBC with SHA-1
])
def test_weak_tls12_ciphers_refused(sluice_factory, upstream, tls_pki, cipher):
    """RC4 and 3DES are not in this list: this OpenSSL 3 (Debian) cannot even offer them, so
    the client would refuse before the gateway is asked."""
    ctx = legacy_client_context(maximum=ssl.TLSVersion.TLSv1_2, ciphers=cipher)
    with LegacyTlsServer(tls_pki.certs["default"]) as control:
        got = handshake(control.port, ctx)
        assert got == ("TLSv1.2", cipher), (got, control.results)  # the client does speak it
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    result = handshake(gw.port, ctx, "default.test")
    assert isinstance(result, ssl.SSLError), f"{cipher} was accepted: {result}"
    assert "HANDSHAKE_FAILURE" in str(result).upper() or "NO_SHARED_CIPHER" in str(result).upper(), \
        result
    rc, out = s_client(gw.port, "-tls1_2", "-cipher", f"{cipher}:@SECLEVEL=0", "-servername",
                       "default.test")
    assert rc != 0 and "handshake failure" in out, out


def test_alpn_http11(sluice_factory, upstream, tls_pki):
    """With http2 = false, ALPN offers http/1.1 alone."""
    gw = sluice_factory(upstream, server={"http2": False}, extra_toml=tls_server_toml(
        tls_pki.certs["default"], [tls_pki.certs["api"]]))
    root = tls_pki.certs["root"]
    cases = [(["h2", "http/1.1"], "http/1.1"), (["http/1.1"], "http/1.1"), (["h2"], None),
             (None, None)]
    for offered, expected in cases:
        r = https_request(gw.port, "GET", "/echo", context=tls_client_context(root, alpn=offered),
                          server_hostname="default.test")
        assert r.alpn == expected, (offered, r.alpn)
        assert r.status == 200, (offered, r)
    rc, out = s_client(gw.port, "-alpn", "h2,http/1.1", "-servername", "default.test")
    assert "ALPN protocol: http/1.1" in out, out


def test_alpn_h2_first(sluice_factory, upstream, tls_pki):
    """By default ALPN offers h2, then http/1.1; a client offering neither gets HTTP/1.1."""
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    root = tls_pki.certs["root"]
    for offered, expected in [(["h2", "http/1.1"], "h2"), (["http/1.1", "h2"], "h2"),
                              (["http/1.1"], "http/1.1"), (["h2"], "h2")]:
        ctx = tls_client_context(root, alpn=offered)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="default.test") as tls:
                assert tls.selected_alpn_protocol() == expected, (offered, expected)
    r = https_request(gw.port, "GET", "/echo", context=tls_client_context(root, alpn=None),
                      server_hostname="default.test")
    assert r.alpn is None and r.status == 200, r


# ------------------------------------------------------------------------ SNI

def test_certificate_chosen_by_sni(sluice_factory, upstream, tls_pki):
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    cases = {
        "default.test": "default",
        "api.test": "api",
        "API.Test": "api",            # names are case-insensitive
        "x.wild.test": "api",         # *.wild.test
        "a.b.wild.test": "default",   # a wildcard covers one label only
        "wild.test": "default",
        "unknown.test": "default",    # unknown: the default certificate
        None: "default",              # no SNI at all
    }
    lax = tls_client_context(verify=False)
    wrong = []
    for sni, want in cases.items():
        r = https_request(gw.port, "GET", "/echo", context=lax, server_hostname=sni)
        assert r.status == 200, (sni, r)
        if r.peer_der != tls_pki.certs[want].der:
            wrong.append(f"SNI {sni!r}: got {tls_pki.which(r.peer_der)}, want {want}")
    assert not wrong, wrong
    # and verified, hostname checked, for names each certificate carries
    strict = tls_client_context(tls_pki.certs["root"])
    for sni in ("default.test", "api.test", "x.wild.test"):
        r = https_request(gw.port, "GET", "/echo", context=strict, server_hostname=sni)
        assert r.status == 200, (sni, r)
    rc, out = s_client(gw.port, "-servername", "api.test", "-CAfile",
                       str(tls_pki.certs["root"].cert), "-verify_return_error")
    assert "subject=CN = api.test" in out and "Verify return code: 0 (ok)" in out, out


# ------------------------------------------------------------------------ reload on SIGHUP

def wait_reloads(gw, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while metric_sum(gw, "sluice_config_reloads_total", result="success") < n:
        assert time.monotonic() < deadline, f"reload {n} not seen:\n{gw.stderr()[-3000:]}"
        time.sleep(0.02)


def wait_served(gw, cert, pki, sni="default.test", timeout=5.0):
    """Polls new connections until they are served `cert` (the worker applies a reload just
    after the main thread counted it)."""
    lax = tls_client_context(verify=False)
    deadline = time.monotonic() + timeout
    while True:
        with TlsRawClient(gw.port, context=lax, server_hostname=sni) as c:
            der = c.peer_der()
        if der == cert.der:
            return
        assert time.monotonic() < deadline, f"still served {pki.which(der)}, want {cert.name}"
        time.sleep(0.02)


def install(cert, tmp_path):
    """Copies cert/key over the files the gateway's configuration names."""
    for src, dst in ((cert.cert, tmp_path / "live.crt"), (cert.key, tmp_path / "live.key")):
        tmp = dst.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def live_gateway(sluice_factory, upstream, tls_pki, tmp_path, **kw):
    install(tls_pki.certs["default"], tmp_path)
    live = type(tls_pki.certs["default"])("live", tmp_path / "live.crt", tmp_path / "live.key",
                                         0, b"", "")
    return sluice_factory(upstream, extra_toml=tls_server_toml(live, [tls_pki.certs["api"]], **kw))


def test_sighup_reloads_certificates(sluice_factory, upstream, tls_pki, tmp_path):
    gw = live_gateway(sluice_factory, upstream, tls_pki, tmp_path)
    old = tls_pki.certs["default"]
    new = tls_pki.leaf(f"default_r{os.getpid()}_{time.monotonic_ns()}", "default.test",
                       tls_pki.certs["inter"], dns=["default.test"],
                       chain=[tls_pki.certs["inter"]])
    strict = tls_client_context(tls_pki.certs["root"])
    with TlsRawClient(gw.port, context=strict, server_hostname="default.test") as kept:
        kept.request("GET", "/echo")
        assert kept.read_response().status == 200
        assert kept.sock.getpeercert()["serialNumber"] == old.serial_hex

        install(new, tmp_path)
        gw.send_signal(signal.SIGHUP)
        wait_reloads(gw, 1)
        wait_served(gw, new, tls_pki)
        r = https_request(gw.port, "GET", "/echo", context=strict, server_hostname="default.test")
        assert r.status == 200 and r.peer_der == new.der, r
        with TlsRawClient(gw.port, context=strict, server_hostname="default.test") as c:
            assert c.sock.getpeercert()["serialNumber"] == new.serial_hex

        # the connection opened before the reload goes on, with the certificate it had
        for _ in range(2):
            kept.request("GET", "/echo")
            r = kept.read_response()
            assert r.status == 200, r
            assert r.json()["headers"] and hv(r.json()["headers"], "x-forwarded-proto") == ["https"]
        assert kept.peer_der() == old.der
    # the SNI certificate is still chosen after the reload
    r = https_request(gw.port, "GET", "/echo", context=strict, server_hostname="api.test")
    assert r.status == 200 and r.peer_der == tls_pki.certs["api"].der


def test_reload_with_mismatched_key_is_refused(sluice_factory, upstream, tls_pki, tmp_path):
    """A certificate replaced without its key: the reload is refused and the certificate that
    was loaded keeps being served."""
    gw = live_gateway(sluice_factory, upstream, tls_pki, tmp_path)
    other = tls_pki.leaf(f"default_nokey{time.monotonic_ns()}", "default.test",
                         tls_pki.certs["inter"], dns=["default.test"])
    shutil.copyfile(other.cert, tmp_path / "live.crt")  # the key stays the old one
    gw.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while metric_sum(gw, "sluice_config_reloads_total", result="failure") < 1:
        assert time.monotonic() < deadline, gw.stderr()[-3000:]
        time.sleep(0.02)
    assert metric_sum(gw, "sluice_config_reloads_total", result="success") == 0
    for _ in range(3):
        r = https_request(gw.port, "GET", "/echo",
                          context=tls_client_context(tls_pki.certs["root"]),
                          server_hostname="default.test")
        assert r.status == 200 and r.peer_der == tls_pki.certs["default"].der, \
            tls_pki.which(r.peer_der)


def test_handshake_started_before_reloads_completes(sluice_binary, sluice_factory, upstream,
                                                    tls_pki, tmp_path):
    """A client connects, then two reloads happen before it sends its ClientHello (with SNI):
    the certificates of the generation that accepted it must still be usable. The connection
    completes its handshake with an api.test certificate and gets a 200; the gateway lives on
    (and, with the ASan build, exits 0)."""
    gw = live_gateway(sluice_factory, upstream, tls_pki, tmp_path, handshake_timeout="10s")
    inter = tls_pki.certs["inter"]
    gen = [tls_pki.leaf(f"default_g{i}_{time.monotonic_ns()}", "default.test", inter,
                        dns=["default.test"], chain=[inter]) for i in (1, 2)]
    install(gen[0], tmp_path)
    gw.send_signal(signal.SIGHUP)
    wait_reloads(gw, 1)
    wait_served(gw, gen[0], tls_pki)

    ctx = tls_client_context(tls_pki.certs["root"])
    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    try:
        deadline = time.monotonic() + 5
        while metric_sum(gw, "sluice_connections_open") < 1:  # accepted under generation 1
            assert time.monotonic() < deadline
            time.sleep(0.01)
        install(gen[1], tmp_path)
        gw.send_signal(signal.SIGHUP)
        wait_reloads(gw, 2)
        wait_served(gw, gen[1], tls_pki)
        time.sleep(0.1)
        s = ctx.wrap_socket(raw, server_hostname="api.test")
        raw = s
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert s.getpeercert(binary_form=True) == tls_pki.certs["api"].der
        assert data.startswith(b"HTTP/1.1 200 "), data[:200]
    finally:
        raw.close()
    assert gw.alive(), gw.stderr()[-5000:]
    r = https_request(gw.port, "GET", "/echo", context=ctx, server_hostname="api.test")
    assert r.status == 200


# ------------------------------------------------------------------------ pipelining

def test_pipelined_requests_answered_by_the_gateway_over_tls(sluice_factory, upstream, tls_pki):
    """Four requests in one TLS record, the 1st and 3rd answered by the gateway itself (404,
    no route), the others forwarded: four responses in order, as over plain TCP."""
    gw = sluice_factory(upstream, routes=[{"name": "echo", "match": {"path_prefix": "/echo"},
                                           "upstream": "app"}],
                        extra_toml=tls_server_toml(tls_pki.certs["default"]))
    with TlsRawClient(gw.port, context=tls_client_context(tls_pki.certs["root"]),
                      server_hostname="default.test") as c:
        c.send(build_request("GET", "/nope") + build_request("GET", "/echo?second") +
               build_request("GET", "/nope2") + build_request("GET", "/echo?fourth"))
        got = []
        for _ in range(4):
            try:
                r = c.read_response()
            except EOFError:
                got.append("EOF")
                break
            got.append((r.status, r.json()["target"] if r.status == 200 else None))
    assert got == [(404, None), (200, "/echo?second"), (404, None), (200, "/echo?fourth")], got


# ------------------------------------------------------------------------ big bodies

def test_large_bodies_both_ways_over_tls(sluice_factory, upstream, tls_pki):
    """Many TLS records each way (16 KiB each): 4 MB down, 4 MB up, on one connection."""
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    n = 4 * 1024 * 1024
    with TlsRawClient(gw.port, context=tls_client_context(tls_pki.certs["root"]),
                      server_hostname="default.test", timeout=20) as c:
        c.request("GET", f"/bytes/{n}")
        r = c.read_response()
        assert r.status == 200 and len(r.body) == n, r
        assert r.body == pattern_bytes(n)
        body = os.urandom(n)
        c.request("POST", "/echo", body=body)
        r = c.read_response()
        assert r.status == 200, r
        assert r.json()["body_len"] == n
        assert r.json()["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_large_response_to_slow_tls_reader_bounded_memory(sluice_factory, upstream, tls_pki):
    """Backpressure through TLS: 50 MB to a client that reads slowly at first; the gateway's
    RSS stays bounded and every byte arrives."""
    gw = tls_gateway(sluice_factory, upstream, tls_pki)
    n = 50 * 1024 * 1024
    base = peak = gw.rss_kb()
    expected = hashlib.sha256()
    for block in iter_pattern(n):
        expected.update(block)
    got = hashlib.sha256()
    total = 0
    with TlsRawClient(gw.port, context=tls_client_context(tls_pki.certs["root"]),
                      server_hostname="default.test", timeout=20, rcvbuf=64 * 1024) as c:
        c.request("GET", f"/bytes/{n}")
        r = c.read_head()
        assert r.status == 200 and r.header("content-length") == str(n), r
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            data = c.recv_some(32 * 1024)
            assert data, "connection closed early"
            got.update(data)
            total += len(data)
            peak = max(peak, gw.rss_kb())
            time.sleep(0.02)
        slow_total = total
        while total < n:
            data = c.recv_some(1024 * 1024)
            assert data, f"connection closed after {total} bytes"
            got.update(data)
            total += len(data)
        assert total == n and got.hexdigest() == expected.hexdigest()
        c.request("GET", "/echo?after")
        assert c.read_response().status == 200
    assert slow_total < 10 * 1024 * 1024, slow_total
    growth_mb = (peak - base) / 1024
    assert growth_mb < 16, f"gateway RSS grew by {growth_mb:.1f} MB (slow TLS reader)"
