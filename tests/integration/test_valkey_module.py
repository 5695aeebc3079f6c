"""The native engine, sluice-valkey.so (valkey-module/), on a real server: it loads and says its
protocol version; it decides exactly as the Lua library does (a randomized differential test:
both engines on one server, on two key prefixes, at the same frozen server time, replies and
stored values compared after every step); what it writes reaches a replica and the AOF as plain
commands (the replica and the restarted server have no module); hostile arguments are error
replies and the server stays up; its key specs give COMMAND GETKEYS, CROSSSLOT and ACL key
patterns.

The module is SLUICE_VALKEY_MODULE, else the sluice-valkey.so beside SLUICE_BIN (default
<repo>/build/sluice). The server is REDIS_SERVER (as for every Valkey-facing suite: Debian's
redis-server 7.0 by default; REDIS_SERVER=/path/to/valkey-server for Valkey 8.0.1). The frozen
time comes from libfaketime (Debian package faketime; SLUICE_FAKETIME_LIB picks another
path): the server reads its clock from a file the test writes (FAKETIME_TIMESTAMP_FILE,
FAKETIME_NO_CACHE=1; DONT_FAKE_MONOTONIC=1 keeps the event loop's timers real). A server that
does not start under libfaketime (Debian's redis-server 7.0: its jemalloc) gets a small preload
of the same frozen wall clock instead, built by the test (FROZEN_CLOCK_SOURCE). Nothing is
skipped: a missing server, module or libfaketime fails.

Expiry spread: both engines add a random extra life to each key they write (up to half the
window in steps of 5 ms, none under 10 ms, at most 5 minutes; the Lua draws it with math.random, the module with its own
generator), so a TTL is compared exactly only where the spread is 0 (windows and leases under
10 ms: the differential test's short windows), and otherwise within the spread's bound (its long
windows, 10 minutes and more, whose keys the test's simulated time never reaches the end of)."""

from __future__ import annotations

import os
import random
import re
import struct
import time
from pathlib import Path
from typing import Optional

import pytest

from decide_codec import decide_command, decide_library, decide_reply, lease_command, undo_command
from harness.gateway import REPO
from harness.valkey import ValkeyServer

# (the work is inside Valkey: once, not again on the sanitizer build; pytest.ini)
pytestmark = pytest.mark.once

SLUICE_BIN = Path(os.environ.get("SLUICE_BIN", REPO / "build" / "sluice"))
MODULE = Path(os.environ.get("SLUICE_VALKEY_MODULE") or SLUICE_BIN.parent / "sluice-valkey.so")
FAKETIME_LIB = Path(os.environ.get("SLUICE_FAKETIME_LIB")
                    or "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
PROTOCOL_VERSION = 2  # protocol/decide_protocol.h kProtocolVersion


def module_path() -> str:
    if not MODULE.is_file():
        pytest.fail(f"{MODULE}: no sluice-valkey.so (build it: scripts/build.sh, or set "
                    "SLUICE_VALKEY_MODULE)", pytrace=False)
    return str(MODULE)


class FrozenClock:
    """The server's time: a file libfaketime reads at every clock call."""

    def __init__(self, path: Path, start_us: int):
        self.path = path
        self.set(start_us)

    def set(self, us: int) -> None:
        self.us = us
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{us}\n")  # for the fallback's preload (FROZEN_CLOCK_SOURCE)
        os.replace(tmp, self.path.with_suffix(".us"))
        sec, usec = divmod(us, 1_000_000)
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sec)) + f".{usec:06d}500\n"  # (+ 0.5 us: parsed as a double)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def advance(self, us: int) -> None:
        self.set(self.us + us)


class Server(ValkeyServer):
    """A ValkeyServer started with `env` added to its environment (libfaketime), and of
    another binary if given."""

    def __init__(self, workdir: Path, extra_args=(), env: Optional[dict] = None,
                 binary: Optional[str] = None):
        # (the test loads the module itself, or not: never as SLUICE_ENGINE says)
        super().__init__(workdir, extra_args=extra_args, module=False)
        self.env = env or {}
        self.binary = binary

    def start(self, timeout: float = 10.0) -> "Server":
        import harness.valkey as hv
        saved, saved_bin = dict(os.environ), hv.REDIS_SERVER
        os.environ.update(self.env)
        if self.binary:
            hv.REDIS_SERVER = self.binary
        try:
            return super().start(timeout)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            hv.REDIS_SERVER = saved_bin


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def make(*extra, module: bool = True, env: Optional[dict] = None, name: str = "",
             binary: Optional[str] = None, timeout: float = 10.0) -> Server:
        args = (["--loadmodule", module_path()] if module else []) + list(extra)
        s = Server(tmp_path / f"server{len(started)}{name}", args, env, binary)
        started.append(s)
        return s.start(timeout)

    yield make
    for s in started:
        if s._client is not None:
            s._client.close()
        s.stop()


# The server of the frozen-clock tests: SLUICE_FROZEN_SERVER, else the server under test.
FROZEN_SERVER = os.environ.get("SLUICE_FROZEN_SERVER") or None

