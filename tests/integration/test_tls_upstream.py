"""TLS towards upstreams ([[upstream]] tls = true): SNI, certificate verification against
tls_ca_file (on by default; another CA, an expired certificate or a wrong name -> 502;
tls_verify = false turns it off, explicitly), client certificates (mTLS), keep-alive over TLS.

The upstreams are tests/integration/upstream.py behind Python's ssl (TlsUpstreamServer in
conftest.py), which records the SNI, ALPN and client certificate of every handshake."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from conftest import (TIMER_SLACK_S, SilentListener, TlsRawClient, tls_client_context,
                      tls_server_toml)
from upstream import pattern_bytes


def upstream_cfg(name, server, **tls):
    cfg = {"name": name, "endpoints": [server if not isinstance(server, int)
                                       else f"127.0.0.1:{server}"], "tls": True}
    cfg.update({k: str(v) if hasattr(v, "parts") else v for k, v in tls.items()})
    return cfg


def by_host(names):
    """One route per upstream, chosen by Host: <name>.test."""
    return [{"name": n, "match": {"host": f"{n}.test"}, "upstream": n} for n in names]


def get(gw, name, target="/echo", **kw):
    return gw.request("GET", target, host=f"{name}.test", timeout=10, **kw)


def test_upstream_tls_sni_verification_and_keepalive(sluice_factory, tls_upstream_factory,
                                                     tls_pki):
    up = tls_upstream_factory(tls_pki.certs["upstream"], name="secure")
    gw = sluice_factory(upstreams=[upstream_cfg("app", up, tls_server_name="upstream.test",
                                                tls_ca_file=tls_pki.certs["root"].cert)])
    for i in range(3):
        r = gw.get(f"/echo?i={i}")
        assert r.status == 200, r
        assert r.json()["target"] == f"/echo?i={i}"
        assert r.header("x-upstream") == "secure", r
    hs = up.handshakes
    assert len(hs) == 1, hs  # the TLS connection is kept alive and reused
    assert hs[0]["ok"] and hs[0]["sni"] == "upstream.test", hs
    assert hs[0]["alpn"] == "http/1.1" and hs[0]["version"] == "TLSv1.3", hs
    assert up.connection_count == 1 and up.request_count == 3
    # a body goes up and comes back intact over TLS
    body = os.urandom(300_000)
    r = gw.request("POST", "/echo", body=body)
    assert r.status == 200 and r.json()["body_sha256"] == hashlib.sha256(body).hexdigest(), r


def test_upstream_ip_endpoint_verified_by_ip_without_sni(sluice_factory, tls_upstream_factory,
                                                         tls_pki):
    """No tls_server_name: the endpoint's host (127.0.0.1) is the name verified; an IP address
    is not sent as SNI (RFC 6066)."""
    up = tls_upstream_factory(tls_pki.certs["upstream"])
    gw = sluice_factory(upstreams=[upstream_cfg("app", up,
                                                tls_ca_file=tls_pki.certs["root"].cert)])
    r = gw.get("/echo")
    assert r.status == 200, r
    hs = up.handshakes
    assert len(hs) == 1 and hs[0]["ok"] and hs[0]["sni"] is None, hs


REFUSALS = [
    # (id, upstream certificate, upstream options, reason in the gateway's log)
    ("other_ca", "upstream_other_ca", {"tls_server_name": "upstream.test"},
     "unable to get local issuer certificate"),
    ("expired", "upstream_expired", {"tls_server_name": "upstream.test"},
     "certificate has expired"),
    ("wrong_name", "upstream", {"tls_server_name": "wrong.test"}, "hostname mismatch"),
    ("ip_not_in_certificate", "upstream_noip", {}, "IP address mismatch"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_upstream_certificate_refused_unless_verification_off(sluice_factory,
                                                              tls_upstream_factory, tls_pki,
                                                              case):
    """Verification is on by default: the bad certificate gives 502 (and says why in the log);
    the same upstream with tls_verify = false answers 200."""
    _, cert, options, reason = case
    strict = tls_upstream_factory(tls_pki.certs[cert], name="strict")
    lax = tls_upstream_factory(tls_pki.certs[cert], name="lax")
    ca = tls_pki.certs["root"].cert
    gw = sluice_factory(upstreams=[upstream_cfg("strict", strict, tls_ca_file=ca, **options),
                                   upstream_cfg("lax", lax, tls_ca_file=ca, tls_verify=False,
                                                **options)],
                        routes=by_host(["strict", "lax"]))
    for _ in range(2):
        r = get(gw, "strict")
        assert r.status == 502, r
        assert "problem+json" in (r.header("content-type") or ""), r
    strict.wait_for(lambda s: len(s.handshakes) > 0, timeout=5)
    assert strict.request_count == 0
    assert not strict.ok_handshakes(), strict.handshakes
    assert strict.handshakes, "the gateway never tried the upstream"
    if "tls_server_name" in options:
        assert {h["sni"] for h in strict.handshakes} == {options["tls_server_name"]}
    deadline = time.monotonic() + 2
    while reason not in gw.stderr() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reason in gw.stderr(), gw.stderr()[-3000:]

    r = get(gw, "lax")
    assert r.status == 200, r
    assert lax.request_count == 1 and lax.ok_handshakes(), lax.handshakes
    if "tls_server_name" in options:
        assert lax.handshakes[0]["sni"] == options["tls_server_name"]


def test_upstream_verified_against_system_store_by_default(sluice_factory, tls_upstream_factory,
                                                           tls_pki):
    """Without tls_ca_file the system's CA store is used: a private CA is not in it -> 502."""
    up = tls_upstream_factory(tls_pki.certs["upstream"])
    gw = sluice_factory(upstreams=[upstream_cfg("app", up, tls_server_name="upstream.test")])
    r = gw.get("/echo")
    assert r.status == 502, r
    assert up.request_count == 0 and not up.ok_handshakes(), up.handshakes


