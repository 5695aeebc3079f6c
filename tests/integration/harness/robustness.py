"""Helpers of test_robustness_*.py (see README.md, "Robustness"): upstream.py as a process of
its own, a load generator in a process of its own (so that neither shares the GIL of the test
process, whose clocks measure latencies), a probe of the machine's stalls, latency and RSS
bounds."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from harness.gateway import Sluice, is_asan_build, metric_sum, scaled
from harness.net import LocalServerProcess, free_port

# upstream.py's folder, for the upstream process
INTEGRATION_DIR = Path(__file__).resolve().parents[1]

_LEAN_UPSTREAM = r'''
import sys
sys.path.insert(0, sys.argv[1])
import upstream
parse_head = upstream.UpstreamServer._parse_head

def lean_parse_head(self, head, conn, rec):
    req = parse_head(self, head, conn, rec)
    with self._lock:  # no history: under load it only grows, and so do the GC's pauses
        self.requests.clear()
        if len(self.connections) > 1000:
            self.connections = [c for c in self.connections if c.open]
        self._threads = [t for t in self._threads if t.is_alive()]
    return req

upstream.UpstreamServer._parse_head = lean_parse_head
sys.argv = ["upstream.py", "--port", sys.argv[2], "--name", sys.argv[3]]
upstream.main()
'''


class UpstreamProcess(LocalServerProcess):
    """tests/integration/upstream.py run as its own process on a fixed 127.0.0.1 port: kill()
    (SIGKILL: the kernel closes its sockets, like a crash) and start() again on the same port.
    Same endpoints as UpstreamServer, but it keeps no history of requests (/stats is empty): a
    load of 100,000 requests would otherwise make every full collection of Python's GC longer,
    up to pauses of 100+ ms that a test would blame on the gateway. Its output goes to
    `upstream-<name>.log` in the test's tmp dir."""

    def __init__(self, name: str, workdir: Path):
        self.name = name
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = workdir / f"upstream-{name}.log"

    def start(self, timeout: float = 10.0) -> "UpstreamProcess":
        assert not self.running(), f"upstream {self.name} already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _LEAN_UPSTREAM, str(INTEGRATION_DIR),
                 str(self.port), self.name],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"upstream {self.name} exited with {self.proc.returncode}: "
                            f"{self.log_path.read_text(errors='replace')[-2000:]}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"upstream {self.name} not listening after {timeout}s",
                                pytrace=False)
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL to this PID, then waits for it."""
        if self.running():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(5)


_LOAD_CLIENT = r'''
import base64, json, socket, sys, threading, time
cfg = json.loads(sys.stdin.readline())
port, until, timeout, pause = cfg["port"], cfg["until"], cfg["timeout"], cfg["pause"]
records, errors, lock = [], [], threading.Lock()

def read_deadlines():  # each further line: a new end (CLOCK_MONOTONIC seconds)
    global until
    for line in sys.stdin:
        until = min(until, float(line))

threading.Thread(target=read_deadlines, daemon=True).start()

def read_response(sock, buf):
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise EOFError("closed before a response head")
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    close = b"close" in fields.get(b"connection", b"")
    if b"content-length" in fields:
        n = int(fields[b"content-length"])
        while len(buf) < n:
            data = sock.recv(65536)
            if not data:
                raise EOFError("closed in the middle of a body")
            buf += data
        buf = buf[n:]
    elif fields.get(b"transfer-encoding", b"").endswith(b"chunked"):
        while True:
            while b"\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    raise EOFError("closed in the middle of a chunked body")
                buf += data
            line, _, buf = buf.partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            while len(buf) < size + 2:
                data = sock.recv(65536)
                if not data:
                    raise EOFError("closed in the middle of a chunk")
                buf += data
            buf = buf[size + 2:]
            if size == 0:
                break
    elif status not in (204, 304):
        while sock.recv(65536):
            pass
        close = True
    return status, close, buf

def worker(kind, raw, tid):
    sock, buf, i = None, b"", 0
    while time.monotonic() < until:
        i += 1
        req = raw.replace(b"{n}", b"%d-%d" % (tid, i))
        t0 = time.monotonic()
        status, err = -2, None
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = b""
            sock.settimeout(timeout)
            sock.sendall(req)
            status, close, buf = read_response(sock, buf)
            if close:
                sock.close()
                sock = None
        except socket.timeout:
            status, err = -1, "timeout"
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        dt = time.monotonic() - t0
        if err is not None and sock is not None:
            sock.close()
            sock = None
        with lock:
            records.append((kind, t0, dt, status))
            if err is not None and len(errors) < 50:
                errors.append((kind, t0, err))
        if pause:
            time.sleep(pause)
    if sock is not None:
        sock.close()

threads = []
tid = 0
for kind, spec in cfg["kinds"].items():
    for _ in range(spec["threads"]):
        tid += 1
        threads.append(threading.Thread(target=worker, args=(kind, base64.b64decode(spec["raw"]), tid)))
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stdout.write(json.dumps({"records": records, "errors": errors}) + "\n")
'''


@dataclass
class LoadRecord:
    kind: str
    t0: float       # time.monotonic() when the request started (connect included, if any)
    dt: float       # seconds until the whole response was read
    status: int     # -1: no response within the load's timeout; -2: connection error
    # Seconds of the request during which the machine stalled (_STALL_PROBE): time in which no
    # process could run, the gateway included, so no fault of the gateway's.
    stall: float = 0.0

    @property
    def own(self) -> float:
        """dt without the machine's stalls: what the gateway took."""
        return max(0.0, self.dt - self.stall)


