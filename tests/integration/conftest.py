"""Fixtures of Sluice's integration tests: the real binary, real upstreams, loopback only.

- free_port(): a free 127.0.0.1 TCP port (bind to port 0).
- upstream_factory(name=...): starts an in-process upstream.UpstreamServer on a free port;
  `upstream` is one of them, named "up1".
- sluice_factory(...): writes a TOML configuration to the test's tmp dir, starts the binary
  (SLUICE_BIN, default <repo>/build/sluice), waits for GET /healthz on the admin port; at
  teardown sends SIGTERM, waits up to 10 s, asserts exit code 0 (kills that PID if needed).
  Its stderr goes to a file that is printed in the report of a failed test.
- blackhole(): a 127.0.0.1 port whose accept queue is full, so a connect() there hangs.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Optional

import pytest

from rawhttp import RawClient, request_once
from upstream import UpstreamServer

REPO = Path(__file__).resolve().parents[2]
SLUICE_BIN = Path(os.environ.get("SLUICE_BIN", REPO / "build" / "sluice"))


def free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def sluice_bin() -> Path:
    if not SLUICE_BIN.is_file() or not os.access(SLUICE_BIN, os.X_OK):
        pytest.fail(f"sluice binary not found at {SLUICE_BIN} (build it with cmake or set SLUICE_BIN)",
                    pytrace=False)
    return SLUICE_BIN


# ------------------------------------------------------------------------------- TOML writing

def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for what tests write
    if isinstance(v, UpstreamServer):
        return json.dumps(v.address)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def toml_table(header: str, values: dict) -> str:
    lines = [header]
    lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n\n"


def endpoint_text(e: Any) -> str:
    if isinstance(e, UpstreamServer):
        return e.address
    if isinstance(e, int):
        return f"127.0.0.1:{e}"
    return str(e)


# ------------------------------------------------------------------------------- the process

class Sluice:
    def __init__(self, config_path: Path, stderr_path: Path, port: int, admin_port: int):
        self.config_path = config_path
        self.stderr_path = stderr_path
        self.port = port
        self.admin_port = admin_port
        self.proc: Optional[subprocess.Popen] = None
        self.stopped = False
        self.returncode: Optional[int] = None

    # -- lifecycle
    def start(self, timeout: float = 10.0) -> "Sluice":
        self._stderr = open(self.stderr_path, "wb")
        self._stdout = open(self.stderr_path.with_suffix(".stdout"), "wb")
        self.proc = subprocess.Popen([str(sluice_bin()), "-c", str(self.config_path)],
                                     stdout=self._stdout, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self.returncode = rc
                self.stopped = True
                pytest.fail(f"sluice exited with {rc} at startup:\n{self.stderr()}", pytrace=False)
            if self.admin_ok():
                return self
            if time.monotonic() > deadline:
                pytest.fail(f"sluice did not answer /healthz within {timeout}s:\n{self.stderr()}",
                            pytrace=False)
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def admin_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 10.0) -> Optional[int]:
        """Exit code, or None when still running after timeout."""
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.stopped = True
        return self.returncode

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 10.0) -> Optional[int]:
        """Signals, waits; kills this PID (and returns None) if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        rc = self.wait(timeout)
        if rc is None:
            self.proc.kill()
            self.proc.wait(5)
            self.stopped = True
        self._close_files()
        return rc

    def _close_files(self) -> None:
        for f in (getattr(self, "_stderr", None), getattr(self, "_stdout", None)):
            if f and not f.closed:
                f.close()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- observation
    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def admin_get(self, path: str) -> tuple:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    # -- clients
    def client(self, timeout: float = 5.0, **kw) -> RawClient:
        return RawClient(self.port, timeout=timeout, **kw)

    def request(self, method: str, target: str, headers: Iterable = (), body: bytes = b"", **kw):
        return request_once(self.port, method, target, headers, body, **kw)

    def get(self, target: str, headers: Iterable = (), **kw):
        return self.request("GET", target, headers, **kw)


