"""Self-tests of the test infrastructure (upstream.py, rawhttp.py) without the gateway, so that
a failure elsewhere can be told apart from a bug in the harness."""

import base64
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import free_port
from rawhttp import RawClient, build_request, chunked
from upstream import WS_GUID, pattern_bytes, read_ws_frame, ws_frame

HERE = Path(__file__).resolve().parent


def test_upstream_echo_and_keep_alive(upstream):
    with RawClient(upstream.port) as c:
        c.request("POST", "/echo?a=1", [("X-Dup", "1"), ("x-dup", "2")], b"\x00\xffbody")
        r = c.read_response()
        info = r.json()
        assert info["method"] == "POST" and info["target"] == "/echo?a=1"
        assert ["X-Dup", "1"] in info["headers"] and ["x-dup", "2"] in info["headers"]
        assert base64.b64decode(info["body_b64"]) == b"\x00\xffbody"
        c.request("PUT", "/echo", [("Transfer-Encoding", "chunked")], chunked(b"abcdef", [1, 2]))
        info = c.read_response().json()
        assert info["body_text"] == "abcdef" and info["chunk_sizes"] == [1, 2, 3]
        assert info["request_index"] == 2
    assert upstream.connection_count == 1 and upstream.connections[0].requests == 2


def test_upstream_framings(upstream):
    with RawClient(upstream.port) as c:
        c.request("GET", "/bytes/1000")
        r = c.read_response()
        assert r.framing == "content-length" and r.body == pattern_bytes(1000)
        c.request("GET", "/chunked/1000")
        r = c.read_response()
        assert r.framing == "chunked" and len(r.chunk_sizes) > 1 and r.body == pattern_bytes(1000)
        c.request("HEAD", "/bytes/1000")
        r = c.read_response("HEAD")
        assert r.header("content-length") == "1000" and not c.data_pending(0.2)
        c.request("GET", "/status/204")
        assert c.read_response().status == 204
        c.request("GET", "/close-delimited/5000")
        r = c.read_response()
        assert r.framing == "close" and r.body == pattern_bytes(5000)
        assert c.is_closed(1)


def test_upstream_failure_endpoints(upstream):
    with RawClient(upstream.port) as c:
        c.request("GET", "/close-mid")
        r = c.read_response(allow_incomplete=True)
        assert r.status == 200 and not r.complete and len(r.body) == 1000
    with RawClient(upstream.port) as c:
        c.request("GET", "/close-now")
        assert c.is_closed(1) and c.buf == b""
    with RawClient(upstream.port) as c:
        c.request("GET", "/hang")
        assert not c.data_pending(0.3)


def test_upstream_expect_and_websocket(upstream):
    with RawClient(upstream.port) as c:
        c.send(build_request("POST", "/expect", [("Content-Length", "2"), ("Expect", "100-continue")]))
        assert c.read_response().status == 100
        c.send(b"hi")
        assert c.read_response().json()["expect"] == "100-continue"
    with RawClient(upstream.port) as c:
        key = base64.b64encode(os.urandom(16)).decode()
        c.request("GET", "/ws", [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                 ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Version", "13")])
        r = c.read_response()
        assert r.status == 101
        assert r.header("sec-websocket-accept") == base64.b64encode(
            hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        c.send(ws_frame(0x1, b"x" * 70000))
        assert read_ws_frame(c) == (0x1, b"x" * 70000)


def test_upstream_runs_as_a_script():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "upstream.py"), "--port", str(port),
                             "--name", "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        assert f"127.0.0.1:{port}" in line, line
        with RawClient(port) as c:
            c.request("GET", "/stats")
            assert c.read_response().json()["name"] == "demo"
            c.request("GET", "/echo")
            assert c.read_response().json()["upstream"] == "demo"
    finally:
        proc.terminate()
        proc.wait(5)