# A process that sleeps STALL_STEP_S again and again and records each wake-up later than
# STALL_MIN_S: moments when the machine ran nothing for a while (a virtual machine's CPUs taken
# away by its host, or more runnable processes than CPUs). Measured here: stalls of 0.35-0.7 s
# now and then, which break any bound on one request's latency. A request's latency minus the
# stalls during it is what the gateway itself took; a gateway that waits for a fault instead of
# its deadline still shows the whole fault, since a stall that long would be seen by the probe.
_STALL_PROBE = r"""
import json, sys, time
step, least, until = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
stalls = []
try:
    while time.monotonic() < until:
        t = time.monotonic()
        time.sleep(step)
        late = time.monotonic() - t - step
        if late > least:
            stalls.append((t + step, late))
except KeyboardInterrupt:  # the load ended: SIGINT
    pass
print(json.dumps(stalls))
"""
STALL_STEP_S = 0.005
STALL_MIN_S = 0.02


def stall_within(stalls: list, t0: float, t1: float) -> float:
    """Seconds of the stalls [(start, length)] that fall within [t0, t1]."""
    return sum(max(0.0, min(t1, start + length) - max(t0, start)) for start, length in stalls)


class Load:
    """A steady stream of requests from a process of its own: for each kind (a name and a raw
    request, where b"{n}" is replaced by a number unique in the run), `threads` client threads
    that send it back to back on a keep-alive connection (reconnecting after a close or an
    error) until `duration` seconds from start(), or earlier with end_at(). Times are
    CLOCK_MONOTONIC, the clock of the test process's time.monotonic(), so records compare with
    the moments a test caused a fault.

        load = Load(gw.port, {"allow": (raw, 4), "deny": (raw2, 4)}, duration=10).start()
        ... faults ...
        load.end_at(time.monotonic() + 0.5)
        recs = load.results()      # [LoadRecord]; waits for the end
    """

    def __init__(self, port: int, kinds: dict, duration: float, timeout: float = 5.0,
                 pause: float = 0.0):
        self.port = port
        self.kinds = {k: {"raw": base64.b64encode(raw).decode(), "threads": n}
                      for k, (raw, n) in kinds.items()}
        self.duration = duration
        self.timeout = timeout
        self.pause = pause
        self.proc: Optional[subprocess.Popen] = None
        self.probe: Optional[subprocess.Popen] = None
        self.errors: list = []
        self.stalls: list = []  # [(start, seconds)] the probe saw

    def start(self) -> "Load":
        self.started = time.monotonic()
        self.until = self.started + self.duration
        self.proc = subprocess.Popen([sys.executable, "-c", _LOAD_CLIENT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proc.stdin.write(json.dumps({"port": self.port, "until": self.until,
                                          "timeout": self.timeout, "pause": self.pause,
                                          "kinds": self.kinds}) + "\n")
        self.proc.stdin.flush()
        self.probe = subprocess.Popen(
            [sys.executable, "-c", _STALL_PROBE, str(STALL_STEP_S), str(STALL_MIN_S),
             str(self.until + self.timeout)], stdout=subprocess.PIPE, text=True)
        return self

    def end_at(self, when: float) -> None:
        """Ends the load at `when` (time.monotonic()) instead, if that is earlier."""
        self.proc.stdin.write(f"{when}\n")
        self.proc.stdin.flush()

    def results(self) -> list:
        try:
            out, err = self.proc.communicate(timeout=self.duration + self.timeout + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        assert self.proc.returncode == 0, f"load process failed: {err[-3000:]}"
        data = json.loads(out.strip().splitlines()[-1])
        self.errors = data["errors"]
        self.stalls = self._probe_stalls()
        recs = [LoadRecord(*r) for r in data["records"]]
        for r in recs:
            r.stall = stall_within(self.stalls, r.t0, r.t0 + r.dt)
        return sorted(recs, key=lambda r: r.t0)

    def _probe_stalls(self) -> list:
        """The stall probe's record (it ends `timeout` after the load; stopped early here)."""
        try:
            self.probe.send_signal(signal.SIGINT)
            out, _ = self.probe.communicate(timeout=10)
            return [tuple(s) for s in json.loads(out.strip().splitlines()[-1])] if out else []
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return []
        finally:
            if self.probe.poll() is None:
                self.probe.kill()
                self.probe.wait(5)


def records_of(recs: list, kind: str, t_from: float = float("-inf"),
               t_to: float = float("inf")) -> list:
    """The LoadRecords of `kind` whose request started in [t_from, t_to)."""
    return [r for r in recs if r.kind == kind and t_from <= r.t0 < t_to]


def status_counts(recs: list) -> dict:
    counts: dict = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def check_all_answered(recs: list, load: "Load") -> None:
    """No request of the load went without an answer (timeout or connection error)."""
    lost = [r for r in recs if r.status < 0]
    assert not lost, f"{len(lost)} requests without an answer: {lost[:5]} {load.errors[:5]}"


# Latency of requests that a fault does not concern (another route, the gateway's own 404):
# 99% within UNAFFECTED_P99_S and all within UNAFFECTED_MAX_S. Measured p99 is 1-8 ms; a 2-core
# machine running the gateway, Valkey, upstream.py and the load process has hiccups of 50-110 ms
# now and then, with or without a fault, which the maximum allows. A gateway loop blocked by the
# fault would hold them for the whole fault (0.3 s and more in every test) and show at the p99.
UNAFFECTED_P99_S = scaled(0.03, 0.1)
UNAFFECTED_MAX_S = scaled(0.25, 0.35)


def check_unaffected(recs: list, kind: str, status: int) -> dict:
    """Every request of `kind` got `status` within the UNAFFECTED bounds; returns its
    latency_summary()."""
    got = records_of(recs, kind)
    assert got and {r.status for r in got} == {status}, (kind, status_counts(got))
    s = latency_summary(got)
    # Bounds on what the gateway took: each latency without the machine's stalls during it.
    own = latency_summary(got, own=True)
    assert own["p99"] <= UNAFFECTED_P99_S * 1000 and own["max"] <= UNAFFECTED_MAX_S * 1000, \
        (kind, s, own)
    return s


def settled_rss_kb(gw: "Sluice", settle: float = 0.3) -> int:
    """VmRSS of the gateway after `settle` seconds of quiet."""
    time.sleep(settle)
    return gw.rss_kb()


def report_figures(name: str, **figures) -> None:
    """Prints a test's measurements (pytest -s shows them): README.md's robustness table."""
    print(f"\n[robustness] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def latency_summary(recs: list, own: bool = False) -> dict:
    """{"n", "p50", "p99", "max"} of the records' latencies, in milliseconds (`own`: without
    the machine's stalls, LoadRecord.own)."""
    if not recs:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ds = sorted(r.own if own else r.dt for r in recs)

    def q(p: float) -> float:
        return round(ds[min(len(ds) - 1, int(p * len(ds)))] * 1000, 1)

    return {"n": len(ds), "p50": q(0.5), "p99": q(0.99), "max": round(ds[-1] * 1000, 1)}


def wait_connections_open(gw: "Sluice", value: int, timeout: float = 10.0) -> float:
    """Waits until sluice_connections_open equals value; returns the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        seen = metric_sum(gw, "sluice_connections_open")
        if seen == value or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


# ASan's allocator keeps freed memory in a quarantine (256 MiB by default) before reusing it, and
# RSS counts it: after a load of some 10,000 requests RSS grows by the quarantine's size whether
# or not anything leaked. The robustness tests lower it to this size on the ASan build, so their
# RSS checks keep a meaning there (use-after-free detection still covers the last 16 MiB of
# frees; LeakSanitizer at exit remains the leak check).
ASAN_QUARANTINE_MB = 16


# RSS after a fault (and its recovery) may exceed the baseline (taken after a warm-up round of
# the same load, so that pools, buffers and the allocator's arenas are there) by this much: on
# the normal build 10 MiB, which a leak of 100 bytes per request of a 100,000-request run would
# already exceed; on the ASan build also the quarantine, which fills up with the run's frees,
# and 8 MiB for ASan's allocator caches.
RSS_TOLERANCE_KB = 10 * 1024
ASAN_RSS_SLACK_KB = (ASAN_QUARANTINE_MB + 8) * 1024


def rss_tolerance_kb() -> int:
    return RSS_TOLERANCE_KB + (ASAN_RSS_SLACK_KB if is_asan_build() else 0)
