"""Valkey Cluster with keys spread by their own parts (key_prefix without a hash tag): every
client's counters on the primary of its own slot, a request's limits in several slots decided
all or nothing across them (one call per slot, the charges of a refused request taken back),
exact under concurrency. The cluster operations (redirections, failover) are in
test_valkey_cluster.py, whose Cluster this file uses."""

import struct
import threading
import time
from collections import Counter

import pytest
import redis

from conftest import (avoid_window_boundary, hashed_part, limit_cfg, metric_sum,
                      parallel_requests, parse_rl_list, ratelimit_toml, route_cfg, wait_admin,
                      wait_metric)
from rawhttp import RawClient, build_request
from test_valkey_cluster import Cluster

PREFIX = "rl:v2"  # no hash tag: each key's parts are its tag


@pytest.fixture
def spread_cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def spread_toml(cluster, limits, **valkey):
    return ratelimit_toml(None, limits=limits, valkey_options={
        "nodes": [f"127.0.0.1:{cluster.ports[0]}"], "key_prefix": PREFIX, **valkey})


def slot(cluster, key):
    return int(cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", key))


def values_in_other_slots(cluster, limit_a, limit_b):
    """Header values a, b whose keys (limit_a by a, limit_b by b) are owned by different
    primaries."""
    for i in range(100):
        a, b = f"a{i}", f"b{i}"
        owner_a = cluster.owner(slot(cluster, f"{PREFIX}:{limit_a}:{{{hashed_part(a)}}}"))
        owner_b = cluster.owner(slot(cluster, f"{PREFIX}:{limit_b}:{{{hashed_part(b)}}}"))
        if owner_a != owner_b:
            return a, b
    raise AssertionError("no pair of values on different primaries")


def wait_compensations(gw, done, timeout=5.0):
    """Waits until `done` take-backs have been answered."""
    deadline = time.monotonic() + timeout
    while True:
        got = metric_sum(gw, "sluice_valkey_compensations_total", result="done")
        if got >= done or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_clients_spread_over_every_primary_each_exact(sluice_factory, upstream, spread_cluster):
    """100 clients, two limits each (same parts: one slot, one call): every client gets exactly
    its quota, and the keys lie on all three primaries, each key on the owner of its slot."""
    cluster = spread_cluster
    limits = [limit_cfg("minute", "fixed_window", 2, "1h", by=["header:X-Client"]),
              limit_cfg("day", "sliding_window", 5, "1d", by=["header:X-Client"])]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["minute", "day"])],
                        extra_toml=spread_toml(cluster, limits), workers=2)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 30)
    for i in range(100):
        statuses = [gw.get("/status/200", [("X-Client", f"c{i}")]).status for _ in range(3)]
        assert statuses == [200, 200, 429], (i, statuses)
    per_node = {port: int(cluster.cli(port, "DBSIZE")) for port in cluster.ports}
    assert sum(per_node.values()) == 200, per_node
    assert all(n >= 30 for n in per_node.values()), f"keys per primary: {per_node}"
    for port in cluster.ports:
        for key in cluster.cli(port, "--scan", "--pattern", f"{PREFIX}:*").split():
            assert cluster.owner(slot(cluster, key)) == port, key
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_allowed") == 0
    assert metric_sum(gw, "sluice_valkey_compensations_total") == 0, "one slot per request"


def avoid_window_boundary_cluster(cluster, window_s, need_s):
    class Client:  # avoid_window_boundary reads the server's clock through .time()
        def time(self):
            s, us = cluster.cli(cluster.ports[0], "TIME").split()
            return int(s), int(us)
    avoid_window_boundary(Client(), window_s, need_s)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket"])
def test_a_refusal_in_one_slot_leaves_no_charge_in_another(sluice_factory, upstream,
                                                           spread_cluster, algorithm):
    """Limit A (the algorithm, cost 3, count_denied) and limit B (fixed_window 2, count_denied)
    on keys owned by different primaries: while B refuses, A is charged by its slot's call and
    the charge is taken back, so A counts only the requests that went through; B records every
    attempt (count_denied)."""
    cluster = spread_cluster
    limits = [limit_cfg("A", algorithm, 30, "1h", by=["header:X-A"], cost=3, count_denied=True),
              limit_cfg("B", "fixed_window", 2, "1h", by=["header:X-B"], count_denied=True)]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["A", "B"])],
                        extra_toml=spread_toml(cluster, limits), workers=2)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 30)
    a, b = values_in_other_slots(cluster, "A", "B")
    headers = [("X-A", a), ("X-B", b)]
    got = [gw.get("/status/200", headers) for _ in range(6)]
    assert [r.status for r in got] == [200, 200, 429, 429, 429, 429]
    assert wait_compensations(gw, 4) == 4, "each refused request took back A's charge"
    owner_a = cluster.owner(slot(cluster, f"{PREFIX}:A:{{{hashed_part(a)}}}"))
    assert metric_sum(gw, "sluice_valkey_node_compensations_total",
                      node=f"127.0.0.1:{owner_a}") == 4, "sent to the owner of A's key"
    assert metric_sum(gw, "sluice_valkey_node_compensations_total") == 4
    # A counted the two requests that went through (cost 3 each), nothing of the four others.
    r = gw.get("/status/200", [("X-A", a), ("X-B", b + "-other")])
    assert r.status == 200, r
    assert parse_rl_list(r.header("ratelimit"))["A"]["r"] == 30 - 9, r.headers
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="failed") == 0
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_allowed") == 0


