"""TLS helpers (test_tls_*.py): certificates made with the openssl command, client contexts
and clients, the [server.tls] TOML, an upstream behind TLS, and a good HTTPS client that keeps
probing while a test misbehaves."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import pytest

from rawhttp import RawClient, Response
from upstream import UpstreamServer

from harness.gateway import toml_table

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
# The ASan build the TLS bad-input tests also run against (sluice_binary fixture), when set.
SLUICE_ASAN_BIN = os.environ.get("SLUICE_ASAN_BIN")


@dataclass
class CertFiles:
    """One certificate made by Pki: PEM files, its serial and its DER (to compare with what a
    server sent)."""
    name: str
    cert: Path          # PEM: the leaf first, then the chain (if any)
    key: Path           # PEM private key
    serial: int
    der: bytes          # the leaf, DER
    cn: str

    @property
    def serial_hex(self) -> str:
        """As Python's getpeercert() writes it."""
        return "%X" % self.serial


class Pki:
    """Certificates made at test time with the openssl command (OpenSSL 3.0): CAs, leaves
    signed by them (SANs, EC or RSA keys, client or server use), expired ones (days=-1 gives a
    notAfter one day before notBefore, which OpenSSL 3.0 accepts)."""

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.certs: dict[str, CertFiles] = {}

    def openssl(self, *args: str, input: Optional[bytes] = None) -> bytes:
        p = subprocess.run([OPENSSL, *args], input=input, capture_output=True, timeout=30)
        if p.returncode != 0:
            pytest.fail(f"openssl {' '.join(args)} failed: {p.stderr.decode(errors='replace')}",
                        pytrace=False)
        return p.stdout

    def _key(self, path: Path, kind: str) -> None:
        if kind == "rsa":
            self.openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                         "-out", str(path))
        else:
            self.openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                         "-out", str(path))

    def _finish(self, name: str, cert: Path, key: Path, serial: int, cn: str,
                chain: Iterable[CertFiles] = ()) -> CertFiles:
        leaf_pem = cert.read_text()
        der = ssl.PEM_cert_to_DER_cert(leaf_pem)
        chain = list(chain)
        if chain:
            cert.write_text(leaf_pem + "".join(c.cert.read_text() for c in chain))
        out = CertFiles(name, cert, key, serial, der, cn)
        self.certs[name] = out
        return out

    def new_serial(self) -> int:
        return int.from_bytes(os.urandom(8), "big") >> 1 | 1 << 60

    def ca(self, name: str, cn: str, issuer: Optional[CertFiles] = None,
           kind: str = "ec") -> CertFiles:
        """A root CA (issuer None) or an intermediate signed by issuer."""
        key, cert = self.root / f"{name}.key", self.root / f"{name}.crt"
        self._key(key, kind)
        serial = self.new_serial()
        ext = self.root / f"{name}.ext"
        ext.write_text("basicConstraints = critical, CA:TRUE\n"
                       "keyUsage = critical, keyCertSign, cRLSign\n"
                       "subjectKeyIdentifier = hash\n")
        if issuer is None:
            self._self_signed(key, cert, cn, serial, ext)
        else:
            self._sign(key, cert, cn, serial, ext, issuer, days=3650)
        return self._finish(name, cert, key, serial, cn)

    def _self_signed(self, key: Path, cert: Path, cn: str, serial: int, ext: Path) -> None:
        csr = cert.with_suffix(".csr")
        self.openssl("req", "-new", "-key", str(key), "-subj", f"/CN={cn}", "-out", str(csr))
        self.openssl("x509", "-req", "-in", str(csr), "-signkey", str(key), "-days", "3650",
                     "-set_serial", str(serial), "-extfile", str(ext), "-out", str(cert))

    def _sign(self, key: Path, cert: Path, cn: str, serial: int, ext: Path, issuer: CertFiles,
              days: int) -> None:
        csr = cert.with_suffix(".csr")
        self.openssl("req", "-new", "-key", str(key), "-subj", f"/CN={cn}", "-out", str(csr))
        self.openssl("x509", "-req", "-in", str(csr), "-CA", str(issuer.cert), "-CAkey",
                     str(issuer.key), "-set_serial", str(serial), "-days", str(days),
                     "-extfile", str(ext), "-out", str(cert))

    def leaf(self, name: str, cn: str, issuer: CertFiles, *, dns: Iterable[str] = (),
             ips: Iterable[str] = (), kind: str = "ec", days: int = 30, client: bool = False,
             chain: Iterable[CertFiles] = (), key: Optional[Path] = None) -> CertFiles:
        """A server (or client) certificate signed by issuer. days=-1: already expired. key:
        reuse an existing private key instead of making one. chain: certificates appended to
        the PEM file after the leaf (intermediates)."""
        cert = self.root / f"{name}.crt"
        if key is None:
            key = self.root / f"{name}.key"
            self._key(key, kind)
        serial = self.new_serial()
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        ext = self.root / f"{name}.ext"
        lines = ["basicConstraints = critical, CA:FALSE",
                 "keyUsage = critical, digitalSignature" + (", keyEncipherment" if kind == "rsa" else ""),
                 "extendedKeyUsage = " + ("clientAuth" if client else "serverAuth")]
        if sans:
            lines.append("subjectAltName = " + ", ".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        self._sign(key, cert, cn, serial, ext, issuer, days)
        return self._finish(name, cert, key, serial, cn, chain)

    def describe(self, der: Optional[bytes]) -> str:
        """subject, issuer, serial and dates of a DER certificate (for assertion messages)."""
        if not der:
            return "(no certificate)"
        pem = ssl.DER_cert_to_PEM_cert(der).encode()
        return self.openssl("x509", "-noout", "-subject", "-issuer", "-serial", "-dates",
                            input=pem).decode().strip().replace("\n", "; ")

    def which(self, der: Optional[bytes]) -> str:
        """The name of the Pki certificate whose DER this is, else a description."""
        for c in self.certs.values():
            if c.der == der:
                return c.name
        return self.describe(der)


def make_test_pki(root: Path) -> Pki:
    """The certificates the TLS tests share (made once per session, about 1 s):

    - root ("Sluice Test Root CA"), inter (intermediate signed by root), other_root (a CA
      nobody trusts);
    - default: RSA 2048, default.test, signed by inter; its PEM holds the chain (leaf + inter),
      so a client that trusts only root verifies it only if the gateway sends the chain;
    - api: EC, api.test and *.wild.test, signed by root;
    - upstream: EC, upstream.test and IP 127.0.0.1, signed by root; upstream_noip: the same
      without the IP; upstream_other_ca: signed by other_root; upstream_expired: expired;
    - client: clientAuth, CN sluice-client, signed by root; client_other_ca: by other_root.
    """
    pki = Pki(root)
    root = pki.ca("root", "Sluice Test Root CA")
    inter = pki.ca("inter", "Sluice Test Intermediate CA", issuer=root)
    other = pki.ca("other_root", "Other Test CA")
    pki.leaf("default", "default.test", inter, dns=["default.test"], kind="rsa", chain=[inter])
    pki.leaf("api", "api.test", root, dns=["api.test", "*.wild.test"])
    up_names = dict(dns=["upstream.test"], ips=["127.0.0.1"])
    pki.leaf("upstream", "upstream.test", root, **up_names)
    pki.leaf("upstream_noip", "upstream.test", root, dns=["upstream.test"])
    pki.leaf("upstream_other_ca", "upstream.test", other, **up_names)
    pki.leaf("upstream_expired", "upstream.test", root, days=-1, **up_names)
    pki.leaf("client", "sluice-client", root, client=True)
    pki.leaf("client_other_ca", "sluice-client", other, client=True)
    return pki


def tls_client_context(cafile: Any = None, *, verify: bool = True, check_hostname: bool = True,
                       minimum: Optional[ssl.TLSVersion] = None,
                       maximum: Optional[ssl.TLSVersion] = None, ciphers: Optional[str] = None,
                       alpn: Optional[list] = None) -> ssl.SSLContext:
    """A client context: verifies against cafile (a path or CertFiles) unless verify=False."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if verify:
        ctx.load_verify_locations(str(cafile.cert if isinstance(cafile, CertFiles) else cafile))
        ctx.check_hostname = check_hostname
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if ciphers:
        ctx.set_ciphers(ciphers)
    if minimum:
        ctx.minimum_version = minimum
    if maximum:
        ctx.maximum_version = maximum
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def legacy_client_context(*, maximum: ssl.TLSVersion, ciphers: str = "DEFAULT") -> ssl.SSLContext:
    """A client willing to speak what the gateway must refuse: TLS 1.0/1.1 or weak TLS 1.2
    ciphers. OpenSSL 3 allows those only at security level 0, so it is set here; tests prove
    with legacy_tls_server() that such a client really does negotiate them."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_ciphers(ciphers + ":@SECLEVEL=0")
    with warnings.catch_warnings():  # TLSVersion.TLSv1 / TLSv1_1 are deprecated: on purpose
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = maximum
    return ctx


class TlsRawClient(RawClient):
    """RawClient over TLS (same reading helpers); .sock is the ssl.SSLSocket. The handshake
    happens in the constructor; an EOF without close_notify reads as EOF."""

    def __init__(self, port: int, *, context: ssl.SSLContext, server_hostname: Optional[str],
                 timeout: float = 5.0, rcvbuf: Optional[int] = None):
        super().__init__(port, timeout=timeout, rcvbuf=rcvbuf)
        raw = self.sock
        try:
            self.sock = context.wrap_socket(raw, server_hostname=server_hostname)
        except BaseException:
            raw.close()
            raise

    EOF_ERRORS = (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError)

    def peer_der(self) -> Optional[bytes]:
        return self.sock.getpeercert(binary_form=True)


def https_request(port: int, method: str, target: str, headers: Iterable = (), body: bytes = b"",
                  *, context: ssl.SSLContext, server_hostname: Optional[str],
                  timeout: float = 5.0, **kw) -> Response:
    """One request on a fresh TLS connection; returns the final response (with .peer_der, the
    certificate the server sent, and .tls_version / .cipher / .alpn)."""
    with TlsRawClient(port, context=context, server_hostname=server_hostname,
                      timeout=timeout) as c:
        c.request(method, target, headers, body, **kw)
        r = c.read_final_response(method)
        r.peer_der = c.peer_der()
        r.tls_version = c.sock.version()
        r.cipher = c.sock.cipher()[0]
        r.alpn = c.sock.selected_alpn_protocol()
        return r


def client_hello(server_hostname: Optional[str] = "default.test") -> bytes:
    """The bytes of a real ClientHello (Python's defaults, TLS 1.2 and 1.3), for tests that send
    part of one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    assert hello[:1] == b"\x16" and len(hello) > 100, hello[:16]
    return hello


def tls_server_toml(default: CertFiles, sni: Iterable[CertFiles] = (),
                    handshake_timeout: Optional[str] = None) -> str:
    """[server.tls] (and [[server.tls.certificates]]) for sluice_factory(extra_toml=...)."""
    text = "\n" + toml_table("[server.tls]", {"cert": str(default.cert), "key": str(default.key),
                                              "handshake_timeout": handshake_timeout})
    for c in sni:
        text += toml_table("[[server.tls.certificates]]", {"cert": str(c.cert), "key": str(c.key)})
    return text


class TlsUpstreamServer(UpstreamServer):
    """UpstreamServer (same endpoints) behind TLS (Python's ssl): TLS 1.2/1.3, ALPN http/1.1.
    client_ca: require a client certificate signed by it (mTLS). Every handshake is recorded
    in .handshakes: {"sni", "ok", "error", "version", "alpn", "client_cn"}."""

    def __init__(self, cert: CertFiles, *, client_ca: Optional[CertFiles] = None,
                 name: Optional[str] = None, **kw):
        super().__init__(name=name, **kw)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
        ctx.set_alpn_protocols(["http/1.1"])
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(str(client_ca.cert))
        ctx.sni_callback = self._on_sni
        self.ssl_context = ctx
        self.handshakes: list[dict] = []
        self._sni: dict[int, Optional[str]] = {}

    def _on_sni(self, sslobj, server_name, ctx) -> None:
        with self._lock:
            self._sni[id(sslobj)] = server_name
        return None

    def _serve_conn(self, sock: socket.socket, rec) -> None:
        sock.settimeout(5)
        try:
            ssock = self.ssl_context.wrap_socket(sock, server_side=True,
                                                 do_handshake_on_connect=False)
        except OSError as e:
            sock.close()
            with self._lock:
                self.handshakes.append({"sni": None, "ok": False, "error": repr(e)})
            return
        with self._lock:
            self._live[rec.id] = ssock
        entry: dict = {"sni": None, "ok": False, "error": None}
        try:
            ssock.do_handshake()
            # TLS 1.3: the client's certificate is checked when its Finished arrives, which
            # do_handshake has read; a missing or bad one fails here.
            entry.update(ok=True, version=ssock.version(), alpn=ssock.selected_alpn_protocol())
            peer = ssock.getpeercert()
            if peer:
                entry["client_cn"] = dict(x[0] for x in peer["subject"]).get("commonName")
        except (ssl.SSLError, OSError) as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                entry["sni"] = self._sni.pop(id(ssock), None)
                self.handshakes.append(entry)
        if not entry["ok"]:
            try:
                ssock.close()
            finally:
                with self._lock:
                    rec.closed_at = time.monotonic()
                    self._live.pop(rec.id, None)
            return
        ssock.settimeout(None)
        super()._serve_conn(ssock, rec)

    def ok_handshakes(self) -> list:
        with self._lock:
            return [h for h in self.handshakes if h["ok"]]


class HttpsProbe:
    """A good HTTPS client in a background thread that keeps sending GET /echo while a test
    does bad things to the same gateway: alternately on one keep-alive connection and on a new
    connection each time. Use as a context manager; .results: (kind, status or error)."""

    def __init__(self, port: int, context: ssl.SSLContext, server_hostname: str = "default.test",
                 interval: float = 0.02):
        self.port = port
        self.context = context
        self.server_hostname = server_hostname
        self.interval = interval
        self.results: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="https-probe", daemon=True)

    def __enter__(self) -> "HttpsProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        keep: Optional[TlsRawClient] = None
        i = 0
        try:
            while not self._stop.is_set():
                kind = "keep-alive" if i % 2 == 0 else "new"
                i += 1
                try:
                    if kind == "new":
                        r = https_request(self.port, "GET", f"/echo?probe={i}",
                                          context=self.context,
                                          server_hostname=self.server_hostname)
                    else:
                        if keep is None:
                            keep = TlsRawClient(self.port, context=self.context,
                                                server_hostname=self.server_hostname)
                        keep.request("GET", f"/echo?probe={i}")
                        r = keep.read_final_response()
                    self.results.append((kind, r.status))
                except Exception as e:  # noqa: BLE001 - every failure is a result
                    self.results.append((kind, f"{type(e).__name__}: {e}"))
                    if keep is not None:
                        keep.close()
                        keep = None
                self._stop.wait(self.interval)
        finally:
            if keep is not None:
                keep.close()

    def failures(self) -> list:
        return [r for r in self.results if r[1] != 200]

    def check(self, at_least: int = 5) -> None:
        assert not self.failures(), f"the good client saw failures: {self.failures()[:10]}"
        assert len(self.results) >= at_least, f"the good client made only {len(self.results)} requests"
        kinds = {k for k, _ in self.results}
        assert kinds == {"keep-alive", "new"}, kinds