def test_upstream_mtls_client_certificate(sluice_factory, tls_upstream_factory, tls_pki):
    """The upstream requires a client certificate signed by the root CA: none -> 502, one from
    another CA -> 502, tls_client_cert/tls_client_key -> 200 and the upstream saw it."""
    root = tls_pki.certs["root"]
    ups = {n: tls_upstream_factory(tls_pki.certs["upstream"], client_ca=root, name=n)
           for n in ("nocert", "othercert", "mtls")}
    common = {"tls_server_name": "upstream.test", "tls_ca_file": root.cert}
    client, other = tls_pki.certs["client"], tls_pki.certs["client_other_ca"]
    gw = sluice_factory(upstreams=[
        upstream_cfg("nocert", ups["nocert"], **common),
        upstream_cfg("othercert", ups["othercert"], tls_client_cert=other.cert,
                     tls_client_key=other.key, **common),
        upstream_cfg("mtls", ups["mtls"], tls_client_cert=client.cert, tls_client_key=client.key,
                     **common),
    ], routes=by_host(["nocert", "othercert", "mtls"]))

    for name in ("nocert", "othercert"):
        r = get(gw, name)
        assert r.status == 502, (name, r)
        # (TLS 1.3: the upstream refuses after the client's Finished, maybe after our 502)
        ups[name].wait_for(lambda s: len(s.handshakes) > 0, timeout=5)
        assert ups[name].request_count == 0, name
        assert ups[name].handshakes and not ups[name].ok_handshakes(), ups[name].handshakes
        assert "CERTIFICATE" in ups[name].handshakes[0]["error"].upper(), ups[name].handshakes
    for i in range(2):
        r = get(gw, "mtls")
        assert r.status == 200, r
    hs = ups["mtls"].handshakes
    assert len(hs) == 1 and hs[0]["ok"] and hs[0]["client_cn"] == "sluice-client", hs
    # the failures did not disturb the good upstream, nor the other way round
    assert get(gw, "nocert").status == 502


def test_upstream_not_speaking_tls(sluice_factory, upstream):
    """tls = true towards a plain HTTP server -> 502; towards one that accepts and never
    answers the ClientHello -> 502 within connect_timeout (it covers the handshake)."""
    silent = SilentListener()
    try:
        gw = sluice_factory(upstreams=[
            upstream_cfg("plain", upstream, tls_verify=False),
            upstream_cfg("silent", silent.port, tls_verify=False,
                         connect_timeout="400ms"),
        ], routes=by_host(["plain", "silent"]))
        r = get(gw, "plain")
        assert r.status == 502, r
        t0 = time.monotonic()
        r = get(gw, "silent")
        elapsed = time.monotonic() - t0
        assert r.status == 502, r
        # One connect_timeout for connect and handshake together, not one for each (0.8 s).
        assert 0.35 <= elapsed < 0.4 + TIMER_SLACK_S, elapsed
        assert silent.accepted, "the gateway never connected"
    finally:
        silent.close()


