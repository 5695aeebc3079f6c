"""Valkey Cluster mode ([valkey] nodes): real redis-server (or valkey-server: REDIS_SERVER,
REDIS_CLI) nodes in cluster mode, made with `redis-cli --cluster create`. Keys share the slot of
key_prefix's hash tag; decisions are exact through the owner of that slot, follow MOVED, ASK and
TRYAGAIN when the slot moves, fall to on_error when its node is gone, and are exact again once a
replica took over (failover) or the old primary took its slots back (fail-back)."""

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import (TIMER_SLACK_S, free_port, hashed_part, limit_cfg, metric_sum,
                      ratelimit_toml, route_cfg, wait_admin)
from harness.valkey import module_args

PREFIX = "{rl}:v1"


def server_and_cli():
    """The server (REDIS_SERVER, else redis-server on PATH) and its CLI (REDIS_CLI, else the
    valkey-cli or redis-cli beside the server, else redis-cli on PATH). Missing ones fail the
    test: these tests never skip."""
    server = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not server or not os.access(server, os.X_OK):
        pytest.fail("redis-server not found (install it or set REDIS_SERVER)", pytrace=False)
    cli = os.environ.get("REDIS_CLI")
    if not cli:
        folder = Path(server).resolve().parent
        name = Path(server).name.replace("-server", "-cli")
        beside = folder / name
        cli = str(beside) if os.access(beside, os.X_OK) else shutil.which("redis-cli")
    if not cli or not os.access(cli, os.X_OK):
        pytest.fail("redis-cli not found (install it or set REDIS_CLI)", pytrace=False)
    return server, cli


