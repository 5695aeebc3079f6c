"""Requests that an endpoint closed on before answering: sent again to another endpoint when
that is safe (no body, idempotent method), and never otherwise."""

import socket
import threading

from conftest import free_port


class ClosingEndpoint:
    """Accepts, reads a request head, closes without a byte: an endpoint that dies on it."""

    def __init__(self):
        self.port = free_port()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        self.accepted = 0
        self.running = True
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while self.running:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                c.settimeout(2)
                c.recv(65536)
            except OSError:
                pass
            c.close()

    def close(self):
        self.running = False
        self.sock.close()


def test_get_goes_to_the_next_endpoint_when_one_closes_without_answering(sluice_factory,
                                                                         upstream):
    dying = ClosingEndpoint()
    try:
        gw = sluice_factory([f"127.0.0.1:{dying.port}", upstream],
                            upstream_options={"fail_timeout": "0s"})
        for _ in range(4):  # round-robin puts the dying endpoint first every other time
            r = gw.get("/echo")
            assert r.status == 200, r
        assert dying.accepted >= 1, "the dying endpoint was never tried"
    finally:
        dying.close()


def test_a_request_with_a_body_is_not_sent_twice(sluice_factory, upstream):
    dying = ClosingEndpoint()
    try:
        gw = sluice_factory([f"127.0.0.1:{dying.port}", upstream],
                            upstream_options={"fail_timeout": "0s"})
        statuses = [gw.request("POST", "/echo", [], b"payload").status for _ in range(4)]
        # Every request that went to the dying endpoint is a 502: its body may have been used.
        assert statuses.count(502) == dying.accepted >= 1, statuses
        assert all(s in (200, 502) for s in statuses), statuses
        assert upstream.request_count == statuses.count(200)
    finally:
        dying.close()
