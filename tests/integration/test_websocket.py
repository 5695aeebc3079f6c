"""WebSocket upgrade tunnelled both ways through the gateway."""

import base64
import hashlib
import os
import time

from conftest import TIMER_SLACK_S
from rawhttp import build_request
from upstream import WS_GUID, read_ws_frame, ws_frame


def handshake(c, target="/ws"):
    key = base64.b64encode(os.urandom(16)).decode()
    c.request("GET", target, [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                              ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Version", "13")])
    r = c.read_response()
    return key, r


def expected_accept(key):
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def test_websocket_handshake(sluice, upstream):
    with sluice.client() as c:
        key, r = handshake(c)
        assert r.status == 101, r
        assert (r.header("upgrade") or "").lower() == "websocket"
        assert "upgrade" in r.connection_tokens()
        assert r.header("sec-websocket-accept") == expected_accept(key)
    req = upstream.requests[-1]
    names = {n.lower(): v for n, v in req["headers"]}
    assert names.get("upgrade", "").lower() == "websocket"
    assert "upgrade" in names.get("connection", "").lower()
    assert names.get("sec-websocket-key") == key


def test_websocket_echo_both_ways(sluice, upstream):
    with sluice.client() as c:
        _, r = handshake(c)
        assert r.status == 101
        c.send(ws_frame(0x1, b"hello"))
        assert read_ws_frame(c) == (0x1, b"hello")
        big = os.urandom(300 * 1024)
        c.send(ws_frame(0x2, big))
        assert read_ws_frame(c) == (0x2, big)
        # several frames in one write, answered in order
        c.send(ws_frame(0x1, b"one") + ws_frame(0x1, b"two") + ws_frame(0x9, b"ping!"))
        assert read_ws_frame(c) == (0x1, b"one")
        assert read_ws_frame(c) == (0x1, b"two")
        assert read_ws_frame(c) == (0xA, b"ping!")
        # close handshake: the upstream answers and closes; the tunnel ends
        c.send(ws_frame(0x8, (1000).to_bytes(2, "big")))
        op, payload = read_ws_frame(c)
        assert op == 0x8 and payload == (1000).to_bytes(2, "big")
        assert c.is_closed(3)


def test_websocket_client_closes_tunnel(sluice, upstream):
    """The client ending the tunnel ends the upstream side too, and the gateway keeps serving."""
    with sluice.client() as c:
        _, r = handshake(c)
        assert r.status == 101
        c.send(ws_frame(0x1, b"x"))
        assert read_ws_frame(c) == (0x1, b"x")
    assert upstream.wait_for(lambda u: u.open_connection_count == 0, 3), upstream.stats()["connections"]
    r = sluice.get("/echo?after-ws")
    assert r.status == 200


def test_upgrade_refused_by_upstream_is_a_normal_response(sluice, upstream):
    """The upstream answers an Upgrade request with 200: a normal response, no tunnel."""
    with sluice.client() as c:
        c.request("GET", "/echo", [("Upgrade", "websocket"), ("Connection", "Upgrade")])
        r = c.read_response()
        assert r.status == 200
        assert r.json()["path"] == "/echo"


def test_silent_tunnel_closed_after_idle_timeout(sluice_factory, upstream):
    """A tunnel with no byte either way for idle_timeout is closed; traffic keeps it open."""
    gw = sluice_factory(upstream, server={"idle_timeout": "1s"})
    with gw.client() as c:
        _, r = handshake(c)
        assert r.status == 101
        for _ in range(4):  # 2 s of traffic every 0.5 s: never idle for 1 s
            c.send(ws_frame(0x1, b"tick"))
            assert read_ws_frame(c) == (0x1, b"tick")
            assert not c.is_closed(0.5)
        # Quiet for 0.5 s already: idle_timeout ends in 0.5 s (request_header_timeout, 3 s,
        # must not be what closes it).
        assert c.is_closed(0.5 + TIMER_SLACK_S)


class ScriptedEndpoint:
    """Answers every request head with `response` (raw bytes), then echoes whatever else it
    reads (a tunnel, if the gateway opened one) and records it."""

    def __init__(self, response: bytes):
        import socket
        import threading
        from conftest import free_port
        self.response = response
        self.port = free_port()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.after_head = bytearray()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                c.settimeout(3)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        break
                    buf += data
                c.sendall(self.response)
                self.after_head += buf.split(b"\r\n\r\n", 1)[1]
                while True:
                    data = c.recv(65536)
                    if not data:
                        break
                    self.after_head += data
                    c.sendall(data)
            except OSError:
                pass
            finally:
                c.close()

    def close(self):
        self.sock.close()


def test_upstream_101_opens_a_tunnel_only_for_the_protocol_asked_for(sluice_factory):
    """A 101 opens a tunnel only when it answers the request's Upgrade and names the protocol
    that was asked for (RFC 9110 7.8); a 101 without Upgrade, to another protocol, or to a
    request that asked for no upgrade is a 502, and no client byte goes on to the upstream."""
    cases = [
        ("no Upgrade in the 101", b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n",
         True, 502),
        ("another protocol", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
         b"Connection: upgrade\r\n\r\n", True, 502),
        ("no upgrade asked", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
         b"Connection: upgrade\r\n\r\n", False, 502),
        ("the protocol asked for", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\n"
         b"Connection: upgrade\r\n\r\n", True, 101),
    ]
    for name, response, asks, want in cases:
        ep = ScriptedEndpoint(response)
        try:
            gw = sluice_factory(f"127.0.0.1:{ep.port}")
            with gw.client() as c:
                headers = [("Upgrade", "websocket"), ("Connection", "Upgrade")] if asks else []
                c.request("GET", "/ws", headers)
                r = c.read_response()
                assert r.status == want, (name, r)
                if want == 101:
                    c.send(b"tunnelled")
                    assert c.read_exact(9) == b"tunnelled"
                else:
                    try:
                        c.send(b"tunnelled")
                    except OSError:
                        pass
                    time.sleep(0.3)
                    assert b"tunnelled" not in ep.after_head, name
            gw.stop()
        finally:
            ep.close()