class Cluster:
    """`primaries` primaries, each with `replicas` replicas, on loopback ports. Only the
    processes it started are signalled (by their PID)."""

    def __init__(self, tmp_path, size=3, replicas=0, node_timeout_ms=None, modules=None):
        """modules: per node (in port order), whether it loads the Valkey module; None: as
        SLUICE_ENGINE says (harness/valkey.py)."""
        self.server, self.cli_bin = server_and_cli()
        self.ports, self.procs, self.args = [], {}, {}
        extra = []
        if node_timeout_ms:
            extra = ["--cluster-node-timeout", str(node_timeout_ms)]
        for i in range(size * (1 + replicas)):
            port = free_port()
            d = tmp_path / f"node{i}"
            d.mkdir()
            self.args[port] = [
                self.server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled",
                "yes", "--cluster-port", str(free_port()), "--cluster-config-file", str(d / "nodes.conf"), "--dir", str(d),
                "--save", "", "--appendonly", "no", *extra,
                *module_args(None if modules is None else modules[i])]
            self.ports.append(port)
        try:
            for port in self.ports:
                self.start(port)
            out = subprocess.run([self.cli_bin, "--cluster", "create",
                                  *[f"127.0.0.1:{p}" for p in self.ports],
                                  "--cluster-replicas", str(replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stdout + out.stderr
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                # Every node must also know every replica (replica_of() asks one of them):
                # a replica's role reaches the others by gossip, after cluster_state:ok.
                if all("cluster_state:ok" in self.cli(p, "CLUSTER", "INFO") for p in self.ports) \
                        and all(sum("slave" in n["flags"] for n in self.nodes(p)) == size * replicas
                                for p in self.ports) \
                        and all(self.in_sync(p) for p in self.replicas()):
                    return
                time.sleep(0.1)
            pytest.fail("the cluster did not become ok")
        except BaseException:
            self.stop()
            raise

    def start(self, port):
        self.procs[port] = subprocess.Popen(self.args[port], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        self.wait_ping(port)

    def wait_ping(self, port):
        for _ in range(100):
            try:
                if self.cli(port, "PING") == "PONG":
                    return
            except subprocess.SubprocessError:
                pass
            time.sleep(0.05)
        pytest.fail(f"{self.server} on {port} did not start")

    def cli(self, port, *args):
        out = subprocess.run([self.cli_bin, "-p", str(port), *args], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip()

    def nodes(self, via=None):
        """CLUSTER NODES as seen by `via` (else the first live node): a list of dicts."""
        for port in ([via] if via else self.ports):
            if port not in self.procs:
                continue
            rows = []
            for line in self.cli(port, "CLUSTER", "NODES").splitlines():
                f = line.split()
                if len(f) < 8:
                    continue
                rows.append({"id": f[0], "port": int(f[1].split(":")[1].split("@")[0]),
                             "flags": f[2].split(","), "primary": f[3], "slots": f[8:]})
            return rows
        return []

    def owner(self, slot, via=None):
        for n in self.nodes(via):
            if "master" not in n["flags"] or "fail" in n["flags"]:
                continue
            for r in n["slots"]:
                if "-" in r and not r.startswith("["):
                    a, b = map(int, r.split("-"))
                elif r.isdigit():
                    a = b = int(r)
                else:
                    continue
                if a <= slot <= b:
                    return n["port"]
        return None

    def replicas(self):
        return [n["port"] for n in self.nodes() if "slave" in n["flags"]]

    def replica_of(self, primary):
        pid = self.node_id(primary)
        return next(n["port"] for n in self.nodes() if n["primary"] == pid)

    def in_sync(self, replica):
        return "master_link_status:up" in self.cli(replica, "INFO", "replication")

    def wait_replicated(self, primary, replica, timeout=5):
        """Until `replica` has applied every write `primary` made so far. (WAIT from a new
        connection proves nothing: it waits for that connection's own writes, which are none.)"""
        def offset(port, field):
            for line in self.cli(port, "INFO", "replication").splitlines():
                if line.startswith(field + ":"):
                    return int(line.split(":", 1)[1])
            return -1
        target = offset(primary, "master_repl_offset")
        deadline = time.monotonic() + timeout
        while offset(replica, "slave_repl_offset") < target:
            assert time.monotonic() < deadline, f"{replica} did not reach offset {target}"
            time.sleep(0.01)

    def role(self, port):
        return self.cli(port, "ROLE").split("\n")[0]

    def node_id(self, port):
        return self.cli(port, "CLUSTER", "MYID")

    def move_slot(self, slot, to_port, keys=None):
        """Live migration of one slot: IMPORTING/MIGRATING, MIGRATE its keys (or only `keys`:
        then the slot stays half-moved until finish_move), SETSLOT NODE."""
        src = self.owner(slot)
        src_id, dst_id = self.node_id(src), self.node_id(to_port)
        assert self.cli(to_port, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", src_id) == "OK"
        assert self.cli(src, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", dst_id) == "OK"
        if keys is not None:
            self.migrate(src, to_port, keys)
            return src
        keys = self.cli(src, "CLUSTER", "GETKEYSINSLOT", str(slot), "1000").split()
        self.migrate(src, to_port, keys)
        self.finish_move(slot, to_port)
        return keys

    def migrate(self, src, to_port, keys):
        if keys:
            out = self.cli(src, "MIGRATE", "127.0.0.1", str(to_port), "", "0", "5000", "KEYS",
                           *keys)
            assert out == "OK", out

    def finish_move(self, slot, to_port):
        """SETSLOT NODE on the destination first, then on the source (as the cluster
        specification says: else each could send the other a MOVED for a moment), then on
        the others."""
        src, dst_id = self.owner(slot, via=to_port), self.node_id(to_port)
        order = [to_port, src] + [p for p in self.ports if p not in (to_port, src)]
        for port in order:
            if port in self.procs:
                self.cli(port, "CLUSTER", "SETSLOT", str(slot), "NODE", dst_id)

    def kill(self, port):
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop(self):
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs = {}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture
def ha_cluster(tmp_path):
    """Three primaries with one replica each; a primary is found failed after 1 s."""
    c = Cluster(tmp_path, replicas=1, node_timeout_ms=1000)
    yield c
    c.stop()


def cluster_toml(cluster, limits, seed=None, seeds=None, **valkey):
    seeds = [f"127.0.0.1:{p}" for p in (seeds or [seed or cluster.ports[0]])]
    text = ratelimit_toml(None, limits=limits,
                          valkey_options={"nodes": seeds, "key_prefix": PREFIX, **valkey})
    return text


def node_metric(gw, name, port, **labels):
    return metric_sum(gw, name, node=f"127.0.0.1:{port}", **labels)


def slot_of_prefix(cluster):
    return int(cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", PREFIX))


def test_decisions_are_exact_through_the_slot_owner(sluice_factory, upstream, cluster):
    slot = slot_of_prefix(cluster)
    owner = cluster.owner(slot)
    seed = next(p for p in cluster.ports if p != owner)  # the seed does not own the slot
    limits = [limit_cfg("per_ip", "fixed_window", 5, "1h"),
              limit_cfg("per_key", "token_bucket", 3, "1h", by=["api_key"])]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["per_ip", "per_key"])],
                        extra_toml=cluster_toml(cluster, limits, seed=seed), workers=2)
    wait_admin(gw, "/ready", 200)
    statuses = [gw.get("/status/200", [("X-API-Key", "k1")]).status for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429], statuses
    # All of a request's keys are on the owner of the prefix's slot, and only there.
    keys = cluster.cli(owner, "--scan", "--pattern", "{rl}:*").split()
    assert sorted(k.split(":")[2] for k in keys) == ["per_ip", "per_key"], keys
    for port in cluster.ports:
        if port != owner:
            assert cluster.cli(port, "DBSIZE") == "0"
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_allowed") == 0


def test_a_moved_slot_is_followed_and_decisions_stay_exact(sluice_factory, upstream, cluster):
    slot = slot_of_prefix(cluster)
    limits = [limit_cfg("per_ip", "fixed_window", 6, "1h")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["per_ip"])],
                        extra_toml=cluster_toml(cluster, limits))
    wait_admin(gw, "/ready", 200)
    assert [gw.get("/status/200").status for _ in range(3)] == [200] * 3
    old = cluster.owner(slot)
    target = next(p for p in cluster.ports if p != old)
    moved = cluster.move_slot(slot, target)
    assert moved, "the counter should have moved with its slot"
    assert cluster.owner(slot) == target
    # The gateway still sends to the old owner first: MOVED, then the new owner answers.
    statuses = [gw.get("/status/200").status for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429], statuses
    assert metric_sum(gw, "sluice_valkey_errors_total", kind="redirect") >= 1
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_allowed") <= 1
    # Per node: the old owner answered MOVED, the new one took the calls after it.
    assert node_metric(gw, "sluice_valkey_node_redirects_total", old, kind="moved") >= 1
    assert node_metric(gw, "sluice_valkey_node_calls_total", old) >= 3
    assert node_metric(gw, "sluice_valkey_node_calls_total", target) >= 4
    assert node_metric(gw, "sluice_valkey_node_errors_total", target) == 0


def test_the_slot_owner_gone_decides_by_on_error(sluice_factory, upstream, cluster):
    slot = slot_of_prefix(cluster)
    owner = cluster.owner(slot)
    seed = next(p for p in cluster.ports if p != owner)
    limits = [limit_cfg("open", "fixed_window", 100, "1h", on_error="allow"),
              limit_cfg("closed", "fixed_window", 100, "1h", on_error="deny")]
    gw = sluice_factory(upstream,
                        routes=[route_cfg("allow", ["open"], match={"path_prefix": "/status"}),
                                route_cfg("deny", ["closed"], match={"path_prefix": "/echo"})],
                        extra_toml=cluster_toml(cluster, limits, seed=seed, timeout="100ms"))
    wait_admin(gw, "/ready", 200)
    assert gw.get("/status/200").status == 200
    cluster.kill(owner)
    for _ in range(5):
        t0 = time.monotonic()
        assert gw.get("/status/200").status == 200
        r = gw.get("/echo")
        assert r.status == 503 and r.header("retry-after"), r
        # Both at once (the owner's connection closed with it; measured under 30 ms): one
        # deadline (100 ms) at most, never the stall limit or connect_timeout (1 s).
        assert time.monotonic() - t0 < 0.1 + TIMER_SLACK_S
    wait_admin(gw, "/ready", 503, timeout=15)


def test_tryagain_during_a_migration_is_retried_within_the_deadline(sluice_factory, upstream,
                                                                     cluster):
    """Two limits, two keys in one slot; the slot half-moved (one key migrated, the other not):
    the source answers TRYAGAIN until the second key follows. A decision made meanwhile waits
    and is exact once the move ends within its deadline; one whose deadline passes first
    decides by on_error at the deadline."""
    slot = slot_of_prefix(cluster)
    limits = [limit_cfg("a", "fixed_window", 5, "1h", by=["api_key"], on_error="deny"),
              limit_cfg("b", "fixed_window", 50, "1h", by=["api_key"], on_error="deny")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["a", "b"])],
                        extra_toml=cluster_toml(cluster, limits, timeout="1500ms"))
    wait_admin(gw, "/ready", 200)

    def get(key, **kw):
        return gw.get("/status/200", [("X-API-Key", key)], **kw)

    def keys_of(port, key):
        found = cluster.cli(port, "CLUSTER", "GETKEYSINSLOT", str(slot), "100").split()
        return sorted(k for k in found if k.endswith("{" + hashed_part(key) + "}"))

    assert [get("k1").status for _ in range(2)] == [200, 200]
    src = cluster.owner(slot)
    dst = next(p for p in cluster.ports if p != src)
    keys = keys_of(src, "k1")
    assert len(keys) == 2, keys
    cluster.move_slot(slot, dst, keys=keys[:1])  # half-moved: TRYAGAIN from the source

    result = {}

    def one():
        t0 = time.monotonic()
        result["status"] = get("k1", timeout=10).status
        result["took"] = time.monotonic() - t0

    t = threading.Thread(target=one)
    t.start()
    time.sleep(0.4)
    cluster.migrate(src, dst, keys[1:])
    cluster.finish_move(slot, dst)
    t.join(10)
    assert result.get("status") == 200, result
    assert 0.35 < result["took"] < 1.5 + TIMER_SLACK_S, result
    assert node_metric(gw, "sluice_valkey_node_redirects_total", src, kind="tryagain") >= 1
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_denied") == 0
    # Exact: 3 charged so far, 2 more allowed by "a".
    assert [get("k1").status for _ in range(3)] == [200, 200, 429]

    # Half-moved longer than a decision's deadline (back the other way): on_error at the
    # deadline, not later, counted as a timeout of the node that said TRYAGAIN.
    assert get("k2").status == 200
    keys = keys_of(dst, "k2")
    assert len(keys) == 2, keys
    cluster.move_slot(slot, src, keys=keys[:1])
    t0 = time.monotonic()
    r = get("k2", timeout=10)
    took = time.monotonic() - t0
    assert r.status == 503, r
    assert 1.4 < took < 1.5 + TIMER_SLACK_S, took
    assert node_metric(gw, "sluice_valkey_node_errors_total", dst, kind="timeout") == 1
    cluster.migrate(dst, src, cluster.cli(dst, "CLUSTER", "GETKEYSINSLOT", str(slot),
                                          "100").split())
    cluster.finish_move(slot, src)
    # Nothing was charged by the call that never ran: k2 has 4 left.
    assert [get("k2").status for _ in range(5)] == [200] * 4 + [429]


def test_a_reload_while_a_call_waits_after_tryagain_decides_it_by_on_error(
        sluice_factory, upstream, cluster):
    """The cluster client replaced (SIGHUP with another [valkey]) while a call waits to resend
    after TRYAGAIN: the call is failed at once (on_error), not left behind its timer; the new
    client decides exactly once the move ends (the ASan build checks what is freed when)."""
    slot = slot_of_prefix(cluster)
    limits = [limit_cfg("a", "fixed_window", 5, "1h", on_error="deny"),
              limit_cfg("b", "fixed_window", 50, "1h", on_error="deny")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["a", "b"])],
                        extra_toml=cluster_toml(cluster, limits, timeout="3s"))
    wait_admin(gw, "/ready", 200)
    assert gw.get("/status/200").status == 200
    src = cluster.owner(slot)
    dst = next(p for p in cluster.ports if p != src)
    keys = sorted(cluster.cli(src, "CLUSTER", "GETKEYSINSLOT", str(slot), "10").split())
    assert len(keys) == 2, keys
    cluster.move_slot(slot, dst, keys=keys[:1])
    result = {}

    def one():
        t0 = time.monotonic()
        result["status"] = gw.get("/status/200", timeout=10).status
        result["took"] = time.monotonic() - t0

    t = threading.Thread(target=one)
    t.start()
    time.sleep(0.3)
    reloads0 = metric_sum(gw, "sluice_config_reloads_total", result="success")
    gw.config_path.write_text(gw.config_path.read_text().replace('timeout = "3s"',
                                                                 'timeout = "2s"'))
    gw.send_signal(signal.SIGHUP)
    t.join(10)
    assert metric_sum(gw, "sluice_config_reloads_total", result="success") == reloads0 + 1
    assert result.get("status") == 503, result
    assert result["took"] < 1.5, result
    assert node_metric(gw, "sluice_valkey_node_redirects_total", src, kind="tryagain") >= 1
    cluster.migrate(src, dst, keys[1:])
    cluster.finish_move(slot, dst)
    wait_admin(gw, "/ready", 200)
    # The waiting call never ran: 1 charged, 4 more allowed.
    assert [gw.get("/status/200").status for _ in range(5)] == [200] * 4 + [429]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.02)
    pytest.fail(f"{what}: not within {timeout} s")