@pytest.fixture
def blackhole():
    """Ports on 127.0.0.1 that never complete a TCP handshake: a listening socket with backlog 0
    that is never accept()ed, its queue filled; SYNs beyond it are dropped."""
    opened = []

    def make() -> int:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(0)
        port = lsock.getsockname()[1]
        opened.append(lsock)
        for _ in range(3):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            opened.append(s)
            select.select([], [s], [], 0.05)
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.fail("could not build a blackhole port (connect succeeded)")
        except socket.timeout:
            pass
        finally:
            probe.close()
        return port

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def upstream_factory():
    servers: list[UpstreamServer] = []

    def make(name: Optional[str] = None, **kw) -> UpstreamServer:
        s = UpstreamServer(name=name or f"up{len(servers) + 1}", **kw).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def upstream(upstream_factory) -> UpstreamServer:
    return upstream_factory("up1")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for inst in getattr(item, "_sluice_instances", []):
            report.sections.append((f"sluice stderr (pid {inst.proc.pid if inst.proc else '-'}, "
                                    f"config {inst.config_path})",
                                    inst.config_path.read_text() + "\n----- stderr -----\n" +
                                    inst.stderr()[-20000:]))


DEFAULT_SERVER = {
    "request_header_timeout": "3s",
    "idle_timeout": "5s",
    "drain_timeout": "5s",
}
DEFAULT_UPSTREAM = {
    "connect_timeout": "500ms",
    "response_timeout": "5s",
}


@pytest.fixture
def sluice_factory(tmp_path, request):
    """make(upstream=server_or_list, ...) for one cluster "app" and a catch-all route, or
    make(upstreams=[{name, endpoints, ...}], routes=[{name, match, upstream}]).
    server / log / upstream_options: extra keys; workers defaults to 1; start=False only writes
    the configuration (returns the Sluice, not started)."""
    instances: list[Sluice] = []
    request.node._sluice_instances = instances

    def make(upstream: Any = None, *, upstreams: Optional[list] = None,
             routes: Optional[list] = None, server: Optional[dict] = None,
             upstream_options: Optional[dict] = None, log: Optional[dict] = None,
             workers: int = 1, extra_toml: str = "", start: bool = True) -> Sluice:
        n = len(instances)
        port, admin_port = free_port(), free_port()
        while admin_port == port:
            admin_port = free_port()
        if upstreams is None:
            upstreams = []
            if upstream is not None:
                eps = upstream if isinstance(upstream, (list, tuple)) else [upstream]
                upstreams.append({"name": "app", "endpoints": list(eps)})
        ups = []
        for u in upstreams:
            u = {**DEFAULT_UPSTREAM, **(upstream_options or {}), **u}
            u["endpoints"] = [endpoint_text(e) for e in u["endpoints"]]
            # name first, for readable files
            ups.append({"name": u.pop("name"), **u})
        if routes is None:
            routes = [{"name": "all", "match": {"path_prefix": "/"}, "upstream": ups[0]["name"]}] if ups else []
        server_cfg = {"listen": f"127.0.0.1:{port}", "workers": workers, **DEFAULT_SERVER,
                      **(server or {})}
        text = toml_table("[server]", server_cfg)
        text += toml_table("[admin]", {"listen": f"127.0.0.1:{admin_port}"})
        text += toml_table("[log]", {"level": "debug", "access_log": "off", **(log or {})})
        for u in ups:
            text += toml_table("[[upstream]]", u)
        for r in routes:
            text += toml_table("[[route]]", r)
        text += extra_toml
        cfg = tmp_path / f"sluice{n}.toml"
        cfg.write_text(text)
        inst = Sluice(cfg, tmp_path / f"sluice{n}.stderr", port, admin_port)
        instances.append(inst)
        if start:
            inst.start()
        return inst

    yield make

    problems = []
    for inst in instances:
        if inst.proc is None:
            continue
        if inst.stopped:
            inst._close_files()
            continue
        rc = inst.stop(signal.SIGTERM, timeout=10)
        if rc is None:
            problems.append(f"sluice pid {inst.pid} did not exit within 10 s of SIGTERM (killed)")
        elif rc != 0:
            problems.append(f"sluice pid {inst.pid} exited with {rc} after SIGTERM")
    if problems:
        pytest.fail("; ".join(problems) + "\n" + "\n".join(i.stderr()[-5000:] for i in instances),
                    pytrace=False)


@pytest.fixture
def sluice(sluice_factory, upstream) -> Sluice:
    """One gateway in front of the `upstream` fixture, with a catch-all route."""
    return sluice_factory(upstream)
