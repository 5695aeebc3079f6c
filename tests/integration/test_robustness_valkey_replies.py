"""A malformed Valkey reply never ends the process (issue 23, item 5).

Valkey never sends these, so the server here is a fake: a TCP server in this process that
speaks enough RESP for the gateway's handshake (FUNCTION LOAD) and answers each decision as
the test says. Replies beyond the reader's bounds (an array announcing 2,000,000,000 elements)
fail their connection, which is made anew; replies of the wrong shape for their call fail that
call. Either way the requests are decided by on_error, the fault is logged and counted
(sluice_valkey_errors_total{kind="malformed"}), and the gateway goes on. A wait of INT64_MAX ms
is said as the ceiling, Retry-After: 2147483647."""

import socket
import threading
import time

import pytest

from conftest import limit_cfg, metric_sum, sluice_with_limits

INT64_MAX = 2**63 - 1


class FakeValkey:
    """Answers FUNCTION LOAD with the library's name, PING with PONG, and each FCALL with
    `self.answer(args)` (raw bytes). Counts connections and decisions."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.decisions = 0
        self.answer = lambda args: good_reply(args)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while True:
                    parsed = parse_command(buf)
                    if parsed is None:
                        break
                    args, buf = parsed
                    name = args[0].upper()
                    if name == b"FUNCTION":
                        conn.sendall(b"$6\r\nsluice\r\n")
                    elif name == b"FCALL":
                        self.decisions += 1
                        conn.sendall(self.answer(args))
                    elif name == b"PING":
                        conn.sendall(b"+PONG\r\n")
                    else:
                        conn.sendall(b"+OK\r\n")
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.closed = True
        self.sock.close()


def parse_command(buf: bytes):
    """One RESP array of bulk strings from buf: (args, rest), or None if incomplete."""
    if not buf.startswith(b"*"):
        return None
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    n, pos, args = int(buf[1:end]), end + 2, []
    for _ in range(n):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1:end])
        pos = end + 2
        if len(buf) < pos + size + 2:
            return None
        args.append(buf[pos:pos + size])
        pos += size + 2
    return args, buf[pos:]


def integers(*values) -> bytes:
    return f"*{len(values)}\r\n".encode() + b"".join(f":{v}\r\n".encode() for v in values)


def now_us() -> int:
    return int(time.time() * 1e6)


def good_reply(args) -> bytes:
    """An allowing decision for one request of one limit: time, remaining, reset, retry 0."""
    return integers(now_us(), 4, 1000, 0)


@pytest.fixture
def fake():
    f = FakeValkey()
    yield f
    f.close()


def gateway(sluice_factory, upstream, fake, on_error="deny"):
    return sluice_with_limits(sluice_factory, upstream, f"127.0.0.1:{fake.port}",
                              [limit_cfg("lim", "fixed_window", 5, "10s", on_error=on_error)],
                              valkey_options={"timeout": "300ms"})


def malformed(gw) -> float:
    return metric_sum(gw, "sluice_valkey_errors_total", kind="malformed")


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.mark.parametrize("on_error,status", [("deny", 503), ("allow", 200)])
def test_an_array_of_two_billion_elements_is_decided_by_on_error(sluice_factory, upstream, fake,
                                                                 on_error, status):
    gw = gateway(sluice_factory, upstream, fake, on_error)
    assert gw.get("/status/200").status == 200, "the fake answers good decisions"
    before = fake.connections
    fake.answer = lambda args: b"*2000000000\r\n"
    assert gw.get("/status/200").status == status
    assert gw.alive(), "the gateway still runs"
    assert wait_for(lambda: malformed(gw) >= 1), "counted"
    # The connection is made anew, and decisions are good again.
    fake.answer = good_reply
    assert wait_for(lambda: fake.connections > before)
    assert wait_for(lambda: gw.get("/status/200").status == 200)
    assert "malformed reply" in gw.stderr()


def test_a_retry_of_int64_max_ms_says_the_ceiling(sluice_factory, upstream, fake):
    gw = gateway(sluice_factory, upstream, fake)
    fake.answer = lambda args: integers(now_us(), 0, INT64_MAX, INT64_MAX)
    r = gw.get("/status/200")
    assert r.status == 429
    assert r.header("retry-after") == "2147483647"
    assert 'r=0;t=2147483647' in r.header("ratelimit")


# Named ids: a reply that holds the time differs between the processes of a parallel run
# (pytest-xdist), which must all collect the same tests.
@pytest.mark.parametrize("reply", [
    pytest.param(b":5\r\n", id="not-an-array"),
    pytest.param(integers(now_us(), 4, 1000), id="a-value-missing"),
    pytest.param(integers(now_us(), 4, 1000, 0, 7), id="one-too-many"),
    pytest.param(b"*4\r\n:1\r\n:4\r\n*1\r\n:1\r\n:0\r\n", id="array-for-integer"),
    pytest.param(b"*4\r\n:1\r\n:4\r\n$2\r\n10\r\n:0\r\n", id="string-for-integer"),
    pytest.param(integers(-5, 4, 1000, 0), id="negative-time"),
    pytest.param(b"*4\r\n:1\r\n:99999999999999999999999\r\n:0\r\n:0\r\n", id="beyond-int64"),
])
def test_a_reply_of_the_wrong_shape_fails_only_its_call(sluice_factory, upstream, fake, reply):
    gw = gateway(sluice_factory, upstream, fake)
    fake.answer = lambda args: reply
    assert gw.get("/status/200").status == 503
    assert gw.alive()
    assert wait_for(lambda: malformed(gw) >= 1), "counted"
    fake.answer = good_reply
    assert wait_for(lambda: gw.get("/status/200").status == 200)


def test_a_huge_bulk_string_announced_is_never_allocated_up_front(sluice_factory, upstream, fake):
    gw = gateway(sluice_factory, upstream, fake)
    fake.answer = lambda args: b"$2000000000\r\nabc"
    assert gw.get("/status/200").status == 503, "late: decided by on_error at the deadline"
    assert gw.alive()
    fake.answer = good_reply
    assert wait_for(lambda: gw.get("/status/200").status == 200, timeout=10)
