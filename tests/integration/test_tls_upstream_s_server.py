"""TLS towards an upstream that is a real TLS server from Debian: `openssl s_server -WWW`
(OpenSSL's own server, serving files from a directory over HTTP/1.0, one connection at a time,
closing after each response). The same checks as test_tls_upstream.py, which uses Python's ssl
for the upstream, against a server Sluice's tests do not implement: verification (a certificate
from another CA or an expired one is refused; tls_verify = false accepts it), SNI, and a client
certificate that s_server requires (-Verify, -verify_return_error)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import free_port
from test_tls_upstream import by_host, get, upstream_cfg

BODY = b"served by openssl s_server\n"


class SServer:
    """openssl s_server -WWW on a free loopback port, serving `hello.txt` from its directory."""

    def __init__(self, directory: Path, cert, client_ca=None):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hello.txt").write_bytes(BODY)
        self.port = free_port()
        self.log = directory / "s_server.log"
        args = ["openssl", "s_server", "-accept", f"127.0.0.1:{self.port}", "-cert", cert.cert,
                "-key", cert.key, "-WWW", "-tlsextdebug"]  # -tlsextdebug: prints the SNI received
        if client_ca is not None:
            args += ["-Verify", "1", "-verify_return_error", "-CAfile", client_ca.cert]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=directory, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"s_server exited: {self.output()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(f"s_server did not listen: {self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def server_names(self) -> list:
        """The SNI of every handshake, from -tlsextdebug's hex dumps of the server_name
        extension (list length 2 bytes, type 1, name length 2, name)."""
        names, lines = [], self.output().splitlines()
        for i, line in enumerate(lines):
            if 'extension "server name"' not in line:
                continue
            raw = bytearray()
            for dump in lines[i + 1:]:
                m = re.match(r"^[0-9a-f]{4} - (.*?)(?:   |$)", dump)
                if not m:
                    break
                raw += bytes.fromhex(m.group(1).replace("-", " "))
            names.append(raw[5:].decode("ascii", "replace"))
        return names

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def s_server_factory(tmp_path):
    servers = []

    def make(name, cert, client_ca=None):
        server = SServer(tmp_path / name, cert, client_ca)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def test_upstream_tls_to_openssl_s_server(sluice_factory, s_server_factory, tls_pki):
    """Verified against tls_ca_file with the SNI of tls_server_name; s_server answers HTTP/1.0
    and closes, so every request is a new TLS connection, and each one works."""
    server = s_server_factory("good", tls_pki.certs["upstream"])
    gw = sluice_factory(upstreams=[upstream_cfg("app", server.port,
                                                tls_server_name="upstream.test",
                                                tls_ca_file=tls_pki.certs["root"].cert)])
    for _ in range(3):
        r = gw.get("/hello.txt")
        assert r.status == 200, (r, server.output()[-2000:])
        assert r.body == BODY, r
    assert server.server_names() == ["upstream.test"] * 3, server.output()[-2000:]


@pytest.mark.parametrize("cert, server_name, reason", [
    ("upstream_other_ca", "upstream.test", "unable to get local issuer certificate"),
    ("upstream_expired", "upstream.test", "certificate has expired"),
    ("upstream", "wrong.test", "hostname mismatch"),
])
def test_openssl_s_server_certificate_refused_unless_verification_off(
        sluice_factory, s_server_factory, tls_pki, cert, server_name, reason):
    """A certificate that must be refused (another CA, expired, another name): 502 and the
    reason in the log; the same server with tls_verify = false: 200."""
    strict = s_server_factory("strict", tls_pki.certs[cert])
    lax = s_server_factory("lax", tls_pki.certs[cert])
    common = {"tls_server_name": server_name, "tls_ca_file": tls_pki.certs["root"].cert}
    gw = sluice_factory(upstreams=[upstream_cfg("strict", strict.port, **common),
                                   upstream_cfg("lax", lax.port, tls_verify=False, **common)],
                        routes=by_host(["strict", "lax"]))
    r = get(gw, "strict", "/hello.txt")
    assert r.status == 502 and r.body != BODY, r
    deadline = time.monotonic() + 2
    while reason not in gw.stderr() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reason in gw.stderr(), gw.stderr()[-3000:]
    r = get(gw, "lax", "/hello.txt")
    assert r.status == 200 and r.body == BODY, r


def test_openssl_s_server_requiring_a_client_certificate(sluice_factory, s_server_factory,
                                                         tls_pki):
    """s_server -Verify 1 -verify_return_error: without a client certificate, or with one from
    another CA, the handshake fails (502); with tls_client_cert / tls_client_key it is 200."""
    root = tls_pki.certs["root"]
    servers = {n: s_server_factory(n, tls_pki.certs["upstream"], client_ca=root)
               for n in ("nocert", "othercert", "mtls")}
    common = {"tls_server_name": "upstream.test", "tls_ca_file": root.cert}
    client, other = tls_pki.certs["client"], tls_pki.certs["client_other_ca"]
    gw = sluice_factory(upstreams=[
        upstream_cfg("nocert", servers["nocert"].port, **common),
        upstream_cfg("othercert", servers["othercert"].port, tls_client_cert=other.cert,
                     tls_client_key=other.key, **common),
        upstream_cfg("mtls", servers["mtls"].port, tls_client_cert=client.cert,
                     tls_client_key=client.key, **common),
    ], routes=by_host(["nocert", "othercert", "mtls"]))
    for name in ("nocert", "othercert"):
        r = get(gw, name, "/hello.txt")
        assert r.status == 502 and r.body != BODY, (name, r)
    for _ in range(2):
        r = get(gw, "mtls", "/hello.txt")
        assert r.status == 200 and r.body == BODY, (r, servers["mtls"].output()[-2000:])
    assert "sluice-client" in servers["mtls"].output(), servers["mtls"].output()[-2000:]