@pytest.mark.parametrize("tight", ["A", "B"])
def test_concurrent_requests_across_slots_exactly_the_limit(sluice_factory, upstream,
                                                             spread_cluster, tight):
    """8 processes x 2 workers, 64 requests at once, each with limits A and B on keys owned by
    different primaries, one of them allowing 15: exactly 15 go through, and once the
    take-backs are answered the other limit counts exactly those 15."""
    cluster = spread_cluster
    quota = {"A": 15 if tight == "A" else 1000, "B": 15 if tight == "B" else 1000}
    limits = [limit_cfg(name, "fixed_window", quota[name], "1h", by=[f"header:X-{name}"])
              for name in ("A", "B")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["A", "B"])],
                        extra_toml=spread_toml(cluster, limits), workers=2)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 60)
    a, b = values_in_other_slots(cluster, "A", "B")
    raw = build_request("GET", "/status/200", [("X-A", a), ("X-B", b), ("Connection", "close")])
    statuses = Counter(s for s, _ in parallel_requests(gw.port, [raw] * 64, processes=8))
    assert statuses == {200: 15, 429: 49}, dict(statuses)
    # The loose limit's count, once the take-backs are answered: what went through, no charge
    # of a refused request left (those refused from the deny cache never charged it).
    loose = "B" if tight == "A" else "A"
    key = f"{PREFIX}:{loose}:{{{hashed_part(a if loose == 'A' else b)}}}"
    owner = redis.Redis(port=cluster.owner(slot(cluster, key)))
    deadline = time.monotonic() + 5
    while (count := struct.unpack("<Id", owner.get(key))[1]) != 15 and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert count == 15, f"{loose} counts {count} after 15 requests went through"
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="failed") == 0


def test_a_slot_moved_under_load_admits_nothing_beyond_the_limit(sluice_factory, upstream,
                                                                 spread_cluster):
    """4 clients in a loop on one client's limit A (60 an hour; on_error deny) and a loose
    limit B in another slot, while A's slot moves to another primary (MIGRATING/IMPORTING,
    MIGRATE, SETSLOT NODE): at worst some decisions go by on_error (503) while it moves;
    exactly 60 are admitted in all, the last ones by the new owner."""
    cluster = spread_cluster
    limits = [limit_cfg("A", "fixed_window", 60, "1h", by=["header:X-A"], on_error="deny"),
              limit_cfg("B", "fixed_window", 100000, "1h", by=["header:X-B"])]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["A", "B"])],
                        extra_toml=spread_toml(cluster, limits, timeout="200ms"), workers=2)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 60)
    a, b = values_in_other_slots(cluster, "A", "B")
    key_a = f"{PREFIX}:A:{{{hashed_part(a)}}}"
    slot_a = slot(cluster, key_a)
    source = cluster.owner(slot_a)
    target = next(p for p in cluster.ports if p not in (source, cluster.owner(
        slot(cluster, f"{PREFIX}:B:{{{hashed_part(b)}}}"))))
    statuses, stop = [], threading.Event()

    def client():
        while not stop.is_set():
            statuses.append(gw.get("/status/200", [("X-A", a), ("X-B", b)]).status)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while statuses.count(200) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cluster.move_slot(slot_a, target) == [key_a], "A's counter moves with its slot"
        deadline = time.monotonic() + 10
        while 429 not in statuses[-20:] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    got = Counter(statuses)
    assert got[200] == 60, dict(got)
    assert set(got) <= {200, 429, 503}, dict(got)
    assert cluster.owner(slot_a) == target
    assert struct.unpack("<Id", redis.Redis(port=target).get(key_a))[1] == 60, \
        "the new owner counts every admitted request, and no refused one"
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="failed") == 0