# Debian's redis-server 7.0 does not start under libfaketime (its jemalloc calls clock_gettime
# while libfaketime initializes: "Unexpected recursive calls to clock_gettime()"). For a server
# that does not, the test builds this preload instead (cc): the same frozen wall clock, read
# from a file of microseconds, with no allocation and no dlsym (syscalls only).
FROZEN_CLOCK_SOURCE = r"""
// A frozen wall clock for a test server: gettimeofday, clock_gettime(CLOCK_REALTIME*) and time
// read the time (microseconds since the epoch, decimal) from the file FROZEN_CLOCK_FILE at
// every call; every other clock is the kernel's (by syscall: no dlsym, no allocation).
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long frozen_us(void) {
  static const char* path = 0;
  if (!path) path = getenv("FROZEN_CLOCK_FILE");
  if (!path) return -1;
  int fd = (int)syscall(SYS_open, path, O_RDONLY);
  if (fd < 0) return -1;
  char buf[32];
  long n = (long)syscall(SYS_read, fd, buf, sizeof buf - 1);
  syscall(SYS_close, fd);
  if (n <= 0) return -1;
  long long us = 0;
  for (long i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) us = us * 10 + (buf[i] - '0');
  return us;
}

int clock_gettime(clockid_t clk, struct timespec* ts) {
  if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE) {
    long long us = frozen_us();
    if (us >= 0) {
      ts->tv_sec = us / 1000000;
      ts->tv_nsec = (us % 1000000) * 1000;
      return 0;
    }
  }
  return (int)syscall(SYS_clock_gettime, clk, ts);
}

int gettimeofday(struct timeval* tv, void* tz) {
  (void)tz;
  long long us = frozen_us();
  if (us < 0) return (int)syscall(SYS_gettimeofday, tv, tz);
  tv->tv_sec = us / 1000000;
  tv->tv_usec = us % 1000000;
  return 0;
}

time_t time(time_t* t) {
  long long us = frozen_us();
  time_t s = us >= 0 ? (time_t)(us / 1000000) : (time_t)syscall(SYS_time, t);
  if (t) *t = s;
  return s;
}
"""


def frozen_preload(tmp_path: Path) -> dict:
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler for the frozen clock's preload", pytrace=False)
    source, lib = tmp_path / "frozen_clock.c", tmp_path / "frozen_clock.so"
    source.write_text(FROZEN_CLOCK_SOURCE)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return {"LD_PRELOAD": str(lib), "FROZEN_CLOCK_FILE": str(tmp_path / "clock.us")}


def frozen_server(servers, tmp_path, start_us: int):
    clock = FrozenClock(tmp_path / "clock", start_us)
    try:
        server = servers(env=frozen_env(tmp_path / "clock"), binary=FROZEN_SERVER, timeout=3.0)
    except pytest.fail.Exception:
        server = servers(env=frozen_preload(tmp_path), binary=FROZEN_SERVER, name="preload")
    t = server.client.time()
    assert t[0] * 1_000_000 + t[1] == start_us, "the server runs on the frozen clock"
    return server, clock


def frozen_env(clock_file: Path) -> dict:
    if not FAKETIME_LIB.is_file():
        pytest.fail(f"{FAKETIME_LIB}: no libfaketime (apt-get install faketime, or set "
                    "SLUICE_FAKETIME_LIB)", pytrace=False)
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME_TIMESTAMP_FILE": str(clock_file),
            "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1", "TZ": "UTC"}


def raw(client):
    """A client of the same server that returns bytes."""
    return client.__class__(host="127.0.0.1", port=client.connection_pool.connection_kwargs["port"],
                            socket_timeout=10, decode_responses=False)


def is_number(value) -> bool:
    """A string value that is a token bucket's (a number: its TAT)."""
    return isinstance(value, bytes) and value.isdigit()


def value_of(client, key):
    """A key's value, as bytes: a string's, a list's elements, a sorted set's members."""
    c = raw(client)
    t = c.type(key)
    if t == b"list":
        return t, c.lrange(key, 0, -1)
    if t == b"zset":
        return t, c.zrange(key, 0, -1, withscores=True)
    return t, c.get(key) if t == b"string" else None


def run(client, *command):
    """The reply, or ("error", text) for an error reply."""
    import redis
    try:
        return client.execute_command(*command)
    except redis.ResponseError as e:
        return ("error", str(e))


def module_command(fcall: list) -> list:
    """The module's command for an FCALL of the library ([FCALL, function, numkeys, ...])."""
    function = fcall[1]
    suffix = function.rsplit("_", 1)[-1] if function.count("_") > 2 else ""
    name = {"undo": "SLUICE.UNDO", "lease": "SLUICE.LEASE", "peek": "SLUICE.PEEK"}.get(
        suffix, "SLUICE.DECIDE")
    return [name] + list(fcall[2:])


# ------------------------------------------------------------------ loading, key specs


def test_the_module_loads_and_answers_its_protocol_version(servers):
    s = servers()
    c = s.client
    assert c.execute_command("SLUICE.VERSION") == PROTOCOL_VERSION
    modules = c.execute_command("MODULE", "LIST")
    names = [m[b"name"] if isinstance(m, dict) and b"name" in m else m.get("name")
             for m in modules] if modules and isinstance(modules[0], dict) else \
        [dict(zip(m[::2], m[1::2]))["name"] for m in modules]
    assert "sluice" in names, modules
    assert run(c, "SLUICE.VERSION", "x")[0] == "error"
    text = resp(s.port, "COMMAND", "INFO", "sluice.decide", "sluice.undo", "sluice.lease",
                "sluice.peek", "sluice.version")
    assert text.count(b"sluice.") == 5, text
    for flag in (b"write", b"denyoom", b"readonly", b"fast", b"movablekeys"):
        assert flag in text, (flag, text)
    # The same call through the Lua library and the module: one reply.
    lib, fn = decide_library()
    c.function_load(lib, replace=True)
    requests = [[("a", {"algorithm": "fixed_window", "limit": 5, "window_ms": 3600000})]]
    lua = decided_by(c, decide_command(requests))
    native = decided_by(c, module_command(decide_command(
        [[("b", {"algorithm": "fixed_window", "limit": 5, "window_ms": 3600000})]])))
    # (real time here: the reset differs by the time between the two calls)
    first = decide_reply(lua, requests).results[0]
    second = decide_reply(native, requests).results[0]
    assert (first[0], first[1][0][:2]) == (second[0], second[1][0][:2]) == (1, (1, 4))


