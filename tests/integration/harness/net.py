"""Loopback plumbing of the integration tests: free ports, refused and silent ports, local
server processes, and many raw clients that send at the same moment."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Optional


def _port_block() -> tuple[int, int]:
    """The ports this test process hands out: below the kernel's ephemeral range (which
    bind(port 0) and every outgoing connect() draw from, so no other socket takes a port
    between our check and the server's bind), split into one block per pytest-xdist worker
    (so two workers never hand out the same port)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low, high = 10000, min(ephemeral_low, 65536)
    if high - low < 2000:
        return 0, 0  # no room below the ephemeral range: fall back to port 0
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count < 1:
        return low, high
    size = (high - low) // count
    index = int(worker[2:]) % count
    return low + index * size, low + (index + 1) * size


_BLOCK = _port_block()
_next_port = [0]


def _bindable(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port() -> int:
    """A 127.0.0.1 TCP port that nothing holds, for a server a test starts next."""
    low, high = _BLOCK
    if high > low:
        if not _next_port[0]:
            _next_port[0] = low + (os.getpid() * 7919) % (high - low)  # vary between runs
        for _ in range(high - low):
            port = _next_port[0]
            _next_port[0] = port + 1 if port + 1 < high else low
            if _bindable(port):
                return port
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def connection_refused(port: int, within: float = 2.0) -> bool:
    """True once a connect() to 127.0.0.1:port is refused within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        except OSError:
            pass
        finally:
            s.close()
        time.sleep(0.02)
    return False


class SilentListener:
    """A 127.0.0.1 port that accepts connections and never sends a byte (a TLS upstream that
    never answers the ClientHello). `.port`, `.accepted`; `close()` closes everything."""

    def __init__(self, backlog: int = 16):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                self.accepted.append(self.sock.accept()[0])
            except socket.timeout:
                continue
            except OSError:
                return

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        for c in self.accepted:
            c.close()
        self.sock.close()


class LocalServerProcess:
    """A server process of the tests on its own 127.0.0.1 port (`.port`, `.proc`)."""

    port: int
    proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# ------------------------------------------------------------------ parallel clients

_PARALLEL_CLIENT = r'''
import base64, json, socket, sys
port = int(sys.argv[1])
reqs = [base64.b64decode(r) for r in json.loads(sys.stdin.readline())]
socks = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in reqs]
for s in socks:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
for s, r in zip(socks, reqs):
    s.sendall(r)
out = []
for s in socks:
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        data += chunk
    s.close()
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    try:
        status = int(lines[0].split(" ")[1])
    except Exception:
        status = -1
    headers = [l.split(":", 1) for l in lines[1:] if ":" in l]
    out.append([status, [[n, v.strip()] for n, v in headers]])
sys.stdout.write(json.dumps(out) + "\n"); sys.stdout.flush()
'''


def parallel_requests(port: int, raw_requests: list, processes: int = 5,
                      timeout: float = 30.0) -> list:
    """Sends every raw request (bytes; use Connection: close) on its own connection, from
    `processes` client processes that all connect first and then send at the same moment.
    Returns [(status, [(name, value)])] in the order of raw_requests (status -1: no response)."""
    groups = [list(range(i, len(raw_requests), processes)) for i in range(processes)]
    groups = [g for g in groups if g]
    procs = []
    try:
        for g in groups:
            p = subprocess.Popen([sys.executable, "-c", _PARALLEL_CLIENT, str(port)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            p.stdin.write(json.dumps([base64.b64encode(raw_requests[i]).decode() for i in g]) + "\n")
            p.stdin.flush()
            procs.append(p)
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", f"client process failed: {line!r} {p.stderr.read()}"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results: list = [None] * len(raw_requests)
        for p, g in zip(procs, groups):
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"client process failed: {err}"
            for i, (status, headers) in zip(g, json.loads(out.strip().splitlines()[-1])):
                results[i] = (status, [tuple(h) for h in headers])
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
