"""Valkey for the rate-limit tests: a private redis-server / valkey-server process, the TOML
of limits, routes and identity, a gateway with limits, what a limit's key holds (as the Lua
scripts write it), the server's clock and window boundaries, and MONITOR."""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import pytest

from harness.gateway import REPO, Sluice, endpoint_text, toml_table, wait_admin
from harness.net import LocalServerProcess, free_port

REDIS_SERVER = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
LUA_DIR = REPO / "lua"
# The engine the suites decide with (README "Engines"): "lua" (the functions; servers without
# the module), or "module": every server the tests start loads sluice-valkey.so and every
# gateway runs with engine = "module", so a node without it fails the test instead of
# quietly deciding with the functions. .ci/run runs the Valkey-facing suites on both.
ENGINE = os.environ.get("SLUICE_ENGINE", "lua")
assert ENGINE in ("lua", "module"), f"SLUICE_ENGINE={ENGINE}: lua or module"


# What a decision goes to Valkey as on this engine, and how many of them a server has run.
DECIDE_VERB = "SLUICE.DECIDE" if ENGINE == "module" else "FCALL"


def decide_calls(client) -> int:
    stat = "cmdstat_" + DECIDE_VERB.lower()
    return client.info("commandstats").get(stat, {}).get("calls", 0)


def decide_args(command: list) -> list:
    """A decision's arguments as MONITOR shows it, from numkeys on (after FCALL's function
    name, or after the module's command)."""
    return command[2:] if str(command[0]).upper() == "FCALL" else command[1:]


def module_path() -> str:
    """The Valkey module: SLUICE_MODULE, else the sluice-valkey.so beside SLUICE_BIN."""
    from harness.gateway import SLUICE_BIN
    path = os.environ.get("SLUICE_MODULE") or str(Path(SLUICE_BIN).parent / "sluice-valkey.so")
    if not os.path.isfile(path):
        pytest.fail(f"the Valkey module is not at {path} (the build makes it beside sluice, or "
                    f"set SLUICE_MODULE)", pytrace=False)
    return path


def module_args(load: Optional[bool] = None) -> list:
    """A server's arguments that load the module: when `load`, or by default when the suites
    run on the module engine."""
    return ["--loadmodule", module_path()] if (ENGINE == "module" if load is None else load) \
        else []


def redis_server_bin() -> str:
    if not REDIS_SERVER or not os.access(REDIS_SERVER, os.X_OK):
        pytest.fail("redis-server not found on PATH (install redis-server or valkey-server, or set "
                    "REDIS_SERVER): the rate-limit tests need a real server", pytrace=False)
    return REDIS_SERVER