def resp(port: int, *command: str) -> bytes:
    """The raw RESP reply of one command (what redis-py will not parse: COMMAND INFO)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        out = b"*%d\r\n" % len(command) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in command)
        sock.sendall(out)
        sock.settimeout(0.5)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        return data


def decided_by(client, command):
    return client.execute_command(*command)


def test_key_specs_give_getkeys_crossslot_and_acl_key_patterns(servers, tmp_path):
    s = servers()
    c = s.client
    assert c.command_getkeys("SLUICE.DECIDE", "2", "a", "b", "x") == \
        ["a", "b"]
    assert c.command_getkeys("SLUICE.UNDO", "1", "k", "token_bucket",
                             "1", "1", "1", "0") == ["k"]
    assert c.command_getkeys("SLUICE.LEASE", "2", "p", "q", "renew",
                             "s", "1", "t", "1") == ["p", "q"]
    assert c.command_getkeys("SLUICE.PEEK", "1", "z", "fixed_window",
                             "1", "1", "1", "0", "0", "1") == ["z"]
    # ACL key patterns: a user allowed ~a* only.
    c.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~a*", "+@all")
    u = s.new_client(username="limited", password="pw")
    definition = ["1", "fixed_window", "5", "60000", "5", "0", "0", "5", "1:1"]
    assert isinstance(u.execute_command("SLUICE.DECIDE", "1", "a1", *definition), list)
    denied = run(u, "SLUICE.DECIDE", "1", "b1", *definition)
    assert denied[0] == "error" and "no permissions" in denied[1].lower(), denied
    u.close()
    # A cluster node: keys of two slots are CROSSSLOT, of one slot decided.
    from harness.net import free_port
    node = servers("--cluster-enabled", "yes", "--cluster-config-file",
                   str(tmp_path / "nodes.conf"), "--cluster-port", str(free_port()),
                   name="cluster")  # (its own bus port: port + 10000 may pass 65535)
    n = node.client
    n.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
    deadline = time.monotonic() + 10
    while n.cluster("INFO").get("cluster_state") != "ok":
        assert time.monotonic() < deadline, "the one-node cluster never became ok"
        time.sleep(0.05)
    two = ["2", "{x}a", "{y}b", "1", "fixed_window", "5", "60000", "5", "0", "0", "5",
           "1:1,1:1"]
    crossed = run(n, "SLUICE.DECIDE", *two)
    assert crossed[0] == "error" and "CROSSSLOT" in crossed[1], crossed
    one = ["2", "{x}a", "{x}b"] + two[3:]
    assert isinstance(n.execute_command("SLUICE.DECIDE", *one), list)


# ------------------------------------------------------------------ the differential test

# Long windows (10 min, 1 h: spread up to 5 minutes) and short ones (under 10 ms: no spread).
LONG_WINDOWS = [600_000, 3_600_000]
SHORT_WINDOWS = [1, 3, 7, 9]
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"]
# Costs: small, 0, huge (a sliding_log's charge adds at most keep + 1 entries, and fails its
# request where its key would pass 64 MiB), and out of range.
COSTS = [0, 1, 1, 1, 2, 3, 5]
HUGE = [10**15, 10**15 - 1, 2**31, 2**31 + 3, 2**32, 2**32 + 1, 2**32 + 5, 2**40]
BAD_COSTS = [10**15 + 1, 10**16, 99999999999999999999]


def spread_bound(window_ms: float) -> int:
    return max(0, min(5 * int(window_ms // 10), 300000))


class Differential:
    """One server, the Lua library (prefix L:) and the module (prefix M:), one frozen clock."""

    def __init__(self, server: Server, clock: FrozenClock, rng: random.Random):
        self.c = raw(server.client)
        self.clock = clock
        self.rng = rng
        source, self.fn = decide_library()
        self.c.function_load(source, replace=True)
        self.keys = [f"s{i}" for i in range(5)] + [f"t{i}" for i in range(4)] + \
            [f"c{i}" for i in range(3)]
        self.windows: dict = {k: set() for k in self.keys}  # windows each key was used with
        self.history: list = []  # (T, [(key, definition fields, cost text)]) of decide calls
        self.slots: list = []  # slot names taken so far
        self.steps = 0
        self.errors_seen = 0

    # -- generation

    def definition(self) -> list:
        r = self.rng
        algorithm = r.choice(ALGORITHMS)
        window = r.choice(LONG_WINDOWS if r.random() < 0.5 else SHORT_WINDOWS)
        limit = r.choice([1, 2, 3, 5, 10]) if r.random() < 0.9 else 10**15
        burst = r.choice([limit, 1, 2, 7]) if r.random() < 0.9 else 10**15
        keep = max(limit, r.choice([1, 5, 20]))
        fields = [algorithm, str(limit), str(window), str(burst), r.choice("01"), r.choice("01"),
                  str(keep)]
        if r.random() < 0.04:  # a bad number or algorithm: fails only its requests
            i = r.choice([0, 1, 2, 3, 6])
            fields[i] = r.choice(["0", "1.5", "1e16", "abc", "", "-1", "9223372036854775808",
                                  "nope"] if i else ["nope", ""])
        return fields

    def key_for(self, algorithm: str) -> str:
        r = self.rng
        pool = {"concurrency": "c", "token_bucket": "t"}.get(algorithm, "s")
        if r.random() < 0.05:
            # another algorithm's key: another format or type (a bucket whose value is not a
            # number fails each request on it)
            return r.choice([k for k in self.keys if k[0] != pool[0]])
        return r.choice([k for k in self.keys if k[0] == pool])

    def cost(self, algorithm: str) -> str:
        r = self.rng
        x = r.random()
        if x < 0.05:
            return str(r.choice(BAD_COSTS))
        if x < 0.12:
            return str(r.choice(HUGE))
        return str(r.choice(COSTS))

    def decide_args(self):
        r = self.rng
        definitions = [self.definition() for _ in range(r.randint(1, 4))]
        keys: list = []
        texts: list = []
        planned: list = []
        for _ in range(r.randint(1, 5)):
            parts, names, used = [], [], []
            for _ in range(r.choice([1, 1, 2, 3])):
                j = r.randint(1, len(definitions))
                fields = definitions[j - 1]
                algorithm = fields[0]
                key = self.key_for(algorithm)
                cost = self.cost(algorithm)
                mode = r.choice(["", "", "", "", "~", "!"])
                ref = f"{j}:{cost}{mode}"
                if r.random() < 0.02:
                    ref = r.choice([f"{len(definitions) + 1}:1", "0:1", "x", "", f"{j}:-1",
                                    f"{j}:1.5"])
                if key in keys and r.random() < 0.9:
                    ref += f"@{keys.index(key) + 1}"
                elif r.random() < 0.03:
                    odd = ["@0", "@x", "@1.5", f"@{len(keys) + 5}"]
                    if keys:
                        odd += ["@ 1", "@1e0"]  # KEYS[1], written oddly
                    ref += r.choice(odd)
                else:
                    keys.append(key)
                parts.append(ref)
                used.append((key, fields, cost + mode))
                # (a slot name follows each limit whose text names a concurrency definition,
                # as decide.lua counts them: "<j>:<digits>[~!]", whatever its numbers)
                if algorithm == "concurrency" and re.fullmatch(rf"{j}:\d+[~!]?(@.*)?", ref):
                    # (every concurrency limit names its slot: a name missing in the middle
                    # shifts the next request's text into a slot name, which the protocol
                    # allows but which would mix the key pools; the last may lack it)
                    name = f"slot{r.randint(0, 30)}"
                    names.append(name)
                    self.slots.append(name)
                for w in (fields[2],):
                    try:
                        self.windows[key].add(float(w))
                    except ValueError:
                        pass
            texts.append(",".join(parts))
            texts.extend(names)
            planned.append(used)
        if texts and texts[-1].startswith("slot") and r.random() < 0.2:
            texts.pop()  # the last request's slot name missing: its limit takes none
        if not keys:
            keys.append(self.rng.choice(self.keys))
        args = [str(len(definitions))] + [f for d in definitions for f in d] + texts
        return keys, args, planned

    def undo_args(self):
        r = self.rng
        if not self.history:
            return None
        at, used = r.choice(self.history[-8:])
        keys, args = [], []
        for key, fields, cost in used[:4]:
            algorithm = fields[0]
            c = cost.rstrip("~!")
            if not (c.isdigit() and int(c) <= 10**15) or (
                    algorithm == "token_bucket" and fields[2] not in map(str, SHORT_WINDOWS)):
                # (an undo of what was never charged, on a bucket whose TAT has passed, finds
                # the key or not by its expiry spread, which differs between the engines: a
                # gateway takes back only what was charged; short windows have no spread)
                continue
            if algorithm == "token_bucket" and r.random() < 0.3:
                c = r.choice(["u0", "u1", "u1000", "u250000", "u2147483647000000", "u-1", "ux"])
            t = r.choice(self.slots) if algorithm == "concurrency" and self.slots else str(at)
            keys.append(key)
            args += [algorithm, fields[1], fields[2], c, t]
        if not keys:
            return None
            self.windows[key].add(float(fields[2]) if re.fullmatch(r"\d+", fields[2]) else 0)
        return keys, args

    def lease_args(self):
        r = self.rng
        keys, args = [], [r.choice(["renew", "renew", "release"])]
        for _ in range(r.randint(1, 3)):
            keys.append(r.choice([k for k in self.keys if k[0] == "c"]))
            lease = r.choice(SHORT_WINDOWS + LONG_WINDOWS)
            self.windows[keys[-1]].add(float(lease))
            args += [r.choice(self.slots) if self.slots else "slot0", str(lease)]
        return keys, args

    def peek_args(self):
        fields = self.definition()
        key = self.key_for(fields[0])
        return [key], fields

    # -- running

    def both(self, function: str, command: str, keys: list, args: list):
        lua = run(self.c, "FCALL", function, len(keys), *["L:" + k for k in keys], *args)
        native = run(self.c, command, len(keys), *["M:" + k for k in keys], *args)
        return lua, native

    def compare_replies(self, lua, native, what):
        def norm(x):
            if isinstance(x, tuple):  # an error of the whole call: both fail, no more
                return ("error",)
            if isinstance(x, list):
                return [re.sub(rb"^user_function:\d+: ", b"", e) if isinstance(e, bytes) else e
                        for e in x]
            return x
        assert norm(lua) == norm(native), f"step {self.steps} {what}:\n lua    {lua!r}\n " \
                                          f"module {native!r}"
        if isinstance(lua, tuple):
            self.errors_seen += 1

    def state(self, prefix: str, key: str):
        c = self.c
        t = c.type(prefix + key)
        pttl = c.pttl(prefix + key)
        if t == b"string":
            value = c.get(prefix + key)
        elif t == b"zset":
            value = c.zrange(prefix + key, 0, -1, withscores=True)
        elif t == b"list":
            value = c.lrange(prefix + key, 0, -1)
        elif t == b"none":
            value = None
        else:
            value = c.dump(prefix + key)
        return t, value, pttl

    def compare_state(self, what):
        for key in self.keys:
            lt, lv, lp = self.state("L:", key)
            mt, mv, mp = self.state("M:", key)
            where = f"step {self.steps} {what}, key {key}: lua {lt} {lv!r} pttl {lp}, " \
                    f"module {mt} {mv!r} pttl {mp}"
            bound = max([spread_bound(w) for w in self.windows[key]] or [0])
            if (lt, lv) != (mt, mv) and b"none" in (lt, mt) and \
                    (key[0] == "t" or is_number(mv if lt == b"none" else lv)):
                # A bucket full again (TAT passed: it reads as absent) lives on for its
                # spread, which differs between the engines: one may have dropped it. (Also
                # on another algorithm's key, which a token_bucket limit may have written.)
                value, pttl = (mv, mp) if lt == b"none" else (lv, lp)
                assert 0 <= pttl <= bound and float(value) <= self.clock.us, where
                continue
            assert (lt, lv) == (mt, mv), where
            if bound == 0 or lp < 0 or mp < 0:
                assert lp == mp, where
            else:
                assert abs(lp - mp) <= bound, where

    def step(self):
        r = self.rng
        self.steps += 1
        x = r.random()
        if x < 0.62:
            keys, args, planned = self.decide_args()
            lua, native = self.both(self.fn, "SLUICE.DECIDE", keys, args)
            self.compare_replies(lua, native, f"decide {keys} {args}")
            if isinstance(lua, list):
                assert lua[0] == self.clock.us, "the reply's time is the frozen server time"
                self.history.append((lua[0], [u for p in planned for u in p]))
            what = f"decide {keys} {args}"
        elif x < 0.77:
            made = self.undo_args()
            if made is None:
                return
            keys, args = made
            lua, native = self.both(self.fn + "_undo", "SLUICE.UNDO", keys, args)
            what = f"undo {keys} {args}"
            self.compare_replies(lua, native, what)
        elif x < 0.89:
            keys, args = self.lease_args()
            lua, native = self.both(self.fn + "_lease", "SLUICE.LEASE", keys, args)
            what = f"lease {keys} {args}"
            self.compare_replies(lua, native, what)
        elif x < 0.97:
            keys, args = self.peek_args()
            # (A concurrency peek: the Lua's removes ended slots, a write; the module's only
            # counts the live ones, a peek being readonly. The replies are the same.)
            lua, native = self.both(self.fn + "_peek", "SLUICE.PEEK", keys, args)
            what = f"peek {keys} {args}"
            self.compare_replies(lua, native, what)
            if args[0] == "concurrency" and isinstance(lua, list) and \
                    self.c.type("M:" + keys[0]) == b"zset":
                # what the Lua's peek removed (see above), so that the states stay one
                self.c.zremrangebyscore("M:" + keys[0], "-inf", self.clock.us)
        else:
            # A hostile value on one key of both prefixes (the same bytes).
            key = r.choice(self.keys)
            value = r.choice([b"abc", b"", b"12.5", b" 0x10 ", b"nan", b"inf", b"1e300",
                              struct.pack("<Id", 7, 2.0), b"\x00" * 20, b"12345678" * 3 + b"x"])
            kind = r.random()
            if key[0] == "t":  # (numbers only, as above; another type reads as absent)
                value = r.choice([b"12.5", b" 0x10 ", b"nan", b"inf", b"1e300", b"-5",
                                  str(self.clock.us + 5_000_000).encode()])
            for p in ("L:", "M:"):
                self.c.delete(p + key)
                if kind < 0.8:
                    self.c.set(p + key, value, px=3_600_000)
                else:
                    self.c.rpush(p + key, b"x")
            return
        self.compare_state(what)

    def advance(self):
        r = self.rng
        x = r.random()
        if x < 0.3:
            return
        if x < 0.85:
            self.clock.advance(r.randint(1, 12_000))  # up to 12 ms: short windows end
        else:  # up to 3 s (less in a longer run: the long windows must not end)
            self.clock.advance(r.randint(10_000, self.big))


def test_the_module_decides_exactly_as_the_lua_library(servers, tmp_path):
    seed = int(os.environ.get("SLUICE_DIFF_SEED", random.randrange(1 << 30)))
    steps = int(os.environ.get("SLUICE_DIFF_STEPS", "1500"))
    rng = random.Random(seed)
    # An hour boundary plus a little: the long windows do not end while the test runs (its
    # clock moves by at most 1500 * 3 s / 7 or so, well under 10 minutes on average).
    start = (int(time.time()) // 3600 * 3600 + 3600) * 1_000_000 + rng.randrange(1_000_000)
    server, clock = frozen_server(servers, tmp_path, start)
    c = server.client
    d = Differential(server, clock, rng)
    d.big = max(20_000, min(3_000_000, int(2e6 * (450 / steps - 0.004) / 0.15)))
    try:
        for _ in range(steps):
            d.step()
            d.advance()
            assert clock.us - start < 590_000_000, "simulated time reached the long windows"
    except AssertionError as e:
        raise AssertionError(f"seed {seed} (SLUICE_DIFF_SEED={seed} reruns it): {e}") from None
    assert d.steps >= steps * 0.9
    assert c.ping()


def test_the_module_agrees_with_the_library_through_the_codec(servers, tmp_path):
    """Calls made by Sluice's own codec (ScriptBatch, undoCommand, the lease command), read
    back by it: the module's replies read the same as the library's."""
    start = (int(time.time()) // 3600 * 3600 + 3600) * 1_000_000 + 123_456
    server, clock = frozen_server(servers, tmp_path, start)
    c = server.client
    source, _ = decide_library()
    c.function_load(source, replace=True)
    limits = [
        {"algorithm": "fixed_window", "limit": 3, "window_ms": 5},
        {"algorithm": "sliding_window", "limit": 4, "window_ms": 8, "count_denied": True},
        {"algorithm": "sliding_log", "limit": 3, "window_ms": 9, "keep": 5,
         "count_denied": True},
        {"algorithm": "token_bucket", "limit": 5, "window_ms": 9, "burst": 3, "shadow": True,
         "count_denied": True},
        {"algorithm": "token_bucket", "limit": 2, "window_ms": 7, "cost": 2},
        {"algorithm": "concurrency", "limit": 2, "window_ms": 6},
    ]
    rng = random.Random(7)
    for step in range(300):
        requests = {p: [] for p in ("L:", "M:")}
        for r in range(rng.randint(1, 4)):
            chosen = rng.sample(limits, rng.randint(1, 3))
            request = []
            for i, limit in enumerate(chosen):
                limit = dict(limit)
                if limit["algorithm"] == "concurrency":
                    limit["lease"] = f"r{step}.{r}"
                if rng.random() < 0.2:
                    limit["charge"] = rng.choice(["later", "forced"])
                request.append((f"k{limits.index(chosen[i])}{rng.randint(0, 1)}", limit))
            for p in requests:
                requests[p].append([(p + k, l) for k, l in request])
        lua = c.execute_command(*decide_command(requests["L:"]))
        native = c.execute_command(*module_command(decide_command(requests["M:"])))
        a, b = decide_reply(lua, requests["L:"]), decide_reply(native, requests["M:"])
        assert a == b, f"step {step}: {a} != {b}"
        if rng.random() < 0.3:  # take back the last request's charges
            lua_undo = c.execute_command(*undo_command(requests["L:"][-1], a.time_us))
            native_undo = c.execute_command(*module_command(undo_command(requests["M:"][-1],
                                                                         a.time_us)))
            assert lua_undo == native_undo, f"step {step}: undo {lua_undo} != {native_undo}"
        if rng.random() < 0.3:
            slots = [(k, l) for k, l in requests["L:"][0] if l["algorithm"] == "concurrency"]
            if slots:
                renew = rng.random() < 0.5
                fcall = lease_command(slots, renew)
                mine = module_command(lease_command([("M:" + k[2:], l) for k, l in slots], renew))
                assert c.execute_command(*fcall) == c.execute_command(*mine)
        for key in {k[2:] for r in requests["L:"] for k, _ in r}:
            assert c.type("L:" + key) == c.type("M:" + key)
            if c.type("L:" + key) == "string":
                assert value_of(c, "L:" + key) == value_of(c, "M:" + key), key
                assert c.pttl("L:" + key) == c.pttl("M:" + key), key
            elif c.type("L:" + key) == "zset":
                assert c.zrange("L:" + key, 0, -1, withscores=True) == \
                    c.zrange("M:" + key, 0, -1, withscores=True)
                assert c.pttl("L:" + key) == c.pttl("M:" + key), key
        clock.advance(rng.randint(0, 4000))


def test_one_key_named_at_several_positions_decides_as_the_library(servers, tmp_path):
    """A call (not one of Sluice's codec, which names every key once) that names one key at
    several positions, for limits of different algorithms: each write goes through the one
    handle of that key (a second handle would read the value another write replaced: the server
    crashed so), and replies, values and TTLs are the library's, as the stored value grows,
    shrinks and changes format."""
    start = (int(time.time()) // 3600 * 3600 + 3600) * 1_000_000 + 654_321
    server, clock = frozen_server(servers, tmp_path, start)
    c = server.client
    source, _ = decide_library()
    c.function_load(source, replace=True)
    # (windows under 10 ms: no expiry spread, so the TTLs compare exactly)
    # Two sliding_logs on the key: the first write grows the log (a longer value: a new string),
    # then the second writes through the same handle.
    limits = [{"algorithm": "fixed_window", "limit": 5, "window_ms": 9},
              {"algorithm": "sliding_window", "limit": 999999, "window_ms": 7},
              {"algorithm": "token_bucket", "limit": 3, "window_ms": 5, "burst": 2},
              {"algorithm": "sliding_log", "limit": 50, "window_ms": 9, "keep": 50},
              {"algorithm": "sliding_log", "limit": 40, "window_ms": 9, "keep": 40}]
    rng = random.Random(11)
    for step in range(120):
        chosen = limits[3:] if step % 2 else rng.sample(limits, rng.randint(2, 5))
        fcall = decide_command([[(f"k{i}", limit) for i, limit in enumerate(chosen)]])
        n = int(fcall[2])
        assert n == len(chosen)
        rest = fcall[3 + n:]
        lua = run(c, *fcall[:2], n, *["L:same"] * n, *rest)
        native = run(c, *module_command([*fcall[:2], n, *["M:same"] * n, *rest]))
        # (a limit that finds another algorithm's value fails as the Lua does, less its line)
        lua = [re.sub(r"^user_function:\d+: ", "", e) if isinstance(e, str) else e
               for e in lua] if isinstance(lua, list) else lua
        assert lua == native, f"step {step}: {lua} != {native}"
        assert c.type("L:same") == c.type("M:same")
        assert value_of(c, "L:same") == value_of(c, "M:same"), f"step {step}"
        assert c.pttl("L:same") == c.pttl("M:same"), f"step {step}"
        clock.advance(rng.randint(0, 4000) if step % 10 == 9 else rng.randint(0, 20))
    assert server.client.ping()


# ------------------------------------------------------------------ replication and AOF

def module_workload(c) -> list:
    """Decisions of every algorithm through the module (long windows: nothing expires while the
    test runs); the keys it wrote."""
    definitions = ["5",
                   "fixed_window", "5", "3600000", "5", "1", "0", "5",
                   "sliding_window", "5", "3600000", "5", "1", "0", "5",
                   "sliding_log", "3", "3600000", "3", "1", "0", "6",
                   "token_bucket", "5", "3600000", "4", "1", "1", "5",
                   "concurrency", "3", "3600000", "3", "0", "0", "3"]
    keys = ["r:fw", "r:sw", "r:sl", "r:tb", "r:cc"]
    for i in range(8):
        reply = c.execute_command("SLUICE.DECIDE", 5, *keys, *definitions,
                                  "1:1,2:1,3:1,4:2,5:1", f"slot{i}", "1:1@1,2:1@2", "3:2@3!")
        assert isinstance(reply, list) and len(reply) > 1
    t = reply[0]
    c.execute_command("SLUICE.UNDO", 4, "r:fw", "r:sw", "r:sl", "r:cc",
                      "fixed_window", "5", "3600000", "1", str(t),
                      "sliding_window", "5", "3600000", "1", str(t),
                      "sliding_log", "3", "3600000", "1", str(t),
                      "concurrency", "3", "3600000", "1", "slot1")
    c.execute_command("SLUICE.UNDO", 1, "r:tb", "token_bucket", "5", "3600000", "u1000", str(t))
    c.execute_command("SLUICE.LEASE", 2, "r:cc", "r:cc", "renew", "slot2", "3600000",
                      "release", "1")
    c.execute_command("SLUICE.LEASE", 1, "r:cc", "release", "slot3", "1")
    return keys


def snapshot(c, keys) -> dict:
    out = {}
    for k in keys:
        t = c.type(k)
        value = c.get(k) if t == b"string" else c.lrange(k, 0, -1) if t == b"list" \
            else c.zrange(k, 0, -1, withscores=True)
        out[k] = (t, value, c.execute_command("PEXPIRETIME", k))
    return out


def test_replicas_and_the_aof_hold_what_the_module_wrote(servers):
    primary = servers("--appendonly", "yes", "--appendfsync", "always")
    replica = servers("--replicaof", "127.0.0.1", str(primary.port), module=False)
    p, r = raw(primary.client), raw(replica.client)
    deadline = time.monotonic() + 10
    while r.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.05)
    keys = module_workload(p)
    before = snapshot(p, keys)
    assert all(t in (b"string", b"zset", b"list") for t, _, _ in before.values()), before
    assert all(e > 0 for _, _, e in before.values()), "every key expires"
    p.execute_command("WAIT", 1, 5000)
    assert snapshot(r, keys) == before, "the replica holds the same values and expiries"
    # The AOF replays into a server without the module: the same values and expiries.
    primary.extra_args = [a for a in primary.extra_args]
    i = primary.extra_args.index("--loadmodule")
    del primary.extra_args[i:i + 2]
    primary.restart()
    p = raw(primary.client)
    assert snapshot(p, keys) == before, "the AOF restores the same values and expiries"
    assert run(p, "SLUICE.VERSION")[0] == "error", "restarted without the module"


# ------------------------------------------------------------------ hostile arguments

HOSTILE = [
    ["SLUICE.DECIDE"],
    ["SLUICE.DECIDE", "5", "a"],
    ["SLUICE.DECIDE", "99999999999999999999", "a"],
    ["SLUICE.DECIDE", "9223372036854775807", "a"],
    ["SLUICE.DECIDE", "-1", "a"],
    ["SLUICE.DECIDE", "", "a"],
    ["SLUICE.DECIDE", "0"],
    ["SLUICE.DECIDE", "1", "k"],
    ["SLUICE.DECIDE", "1", "k", ""],
    ["SLUICE.DECIDE", "1", "k", "x"],
    ["SLUICE.DECIDE", "1", "k", "-1", "1:1"],
    ["SLUICE.DECIDE", "1", "k", "1.5", "1:1"],
    ["SLUICE.DECIDE", "1", "k", "nan"],
    ["SLUICE.UNDO"],
    ["SLUICE.UNDO", "2", "a"],
    ["SLUICE.UNDO", "1", "k"],
    ["SLUICE.UNDO", "1", "k", "fixed_window", "1", "1"],
    ["SLUICE.UNDO", "1", "k", "nope", "1", "1", "1", "1"],
    ["SLUICE.UNDO", "1", "k", "token_bucket", "1", "1", "u9223372036854775808", "1"],
    ["SLUICE.UNDO", "1", "k", "fixed_window", "1", "1", "1", "x"],
    ["SLUICE.LEASE"],
    ["SLUICE.LEASE", "1", "k"],
    ["SLUICE.LEASE", "1", "k", "grab", "s", "1"],
    ["SLUICE.LEASE", "1", "k", "renew", "s"],
    ["SLUICE.LEASE", "1", "k", "renew", "s", "x"],
    ["SLUICE.PEEK"],
    ["SLUICE.PEEK", "0", "fixed_window", "1", "1", "1", "0", "0", "1"],
    ["SLUICE.PEEK", "1", "k"],
    ["SLUICE.PEEK", "1", "k", "fixed_window", "9223372036854775808", "1", "1", "0", "0", "1"],
    ["SLUICE.PEEK", "1", "k", "nope", "1", "1", "1", "0", "0", "1"],
    ["SLUICE.VERSION", "x"],
]

BIG = 2**63
# Requests whose numbers are out of range: each fails alone, in the reply.
BAD_REQUESTS = [
    ["1", "fixed_window", str(BIG), "1000", "1", "0", "0", "1", "1:1"],
    ["1", "fixed_window", "1", str(BIG), "1", "0", "0", "1", "1:1"],
    ["1", "token_bucket", "1", "1000", str(BIG), "0", "0", "1", "1:1"],
    ["1", "sliding_log", "1", "1000", "1", "0", "0", str(BIG), "1:1"],
    ["1", "sliding_window", "1", "1000", "1", "0", "0", "1", f"1:{BIG}"],
    ["1", "fixed_window", "", "", "", "", "", "", ""],
    ["1", "fixed_window", "1", "1000", "1", "0", "0", "1", "1:1@9223372036854775808"],
    ["1", "fixed_window", "1", "1000", "1", "0", "0", "1", "1:1@1e300"],
    ["1", "fixed_window", "1", "1000", "1", "0", "0", "1", ",,,,"],
    ["1", "fixed_window", "1", "1000", "1", "0", "0", "1", "1:1," * 5000 + "1:1"],
    ["1", "sliding_log", "1000000000000000", "1000", "1", "1", "0", "1000000000000000",
     "1:100000000"],
]


def test_hostile_arguments_are_error_replies_and_the_server_stays_up(servers):
    s = servers()
    c = raw(s.client)
    for command in HOSTILE:
        reply = run(c, *command)
        assert isinstance(reply, tuple) and reply[0] == "error", (command, reply)
        assert c.ping()
    for args in BAD_REQUESTS:
        reply = run(c, "SLUICE.DECIDE", "1", "bad", *args)
        assert isinstance(reply, list), (args, reply)
        assert all(isinstance(e, bytes) for e in reply[1:]) and len(reply) == 2, (args, reply)
    # D far past the arguments: no definitions, no requests, only the time (the Lua would
    # loop over 7 * D fields first).
    reply = run(c, "SLUICE.DECIDE", "1", "k", "1000000000000000", "1:1")
    assert isinstance(reply, list) and len(reply) == 1
    # A key of another type: read as absent and replaced by a decide (as the Lua's MGET and
    # SET; a sliding_log's list, a string for it, as its LLEN and writes); an undo is the call's
    # WRONGTYPE error (as the Lua's GET, or LLEN); a concurrency key of another type is
    # replaced; a peek reads it as absent.
    for algorithm in ALGORITHMS:
        own = {"concurrency": b"zset", "sliding_log": b"list"}.get(algorithm, b"string")
        other = b"string" if own == b"list" else b"list"

        def put_other():
            c.delete("w")
            c.set("w", "x") if other == b"string" else c.rpush("w", "x")
        put_other()
        definition = ["1", algorithm, "5", "3600000", "5", "0", "0", "5", "1:1"]
        if algorithm == "concurrency":
            definition.append("slot")
        reply = run(c, "SLUICE.DECIDE", "1", "w", *definition)
        assert isinstance(reply, list) and all(isinstance(e, int) for e in reply), reply
        assert c.type("w") == own
        put_other()
        undo = run(c, "SLUICE.UNDO", "1", "w", algorithm, "5", "3600000", "1", "1")
        if algorithm == "concurrency":
            assert undo == 0
        else:
            assert undo[0] == "error" and "WRONGTYPE" in undo[1], undo
        peek = run(c, "SLUICE.PEEK", "1", "w", *definition[1:8])
        assert isinstance(peek, list) and len(peek) == 3, peek
        assert run(c, "SLUICE.LEASE", "1", "w", "renew", "slot", "1000") == 0
        assert c.type("w") == other
    # Every algorithm with a huge limit and cost: whole numbers, no crash.
    for algorithm in ALGORITHMS:
        for cost in ("0", "1000000000000000", str(2**32), str(2**32 + 1)):
            args = ["1", algorithm, "1000000000000000", "1000000000000000",
                    "1000000000000000", "1", "1", "1000000000000000", f"1:{cost}", "slot"]
            reply = run(c, "SLUICE.DECIDE", "1", f"huge:{algorithm}", *args)
            assert isinstance(reply, list), (algorithm, cost, reply)
    assert c.ping()
    assert "uptime_in_seconds" in c.info("server")


# ------------------------------------------------------------------ a full sliding_log

def test_a_sliding_log_decision_does_not_grow_with_its_log(servers):
    """A sliding_log at the largest limit the configuration allows (10^6), its key full: a
    decision reads and writes a few entries, not the log (it copied and rewrote all 8 MB of it,
    52 ms in the Lua, 6.5 ms in the module, so one client within its quota could saturate the
    Valkey every gateway shares). Both engines, the Valkey's own time per call
    (INFO commandstats) on the full key against a key of 10 entries: about the same."""
    server = servers()
    c = server.client
    source, _ = decide_library()
    c.function_load(source, replace=True)
    limit = {"algorithm": "sliding_log", "limit": 1_000_000, "window_ms": 3_600_000,
             "count_denied": True, "keep": 1_000_000}
    s, us = c.time()
    t = str(s * 1_000_000 + us - 1_000_000)
    for key, n in (("L:full", 1_000_000), ("M:full", 1_000_000), ("L:few", 10), ("M:few", 10)):
        pipe = c.pipeline(transaction=False)
        for i in range(0, n, 10_000):
            pipe.rpush(key, *[t] * min(10_000, n - i))
        pipe.execute()
        c.expire(key, 3600)
    fcall = decide_command([[("k", limit)]])
    rest = fcall[4:]

    def per_call_us(engine: str, key: str, calls: int = 200) -> float:
        c.config_resetstat()
        for _ in range(calls):
            command = [*fcall[:3], key, *rest]
            reply = run(c, *(command if engine == "lua" else module_command(command)))
            assert isinstance(reply, list) and len(reply) == 4, reply
        stat = "cmdstat_fcall" if engine == "lua" else "cmdstat_sluice.decide"
        info = c.info("commandstats")[stat]
        assert info["calls"] == calls, info
        return info["usec_per_call"]

    for engine, prefix in (("lua", "L:"), ("module", "M:")):
        few = per_call_us(engine, prefix + "few")
        full = per_call_us(engine, prefix + "full")
        print(f"[sliding_log {engine}] {few:.1f} us per decision on 10 entries, {full:.1f} us "
              f"on 1,000,000")
        assert full < 5 * few + 50, f"{engine}: {full:.0f} us on a full log, {few:.0f} us on 10"
        assert c.llen(prefix + "full") == 1_000_001, "the hammering client: newest keep + 1"