def both_sides(sluice_factory, tls_upstream_factory, tls_pki):
    up = tls_upstream_factory(tls_pki.certs["upstream"])
    gw = sluice_factory(upstreams=[upstream_cfg("app", up, tls_server_name="upstream.test",
                                                tls_ca_file=tls_pki.certs["root"].cert)],
                        extra_toml=tls_server_toml(tls_pki.certs["default"]))
    client = TlsRawClient(gw.port, context=tls_client_context(tls_pki.certs["root"]),
                          server_hostname="default.test", timeout=20)
    return up, gw, client


N = 4 * 1024 * 1024


@pytest.mark.parametrize("path", ["bytes", "chunked"])
def test_tls_on_both_sides_download(sluice_factory, tls_upstream_factory, tls_pki, path):
    """Client -> TLS -> gateway -> TLS -> upstream: 4 MB down (Content-Length, then chunked),
    byte for byte, twice on the same connections."""
    up, gw, c = both_sides(sluice_factory, tls_upstream_factory, tls_pki)
    with c:
        for _ in range(2):
            c.request("GET", f"/{path}/{N}")
            r = c.read_response()
            assert r.status == 200 and len(r.body) == N, r
            if r.body != pattern_bytes(N):
                first = next(i for i in range(N) if r.body[i] != pattern_bytes(N)[i])
                pytest.fail(f"body differs from byte {first} on ({len(r.chunk_sizes)} chunks, "
                            f"first sizes {r.chunk_sizes[:6]}): {r.body[first:first + 16]!r}")
    assert len(up.handshakes) == 1 and up.handshakes[0]["ok"], up.handshakes


def test_tls_on_both_sides_upload(sluice_factory, tls_upstream_factory, tls_pki):
    up, gw, c = both_sides(sluice_factory, tls_upstream_factory, tls_pki)
    with c:
        for _ in range(2):
            body = os.urandom(N)
            c.request("POST", "/echo", body=body)
            r = c.read_response()
            assert r.status == 200, r
            h = r.json()
            assert h["body_len"] == N and h["body_sha256"] == hashlib.sha256(body).hexdigest()
            assert [v for k, v in h["headers"] if k.lower() == "x-forwarded-proto"] == ["https"]
    assert len(up.handshakes) == 1 and up.handshakes[0]["ok"], up.handshakes


def test_client_leaves_during_upstream_handshake(sluice_binary, sluice_factory,
                                                 tls_upstream_factory, tls_pki):
    """A client gives up while the gateway is still in the TLS handshake with the upstream (the
    upstream accepts and says nothing): the gateway cleans up, answers 502 to a client that
    waits, and keeps serving a good TLS upstream (and, with the ASan build, exits 0)."""
    silent = SilentListener()
    good = tls_upstream_factory(tls_pki.certs["upstream"], name="good")
    try:
        gw = sluice_factory(upstreams=[
            upstream_cfg("silent", silent.port, tls_server_name="upstream.test",
                         tls_ca_file=tls_pki.certs["root"].cert, connect_timeout="500ms"),
            upstream_cfg("good", good, tls_server_name="upstream.test",
                         tls_ca_file=tls_pki.certs["root"].cert),
        ], routes=by_host(["silent", "good"]))
        for leave in ("close", "reset"):
            c = gw.client()
            c.request("GET", "/echo", host="silent.test")
            time.sleep(0.15)
            c.reset() if leave == "reset" else c.close()
        r = get(gw, "silent")
        assert r.status == 502, r
        time.sleep(0.3)  # past connect_timeout of the abandoned handshakes
        assert len(silent.accepted) >= 2, silent.accepted
        for _ in range(3):
            r = get(gw, "good")
            assert r.status == 200, r
        assert gw.alive()
    finally:
        silent.close()
