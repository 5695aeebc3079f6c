#!/usr/bin/env python3
"""A real HTTP/1.1 upstream for Sluice's integration tests (and the README's demo upstream).

Standard library only: raw sockets and one thread per connection, so that every endpoint can
do what a well-behaved library server never would (close in the middle of a response, never
answer, answer without any framing, switch to WebSocket).

Run it as a script:

    python3 tests/integration/upstream.py --port 9000 [--host 127.0.0.1] [--name app]

or start it in-process from a test:

    server = UpstreamServer(name="a").start()
    ... server.port, server.stats() ...
    server.stop()

Endpoints (any method unless stated; HEAD answers like GET without a body):

    /echo                 JSON: method, target (path+query), version, headers as [name, value]
                          pairs (order, case and duplicates kept), body (base64 and, when it is
                          UTF-8, text; left out above 1 MiB), body_len, body_sha256, how the body
                          was framed (content-length / chunked / none), the chunk sizes, the
                          upstream's name and the connection id and request index on it.
    /status/N             responds N (204 and 304 without a body).
    /bytes/N              N bytes (byte i is i % 256) with Content-Length.
    /chunked/N            the same N bytes in chunked encoding, in several chunks.
    /close-delimited/N    the same N bytes, no Content-Length, no chunking: ended by the close.
    /slow/MS              waits MS milliseconds, then answers with a small JSON body.
    /hang                 reads the request and never answers (until the peer closes).
    /close-mid            head with Content-Length: 100000, then 1000 bytes, then closes
                          (?chunked=1: a chunked head and one 1000-byte chunk, no last chunk).
    /close-now            reads the request and closes without answering.
    /ws                   WebSocket handshake (RFC 6455), then echoes every frame back.
    /expect               JSON: the Expect header it saw (null when none) and the body length.
    /drain-after/MS       waits MS milliseconds before it reads the request body, then
                          answers with its length and SHA-256 (upload backpressure).
    /response-headers?N=V&...   200 with each N: V added to the response head as given.
    /stats                JSON: connections (with their request counts) and requests seen.
                          Not counted itself.

A request with `Expect: 100-continue` gets `100 Continue` before its body is read, like a real
server would do.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import select
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PATTERN = bytes(range(256)) * 256  # 64 KiB; byte i of every generated body is i % 256
MAX_HEAD = 256 * 1024
ECHO_BODY_LIMIT = 1 << 20

REASONS = {
    100: "Continue", 101: "Switching Protocols", 200: "OK", 201: "Created", 202: "Accepted",
    204: "No Content", 206: "Partial Content", 301: "Moved Permanently", 302: "Found",
    304: "Not Modified", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
    418: "I'm a teapot", 429: "Too Many Requests", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}


def pattern_bytes(n: int, offset: int = 0) -> bytes:
    """The bytes [offset, offset + n) of the body /bytes, /chunked and /close-delimited send."""
    out = bytearray()
    pos = offset
    end = offset + n
    while pos < end:
        start = pos % len(PATTERN)
        take = min(len(PATTERN) - start, end - pos)
        out += PATTERN[start:start + take]
        pos += take
    return bytes(out)


def iter_pattern(n: int, block: int = 64 * 1024) -> Iterable[bytes]:
    """The same bytes as pattern_bytes(n), block by block (block is a multiple of 256)."""
    full, rest = divmod(n, len(PATTERN))
    for _ in range(full):
        yield PATTERN
    if rest:
        yield PATTERN[:rest]


class PeerClosed(Exception):
    pass


class Conn:
    """A buffered reader/writer over one accepted socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> None:
        data = self.sock.recv(256 * 1024)
        if not data:
            raise PeerClosed()
        self.buf += data

    def read_until(self, delim: bytes, limit: int) -> bytes:
        while True:
            idx = self.buf.find(delim)
            if idx >= 0:
                out = bytes(self.buf[: idx + len(delim)])
                del self.buf[: idx + len(delim)]
                return out
            if len(self.buf) > limit:
                raise ValueError("line too long")
            self._fill()

    def read_exact(self, n: int, progress: Optional[Callable[[int], None]] = None) -> bytes:
        out = bytearray()
        while len(out) < n:
            if not self.buf:
                self._fill()
            take = min(n - len(out), len(self.buf))
            out += self.buf[:take]
            del self.buf[:take]
            if progress:
                progress(take)
        return bytes(out)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list  # [[name, value], ...] as received
    conn: Conn
    server: "UpstreamServer"
    conn_record: "ConnRecord"
    index: int  # 1-based index of this request on its connection
    body_read: bool = False
    body: bytes = b""
    body_framing: str = "none"
    chunk_sizes: list = field(default_factory=list)
    trailers: list = field(default_factory=list)
    continue_sent: bool = False

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> list:
        parts = self.target.split("?", 1)
        return urllib.parse.parse_qsl(parts[1], keep_blank_values=True) if len(parts) > 1 else []

    def header(self, name: str) -> Optional[str]:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None

    def header_values(self, name: str) -> list:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def wants_close(self) -> bool:
        tokens = []
        for v in self.header_values("connection"):
            tokens += [t.strip().lower() for t in v.split(",")]
        if self.version == "HTTP/1.0":
            return "keep-alive" not in tokens
        return "close" in tokens

    def has_body(self) -> bool:
        te = self.header("transfer-encoding")
        if te is not None:
            return True
        cl = self.header("content-length")
        return cl is not None and int(cl.strip()) > 0

    def read_body(self) -> bytes:
        if self.body_read:
            return self.body
        self.body_read = True
        expect = self.header("expect")
        if expect and expect.lower() == "100-continue" and self.has_body() and not self.continue_sent:
            self.continue_sent = True
            self.conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        progress = self.server._progress_cb(self)
        te = self.header("transfer-encoding")
        if te is not None and te.split(",")[-1].strip().lower() == "chunked":
            self.body_framing = "chunked"
            out = bytearray()
            while True:
                line = self.conn.read_until(b"\r\n", 4096)
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while True:
                        t = self.conn.read_until(b"\r\n", MAX_HEAD)
                        if t == b"\r\n":
                            break
                        name, _, value = t.decode("latin-1").rstrip("\r\n").partition(":")
                        self.trailers.append([name, value.strip()])
                    break
                self.chunk_sizes.append(size)
                out += self.conn.read_exact(size, progress)
                if self.conn.read_exact(2) != b"\r\n":
                    raise ValueError("bad chunk end")
            self.body = bytes(out)
        elif self.header("content-length") is not None:
            self.body_framing = "content-length"
            self.body = self.conn.read_exact(int(self.header("content-length").strip()), progress)
        self.server._body_done(self)
        return self.body