class ValkeyServer(LocalServerProcess):
    """A private redis-server (same protocol as Valkey) on 127.0.0.1, no persistence."""

    def __init__(self, workdir: Path, password: Optional[str] = None, extra_args: Iterable = (),
                 module: Optional[bool] = None):
        self.module = module  # load sluice-valkey.so (None: as SLUICE_ENGINE says)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self._client = None
        self._log_path = workdir / "redis.log"

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")
        except OSError:
            return ""

    def new_client(self, **kw):
        import redis
        opts = dict(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5,
                    socket_connect_timeout=2, decode_responses=True,
                    encoding_errors="backslashreplace")
        opts.update(kw)
        return redis.Redis(**opts)

    @property
    def client(self):
        if self._client is None:
            self._client = self.new_client()
        return self._client

    def start(self, timeout: float = 10.0) -> "ValkeyServer":
        """Starts (or restarts, on the same port) and waits until PING answers."""
        assert not self.running(), "redis-server already running"
        args = [redis_server_bin(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--daemonize", "no", "--logfile", str(self._log_path)]
        if self.password:
            args += ["--requirepass", self.password]
        args += module_args(self.module) + self.extra_args
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        probe = self.new_client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(f"redis-server exited with {self.proc.returncode} at startup "
                                f"(port {self.port}):\n{self.log()[-3000:]}", pytrace=False)
                try:
                    if probe.ping():
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not answer PING within {timeout}s",
                                pytrace=False)
                time.sleep(0.01)
        finally:
            probe.close()
        if self._client is not None:
            self._client.connection_pool.disconnect()
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stops this PID (SIGCONT first, in case it is paused); SIGKILL if it does not exit."""
        if self._client is not None:
            self._client.connection_pool.disconnect()
        if not self.running():
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> "ValkeyServer":
        self.stop()
        return self.start()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


# ------------------------------------------------------------------ configuration for limits

# Correctness tests use a generous deadline so that a loaded machine never turns a decision into
# an on_error one; the failure-path tests set the 25 ms default explicitly.
DEFAULT_VALKEY_OPTIONS = {"timeout": "1s", **({"engine": "module"} if ENGINE == "module" else {})}


def ratelimit_toml(valkey: Any = None, *, limits: Iterable = (), valkey_options: Optional[dict] = None,
                   identity: Optional[dict] = None, plans: Iterable = (),
                   tenants: Iterable = ()) -> str:
    """TOML text for sluice_factory(extra_toml=...): [valkey] (address of a ValkeyServer, a port
    or "host:port"), [identity], [[limit]], [[plan]], [[tenant]]. Dict keys are written as given,
    e.g. limits=[{"name": "per_ip", "algorithm": "fixed_window", "by": ["ip"], "limit": 5,
    "window": "2s"}]."""
    text = "\n"
    v = dict(DEFAULT_VALKEY_OPTIONS)
    if valkey is not None:
        v["address"] = valkey.address if isinstance(valkey, ValkeyServer) else endpoint_text(valkey)
    v.update(valkey_options or {})
    v = {"address": v.pop("address"), **v} if "address" in v else v
    text += toml_table("[valkey]", v)
    if identity:
        text += toml_table("[identity]", identity)
    for l in limits:
        text += toml_table("[[limit]]", {"name": l["name"], **l})
    for p in plans:
        text += toml_table("[[plan]]", {"name": p["name"], **p})
    for t in tenants:
        text += toml_table("[[tenant]]", {"name": t["name"], **t})
    return text


def limit_cfg(name: str, algorithm: str, limit: int, window: str, by: Iterable = ("ip",),
              **kw) -> dict:
    return {"name": name, "algorithm": algorithm, "by": list(by), "limit": limit,
            "window": window, **kw}


def route_cfg(name: str, limits: Iterable = (), match: Optional[dict] = None,
              upstream: str = "app", **kw) -> dict:
    return {"name": name, "match": match or {"path_prefix": "/"}, "upstream": upstream,
            "limits": list(limits), **kw}


# ------------------------------------------------------------------ what a key holds

WINDOW_NUMBERS = 1 << 32  # fixed_window and sliding_window keep their window number modulo this


def raw_value(valkey, key: str) -> Optional[bytes]:
    """A key's value as bytes (window values are binary); a list (a sliding_log) as the tuple
    of its elements."""
    if getattr(valkey, "_raw_client", None) is None:
        valkey._raw_client = valkey.new_client(decode_responses=False)
    c = valkey._raw_client
    if c.type(key) == b"list":
        return tuple(c.lrange(key, 0, -1))
    return c.get(key)


def stored(valkey, key: str, algorithm: str):
    """What a limit's key holds, as the scripts write it (lua/<algorithm>.lua): fixed_window
    (window number mod 2^32, count); sliding_window (window number, current, previous);
    sliding_log [entry times, us]; token_bucket TAT (us). None when the key is absent."""
    if algorithm == "sliding_log":  # a list of the entries' times, oldest first
        entries = valkey.client.lrange(key, 0, -1)
        return [int(t) for t in entries] if entries else None
    raw = raw_value(valkey, key)
    if raw is None:
        return None
    if algorithm == "fixed_window":
        n, count = struct.unpack("<Id", raw)
        return n, int(count)
    if algorithm == "sliding_window":
        n, current, previous = struct.unpack("<Idd", raw)
        return n, int(current), int(previous)
    assert algorithm == "token_bucket", algorithm
    return int(raw)


def used(valkey, key: str, algorithm: str, window_s: float = 0) -> int:
    """What counts in a window key now: fixed_window its count (0 when it holds an earlier
    window), sliding_window this window's count, sliding_log its entries (not aged out within
    `window_s`; all when 0)."""
    value = stored(valkey, key, algorithm)
    if value is None:
        return 0
    if algorithm in ("fixed_window", "sliding_window"):
        n = math.floor(server_time(valkey.client) / window_s) if window_s else None
        if n is not None and value[0] != n % WINDOW_NUMBERS:
            return 0
        return value[1]
    if algorithm == "sliding_log":
        cutoff = server_time_us(valkey.client) - window_s * 1e6 if window_s else -1
        return sum(1 for t in value if t > cutoff)
    raise AssertionError(f"no count for {algorithm}")


def server_time(client) -> float:
    """Valkey's clock (TIME), in seconds."""
    s, us = client.time()
    return s + us / 1e6