class Traffic:
    """Requests one after the other (fail-closed limit: an on_error decision is a 503), each
    recorded with the time it was answered, while the test watches the cluster."""

    def __init__(self, gw):
        self.gw, self.log = gw, []

    def step(self):
        r = self.gw.get("/status/200", timeout=10)
        self.log.append((time.monotonic(), r.status))
        return r.status

    def first_after(self, t, status):
        return next((at for at, s in self.log if at >= t and s == status), None)


# A failover test runs well under this; its fixed window of one hour must not turn over while
# it runs (the count would start again at the top of the hour: more allowed than the limit).
FAILOVER_RUN_S = 90


def failover_gateway(sluice_factory, upstream, ha_cluster, limit, seeds):
    # The window is the server's clock's hour (this machine's clock): too close to its end,
    # the test waits for the next one.
    left = 3600 - time.time() % 3600
    if left < FAILOVER_RUN_S:
        time.sleep(left + 0.1)
    limits = [limit_cfg("per_ip", "fixed_window", limit, "1h", on_error="deny")]
    # Two workers, each with its own connections and slot map: both must recover.
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["per_ip"])], workers=2,
                        extra_toml=cluster_toml(ha_cluster, limits, seeds=seeds,
                                                timeout="100ms"))
    wait_admin(gw, "/ready", 200)
    return gw