@dataclass
class ConnRecord:
    id: int
    peer: tuple
    opened_at: float
    requests: int = 0
    closed_at: Optional[float] = None

    @property
    def open(self) -> bool:
        return self.closed_at is None


class UpstreamServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, name: Optional[str] = None,
                 backlog: int = 128, strip_prefix: str = ""):
        self.host = host
        self.name = name or "upstream"
        # The demo stack routes /api/ here: /api/echo is /echo (the target is reported whole).
        self.strip_prefix = strip_prefix
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(backlog)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._live: dict[int, socket.socket] = {}
        self.connections: list[ConnRecord] = []
        self.requests: list[dict] = []  # one per request, in arrival order
        self.body_progress: dict[int, int] = {}  # connection id -> body bytes read so far
        self.errors: list[str] = []

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> "UpstreamServer":
        t = threading.Thread(target=self._accept_loop, name=f"{self.name}-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the accept thread
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            live = list(self._live.values())
        for s in live:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=2)

    def serve_forever(self) -> None:
        self.start()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict:
        with self._lock:
            return {
                "name": self.name,
                "connections": [
                    {"id": c.id, "peer": list(c.peer), "requests": c.requests, "open": c.open}
                    for c in self.connections
                ],
                "connection_count": len(self.connections),
                "open_connections": sum(1 for c in self.connections if c.open),
                "request_count": len(self.requests),
                "requests": [dict(r) for r in self.requests],
            }

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self.connections)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def open_connection_count(self) -> int:
        with self._lock:
            return sum(1 for c in self.connections if c.open)

    def progress(self) -> int:
        """Body bytes read so far, summed over the connections."""
        with self._lock:
            return sum(self.body_progress.values())

    def reset_stats(self) -> None:
        with self._lock:
            self.requests.clear()
            self.body_progress.clear()

    def wait_for(self, predicate: Callable[["UpstreamServer"], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return predicate(self)

    def _progress_cb(self, req: Request) -> Callable[[int], None]:
        cid = req.conn_record.id

        def cb(n: int) -> None:
            with self._lock:
                self.body_progress[cid] = self.body_progress.get(cid, 0) + n

        with self._lock:
            self.body_progress[cid] = 0
        return cb

    def _body_done(self, req: Request) -> None:
        pass

    # -------------------------------------------------------------- connections

    def _accept_loop(self) -> None:
        next_id = 1
        while not self._stop.is_set():
            try:
                sock, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rec = ConnRecord(id=next_id, peer=peer, opened_at=time.monotonic())
            next_id += 1
            with self._lock:
                self.connections.append(rec)
                self._live[rec.id] = sock
            t = threading.Thread(target=self._serve_conn, args=(sock, rec),
                                 name=f"{self.name}-conn{rec.id}", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve_conn(self, sock: socket.socket, rec: ConnRecord) -> None:
        conn = Conn(sock)
        try:
            while not self._stop.is_set():
                try:
                    head = conn.read_until(b"\r\n\r\n", MAX_HEAD)
                except PeerClosed:
                    return
                req = self._parse_head(head, conn, rec)
                if req is None:
                    conn.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                keep = self._dispatch(req)
                if not keep:
                    return
        except (PeerClosed, ConnectionError, OSError, ValueError) as e:
            if not isinstance(e, (PeerClosed, ConnectionError)) and not self._stop.is_set():
                self.errors.append(f"conn {rec.id}: {e!r}")
        finally:
            try:
                sock.close()
            except OSError:
                pass
            with self._lock:
                rec.closed_at = time.monotonic()
                self._live.pop(rec.id, None)

    def _parse_head(self, head: bytes, conn: Conn, rec: ConnRecord) -> Optional[Request]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return None
        method, target, version = parts
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                return None
            headers.append([name, value.strip(" \t")])
        counted = not target.startswith("/stats")
        with self._lock:
            if counted:
                rec.requests += 1
            index = rec.requests
            if counted:
                self.requests.append({"conn": rec.id, "index": index, "method": method,
                                      "target": target, "headers": headers})
        return Request(method, target, version, headers, conn, self, rec, index)

    # ---------------------------------------------------------------- responses

    def _write_response(self, req: Request, status: int, headers: list, body: bytes | Iterable[bytes] = b"",
                        framing: str = "length", length: Optional[int] = None,
                        trailers: Iterable = ()) -> bool:
        """framing: 'length' (Content-Length), 'chunked', 'close' (delimited by close) or 'none'.
        trailers: [(name, value)] after the last chunk (chunked only).
        Returns whether the connection stays open."""
        close = req.wants_close() or framing == "close"
        out = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
        out += [f"Server: sluice-test-upstream", f"X-Upstream: {self.name}",
                f"X-Upstream-Conn: {req.conn_record.id}", f"X-Upstream-Request: {req.index}"]
        out += [f"{n}: {v}" for n, v in headers]
        if isinstance(body, (bytes, bytearray)):
            blocks: Iterable[bytes] = [bytes(body)] if body else []
            if length is None:
                length = len(body)
        else:
            blocks = body
        if framing == "length":
            out.append(f"Content-Length: {length}")
        elif framing == "chunked":
            out.append("Transfer-Encoding: chunked")
        if close and framing != "close":
            out.append("Connection: close")
        elif not close and req.version == "HTTP/1.0":
            out.append("Connection: keep-alive")
        req.conn.send(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        if req.method != "HEAD" and framing != "none":
            for block in blocks:
                if not block:
                    continue
                if framing == "chunked":
                    req.conn.send(b"%x\r\n" % len(block) + block + b"\r\n")
                else:
                    req.conn.send(block)
            if framing == "chunked":
                req.conn.send(b"0\r\n" + b"".join(f"{n}: {v}\r\n".encode("latin-1")
                                                   for n, v in trailers) + b"\r\n")
        return not close

    def _json(self, req: Request, obj: dict, status: int = 200) -> bool:
        body = json.dumps(obj).encode()
        return self._write_response(req, status, [("Content-Type", "application/json")], body)

    def _dispatch(self, req: Request) -> bool:
        path = req.path
        if self.strip_prefix and path.startswith(self.strip_prefix + "/"):
            path = path[len(self.strip_prefix):]
        segs = path.strip("/").split("/")
        head = segs[0] if segs else ""
        arg = segs[1] if len(segs) > 1 else None
        if head == "ws" and req.header("upgrade"):
            return self._websocket(req)
        if head == "drain-after":
            time.sleep(int(arg) / 1000.0)
        if head == "close-now":
            req.read_body()
            try:
                req.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return False
        body = req.read_body()
        if head == "echo":
            info = {
                "upstream": self.name,
                "conn": req.conn_record.id,
                "request_index": req.index,
                "method": req.method,
                "target": req.target,
                "path": req.path,
                "version": req.version,
                "headers": req.headers,
                "body_len": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
                "body_framing": req.body_framing,
                "chunk_sizes": req.chunk_sizes,
                "trailers": req.trailers,
                "continue_sent": req.continue_sent,
            }
            if len(body) <= ECHO_BODY_LIMIT:
                info["body_b64"] = base64.b64encode(body).decode()
                try:
                    info["body_text"] = body.decode("utf-8")
                except UnicodeDecodeError:
                    info["body_text"] = None
            return self._json(req, info)
        if head == "status" and arg is not None:
            status = int(arg)
            if status in (204, 304) or 100 <= status < 200:
                return self._write_response(req, status, [], b"", framing="none")
            return self._write_response(req, status, [("Content-Type", "text/plain")],
                                        f"status {status}\n".encode())
        if head == "bytes" and arg is not None:
            n = int(arg)
            return self._write_response(req, 200, [("Content-Type", "application/octet-stream")],
                                        iter_pattern(n), framing="length", length=n)
        if head == "chunked" and arg is not None:
            n = int(arg)
            data = pattern_bytes(n)
            size = max(1, min(16384, n // 4 or 1))
            chunks = [data[i:i + size] for i in range(0, n, size)]
            return self._write_response(req, 200, [("Content-Type", "application/octet-stream")],
                                        chunks, framing="chunked")
        if head == "trailers" and arg is not None:
            # /trailers/N?name=value...: N body bytes, chunked, then the query as trailer fields
            n = int(arg)
            data = pattern_bytes(n)
            chunks = [data[i:i + 16384] for i in range(0, n, 16384)]
            names = ", ".join(name for name, _ in req.query)
            return self._write_response(req, 200, [("Content-Type", "application/octet-stream"),
                                                   ("Trailer", names)],
                                        chunks, framing="chunked", trailers=req.query)
        if head == "close-delimited" and arg is not None:
            n = int(arg)
            self._write_response(req, 200, [("Content-Type", "application/octet-stream")],
                                 iter_pattern(n), framing="close")
            return False
        if head == "slow" and arg is not None:
            ms = int(arg)
            if not self._sleep_watching(req, ms / 1000.0):
                return False  # the peer went away while we waited
            return self._json(req, {"upstream": self.name, "slept_ms": ms, "target": req.target})
        if head == "hang":
            # Never answer; wait until the peer goes away (or the server stops).
            req.conn.sock.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    if not req.conn.sock.recv(65536):
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            return False
        if head == "close-mid":
            if ("chunked", "1") in req.query:
                req.conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n3e8\r\n" + pattern_bytes(1000)
                              + b"\r\n")
            else:
                req.conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                              b"Content-Length: 100000\r\n\r\n" + pattern_bytes(1000))
            time.sleep(0.05)
            return False
        if head == "expect":
            return self._json(req, {"upstream": self.name, "expect": req.header("expect"),
                                    "body_len": len(body), "continue_sent": req.continue_sent})
        if head == "drain-after":
            return self._json(req, {"upstream": self.name, "body_len": len(body),
                                    "body_sha256": hashlib.sha256(body).hexdigest()})
        if head == "response-headers":
            return self._write_response(req, 200, [("Content-Type", "text/plain")] + req.query,
                                        b"ok\n")
        if head == "stats":
            return self._json(req, self.stats())
        return self._write_response(req, 404, [("Content-Type", "text/plain")],
                                    b"upstream: no such endpoint\n")

    def _sleep_watching(self, req: Request, seconds: float) -> bool:
        """Sleeps, but notices when the peer closes (or resets) the connection meanwhile, so
        that the connection's record shows it. Bytes that arrive are kept (pipelining).
        Returns False when the peer went away."""
        sock = req.conn.sock
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            r, _, _ = select.select([sock], [], [], min(left, 0.05))
            if r:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return False
                if not data:
                    return False
                req.conn.buf += data

    # ---------------------------------------------------------------- websocket

    def _websocket(self, req: Request) -> bool:
        key = req.header("sec-websocket-key")
        if not key or (req.header("upgrade") or "").lower() != "websocket":
            return self._write_response(req, 400, [], b"bad websocket handshake\n")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        req.conn.send(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\n"
                       f"Sec-WebSocket-Accept: {accept}\r\nX-Upstream: {self.name}\r\n\r\n").encode())
        while True:
            try:
                opcode, payload = read_ws_frame(req.conn)
            except (PeerClosed, ConnectionError, OSError):
                return False
            if opcode == 0x8:  # close: answer with the same status and stop
                req.conn.send(ws_frame(0x8, payload[:2], mask=False))
                return False
            if opcode == 0x9:  # ping
                req.conn.send(ws_frame(0xA, payload, mask=False))
                continue
            req.conn.send(ws_frame(opcode, payload, mask=False))


def ws_frame(opcode: int, payload: bytes, mask: bool = True, fin: bool = True) -> bytes:
    """One WebSocket frame (RFC 6455 5.2); clients must mask, servers must not."""
    import os
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = bytes([b0, (0x80 if mask else 0) | n])
    elif n < 65536:
        head = bytes([b0, (0x80 if mask else 0) | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([b0, (0x80 if mask else 0) | 127]) + n.to_bytes(8, "big")
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _xor(payload, key)


def _xor(data: bytes, key: bytes) -> bytes:
    if not data:
        return b""
    full = (key * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(full, "big")).to_bytes(len(data), "big")


def read_ws_frame(conn) -> tuple:
    """Reads one frame from an object with read_exact(n); returns (opcode, unmasked payload)."""
    b0, b1 = conn.read_exact(2)
    opcode = b0 & 0x0F
    masked = bool(b1 & 0x80)
    n = b1 & 0x7F
    if n == 126:
        n = int.from_bytes(conn.read_exact(2), "big")
    elif n == 127:
        n = int.from_bytes(conn.read_exact(8), "big")
    key = conn.read_exact(4) if masked else None
    payload = conn.read_exact(n) if n else b""
    if key:
        payload = _xor(payload, key)
    return opcode, payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--name", default=None, help="reported in X-Upstream and /echo")
    ap.add_argument("--strip-prefix", default="",
                    help="serve <prefix>/echo as /echo and so on (the demo stack's /api/)")
    args = ap.parse_args()
    server = UpstreamServer(args.host, args.port, name=args.name or f"upstream-{args.port}",
                            strip_prefix=args.strip_prefix.rstrip("/"))
    print(f"upstream {server.name} listening on {server.address}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