def test_a_slot_taken_in_one_slot_is_freed_when_another_refuses(sluice_factory, upstream,
                                                                spread_cluster):
    """A concurrency limit and a fixed window on keys owned by different primaries: while the
    window refuses, the slot its slot's call took is freed (by the take-back), so the slots
    hold only the requests in flight, and the renewal and release go to the slot's owner."""
    cluster = spread_cluster
    limits = [{"name": "S", "algorithm": "concurrency", "by": ["header:X-A"], "limit": 1},
              limit_cfg("B", "fixed_window", 1, "1h", by=["header:X-B"])]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["S", "B"])],
                        extra_toml=spread_toml(cluster, limits), workers=1)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 30)
    a, b = values_in_other_slots(cluster, "S", "B")
    key_s = f"{PREFIX}:S:{{{hashed_part(a)}}}"
    owner_s = cluster.owner(slot(cluster, key_s))
    assert gw.get("/status/200", [("X-A", a), ("X-B", b)]).status == 200
    for _ in range(3):
        r = gw.get("/status/200", [("X-A", a), ("X-B", b)])
        assert r.status == 429 and r.json()["violated-policies"] == ["B"], r
    # (The first refusal is Valkey's, taken back; the next ones come from the deny cache, which
    # asks nothing and takes no slot.)
    assert wait_compensations(gw, 1) == 1
    assert int(cluster.cli(owner_s, "EXISTS", key_s)) == 0, "no slot left behind"
    # The slot is free: another request of that client (another B) passes.
    assert gw.get("/status/200", [("X-A", a), ("X-B", b + "-2")]).status == 200
    # Its slot is freed after its response went out (the release goes with the worker's next
    # flush, and the client may look first): once the owner answered both releases (this
    # request's and the first one's), the key is gone.
    assert wait_metric(gw, "sluice_concurrency_lease_calls_total", lambda v: v >= 2,
                       timeout=5.0, op="release", result="done") == 2
    assert int(cluster.cli(owner_s, "EXISTS", key_s)) == 0


def test_a_take_back_forgets_the_refusals_cached_from_the_charge_it_took_back(
        sluice_factory, upstream, spread_cluster):
    """Issue 23, item 3. per_ip 3/h and per_key 1/h, in different slots. A (an address's key
    that per_key refuses) and B (the same address, another key) at once: when B's per_ip is
    decided while A's per_ip charge stands, B is refused (3 of 3) and the worker caches that
    refusal; A's charge is then taken back (Valkey holds 2 of 3). The cached refusal came from
    a view the take-back changed: it is forgotten, and the address's next request is decided
    by Valkey (allowed), not refused from the cache for the rest of the hour."""
    cluster = spread_cluster
    limits = [limit_cfg("per_ip", "fixed_window", 3, "1h", by=["ip"]),
              limit_cfg("per_key", "fixed_window", 1, "1h", by=["api_key"])]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["per_ip", "per_key"])],
                        extra_toml=ratelimit_toml(
                            None, limits=limits, identity={"trusted_proxies": ["127.0.0.1/32"],
                                                             "valkey_tenants": False},
                            valkey_options={"nodes": [f"127.0.0.1:{cluster.ports[0]}"],
                                            "key_prefix": PREFIX}),
                        workers=1)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 60)

    def request(ip, key):
        return build_request("GET", "/status/200", [("X-Forwarded-For", ip), ("X-API-Key", key)])

    # (No tenant lookup: B is decided at once, in A's call or the next.) B may still be decided
    # after the take-back: up to 120 trials, each with an address of its own.
    races = 0
    for trial in range(120):
        ip = f"203.0.{113 + trial // 100}.{trial % 100 + 1}"
        for key in (f"t{trial}a", f"t{trial}b"):  # per_ip: 2 of 3
            assert gw.get("/status/200", [("X-Forwarded-For", ip), ("X-API-Key", key)]).status == 200
        done = metric_sum(gw, "sluice_valkey_compensations_total", result="done")
        # A (per_key t{trial}a is used up) and B (a fresh key) at once.
        a, b = (RawClient(gw.port, timeout=5) for _ in range(2))
        try:
            a.sock.sendall(request(ip, f"t{trial}a"))
            b.sock.sendall(request(ip, f"t{trial}c"))
            ra, rb = a.read_response(), b.read_response()
        finally:
            a.close()
            b.close()
        assert ra.status == 429 and ra.json()["violated-policies"] == ["per_key"], ra
        if rb.status != 429:
            continue  # B was decided after the take-back (3 of 3 then): no race this time
        assert rb.json()["violated-policies"] == ["per_ip"], rb
        races += 1
        # Both refused across slots: A's per_ip and B's per_key are taken back.
        assert wait_compensations(gw, done + 2) >= done + 2
        r = gw.get("/status/200", [("X-Forwarded-For", ip), ("X-API-Key", f"t{trial}d")])
        assert r.status == 200, (f"trial {trial}: refused from a cached refusal that the take-back "
                                 f"made stale", r.status, r.body)
        if races >= 2:
            break
    print(f"[item3] {races} races in {trial + 1} trials")
    assert races >= 1, "B was never decided while A's charge stood"