def kill_and_wait_for_promotion(ha_cluster, gw, traffic, primary, replica, survivor):
    """SIGKILL of `primary`; requests until `replica` is primary in `survivor`'s view, or
    until the gateway found the promotion first (it refreshes its slot map between two of
    our looks at the survivor's, and may ask the promoted replica itself).
    Returns (time of the kill, time the promotion was seen, time /ready went 503)."""
    t_kill = time.monotonic()
    ha_cluster.kill(primary)
    t_promoted = t_unready = None
    slot = slot_of_prefix_port(ha_cluster, survivor)
    while t_promoted is None:
        assert time.monotonic() - t_kill < 20, "no promotion within 20 s"
        status = traffic.step()
        if status == 200:
            # Only the promoted replica can have decided it: a replica answers MOVED.
            assert ha_cluster.owner(slot, via=replica) == replica, \
                "200 while the slot's primary is dead and its replica not promoted"
            t_promoted = traffic.log[-1][0]
            break
        assert status == 503, f"{status} while the slot's primary is dead"
        if t_unready is None and gw.admin_get("/ready")[0] == 503:
            t_unready = time.monotonic()
        if ha_cluster.owner(slot, via=survivor) == replica:
            t_promoted = time.monotonic()
        time.sleep(0.01)
    return t_kill, t_promoted, t_unready


