"""Fixtures of Sluice's integration tests: the real binary, real upstreams, loopback only.

- free_port(): a free 127.0.0.1 TCP port, below the ephemeral range, one block per xdist worker.
- connection_refused(port, within): True once a connect() there is refused.
- SilentListener(): a port that accepts and never answers (.port, .accepted, close()).
- upstream_factory(name=...): starts an in-process upstream.UpstreamServer on a free port;
  `upstream` is one of them, named "up1".
- sluice_factory(...): writes a TOML configuration to the test's tmp dir, starts the binary
  (SLUICE_BIN, default <repo>/build/sluice), waits for GET /healthz on the admin port; at
  teardown sends SIGTERM, waits up to 10 s, asserts exit code 0 (kills that PID if needed).
  Its stderr goes to a file that is printed in the report of a failed test.
- blackhole(): a 127.0.0.1 port whose accept queue is full, so a connect() there hangs.

Rate limiting and identity (Valkey):

- valkey_factory(password=None, extra_args=()) / valkey: a private redis-server (from PATH;
  the test fails if there is none) on a free 127.0.0.1 port: .port, .address, .client
  (redis.Redis, decode_responses), .pid, stop(sig)/start() (same port), pause()/resume()
  (SIGSTOP/SIGCONT). Teardown: SIGCONT, SIGTERM, wait; kills only that PID.
- ratelimit_toml(valkey, limits=[...], identity={...}, plans=[...], tenants=[...]): the
  [valkey], [identity], [[limit]], [[plan]] and [[tenant]] text for sluice_factory(extra_toml=).
- the decide function's calls and replies: decide_codec.py (Sluice's own codec, through the
  sluice_codec tool).
- parallel_requests(port, raw_requests, processes): fires requests at once from several
  processes (raw sockets), returns (status, headers) per request in order.
- helpers: server_time(), sleep_until_window_offset(), avoid_window_boundary(), metric_sum(),
  wait_admin(), parse_rl_list(), limit_keys().

TLS (test_tls_*.py; see README.md):

- tls_pki (session): CAs and certificates made with the openssl command (Pki, CertFiles).
- tls_server_toml(default, sni, handshake_timeout=): [server.tls] text for extra_toml.
- tls_client_context(), legacy_client_context(), TlsRawClient, https_request(), client_hello().
- tls_upstream_factory(cert, client_ca=None): upstream.py behind Python's ssl, recording the
  SNI, ALPN and client certificate of each handshake (TlsUpstreamServer).
- HttpsProbe: a good HTTPS client in a thread while a test misbehaves.
- sluice_binary: parametrizes over SLUICE_BIN and, if set, SLUICE_ASAN_BIN.

Robustness (test_robustness_*.py; see README.md):

- sluice_factory(nofile=N) / raise_nofile(n, pid=0): open-files soft limits (prlimit).
- upstream_process_factory(name) -> UpstreamProcess: upstream.py as its own process, kill()
  (SIGKILL) and start() on the same port.
- Load(port, {kind: (raw, threads)}, duration).start() ... end_at(t) ... results(): a load
  process; LoadRecord(kind, t0, dt, status, stall) and .own (dt without the machine's stalls
  that a probe process saw during the request); records_of(), status_counts(),
  latency_summary(), check_all_answered(), check_unaffected() (UNAFFECTED_P99_S / _MAX_S, on
  .own).
- settled_rss_kb(), rss_tolerance_kb(), wait_connections_open(), report_figures().
- is_asan_build() / scaled(normal, asan); asan_small_quarantine (ASAN_OPTIONS
  quarantine_size_mb=16 for the gateways of a test, on the ASan build only).
- TIMER_SLACK_S / EXIT_SLACK_S: how much later than configured a test may see a timer fire or
  the process exit after a drain.

Where they live: the fixtures are here; the rest is in the
harness package beside this file and re-exported here, so that tests import every name from
conftest:

- harness/net.py: ports, SilentListener, LocalServerProcess, parallel_requests().
- harness/gateway.py: the binary, TOML writing, the Sluice process, sluice_config(),
  is_asan_build() / scaled() and the slack constants, wait_admin(), metric_sum(), wait_until(),
  wait_metric(), parse_rl_list().
- harness/valkey.py: ValkeyServer, ratelimit_toml() / limit_cfg() / route_cfg(),
  sluice_with_limits(), what a key holds (stored(), used()), the server's clock,
  ValkeyMonitor.
- harness/tls.py: Pki, make_test_pki(), client contexts and clients, TlsUpstreamServer,
  HttpsProbe.
- harness/robustness.py: UpstreamProcess, Load and its records, latency and RSS bounds.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import pytest

from upstream import UpstreamServer

# Re-exported: tests import these from conftest.
from rawhttp import RawClient, Response, request_once  # noqa: F401
from harness import gateway
from harness.gateway import (  # noqa: F401
    DEFAULT_SERVER, DEFAULT_UPSTREAM, EXIT_SLACK_S, REPO, SLUICE_BIN, TIMER_SLACK_S, Sluice,
    endpoint_text, is_asan_build, metric_sum, parse_rl_list, raise_nofile, scaled, sluice_bin,
    sluice_config, toml_table, toml_value, wait_admin, wait_metric, wait_until)
from harness.net import (  # noqa: F401
    LocalServerProcess, SilentListener, connection_refused, free_port, parallel_requests)
from harness.robustness import (  # noqa: F401
    ASAN_QUARANTINE_MB, ASAN_RSS_SLACK_KB, RSS_TOLERANCE_KB, STALL_MIN_S, STALL_STEP_S,
    UNAFFECTED_MAX_S, UNAFFECTED_P99_S, Load, LoadRecord, UpstreamProcess, check_all_answered,
    check_unaffected, latency_summary, records_of, report_figures, rss_tolerance_kb,
    settled_rss_kb, stall_within, status_counts, wait_connections_open)
from harness.tls import (  # noqa: F401
    OPENSSL, SLUICE_ASAN_BIN, CertFiles, HttpsProbe, Pki, TlsRawClient, TlsUpstreamServer,
    client_hello, https_request, legacy_client_context, make_test_pki, tls_client_context,
    tls_server_toml)
from harness.valkey import (  # noqa: F401
    DEFAULT_VALKEY_OPTIONS, LUA_DIR, REDIS_SERVER, WINDOW_NUMBERS, ValkeyMonitor, ValkeyServer,
    avoid_window_boundary, duration_seconds, hashed_part, key_part, limit_cfg, limit_keys,
    ratelimit_toml, raw_value, redis_server_bin, route_cfg, server_time, server_time_us,
    sleep_until_window_offset, sluice_with_limits, stored, used)


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
        for v in getattr(item, "_valkey_instances", []):
            report.sections.append((f"redis-server log (port {v.port})", v.log()[-5000:]))


@pytest.fixture
def sluice_factory(tmp_path, request):
    """make(upstream=server_or_list, ...) for one cluster "app" and a catch-all route, or
    make(upstreams=[{name, endpoints, ...}], routes=[{name, match, upstream}]).
    server / log / admin / upstream_options: extra keys; workers defaults to 1; start=False only writes
    the configuration (returns the Sluice, not started); nofile=N starts the gateway with its
    open-files soft limit raised to N (capped by the hard limit; default: inherited)."""
    instances: list[Sluice] = []
    request.node._sluice_instances = instances

    def make(upstream: Any = None, *, upstreams: Optional[list] = None,
             routes: Optional[list] = None, server: Optional[dict] = None,
             upstream_options: Optional[dict] = None, log: Optional[dict] = None,
             admin: Optional[dict] = None, workers: int = 1, extra_toml: str = "",
             start: bool = True,
             nofile: Optional[int] = None) -> Sluice:
        n = len(instances)
        port, admin_port = free_port(), free_port()
        while admin_port == port:
            admin_port = free_port()
        cfg = tmp_path / f"sluice{n}.toml"
        cfg.write_text(sluice_config(port, admin_port, upstream, upstreams=upstreams,
                                     routes=routes, server=server,
                                     upstream_options=upstream_options, log=log,
                                     admin=admin, workers=workers, extra_toml=extra_toml))
        inst = Sluice(cfg, tmp_path / f"sluice{n}.stderr", port, admin_port, nofile=nofile)
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


@pytest.fixture
def valkey_factory(tmp_path, request):
    servers: list[ValkeyServer] = []
    request.node._valkey_instances = servers

    def make(password: Optional[str] = None, extra_args: Iterable = ()) -> ValkeyServer:
        v = ValkeyServer(tmp_path / f"valkey{len(servers)}", password, extra_args)
        servers.append(v)
        for attempt in range(3):
            try:
                return v.start()
            except pytest.fail.Exception:
                if attempt == 2 or v.running():
                    raise
                v.port = free_port()  # lost a race for the port: try another one
        return v

    yield make
    for v in servers:
        if v._client is not None:
            v._client.close()
        v.stop()


@pytest.fixture
def valkey(valkey_factory) -> ValkeyServer:
    return valkey_factory()


# ------------------------------------------------------------------ the decide script

# (Its calls and replies: decide_codec.py, Sluice's own codec.)


@pytest.fixture(scope="session")
def tls_pki(tmp_path_factory) -> Pki:
    """The certificates the TLS tests share, made once per session (harness/tls.py,
    make_test_pki(), lists them)."""
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=["bin"] + (["asan"] if SLUICE_ASAN_BIN else []))
def sluice_binary(request, monkeypatch) -> Path:
    """Parametrizes a test over the gateway binaries: SLUICE_BIN (id "bin") and, when
    SLUICE_ASAN_BIN is set, that ASan/UBSan build too (id "asan"; a leak or a memory error
    makes its exit code non-zero, which the sluice_factory teardown reports). Request it before
    sluice_factory starts a gateway."""
    if request.param == "asan":
        # harness.gateway's SLUICE_BIN is the one sluice_bin() and is_asan_build() read.
        monkeypatch.setattr(gateway, "SLUICE_BIN", Path(SLUICE_ASAN_BIN))
        monkeypatch.setattr(sys.modules[__name__], "SLUICE_BIN", Path(SLUICE_ASAN_BIN))
    return gateway.SLUICE_BIN


@pytest.fixture
def tls_upstream_factory():
    """make(cert, client_ca=None, name=None) -> a started TlsUpstreamServer (stopped at
    teardown)."""
    servers: list[TlsUpstreamServer] = []

    def make(cert: CertFiles, client_ca: Optional[CertFiles] = None,
             name: Optional[str] = None) -> TlsUpstreamServer:
        s = TlsUpstreamServer(cert, client_ca=client_ca, name=name or f"tls{len(servers) + 1}")
        s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def upstream_process_factory(tmp_path):
    """make(name) -> a started UpstreamProcess; every one is killed (by its PID) at teardown."""
    procs: list[UpstreamProcess] = []

    def make(name: str) -> UpstreamProcess:
        p = UpstreamProcess(name, tmp_path)
        procs.append(p)
        return p.start()

    yield make
    for p in procs:
        p.kill()


@pytest.fixture
def asan_small_quarantine(monkeypatch):
    """On the ASan build: ASAN_OPTIONS (as given, plus quarantine_size_mb=ASAN_QUARANTINE_MB)
    for the gateways this test starts. Nothing on the normal build."""
    if is_asan_build():
        opts = os.environ.get("ASAN_OPTIONS", "")
        monkeypatch.setenv("ASAN_OPTIONS", (opts + ":" if opts else "") +
                           f"quarantine_size_mb={ASAN_QUARANTINE_MB}")
