"""A frame-level HTTP/2 client for test_http2.py: hyperframe frames and hpack header blocks over
a plain (h2c, prior knowledge) or TLS socket, with no state machine of its own, so that a test
can send what a well-behaved client never would (a stream past the peer's limit, HEADERS then
RST_STREAM a thousand times, WINDOW_UPDATE 0, DATA after END_STREAM, connection-specific
fields) and still see every frame the gateway sends back.

    c = H2Client(port)                        # preface + SETTINGS sent; TLS: context=...
    sid = c.request("GET", "/echo")           # HEADERS (END_STREAM); returns the stream id
    s = c.response(sid)                       # waits until END_STREAM or RST_STREAM
    s.status, s.headers, s.body, s.reset      # reset: the RST_STREAM error code, or None
    c.server_settings, c.goaways, c.closed    # what the connection said

It keeps flow control honest in both directions: DATA it sends waits for the peer's windows,
and (unless auto_window=False) every DATA frame it receives is given back at once with
WINDOW_UPDATE on the stream and the connection. Reading happens only inside the calls that
wait (pump(), wait(), response(), ...): one client belongs to one thread.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from hpack import Decoder, Encoder
from hyperframe.frame import (ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame,
                              PingFrame, PushPromiseFrame, RstStreamFrame, SettingsFrame,
                              WindowUpdateFrame)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# RFC 9113 section 7
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

ERROR_NAMES = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR",
               0x3: "FLOW_CONTROL_ERROR", 0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED",
               0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM", 0x8: "CANCEL",
               0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
               0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED"}

# SETTINGS identifiers (RFC 9113 section 6.5.2)
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

MAX_WINDOW = 2 ** 31 - 1

# Fields that RFC 9113 section 8.2.2 forbids in HTTP/2 (te is allowed only as "trailers").
CONNECTION_SPECIFIC = {"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                       "upgrade"}


def error_name(code: Optional[int]) -> str:
    if code is None:
        return "none"
    return ERROR_NAMES.get(code, hex(code))


@dataclass
class H2Stream:
    id: int
    status: Optional[int] = None
    headers: list = field(default_factory=list)  # [(name, value)] of the final response
    informational: list = field(default_factory=list)  # [(status, headers)] of 1xx responses
    trailers: list = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False  # END_STREAM received
    reset: Optional[int] = None  # error code of a RST_STREAM received
    data_frames: int = 0

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    @property
    def body(self) -> bytes:
        return bytes(self.data)

    def header(self, name: str) -> Optional[str]:
        for n, v in self.headers:
            if n == name.lower():
                return v
        return None

    def header_values(self, name: str) -> list:
        return [v for n, v in self.headers if n == name.lower()]

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        body = self.body if len(self.data) <= 300 else self.body[:300] + b"...(%d bytes)" % len(self.data)
        return (f"H2Stream(id={self.id}, status={self.status}, headers={self.headers!r}, "
                f"body={body!r}, ended={self.ended}, reset={error_name(self.reset)})")


class H2Client:
    """One HTTP/2 connection to 127.0.0.1:port (see the module's docstring).

    context: an ssl.SSLContext for TLS (its ALPN list as the test sets it; .alpn tells what was
    chosen). settings: the client's SETTINGS ({id: value}; ENABLE_PUSH 0 is always sent unless
    given). auto_window: give every received DATA byte back with WINDOW_UPDATE at once.
    preface: send the preface and SETTINGS in the constructor."""

    def __init__(self, port: int, *, context: Optional[ssl.SSLContext] = None,
                 server_hostname: Optional[str] = None, timeout: float = 5.0,
                 settings: Optional[dict] = None, auto_window: bool = True,
                 preface: bool = True, authority: str = "sluice.test"):
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.alpn: Optional[str] = None
        if context is not None:
            try:
                self.sock = context.wrap_socket(raw, server_hostname=server_hostname)
            except BaseException:
                raw.close()
                raise
            self.alpn = self.sock.selected_alpn_protocol()
        else:
            self.sock = raw
        self.timeout = timeout
        self.authority = authority
        self.scheme = "https" if context is not None else "http"
        self.auto_window = auto_window
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.buf = bytearray()
        self.received_head = bytearray()  # the first 4 KiB received, as they came (diagnostics)
        self.streams: dict[int, H2Stream] = {}
        self.next_stream_id = 1
        self.server_settings: dict = {}
        self.settings_frames = 0  # SETTINGS frames (not ACKs) received
        self.settings_acked = False  # our SETTINGS acknowledged
        self.goaways: list = []  # [(error_code, last_stream_id, debug data)]
        self.frames: list = []  # (type name, stream id, flags) of every frame received
        self.pings_acked = 0
        self.closed = False  # EOF (or a reset) from the peer
        self.closed_at: Optional[float] = None
        self.goaway_at: Optional[float] = None
        self.protocol_errors: list = []  # what this client found wrong in what it received
        self.conn_send_window = 65535
        self.conn_recv_consumed = 0  # flow-controlled bytes of DATA received, padding included
        self.peer_initial_window = 65535
        self.peer_max_frame = 16384
        self.stream_send_windows: dict[int, int] = {}
        self._header_block: Optional[tuple] = None  # (stream id, frame type, bytes, end_stream)
        self.client_settings = {ENABLE_PUSH: 0, **(settings or {})}
        self.recv_initial_window = self.client_settings.get(INITIAL_WINDOW_SIZE, 65535)
        if preface:
            self.send_preface()

    # ------------------------------------------------------------------ plumbing

    def __enter__(self) -> "H2Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send_preface(self) -> None:
        f = SettingsFrame(0)
        for k, v in self.client_settings.items():
            f.settings[k] = v
        self.send_raw(PREFACE + f.serialize())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, *frames: Frame) -> None:
        self.send_raw(b"".join(f.serialize() for f in frames))

    def new_stream_id(self) -> int:
        sid = self.next_stream_id
        self.next_stream_id += 2
        return sid

    # ------------------------------------------------------------------ sending

    def request_headers(self, method: str, path: str, headers: Iterable = (),
                        authority: Optional[str] = None, scheme: Optional[str] = None) -> list:
        """The header list of a request: the four pseudo-header fields, then `headers`.
        authority=None: the client's default; "" leaves :authority out."""
        authority = self.authority if authority is None else authority
        out = [(":method", method), (":scheme", scheme or self.scheme)]
        if authority:
            out.append((":authority", authority))
        out.append((":path", path))
        return out + [(n, v) for n, v in headers]

    def header_frames(self, sid: int, header_list: list, end_stream: bool) -> bytes:
        """HEADERS (+ CONTINUATION) carrying header_list, split at the peer's frame size."""
        block = self.encoder.encode(header_list)
        size = self.peer_max_frame
        pieces = [block[i:i + size] for i in range(0, len(block), size)] or [b""]
        out = bytearray()
        for i, piece in enumerate(pieces):
            f = HeadersFrame(sid) if i == 0 else ContinuationFrame(sid)
            f.data = piece
            if i == 0 and end_stream:
                f.flags.add("END_STREAM")
            if i == len(pieces) - 1:
                f.flags.add("END_HEADERS")
            out += f.serialize()
        return bytes(out)

    def send_headers(self, sid: int, header_list: list, end_stream: bool = True) -> None:
        self.streams.setdefault(sid, H2Stream(sid))
        self.stream_send_windows.setdefault(sid, self.peer_initial_window)
        self.send_raw(self.header_frames(sid, header_list, end_stream))

    def request(self, method: str, path: str, headers: Iterable = (), body: Optional[bytes] = None,
                *, authority: Optional[str] = None, end_stream: Optional[bool] = None,
                sid: Optional[int] = None) -> int:
        """Opens a stream with a request; body (if any) goes in DATA frames as the windows
        allow (the call waits for WINDOW_UPDATEs). end_stream=False leaves the stream open
        after the body (or after HEADERS when there is none). Returns the stream id."""
        sid = sid if sid is not None else self.new_stream_id()
        if end_stream is None:
            end_stream = True
        has_body = body is not None and len(body) > 0
        self.send_headers(sid, self.request_headers(method, path, headers, authority),
                          end_stream=end_stream and not has_body)
        if has_body:
            self.send_data(sid, body, end_stream=end_stream)
        return sid

    def send_requests(self, requests: Iterable) -> list:
        """Several GET-like requests (method, path[, headers[, authority]]) with END_STREAM, all
        HEADERS in one write: they arrive together. Returns the stream ids."""
        out = bytearray()
        sids = []
        for req in requests:
            method, path, *rest = req
            headers = rest[0] if rest else ()
            authority = rest[1] if len(rest) > 1 else None
            sid = self.new_stream_id()
            self.streams.setdefault(sid, H2Stream(sid))
            self.stream_send_windows.setdefault(sid, self.peer_initial_window)
            out += self.header_frames(sid, self.request_headers(method, path, headers, authority),
                                      end_stream=True)
            sids.append(sid)
        self.send_raw(bytes(out))
        return sids

    def send_data(self, sid: int, data: bytes, end_stream: bool = True,
                  timeout: Optional[float] = None) -> None:
        """DATA frames within the peer's connection and stream windows and its frame size."""
        deadline = time.monotonic() + (timeout or self.timeout * 4)
        pos = 0
        self.stream_send_windows.setdefault(sid, self.peer_initial_window)
        while True:
            left = len(data) - pos
            if left == 0 and pos > 0:
                return
            allowed = min(left, self.conn_send_window, self.stream_send_windows[sid],
                          self.peer_max_frame)
            if allowed <= 0 and left > 0:
                if self.closed or self.streams.get(sid, H2Stream(sid)).reset is not None:
                    raise ConnectionError(f"stream {sid} cannot send: closed or reset "
                                          f"({error_name(self.streams[sid].reset if sid in self.streams else None)})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no flow-control window to send on stream {sid} "
                                       f"(connection {self.conn_send_window}, stream "
                                       f"{self.stream_send_windows[sid]})")
                self.pump(0.2)
                continue
            f = DataFrame(sid)
            f.data = data[pos:pos + allowed]
            pos += allowed
            last = pos == len(data)
            if last and end_stream:
                f.flags.add("END_STREAM")
            self.conn_send_window -= allowed
            self.stream_send_windows[sid] -= allowed
            self.send_frame(f)
            if last:
                return

    def end_stream(self, sid: int) -> None:
        f = DataFrame(sid)
        f.flags.add("END_STREAM")
        self.send_frame(f)

    def reset_stream(self, sid: int, code: int = CANCEL) -> None:
        self.send_frame(RstStreamFrame(sid, error_code=code))

    def window_update(self, sid: int, increment: int) -> None:
        self.send_frame(WindowUpdateFrame(sid, window_increment=increment))

    def ping(self, payload: bytes = b"sluice!!") -> None:
        self.send_frame(PingFrame(0, opaque_data=payload))

    def goaway(self, code: int = NO_ERROR) -> None:
        self.send_frame(GoAwayFrame(0, last_stream_id=0, error_code=code))

    # ------------------------------------------------------------------ receiving

    def pump(self, timeout: float = 0.1) -> bool:
        """Reads what arrives within `timeout` (at most one read) and handles the frames it
        completes. Returns False once the peer has closed."""
        if self.closed:
            return False
        pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
        if not pending:
            r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if not r:
                return True
        try:
            data = self.sock.recv(1 << 20)
        except ssl.SSLWantReadError:
            return True
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError, BrokenPipeError):
            data = b""
        except socket.timeout:
            return True
        if not data:
            self.closed = True
            self.closed_at = time.monotonic()
            return False
        if len(self.received_head) < 4096:
            self.received_head += data[:4096 - len(self.received_head)]
        self.buf += data
        self._handle_buffer()
        return True

    def wait(self, predicate: Callable[[], bool], timeout: Optional[float] = None) -> bool:
        """Pumps until predicate() holds, the peer closes or `timeout` passes."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return predicate()
            self.pump(min(left, 0.2))
        return True

    def wait_settings(self, timeout: Optional[float] = None) -> bool:
        return self.wait(lambda: self.settings_frames > 0, timeout)

    def wait_goaway(self, timeout: Optional[float] = None) -> bool:
        return self.wait(lambda: bool(self.goaways), timeout)

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """True once the peer has closed the connection within `timeout`."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.closed and time.monotonic() < deadline:
            try:
                self.pump(min(0.2, max(0.0, deadline - time.monotonic())))
            except OSError:
                self.closed = True
        return self.closed

    def response(self, sid: int, timeout: Optional[float] = None) -> H2Stream:
        """The stream once it has ended or been reset; AssertionError if neither happens."""
        s = self.streams.setdefault(sid, H2Stream(sid))
        self.wait(lambda: s.done, timeout)
        assert s.done, (f"stream {sid} not answered within {timeout or self.timeout}s "
                        f"(closed={self.closed}, goaways={self.goaways_text()}): {s!r}")
        return s

    def responses(self, sids: Iterable[int], timeout: Optional[float] = None) -> list:
        sids = list(sids)
        for sid in sids:
            self.streams.setdefault(sid, H2Stream(sid))
        self.wait(lambda: all(self.streams[s].done for s in sids), timeout)
        missing = [s for s in sids if not self.streams[s].done]
        assert not missing, (f"{len(missing)} of {len(sids)} streams not answered (closed="
                             f"{self.closed}, goaways={self.goaways_text()}): first "
                             f"{self.streams[missing[0]]!r}")
        return [self.streams[s] for s in sids]

    def describe(self) -> str:
        """What the connection has shown so far, for assertion messages."""
        return (f"settings={self.server_settings} goaways={self.goaways_text()} closed={self.closed} "
                f"frames={len(self.frames)} errors={self.protocol_errors[:3]} "
                f"first bytes={bytes(self.received_head[:120])!r}")

    def goaways_text(self) -> str:
        return ", ".join(f"{error_name(c)} last={l} {d[:80]!r}" for c, l, d in self.goaways) or "none"

    def _handle_buffer(self) -> None:
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[0:3], "big")
            if len(self.buf) < 9 + length:
                return
            header = memoryview(bytes(self.buf[:9]))
            body = memoryview(bytes(self.buf[9:9 + length]))
            del self.buf[:9 + length]
            try:
                frame, _ = Frame.parse_frame_header(header)
                frame.parse_body(body)
            except Exception as e:  # noqa: BLE001 - a malformed frame is a finding, not a crash
                self.protocol_errors.append(f"unparsable frame {bytes(header)!r}: {e!r}")
                continue
            self._handle_frame(frame)

    def _stream(self, sid: int) -> H2Stream:
        if sid not in self.streams:
            if sid % 2 == 0 or sid >= self.next_stream_id:
                self.protocol_errors.append(f"frame on stream {sid} that this client never opened")
            self.streams[sid] = H2Stream(sid)
        return self.streams[sid]

    def _handle_frame(self, f: Frame) -> None:
        self.frames.append((type(f).__name__, f.stream_id, set(f.flags)))
        if self._header_block is not None and not isinstance(f, ContinuationFrame):
            self.protocol_errors.append(f"{type(f).__name__} inside a header block")
        if isinstance(f, SettingsFrame):
            if "ACK" in f.flags:
                self.settings_acked = True
                return
            self.settings_frames += 1
            for k, v in f.settings.items():
                if k == INITIAL_WINDOW_SIZE:
                    delta = v - self.peer_initial_window
                    self.peer_initial_window = v
                    for sid in self.stream_send_windows:
                        self.stream_send_windows[sid] += delta
                elif k == MAX_FRAME_SIZE:
                    self.peer_max_frame = v
                elif k == HEADER_TABLE_SIZE:
                    self.encoder.header_table_size = min(v, 4096)
                self.server_settings[k] = v
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self._send_quietly(ack)
        elif isinstance(f, PingFrame):
            if "ACK" in f.flags:
                self.pings_acked += 1
            else:
                ack = PingFrame(0, opaque_data=f.opaque_data)
                ack.flags.add("ACK")
                self._send_quietly(ack)
        elif isinstance(f, WindowUpdateFrame):
            if f.stream_id == 0:
                self.conn_send_window += f.window_increment
            else:
                self.stream_send_windows[f.stream_id] = (
                    self.stream_send_windows.get(f.stream_id, self.peer_initial_window)
                    + f.window_increment)
        elif isinstance(f, GoAwayFrame):
            self.goaways.append((f.error_code, f.last_stream_id, bytes(f.additional_data)))
            if self.goaway_at is None:
                self.goaway_at = time.monotonic()
        elif isinstance(f, RstStreamFrame):
            self._stream(f.stream_id).reset = f.error_code
        elif isinstance(f, (HeadersFrame, ContinuationFrame)):
            if isinstance(f, HeadersFrame):
                self._header_block = (f.stream_id, bytearray(f.data), "END_STREAM" in f.flags)
            elif self._header_block is None or self._header_block[0] != f.stream_id:
                self.protocol_errors.append(f"CONTINUATION on stream {f.stream_id} out of place")
                return
            else:
                self._header_block[1].extend(f.data)
            if "END_HEADERS" in f.flags:
                sid, block, end = self._header_block
                self._header_block = None
                self._headers_received(self._stream(sid), self.decoder.decode(bytes(block)), end)
        elif isinstance(f, DataFrame):
            s = self._stream(f.stream_id)
            if s.status is None:
                self.protocol_errors.append(f"DATA before a response head on stream {s.id}")
            s.data += f.data
            s.data_frames += 1
            if "END_STREAM" in f.flags:
                s.ended = True
            n = f.flow_controlled_length
            self.conn_recv_consumed += n
            if self.auto_window and n:
                frames = [WindowUpdateFrame(0, window_increment=n)]
                if not s.ended:
                    frames.append(WindowUpdateFrame(s.id, window_increment=n))
                self._send_quietly(*frames)
        elif isinstance(f, PushPromiseFrame):
            self.protocol_errors.append(f"PUSH_PROMISE on stream {f.stream_id} with push disabled")

    def _send_quietly(self, *frames: Frame) -> None:
        try:
            self.send_frame(*frames)
        except OSError:
            pass  # the peer is gone; what it sent is still read

    def _headers_received(self, s: H2Stream, fields: list, end_stream: bool) -> None:
        fields = [(n, v) for n, v in fields]
        status = [v for n, v in fields if n == ":status"]
        if s.status is not None and not status:  # trailers
            s.trailers = fields
        elif not status:
            self.protocol_errors.append(f"a response head without :status on stream {s.id}")
        else:
            code = int(status[0])
            regular = [(n, v) for n, v in fields if not n.startswith(":")]
            if 100 <= code < 200:
                s.informational.append((code, regular))
            else:
                s.status = code
                s.headers = regular
            pseudo = [n for n, _ in fields if n.startswith(":")]
            if pseudo != [":status"] or fields[0][0] != ":status":
                self.protocol_errors.append(f"pseudo-header fields {pseudo} on stream {s.id} "
                                            f"(only :status, first)")
        if end_stream:
            s.ended = True


def check_h2_response_fields(s: H2Stream) -> None:
    """What RFC 9113 section 8.2 asks of a response's fields: lower-case names, none of the
    connection-specific ones, a content-length (if any) that matches the body."""
    names = [n for n, _ in s.headers]
    upper = [n for n in names if n != n.lower()]
    assert not upper, f"field names not in lower case on stream {s.id}: {upper}"
    bad = [n for n in names if n in CONNECTION_SPECIFIC]
    assert not bad, f"connection-specific fields in an HTTP/2 response: {bad} ({s!r})"
    te = s.header_values("te")
    assert all(v.strip().lower() == "trailers" for v in te), te


def open_h2(port: int, **kw) -> H2Client:
    """An HTTP/2 connection whose SETTINGS from the gateway have arrived (the test fails
    otherwise)."""
    import pytest
    c = H2Client(port, **kw)
    if not c.wait_settings(3):
        c.close()
        pytest.fail(f"no HTTP/2 SETTINGS from the gateway on port {port}: {c.describe()}",
                    pytrace=False)
    return c