def slot_of_prefix_port(cluster, port):
    return int(cluster.cli(port, "CLUSTER", "KEYSLOT", PREFIX))


def run_until_refused(traffic, limit_s):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if traffic.step() == 429:
            return
        time.sleep(0.01)
    pytest.fail(f"no 429 within {limit_s} s: {traffic.log[-20:]}")


def assert_counted_once(gw, allowed, limit, log):
    """Never beyond the limit; below it only by the calls that ran out of their deadline (the
    gateway answered by on_error, but Valkey may have charged them: conservative)."""
    timeouts = metric_sum(gw, "sluice_valkey_node_errors_total", kind="timeout")
    assert limit - timeouts <= allowed <= limit, (allowed, timeouts, log)


def assert_exact_within(log, t_event, within):
    """From t_event on: 503 (on_error) only within `within` s of it (each worker finds the new
    owner on its own: one may still answer by on_error after the other is exact), then only
    200... and the 429 that ends the run."""
    after = [(at, s) for at, s in log if at >= t_event]
    text = "".join({503: "E", 200: "A", 429: "D"}.get(s, "?") for _, s in after)
    assert re.fullmatch(r"[EA]*D", text), text
    late = [round(at - t_event, 3) for at, s in after if s == 503 and at >= t_event + within]
    assert not late, f"on_error answers {late} s after the event: {text}"


