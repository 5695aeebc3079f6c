"""An HTTP/2 upstream for the gateway's `protocol = "h2c" | "h2"` (python3-h2 as the server's
state machine): h2c with prior knowledge, or h2 over TLS when given a certificate (ALPN h2).
One thread per connection; it counts the connections it accepted and the streams it saw.

Paths:
  /status/N         status N, body "status N" (none for 204 and 304, nor for HEAD)
  /echo             the request's body back, with its content-type; the request's trailers
                    come back as trailers (and x-request-trailers: yes when there were any)
  /headers          the request's fields as JSON (pseudo-fields included)
  /bytes/N          N bytes of a repeating pattern (pattern_bytes)
  /trailers         body "ok", then trailers grpc-status: 0 and x-checksum: 42
  /response-headers?NAME=VALUE&...   those fields in the response, body "ok"
  /slow/MS          the answer after MS milliseconds (the others go on meanwhile)
  /never            no answer at all
  /reset            RST_STREAM INTERNAL_ERROR, no answer
  /goaway           GOAWAY (last stream: this one) after the answer; the streams in flight
                    finish
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from typing import Optional

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import hyperframe.frame


def pattern_bytes(n: int) -> bytes:
    """n bytes of a pattern that shows where a slice went wrong."""
    unit = bytes(range(251))
    return (unit * (n // len(unit) + 1))[:n]


class _Conn:
    def __init__(self, server: "H2Server", sock: socket.socket):
        self.server = server
        self.sock = sock
        self.lock = threading.Lock()
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8",
                                      validate_inbound_headers=False))
        self.requests: dict[int, dict] = {}
        self.pending: dict[int, list] = {}  # stream -> [data left, trailers or None]
        self.closed = False
        self.streams = 0  # requests received on this connection

    def send(self) -> None:
        data = self.h2.data_to_send()
        if data:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def run(self) -> None:
        with self.lock:
            self.h2.initiate_connection()
            self.send()
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            with self.lock:
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError:
                    self.send()
                    break
                for event in events:
                    self.on_event(event)
                self.flush()
                self.send()
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def on_event(self, event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.server.streams += 1
            self.streams += 1
            self.requests[event.stream_id] = {"headers": list(event.headers),
                                              "body": bytearray(), "trailers": []}
        elif isinstance(event, h2.events.DataReceived):
            req = self.requests.get(event.stream_id)
            if req is not None:
                req["body"] += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            req = self.requests.get(event.stream_id)
            if req is not None:
                req["trailers"] = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.answer(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.requests.pop(event.stream_id, None)
            self.pending.pop(event.stream_id, None)
            self.server.resets_received += 1

    def answer(self, stream_id: int) -> None:
        req = self.requests.get(stream_id)
        if req is None:
            return
        fields = dict(req["headers"])
        method, path = fields.get(":method", ""), fields.get(":path", "")
        self.server.seen.append((method, path, req["headers"]))
        if path == "/never":
            return
        if path == "/reset":
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        if path.startswith("/slow/"):
            delay = int(path.split("/")[2]) / 1000
            threading.Timer(delay, self.answer_later, (stream_id, method, "/status/200", req)).start()
            return
        self.respond(stream_id, method, path, req)

    def answer_later(self, stream_id, method, path, req) -> None:
        with self.lock:
            if self.closed or stream_id not in self.requests:
                return
            self.respond(stream_id, method, path, req)
            self.flush()
            self.send()

    def respond(self, stream_id: int, method: str, path: str, req: dict) -> None:
        status, body, headers, trailers = 200, b"", [], None
        if path.startswith("/status/"):
            status = int(path.split("/")[2])
            body = b"" if status in (204, 304) else f"status {status}".encode()
        elif path.startswith("/echo"):
            body = bytes(req["body"])
            ctype = dict(req["headers"]).get("content-type")
            if ctype:
                headers.append(("content-type", ctype))
            if req["trailers"]:
                headers.append(("x-request-trailers", "yes"))
                trailers = req["trailers"]
        elif path == "/headers":
            body = json.dumps(req["headers"]).encode()
            headers.append(("content-type", "application/json"))
        elif path.startswith("/bytes/"):
            body = pattern_bytes(int(path.split("/")[2]))
        elif path.startswith("/response-headers?"):
            for pair in path.split("?", 1)[1].split("&"):
                name, _, value = pair.partition("=")
                headers.append((name.lower(), value))
            body = b"ok"
        elif path == "/trailers":
            body = b"ok"
            trailers = [("grpc-status", "0"), ("x-checksum", "42")]
        elif path == "/goaway":
            body = b"bye"
        else:
            status, body = 404, b"no such path"
        if method == "HEAD":
            headers.append(("content-length", str(len(body))))
            body = b""
        elif status not in (204, 304) and trailers is None:
            headers.append(("content-length", str(len(body))))
        end_now = not body and trailers is None
        self.h2.send_headers(stream_id, [(":status", str(status)), *headers], end_stream=end_now)
        if not end_now:
            self.pending[stream_id] = [memoryview(body), trailers]
        self.requests.pop(stream_id, None)
        if path == "/goaway":
            # A graceful GOAWAY (RFC 9113 6.8): the streams up to this one finish. Written as
            # a frame of its own: python-h2's close_connection() would end them too.
            self.server.goaways_sent += 1
            self.flush()
            self.send()
            frame = hyperframe.frame.GoAwayFrame(0)
            frame.last_stream_id = stream_id
            frame.error_code = 0
            try:
                self.sock.sendall(frame.serialize())
            except OSError:
                self.closed = True

    def flush(self) -> None:
        """Sends what the windows allow of every pending body, then the trailers."""
        for stream_id in list(self.pending):
            body, trailers = self.pending[stream_id]
            try:
                while body:
                    window = min(self.h2.local_flow_control_window(stream_id),
                                 self.h2.max_outbound_frame_size)
                    if window <= 0:
                        break
                    self.h2.send_data(stream_id, bytes(body[:window]))
                    body = body[window:]  # a memoryview: no copy of the rest
                self.pending[stream_id][0] = body
                if body:
                    continue
                if trailers is not None:
                    self.h2.send_headers(stream_id, trailers, end_stream=True)
                else:
                    self.h2.end_stream(stream_id)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                pass
            del self.pending[stream_id]


class H2Server:
    """Listens on a free loopback port; `tls`: (cert file, key file) for h2 over TLS, `alpn`:
    the protocols it selects from by ALPN."""

    def __init__(self, tls: Optional[tuple] = None, alpn: tuple = ("h2",)):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.context = None
        if tls:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.context.set_alpn_protocols(list(alpn))
        self.connections = 0
        self.streams = 0
        self.resets_received = 0
        self.goaways_sent = 0
        self.seen: list = []
        self.conns: list[_Conn] = []
        self.stopped = False
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self) -> None:
        while not self.stopped:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context:
                try:
                    sock = self.context.wrap_socket(sock, server_side=True)
                except (OSError, ssl.SSLError):
                    continue
            self.connections += 1
            conn = _Conn(self, sock)
            self.conns.append(conn)
            threading.Thread(target=conn.run, daemon=True).start()

    def stop(self) -> None:
        self.stopped = True
        # shutdown() wakes the thread blocked in accept(); close() alone would leave the port
        # listening until that accept() returned.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass
        for conn in self.conns:
            conn.closed = True
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
