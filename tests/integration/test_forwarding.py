"""What the gateway adds (X-Forwarded-For/-Proto/-Host, Via) and removes (hop-by-hop fields),
in both directions."""

import urllib.parse


def hv(pairs, name):
    return [v for n, v in pairs if n.lower() == name.lower()]


def names(pairs):
    return {n.lower() for n, _ in pairs}


def echo(sluice, headers=(), host="front.example:8443", method="GET", body=b""):
    r = sluice.request(method, "/echo", headers, body, host=host)
    assert r.status == 200, r
    return r, r.json()["headers"]


def test_x_forwarded_for_added(sluice, upstream):
    _, h = echo(sluice)
    assert hv(h, "x-forwarded-for") == ["127.0.0.1"]


def test_x_forwarded_for_appends_to_existing_chain(sluice, upstream):
    _, h = echo(sluice, [("X-Forwarded-For", "203.0.113.7, 198.51.100.2")])
    assert hv(h, "x-forwarded-for") == ["203.0.113.7, 198.51.100.2, 127.0.0.1"]


def test_x_forwarded_for_several_fields_joined(sluice, upstream):
    _, h = echo(sluice, [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-For", "198.51.100.2")])
    assert hv(h, "x-forwarded-for") == ["203.0.113.7, 198.51.100.2, 127.0.0.1"]


TRUSTED_LOOPBACK = '\n[identity]\ntrusted_proxies = ["127.0.0.1/32"]\n'


def test_x_forwarded_for_chain_kept_from_trusted_proxy(sluice_factory, upstream):
    """The peer is a trusted proxy: the chain it forwards is kept whole and the peer appended."""
    gw = sluice_factory(upstream, extra_toml=TRUSTED_LOOPBACK)
    _, h = echo(gw, [("X-Forwarded-For", "203.0.113.7, 198.51.100.2")])
    assert hv(h, "x-forwarded-for") == ["203.0.113.7, 198.51.100.2, 127.0.0.1"]


def test_x_forwarded_proto_and_host_kept_from_trusted_proxy(sluice_factory, upstream):
    """A trusted proxy in front (terminating TLS, say) has the last word on proto and host."""
    gw = sluice_factory(upstream, extra_toml=TRUSTED_LOOPBACK)
    _, h = echo(gw, [("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "public.example")])
    assert hv(h, "x-forwarded-proto") == ["https"]
    assert hv(h, "x-forwarded-host") == ["public.example"]


def test_x_forwarded_proto_and_host(sluice, upstream):
    _, h = echo(sluice)
    assert hv(h, "x-forwarded-proto") == ["http"]
    assert hv(h, "x-forwarded-host") == ["front.example:8443"]
    assert hv(h, "host") == ["front.example:8443"]


def test_x_forwarded_proto_not_spoofable_by_untrusted_client(sluice, upstream):
    """A client that is not a trusted proxy cannot make the upstream believe it came over
    https: exactly one X-Forwarded-Proto, the real one."""
    _, h = echo(sluice, [("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "evil.example")])
    assert hv(h, "x-forwarded-proto") == ["http"]
    assert hv(h, "x-forwarded-host") == ["front.example:8443"]


def raw_echo(gw, request):
    """Sends one raw request; returns the headers the upstream received, [[name, value]]."""
    with gw.client() as c:
        c.send(request)
        r = c.read_response()
    assert r.status == 200, r
    return r.json()["headers"]


def test_http10_without_host_gets_the_upstream_authority(sluice_factory, upstream):
    """HTTP/1.1 upstream needs a Host (RFC 9112 3.2); an HTTP/1.0 client may send none. Sluice
    then sends the endpoint as configured, as nginx's $proxy_host, with no X-Forwarded-Host."""
    gw = sluice_factory(upstream)
    h = raw_echo(gw, b"GET /echo HTTP/1.0\r\n\r\n")
    assert hv(h, "host") == [f"127.0.0.1:{upstream.port}"], h
    assert hv(h, "x-forwarded-host") == [], h
    # A Host the client sent is passed as it is.
    h = raw_echo(gw, b"GET /echo HTTP/1.0\r\nHost: front.example\r\n\r\n")
    assert hv(h, "host") == ["front.example"], h
    # An absolute-form target names the host (RFC 9112 3.2.3), which the route matched on too.
    h = raw_echo(gw, b"GET http://front.example:8080/echo HTTP/1.0\r\n\r\n")
    assert hv(h, "host") == ["front.example:8080"], h
    # The endpoint's name as written, not its address.
    gw = sluice_factory(f"localhost:{upstream.port}")
    h = raw_echo(gw, b"GET /echo HTTP/1.0\r\n\r\n")
    assert hv(h, "host") == [f"localhost:{upstream.port}"], h


def test_via_added_to_request(sluice, upstream):
    _, h = echo(sluice)
    via = hv(h, "via")
    assert len(via) == 1 and via[0].endswith("1.1 sluice"), via
    _, h = echo(sluice, [("Via", "1.0 edge")])
    assert hv(h, "via") == ["1.0 edge, 1.1 sluice"]


def test_via_added_to_response(sluice, upstream):
    r, _ = echo(sluice)
    via = r.header_values("via")
    assert len(via) == 1 and "sluice" in via[0], r.headers


def test_end_to_end_headers_kept_with_duplicates_and_order(sluice, upstream):
    sent = [("X-Custom", "one"), ("Accept", "text/plain"), ("X-Custom", "two"),
            ("Cookie", "a=1"), ("Authorization", "Bearer t0ken")]
    _, h = echo(sluice, sent)
    assert hv(h, "x-custom") == ["one", "two"]
    assert hv(h, "accept") == ["text/plain"]
    assert hv(h, "cookie") == ["a=1"]
    assert hv(h, "authorization") == ["Bearer t0ken"]


def test_hop_by_hop_request_headers_removed(sluice, upstream):
    _, h = echo(sluice, [
        ("Connection", "keep-alive, X-Hop-One"),
        ("Connection", "x-hop-two"),
        ("X-Hop-One", "1"),
        ("X-Hop-Two", "2"),
        ("Keep-Alive", "timeout=5, max=100"),
        ("TE", "trailers"),
        ("Trailer", "X-Checksum"),
        ("Proxy-Authorization", "Basic c2VjcmV0"),
        ("Proxy-Connection", "keep-alive"),
        ("Proxy-Foo", "bar"),
        ("Upgrade", "h2c"),  # not tunnelled: Connection does not say upgrade
        ("X-End-To-End", "yes"),
    ])
    got = names(h)
    for hop in ("connection", "x-hop-one", "x-hop-two", "keep-alive", "te",
                "proxy-authorization", "proxy-connection", "proxy-foo", "upgrade"):
        assert hop not in got, (hop, h)
    assert hv(h, "x-end-to-end") == ["yes"]
    # Trailer announces trailer fields, which go on too (test_trailers.py): end to end.
    assert hv(h, "trailer") == ["X-Checksum"]


def test_connection_cannot_remove_end_to_end_framing(sluice, upstream):
    """Connection: Content-Length must not make the body lose its framing upstream."""
    r, h = echo(sluice, [("Connection", "Content-Length, Host")], method="POST", body=b"12345")
    assert r.json()["body_text"] == "12345"
    assert hv(h, "host") == ["front.example:8443"]


def test_hop_by_hop_response_headers_removed(sluice, upstream):
    q = urllib.parse.urlencode([
        ("Connection", "X-Resp-Hop"),
        ("X-Resp-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Authenticate", "Basic realm=x"),
        ("Proxy-Foo", "bar"),
        ("Trailer", "X-Checksum"),
        ("Upgrade", "h2c"),
        ("X-E2E", "kept"),
    ])
    with sluice.client() as c:
        c.request("GET", "/response-headers?" + q)
        r = c.read_response()
        assert r.status == 200 and r.body == b"ok\n"
        got = names(r.headers)
        for hop in ("x-resp-hop", "keep-alive", "proxy-authenticate", "proxy-foo", "upgrade"):
            assert hop not in got, (hop, r.headers)
        assert r.header("trailer") == "X-Checksum"
        assert "x-resp-hop" not in r.connection_tokens()
        assert r.header("x-e2e") == "kept"
        # the upstream's Connection option did not break the client connection
        c.request("GET", "/echo?after")
        assert c.read_response().status == 200


def test_invalid_host_is_refused(sluice, upstream):
    """A Host that is not an authority (spaces, quotes, a slash) is 400, never forwarded."""
    for host in [b"a b", b"x\"y", b"x/y", b"\xff"]:
        with sluice.client() as c:
            c.send(b"GET /echo HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            r = c.read_response()
        assert r.status == 400, (host, r)
    for host in ["example.com:8080", "[::1]:80", "EXAMPLE.com"]:
        r = sluice.get("/echo", host=host)
        assert r.status == 200, (host, r)


def test_forwarded_from_untrusted_peer_dropped_and_own_element_appended(sluice_factory, upstream):
    """RFC 7239 Forwarded is treated as X-Forwarded-* are: from a peer that is not a trusted
    proxy it is dropped (it would tell the upstream whatever the client likes), and the
    gateway's own element (for= the peer, host= the Host, proto=) is appended; from a trusted
    proxy what it sent is kept and the element appended."""
    spoof = [("Forwarded", "for=6.6.6.6;proto=https;host=admin.internal"),
             ("Forwarded", "for=7.7.7.7")]
    own = 'for=127.0.0.1;host="front.example:8443";proto=http'
    gw = sluice_factory(upstream)
    _, h = echo(gw, spoof)
    assert hv(h, "forwarded") == [own], h
    _, h = echo(gw, host="plain.example")
    assert hv(h, "forwarded") == ["for=127.0.0.1;host=plain.example;proto=http"], h
    gw = sluice_factory(upstream, extra_toml=TRUSTED_LOOPBACK)
    _, h = echo(gw, spoof)
    assert hv(h, "forwarded") == [
        "for=6.6.6.6;proto=https;host=admin.internal, for=7.7.7.7, " + own], h