def test_a_killed_primary_decides_by_on_error_until_its_replica_is_promoted(
        sluice_factory, upstream, ha_cluster):
    slot = slot_of_prefix(ha_cluster)
    primary = ha_cluster.owner(slot)
    replica = ha_cluster.replica_of(primary)
    survivor = next(p for p in ha_cluster.ports
                    if p not in (primary, replica) and p not in ha_cluster.replicas())
    limit = 30
    # Every node is a seed (replicas too), as in production.
    gw = failover_gateway(sluice_factory, upstream, ha_cluster, limit, ha_cluster.ports)
    assert [gw.get("/status/200").status for _ in range(3)] == [200] * 3
    ha_cluster.wait_replicated(primary, replica)  # the replica has the charges
    traffic = Traffic(gw)
    t_kill, t_promoted, t_unready = kill_and_wait_for_promotion(
        ha_cluster, gw, traffic, primary, replica, survivor)
    # /ready: 503 while the slot has no reachable owner, and 200 again once the promoted
    # replica is connected.
    assert t_unready is not None, "/ready stayed 200 while the slot had no owner"
    t_ready = t_promoted + wait_admin(gw, "/ready", 200, timeout=5)
    run_until_refused(traffic, 5)
    after = [s for at, s in traffic.log if at >= t_kill]
    assert_exact_within(traffic.log, t_promoted, 2.0)
    t_exact = traffic.first_after(t_promoted, 200)
    print(f"\nfailover: promotion seen {t_promoted - t_kill:.2f} s after the kill; exact "
          f"decisions {t_exact - t_promoted:.3f} s after it, /ready 200 after "
          f"{t_ready - t_promoted:.3f} s; /ready 503 {t_unready - t_kill:.3f} s after the kill")
    assert t_exact - t_promoted < 2.0
    assert t_ready - t_promoted < 2.0
    # Exact across the failover: the replica had the 3 charges, 27 more were allowed, no more.
    allowed = 3 + sum(1 for s in after if s == 200)
    assert_counted_once(gw, allowed, limit, traffic.log)
    # Per node: the dead primary's refusals, the promoted replica's calls.
    assert node_metric(gw, "sluice_valkey_node_errors_total", primary) >= 1
    assert node_metric(gw, "sluice_valkey_node_calls_total", replica) >= limit - 3
    assert node_metric(gw, "sluice_valkey_node_errors_total", replica) == 0


def test_a_primary_that_comes_back_and_fails_back_is_used_again(sluice_factory, upstream,
                                                                ha_cluster):
    slot = slot_of_prefix(ha_cluster)
    primary = ha_cluster.owner(slot)
    replica = ha_cluster.replica_of(primary)
    survivor = next(p for p in ha_cluster.ports
                    if p not in (primary, replica) and p not in ha_cluster.replicas())
    limit = 40
    # One seed, which stays a primary: the old primary is only known from the slot map, so its
    # connection is stopped while it owns nothing and started again when it owns slots.
    gw = failover_gateway(sluice_factory, upstream, ha_cluster, limit, [survivor])
    assert gw.get("/status/200").status == 200
    ha_cluster.wait_replicated(primary, replica)
    traffic = Traffic(gw)
    _, t_promoted, _ = kill_and_wait_for_promotion(ha_cluster, gw, traffic, primary, replica,
                                                   survivor)
    wait_for(lambda: traffic.step() == 200, 2.0, "exact decisions after the promotion")

    # The old primary comes back: a replica of its replacement, then its primary again.
    ha_cluster.start(primary)
    wait_for(lambda: ha_cluster.in_sync(primary) and
             ha_cluster.owner(slot, via=survivor) == replica, 15, "the old primary as a replica")
    assert traffic.step() == 200
    calls_before = node_metric(gw, "sluice_valkey_node_calls_total", primary)
    assert ha_cluster.cli(primary, "CLUSTER", "FAILOVER") == "OK"
    t_failover = time.monotonic()
    while ha_cluster.owner(slot, via=survivor) != primary:
        assert time.monotonic() - t_failover < 10, "the fail-back did not happen within 10 s"
        assert traffic.step() in (200, 503)
        time.sleep(0.01)
    t_back = time.monotonic()
    t_exact = wait_for(lambda: traffic.step() == 200, 2.0, "exact decisions after the fail-back")
    run_until_refused(traffic, 5)
    assert_exact_within(traffic.log, t_back, 2.0)
    print(f"\nfail-back: exact decisions {t_exact - t_back:.3f} s after the old primary took "
          f"its slots back ({t_back - t_failover:.2f} s after CLUSTER FAILOVER)")
    assert t_exact - t_back < 2.0
    wait_admin(gw, "/ready", 200, timeout=2)
    # Its decisions went to the old primary again, and every request allowed was counted once.
    assert node_metric(gw, "sluice_valkey_node_calls_total", primary) > calls_before
    allowed = 1 + sum(1 for at, s in traffic.log if s == 200)
    assert_counted_once(gw, allowed, limit, traffic.log)
