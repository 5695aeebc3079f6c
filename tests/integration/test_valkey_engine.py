"""The gateway's engines (README "Engines", `[valkey] engine`): which one a node gets, what a
node without the module means under each setting, and that gateways of both engines, or a
cluster whose nodes differ, decide exactly alike on shared keys.

Servers here load the module or not as each test says (ValkeyServer(module=...)), whatever
SLUICE_ENGINE the suite runs with."""

import threading
import time
from collections import Counter

import pytest

from conftest import (limit_cfg, metric_sum, ratelimit_toml, route_cfg, stored, used,
                      wait_admin, wait_until)
from harness.valkey import ValkeyServer, hashed_part
from test_valkey_cluster import Cluster


@pytest.fixture
def servers(tmp_path):
    made = []

    def make(module: bool, extra_args=()) -> ValkeyServer:
        v = ValkeyServer(tmp_path / f"v{len(made)}", module=module, extra_args=extra_args)
        made.append(v)
        return v.start()

    yield make
    for v in made:
        v.stop()


def gateway(sluice_factory, upstream, address: str, limits: list, engine=None, workers=1,
            **valkey):
    # (engine "auto" unless the test says: not the suites' default of SLUICE_ENGINE)
    options = {"timeout": "1s", "engine": engine or "auto", **valkey}
    return sluice_factory(upstream, routes=[route_cfg("api", [l["name"] for l in limits])],
                          workers=workers,
                          extra_toml=ratelimit_toml(address, limits=limits,
                                                    valkey_options=options))


def engines(gw, node: str) -> dict:
    return {e: metric_sum(gw, "sluice_valkey_engine", node=node, engine=e)
            for e in ("module", "lua")}


def commandstats(v: ValkeyServer) -> Counter:
    stats = v.client.info("commandstats")
    return Counter({name[len("cmdstat_"):]: s["calls"] for name, s in stats.items()})


def test_auto_decides_with_the_module_where_a_node_has_it(sluice_factory, upstream, servers):
    v = servers(module=True)
    gw = gateway(sluice_factory, upstream, v.address,
                 [limit_cfg("per_ip", "fixed_window", 5, "1h")], workers=2)
    wait_admin(gw, "/ready", 200)
    assert engines(gw, v.address) == {"module": 2, "lua": 0}
    v.client.config_resetstat()
    statuses = Counter(gw.get("/status/200").status for _ in range(8))
    assert statuses == {200: 5, 429: 3}
    calls = commandstats(v)
    assert calls["sluice.decide"] >= 1 and calls["fcall"] == 0, calls
    assert "deciding with the module" in gw.stderr()


def test_auto_falls_back_to_the_functions_and_says_why(sluice_factory, upstream, servers):
    v = servers(module=False)
    gw = gateway(sluice_factory, upstream, v.address,
                 [limit_cfg("per_ip", "fixed_window", 3, "1h")])
    wait_admin(gw, "/ready", 200)
    assert engines(gw, v.address) == {"module": 0, "lua": 1}
    assert [gw.get("/status/200").status for _ in range(4)] == [200, 200, 200, 429]
    assert commandstats(v)["fcall"] >= 1
    assert "deciding with the Lua functions: no module" in gw.stderr()


def test_lua_ignores_a_loaded_module(sluice_factory, upstream, servers):
    v = servers(module=True)
    gw = gateway(sluice_factory, upstream, v.address,
                 [limit_cfg("per_ip", "fixed_window", 3, "1h")], engine="lua")
    wait_admin(gw, "/ready", 200)
    assert engines(gw, v.address) == {"module": 0, "lua": 1}
    v.client.config_resetstat()
    assert [gw.get("/status/200").status for _ in range(4)] == [200, 200, 200, 429]
    calls = commandstats(v)
    assert calls["fcall"] >= 1 and calls["sluice.decide"] == 0, calls


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_module_without_the_module_is_not_ready_and_decides_by_on_error(
        sluice_factory, upstream, servers, on_error):
    v = servers(module=False, extra_args=["--enable-module-command", "local"])
    gw = gateway(sluice_factory, upstream, v.address,
                 [limit_cfg("per_ip", "fixed_window", 3, "1h", on_error=on_error)],
                 engine="module")
    time.sleep(0.5)
    assert gw.admin_get("/ready")[0] == 503
    want = 503 if on_error == "deny" else 200
    assert [gw.get("/status/200").status for _ in range(4)] == [want] * 4
    assert 'engine = "module" and the node has no module' in gw.stderr()
    assert engines(gw, v.address) == {"module": 0, "lua": 0}
    assert commandstats(v)["fcall"] == 0
    # Loaded at run time: the next connection finds it (backoff: 5 s at most).
    from harness.valkey import module_path
    v.client.execute_command("MODULE", "LOAD", module_path())
    wait_admin(gw, "/ready", 200, timeout=10)
    assert engines(gw, v.address) == {"module": 1, "lua": 0}
    assert [gw.get("/status/200").status for _ in range(4)] == [200, 200, 200, 429]