def server_time_us(client) -> int:
    s, us = client.time()
    return s * 1_000_000 + us


def sleep_until_window_offset(client, window_s: float, offset_s: float, min_lead: float = 0.0) -> int:
    """Sleeps until the server clock is offset_s into a window (windows aligned to the epoch, as
    the scripts align them: floor(now_us / window_us)), at least min_lead from now. Returns the
    number of that window."""
    now = server_time(client)
    n = math.floor(now / window_s)
    target = n * window_s + offset_s
    while target < now + min_lead:
        target += window_s
    time.sleep(target - now)
    return math.floor(target / window_s + 1e-9)


def avoid_window_boundary(client, window_s: float, need_s: float) -> None:
    """When less than need_s is left in the current window, waits for the next one."""
    now = server_time(client)
    left = (math.floor(now / window_s) + 1) * window_s - now
    if left < need_s:
        time.sleep(left + 0.02)


def limit_keys(client, pattern: str = "*") -> list:
    return sorted(client.scan_iter(match=pattern, count=1000))


def key_part(key: str) -> str:
    """The parts of a limit's key, "<prefix>:<limit>:{<parts>}", as one text."""
    assert key.endswith("}") and ":{" in key, f"not a limit key: {key!r}"
    return key[key.index(":{") + 2:-1]


def hashed_part(value) -> str:
    """How a long or unsafe key part is written (src/ratelimit/keys.h): "~" and the first 32 hex
    digits of its SHA-256."""
    if isinstance(value, str):
        value = value.encode("latin-1")
    return "~" + hashlib.sha256(value).hexdigest()[:32]


def sluice_with_limits(sluice_factory, upstream, valkey, limits: list, routes: Optional[list] = None,
                       *, identity: Optional[dict] = None, plans: Iterable = (),
                       tenants: Iterable = (), valkey_options: Optional[dict] = None,
                       wait_ready: bool = True, extra_toml: str = "", **kw) -> Sluice:
    """A gateway in front of `upstream` with these limits (by default one catch-all route "api"
    with all of them), waiting until /ready says Valkey answers on every worker. `extra_toml`
    follows the limits' tables."""
    if routes is None:
        routes = [route_cfg("api", [l["name"] for l in limits])]
    gw = sluice_factory(upstream, routes=routes,
                        extra_toml=ratelimit_toml(valkey, limits=limits, identity=identity,
                                                  plans=plans, tenants=tenants,
                                                  valkey_options=valkey_options) + extra_toml,
                        **kw)
    if wait_ready:
        wait_admin(gw, "/ready", 200)
        # Counts in these tests are exact: never start one a few seconds before a boundary of a
        # (minute-or-longer) window. Short windows are aligned by the tests themselves.
        for l in limits:
            if l["algorithm"] not in ("fixed_window", "sliding_window"):
                continue
            w = duration_seconds(l["window"])
            if w >= 60:
                avoid_window_boundary(valkey.client, w, 8.0)
    return gw


def duration_seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text)
    assert m, f"bad duration {text!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


class ValkeyMonitor:
    """MONITOR on a raw connection: the commands clients send, script-internal ones ("lua")
    left out.  with ValkeyMonitor(v) as m: ...; m.commands() -> [[name, arg, ...], ...]"""

    _LINE = re.compile(r'^\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$')

    def __init__(self, server: "ValkeyServer"):
        self.server = server
        self.lines: list = []

    def __enter__(self) -> "ValkeyMonitor":
        self.sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        if self.server.password:
            pw = self.server.password.encode()
            self.sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
        self.sock.sendall(b"MONITOR\r\n")
        self.buf = b""
        want = 2 if self.server.password else 1
        while self.buf.count(b"\r\n") < want:
            self.buf += self.sock.recv(65536)
        self.buf = self.buf.split(b"\r\n", want)[-1]
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.1)
        self.sock.settimeout(0.2)
        try:
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                self.buf += data
        except socket.timeout:
            pass
        self.sock.close()
        self.lines = [l.decode("latin-1") for l in self.buf.split(b"\r\n") if l]

    def commands(self, include_lua: bool = False) -> list:
        out = []
        for line in self.lines:
            m = self._LINE.match(line)
            if not m or (m.group(1) == "lua" and not include_lua):
                continue
            out.append(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2)))
        return out
