"""A raw-socket HTTP/1.1 client for what http.client cannot express: pipelining, malformed
requests, half-close, interim (1xx) responses, HEAD on a kept-alive connection, WebSocket.

    c = RawClient(port)
    c.send(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    r = c.read_response()          # Response(status, reason, version, headers, body, ...)
    r = c.read_response("HEAD")    # a response to HEAD never has a body
    c.is_closed(1.0)               # True once the peer closed (EOF or reset) within 1 s
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional


class IncompleteResponse(Exception):
    def __init__(self, message: str, response: "Response"):
        super().__init__(message)
        self.response = response


@dataclass
class Response:
    status: int
    reason: str
    version: str
    headers: list  # [(name, value)] as received
    body: bytes = b""
    framing: str = "none"  # none | content-length | chunked | close
    chunk_sizes: list = field(default_factory=list)
    trailers: list = field(default_factory=list)
    complete: bool = True
    raw_head: bytes = b""
    interim: list = field(default_factory=list)  # 1xx responses that came before this one

    def header(self, name: str) -> Optional[str]:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None

    def header_values(self, name: str) -> list:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def has(self, name: str) -> bool:
        return self.header(name) is not None

    def connection_tokens(self) -> list:
        out = []
        for v in self.header_values("connection"):
            out += [t.strip().lower() for t in v.split(",") if t.strip()]
        return out

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:  # keep pytest output readable with big bodies
        body = self.body if len(self.body) <= 300 else self.body[:300] + b"...(%d bytes)" % len(self.body)
        return (f"Response({self.status} {self.reason!r}, headers={self.headers!r}, body={body!r}, "
                f"framing={self.framing}, complete={self.complete})")


def build_request(method: str, target: str, headers: Iterable = (), body: bytes = b"",
                  version: str = "HTTP/1.1", host: Optional[str] = "sluice.test",
                  content_length: bool = True) -> bytes:
    """A request; Host is added first unless host is None or headers has one; Content-Length is
    added for a non-empty body unless headers already frame it or content_length is False."""
    headers = list(headers)
    names = {n.lower() for n, _ in headers}
    lines = [f"{method} {target} {version}"]
    if host is not None and "host" not in names:
        lines.append(f"Host: {host}")
    lines += [f"{n}: {v}" for n, v in headers]
    if body and content_length and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, sizes: Iterable[int], trailers: Iterable = ()) -> bytes:
    """body in chunked coding, split in chunks of the given sizes (the rest in one chunk)."""
    out = bytearray()
    pos = 0
    for s in sizes:
        if pos >= len(body):
            break
        piece = body[pos:pos + s]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        pos += len(piece)
    if pos < len(body):
        out += b"%x\r\n" % (len(body) - pos) + body[pos:] + b"\r\n"
    out += b"0\r\n"
    for n, v in trailers:
        out += f"{n}: {v}\r\n".encode()
    out += b"\r\n"
    return bytes(out)


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 rcvbuf: Optional[int] = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.eof = False
        self.timeout = timeout

    # --------------------------------------------------------------- plumbing

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), like a client that crashed."""
        import struct
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout
        self.sock.settimeout(timeout)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, method: str, target: str, headers: Iterable = (), body: bytes = b"",
                **kw) -> None:
        self.send(build_request(method, target, headers, body, **kw))

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    # What a read that ends the stream raises (a TLS client adds its own).
    EOF_ERRORS: tuple = (ConnectionResetError,)

    def _fill(self, size: int = 256 * 1024) -> bool:
        """Reads more; False at EOF (or reset)."""
        if self.eof:
            return False
        try:
            data = self.sock.recv(size)
        except self.EOF_ERRORS:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(f"connection closed after {len(self.buf)} of {n} bytes")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv_some(self, max_bytes: int = 65536) -> bytes:
        """Whatever is buffered or arrives next (b'' at EOF)."""
        if not self.buf:
            self._fill(max_bytes)
        out = bytes(self.buf[:max_bytes])
        del self.buf[:max_bytes]
        return out

    def _read_line(self, limit: int = 1 << 20) -> bytes:
        while True:
            idx = self.buf.find(b"\r\n")
            if idx >= 0:
                line = bytes(self.buf[:idx])
                del self.buf[: idx + 2]
                return line
            if len(self.buf) > limit:
                raise ValueError("line too long")
            if not self._fill():
                raise EOFError("connection closed in the middle of a line")

    def is_closed(self, timeout: float = 2.0) -> bool:
        """True when the peer closes (EOF or reset) within timeout, data or not before it.
        Data that arrives stays in the buffer."""
        if self.eof:
            return True
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                try:
                    if not self._fill():
                        return True
                except socket.timeout:
                    return False
        finally:
            self.sock.settimeout(self.timeout)

    def data_pending(self, timeout: float = 0.3) -> bool:
        """Whether any byte (buffered or new) is available within timeout."""
        if self.buf:
            return True
        self.sock.settimeout(timeout)
        try:
            return self._fill()
        except socket.timeout:
            return False
        finally:
            self.sock.settimeout(self.timeout)

    # --------------------------------------------------------------- responses

    def read_head(self) -> Response:
        try:
            status_line = self._read_line()
        except EOFError:
            raise EOFError("connection closed before a response") from None
        raw = [status_line]
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"bad status line {status_line!r}")
        version, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        while True:
            line = self._read_line()
            raw.append(line)
            if not line:
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ValueError(f"bad header line {line!r}")
            headers.append((name, value.strip(" \t")))
        return Response(status, reason, version, headers, raw_head=b"\r\n".join(raw) + b"\r\n")

    def read_response(self, method: str = "GET", allow_incomplete: bool = False) -> Response:
        """The next response, 1xx included. Raises IncompleteResponse (or returns the partial
        response with complete=False when allow_incomplete) when the connection closes before
        the body is complete."""
        r = self.read_head()
        try:
            self._read_body(r, method)
        except EOFError as e:
            r.complete = False
            if allow_incomplete:
                return r
            raise IncompleteResponse(str(e), r) from None
        return r

    def read_final_response(self, method: str = "GET", **kw) -> Response:
        """The next final (non-1xx) response, with the 1xx before it in .interim."""
        interim = []
        while True:
            r = self.read_response(method, **kw)
            if 100 <= r.status < 200 and r.status != 101:
                interim.append(r)
                continue
            r.interim = interim
            return r

    def _read_body(self, r: Response, method: str) -> None:
        if method == "HEAD" or r.status in (204, 304) or 100 <= r.status < 200:
            r.framing = "none"
            return
        te = r.header("transfer-encoding")
        if te is not None and te.split(",")[-1].strip().lower() == "chunked":
            r.framing = "chunked"
            body = bytearray()
            while True:
                line = self._read_line()
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while True:
                        t = self._read_line()
                        if not t:
                            break
                        n, _, v = t.decode("latin-1").partition(":")
                        r.trailers.append((n, v.strip()))
                    break
                r.chunk_sizes.append(size)
                try:
                    body += self.read_exact(size)
                except EOFError:
                    body += self.buf
                    self.buf.clear()
                    r.body = bytes(body)
                    raise
                if self.read_exact(2) != b"\r\n":
                    raise ValueError("bad chunk end")
            r.body = bytes(body)
            return
        cl = r.header("content-length")
        if cl is not None:
            r.framing = "content-length"
            n = int(cl)
            if len(self.buf) < n:
                while len(self.buf) < n and self._fill():
                    pass
            if len(self.buf) < n:
                r.body = bytes(self.buf)
                self.buf.clear()
                raise EOFError(f"connection closed after {len(r.body)} of {n} body bytes")
            r.body = bytes(self.buf[:n])
            del self.buf[:n]
            return
        r.framing = "close"
        while self._fill():
            pass
        r.body = bytes(self.buf)
        self.buf.clear()


def request_once(port: int, method: str, target: str, headers: Iterable = (), body: bytes = b"",
                 timeout: float = 5.0, **kw) -> Response:
    """One request on a fresh connection; returns the final response."""
    with RawClient(port, timeout=timeout) as c:
        c.request(method, target, headers, body, **kw)
        return c.read_final_response(method)