def hammer(gws: list, requests: int, threads: int = 8) -> Counter:
    """`requests` GETs spread over the gateways from `threads` threads at once."""
    statuses, lock = Counter(), threading.Lock()
    todo = list(range(requests))

    def run():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            r = gws[i % len(gws)].get("/status/200")
            with lock:
                statuses[r.status] += 1

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    return statuses


MIXED = [
    limit_cfg("fw", "fixed_window", 40, "1h"),
    limit_cfg("sw", "sliding_window", 40, "1h"),
    limit_cfg("sl", "sliding_log", 40, "1h"),
    limit_cfg("tb", "token_bucket", 40, "1d"),
]


@pytest.mark.parametrize("limit", MIXED, ids=[l["algorithm"] for l in MIXED])
def test_a_mixed_fleet_on_one_valkey_is_exact(sluice_factory, upstream, servers, limit):
    """A rolling upgrade: one gateway on the module, one on the functions, the same keys."""
    v = servers(module=True)
    a = gateway(sluice_factory, upstream, v.address, [limit], engine="module", workers=2)
    b = gateway(sluice_factory, upstream, v.address, [limit], engine="lua", workers=2)
    for gw in (a, b):
        wait_admin(gw, "/ready", 200)
    assert engines(a, v.address)["module"] == 2 and engines(b, v.address)["lua"] == 2
    v.client.config_resetstat()
    statuses = hammer([a, b], 100)
    assert statuses == {200: 40, 429: 60}, statuses
    calls = commandstats(v)
    assert calls["sluice.decide"] > 0 and calls["fcall"] > 0, calls
    key = f"rl:v2:{limit['name']}:{{127.0.0.1}}"
    if limit["algorithm"] == "token_bucket":
        assert stored(v, key, "token_bucket") > 0
    else:
        # (a sliding_log counts refusals by default: it keeps the newest 40 and the last one)
        assert used(v, key, limit["algorithm"], 3600) == \
            (41 if limit["algorithm"] == "sliding_log" else 40)


def test_a_concurrency_limit_is_shared_by_a_mixed_fleet(sluice_factory, upstream, servers):
    v = servers(module=True)
    limit = {"name": "conc", "algorithm": "concurrency", "by": ["ip"], "limit": 3}
    a = gateway(sluice_factory, upstream, v.address, [limit], engine="module")
    b = gateway(sluice_factory, upstream, v.address, [limit], engine="lua")
    for gw in (a, b):
        wait_admin(gw, "/ready", 200)
    results, lock = [], threading.Lock()

    def slow(gw):
        r = gw.get("/slow/1000")
        with lock:
            results.append(r.status)

    threads = [threading.Thread(target=slow, args=(gw,)) for gw in (a, b, a, b, a, b)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(10)
    assert sorted(results) == [200, 200, 200, 429, 429, 429], results
    # Every slot freed (by either engine's release): the next three are admitted again. A slot
    # is freed after its response went out (the release goes with its worker's next flush), so
    # the set empties shortly after the last 200, not before it.
    assert wait_until(lambda: v.client.zcard("rl:v2:conc:{127.0.0.1}"), lambda n: n == 0,
                      timeout=5.0) == 0
    assert [gw.get("/status/200").status for gw in (a, b, a)] == [200, 200, 200]


def test_a_cluster_whose_nodes_differ_is_exact(sluice_factory, upstream, tmp_path):
    """Three primaries, one without the module: per node the engine it has, and every key
    exact whichever node owns it."""
    cluster = Cluster(tmp_path, modules=[True, True, False])
    try:
        limit = limit_cfg("per_user", "fixed_window", 3, "1h", by=["header:X-User"])
        gw = sluice_factory(upstream, routes=[route_cfg("api", ["per_user"])], workers=1,
                            extra_toml=ratelimit_toml(None, limits=[limit], valkey_options={
                                "nodes": [f"127.0.0.1:{cluster.ports[0]}"], "timeout": "1s",
                                "engine": "auto"}))
        wait_admin(gw, "/ready", 200)
        users = [f"u{i}" for i in range(24)]
        owners = {u: cluster.owner(int(cluster.cli(
            cluster.ports[0], "CLUSTER", "KEYSLOT",
            f"rl:v2:per_user:{{{hashed_part(u)}}}"))) for u in users}
        assert len(set(owners.values())) == 3, "users on every primary"
        for u in users:
            got = [gw.get("/status/200", [("X-User", u)]).status for _ in range(4)]
            assert got == [200, 200, 200, 429], (u, owners[u], got)
        by_engine = {p: engines(gw, f"127.0.0.1:{p}") for p in cluster.ports}
        assert by_engine == {cluster.ports[0]: {"module": 1, "lua": 0},
                             cluster.ports[1]: {"module": 1, "lua": 0},
                             cluster.ports[2]: {"module": 0, "lua": 1}}, by_engine
    finally:
        cluster.stop()