def _shadow_and_strict(sluice_factory, upstream, cluster, shadow, strict):
    """A gateway with a shadow limit by X-A and a strict one by X-B, and values a, b whose
    keys are on different primaries (so in different slots: a request is split)."""
    gw = sluice_factory(upstream, routes=[route_cfg("api", [shadow["name"], strict["name"]])],
                        extra_toml=spread_toml(cluster, [shadow, strict]), workers=1)
    wait_admin(gw, "/ready", 200)
    avoid_window_boundary_cluster(cluster, 3600, 60)
    a, b = values_in_other_slots(cluster, shadow["name"], strict["name"])
    from test_admin_limits import peek
    key = peek(gw, f"/limits/{shadow['name']}?header:X-A={a}")["key"]
    node = redis.Redis(port=cluster.owner(slot(cluster, key)))
    return gw, [("X-A", a), ("X-B", b)], key, node


def test_a_shadow_sliding_log_is_left_exactly_as_it_was_by_a_refused_request(sluice_factory,
                                                                             upstream,
                                                                             spread_cluster):
    """Issue 23, item 4. A shadow sliding_log (3 an hour, count_denied) that is full records a
    refused request by trimming its log to the newest 3 and adding the request's entry. When
    another slot refuses that request, nothing of it may stay: in a request split over slots
    the shadow log is only checked with its part and charged once the whole request is allowed,
    so a refused request leaves the log byte for byte as it was, with nothing to take back
    (before: the charge was taken back, and the entry the trim dropped was lost)."""
    cluster = spread_cluster
    shadow = limit_cfg("shadow", "sliding_log", 3, "1h", by=["header:X-A"], shadow=True,
                       count_denied=True)
    strict = limit_cfg("strict", "fixed_window", 4, "1h", by=["header:X-B"])
    gw, hdrs, key, node = _shadow_and_strict(sluice_factory, upstream, cluster, shadow, strict)

    def entries():
        return [int(t) for t in node.lrange(key, 0, -1)]

    for _ in range(4):  # the 4th is over the shadow log's 3: recorded as shadow_denied
        assert gw.get("/status/200", hdrs).status == 200
    # (each charged once its request was allowed: 3 entries, then the trim to 3 and the 4th's)
    deadline = time.monotonic() + 2
    while len(entries()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = entries()
    assert len(before) == 4, before
    done = metric_sum(gw, "sluice_valkey_compensations_total", result="done")
    r = gw.get("/status/200", hdrs)  # strict refuses: the shadow log must not change
    assert r.status == 429 and r.json()["violated-policies"] == ["strict"], r
    time.sleep(0.3)
    assert entries() == before
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="done") == done, \
        "nothing was charged, so nothing was taken back"
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="shadow",
                      outcome="shadow_denied") == 2


def test_a_shadow_token_bucket_take_back_restores_what_its_refusal_took(sluice_factory, upstream,
                                                                       spread_cluster):
    """Issue 23, item 4. A shadow token bucket (5 an hour, cost 4, count_denied) with 1 token
    left refuses a request and, counting it, empties itself (it took 1 token, not the cost's
    4); when another slot refuses that request, the take-back gives back exactly what the
    refusal took (the debt its reply named): 1 token again, never 4 more than it had (before
    this fix the cost's 4; then nothing, leaving it empty). What comes back is less the time
    the charge stood (the undo's rule), here milliseconds of a 720 s token."""
    cluster = spread_cluster
    shadow = limit_cfg("shadow_tb", "token_bucket", 5, "1h", by=["header:X-A"], cost=4,
                       shadow=True, count_denied=True)
    strict = limit_cfg("strict", "fixed_window", 1, "1h", by=["header:X-B"])
    gw, hdrs, key, node = _shadow_and_strict(sluice_factory, upstream, cluster, shadow, strict)
    from test_admin_limits import peek
    assert gw.get("/status/200", hdrs).status == 200  # 5 -> 1 token
    tat_before = int(node.get(key))
    assert peek(gw, f"/limits/shadow_tb?header:X-A={hdrs[0][1]}")["remaining"] == 1
    done = metric_sum(gw, "sluice_valkey_compensations_total", result="done")
    r = gw.get("/status/200", hdrs)  # strict refuses; the shadow bucket refused it too
    assert r.status == 429 and r.json()["violated-policies"] == ["strict"], r
    assert wait_compensations(gw, done + 1) >= done + 1, "the refusal's charge was not taken back"
    tat_after = int(node.get(key))
    assert tat_before <= tat_after <= tat_before + 1_000_000, \
        f"the take-back left TAT {tat_after - tat_before} us from where it was"
    assert peek(gw, f"/limits/shadow_tb?header:X-A={hdrs[0][1]}")["remaining"] == 1
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="shadow_tb",
                      outcome="shadow_denied") == 1
