"""Randomized: the gateway against a small reference model of each algorithm.

Random configurations (two limits of one algorithm on a route, random limits, costs, bursts,
count_denied and shadow, plans that raise or lower them for some API keys) and random request
sequences on shared keys (one address; API keys with and without plans; a header part that is
there or not) are decided by the gateway one request at a time and by the model below; every
answer (200 or 429, and the RateLimit remaining of an admitted request) and the counters left in
Valkey must agree. Windows are long (an hour, a day) so that nothing refills or ages out while a
sequence runs; the tests that exercise time are in test_ratelimit_algorithms.py.

Limit "a" of a fixed_window, sliding_window or token_bucket sequence is at times a cost_from
limit, and some requests' responses report costs up to 10^29: huge costs saturate at 10^15,
debts and counts at their ceilings (README "Cost from the response"), and the model with them.

On a 3-primary cluster too, with limits "a" and "b" in different slots: a request that one slot
refuses has its charges in the other taken back (shadow limits and count_denied ones included),
and the counters must still be the model's.

Bounded: SLUICE_MODEL_SECONDS (default 6) per algorithm (half on the cluster). The seed is
printed; SLUICE_MODEL_SEED replays one.
"""

import math
import os
import random
import time
from fractions import Fraction

import pytest
import redis

from conftest import (avoid_window_boundary, hashed_part, limit_cfg, limit_keys, metric_sum,
                      parse_rl_list, ratelimit_toml, route_cfg, server_time_us, sluice_with_limits,
                      stored, used, wait_admin)
from test_valkey_cluster import Cluster

ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"]
WINDOW = {"fixed_window": ("1h", 3600), "sliding_window": ("1h", 3600),
          "sliding_log": ("1h", 3600), "token_bucket": ("1d", 86400)}
API_KEYS = {"k-none": None, "k-one": "one", "k-two": "two"}  # API key -> plan (None: no plan)
USERS = ["u1", "u2", None]  # X-User values (None: absent, limit "b" does not apply)
FIELD = "X-Tokens-Used"
# What a response reports (None: no field, charged `cost`): small, huge, saturated, malformed.
REPORTS = [None, "0", "1", "4", "1000000000000", "300000000000000", "999999999999999",
           "1000000000000000", "123456789012345678901234567890", "abc"]
MAX_COST = 10**15  # a larger reported cost is charged this
MAX_DEBT_S = 2**31 - 1  # a token bucket's debt saturates here
MAX_COUNT = 2**52  # window counters saturate here


class Quota:
    """One limit as it applies to one request (its plan's override, if any)."""

    def __init__(self, cfg: dict, limit: int, burst: int):
        self.cfg, self.limit, self.burst = cfg, limit, burst
        self.later = bool(cfg.get("cost_from"))  # checked as cost 1, charged from the response
        self.cost = 1 if self.later else cfg.get("cost", 1)
        self.shadow = cfg.get("shadow", False)
        self.count_denied = cfg.get("count_denied", cfg["algorithm"] == "sliding_log")


class Model:
    """Counters as the contract defines them, per key: (limit name, key part). Nothing refills
    or ages out."""

    def __init__(self, algorithm: str, window_s: int, keep: dict):
        self.algorithm, self.window_s, self.keep = algorithm, window_s, keep
        self.state: dict = {}  # fixed/sliding window and log: count; bucket: debt (seconds)

    def fits(self, name: tuple, q: Quota) -> bool:
        used = self.state.get(name, 0)
        if self.algorithm == "token_bucket":  # GCRA in time: a token is window / limit
            token = Fraction(self.window_s, q.limit)
            return used + q.cost * token <= q.burst * token
        return used + q.cost <= q.limit

    def charge(self, name: tuple, q: Quota, allowed: bool) -> None:
        used = self.state.get(name, 0)
        if self.algorithm == "token_bucket":
            token = Fraction(self.window_s, q.limit)
            # A refused request that counts empties the bucket (never refills it).
            self.state[name] = (min(used + q.cost * token, MAX_DEBT_S) if allowed else
                                max(used, min(q.burst * token, MAX_DEBT_S)))
        elif self.algorithm == "sliding_log" and not allowed:
            # The newest `keep` + cost stay (a take-back of the cost leaves `keep`).
            self.state[name] = min(used + q.cost, self.keep[name[0]] + q.cost)
        else:
            self.state[name] = min(used + q.cost, MAX_COUNT)

    def force(self, name: tuple, q: Quota, report) -> None:
        """The charge of a cost_from limit when its response arrives: what it reports (digits
        only, saturated at MAX_COST), else `cost`; whether it fits or not."""
        cost = q.cfg.get("cost", 1)
        if report is not None and report.isdigit():
            cost = min(int(report), MAX_COST)
        if cost == 0:
            return
        used = self.state.get(name, 0)
        if self.algorithm == "token_bucket":
            self.state[name] = min(used + cost * Fraction(self.window_s, q.limit), MAX_DEBT_S)
        else:
            self.state[name] = min(used + cost, MAX_COUNT)

    def remaining(self, name: tuple, q: Quota) -> int:
        used = self.state.get(name, 0)
        if self.algorithm == "token_bucket":
            token = Fraction(self.window_s, q.limit)
            left = math.floor((q.burst * token - used) / token)
        else:
            left = q.limit - used
        return max(0, min(left, q.limit))

    def decide(self, quotas: dict) -> tuple:
        """All or nothing, as decide.lua, for {(limit name, key part): quota}: (allowed,
        {limit name: remaining} of an admitted request)."""
        fits = {n: self.fits(n, q) for n, q in quotas.items()}
        refused = any(not ok and not quotas[n].shadow for n, ok in fits.items())
        for n, q in quotas.items():
            if refused:
                charge = not fits[n] and not q.shadow and q.count_denied
            else:
                charge = fits[n] or q.count_denied
            if charge and not q.later:  # (a cost_from limit: charged from the response)
                self.charge(n, q, fits[n])
        if refused:
            return False, {}
        return True, {n[0]: self.remaining(n, q) for n, q in quotas.items() if not q.shadow}


def random_limit(rng: random.Random, name: str, algorithm: str, by: str) -> dict:
    limit = rng.randint(2, 9)
    cfg = limit_cfg(name, algorithm, limit, WINDOW[algorithm][0], by=[by])
    cfg["cost"] = rng.choice([1, 1, 2, 3]) if limit >= 3 else 1
    if algorithm == "token_bucket" and rng.random() < 0.5:
        cfg["burst"] = rng.randint(cfg["cost"], 12)
    if rng.random() < 0.5:
        cfg["count_denied"] = rng.random() < 0.5
    if rng.random() < 0.2:
        cfg["shadow"] = True
    return cfg


def random_plans(rng: random.Random, limits: list) -> list:
    plans = []
    for plan in ("one", "two"):
        overrides = {}
        for cfg in limits:
            if rng.random() < 0.7:
                value = rng.randint(cfg["cost"], 12)
                if cfg["algorithm"] == "token_bucket" and rng.random() < 0.4:
                    overrides[cfg["name"]] = {"limit": value, "burst": rng.randint(cfg["cost"], 12)}
                else:
                    overrides[cfg["name"]] = value
        plans.append({"name": plan, "limits": overrides})
    return plans


def quota_of(cfg: dict, plan: dict) -> Quota:
    """The plan's override, as the README says: an implicit burst follows the limit."""
    over = plan["limits"].get(cfg["name"]) if plan else None
    if over is None:
        return Quota(cfg, cfg["limit"], cfg.get("burst", cfg["limit"]))
    if isinstance(over, int):
        over = {"limit": over}
    burst = over.get("burst", cfg.get("burst", over["limit"]))
    return Quota(cfg, over["limit"], burst)


def run_sequence(sluice_factory, upstream, valkey, algorithm: str, rng: random.Random,
                 requests: int) -> int:
    limits = [random_limit(rng, "a", algorithm, "ip"),
              random_limit(rng, "b", algorithm, "header:X-User")]
    huge = algorithm != "sliding_log" and rng.random() < 0.5
    if huge:
        limits[0]["cost_from"] = f"response_header:{FIELD}"
    plans = random_plans(rng, limits)
    tenants = [{"name": f"t-{k}", "plan": p, "api_keys": [k]} if p else
               {"name": f"t-{k}", "api_keys": [k]} for k, p in API_KEYS.items()]
    valkey.client.flushall()
    if isinstance(valkey, ClusterStore):
        gw = sluice_factory(upstream, routes=[route_cfg("api", ["a", "b"])], workers=1,
                            extra_toml=ratelimit_toml(None, limits=limits, plans=plans,
                                                      tenants=tenants,
                                                      valkey_options=valkey.options))
        wait_admin(gw, "/ready", 200)
    else:
        gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, plans=plans,
                                tenants=tenants)
    window_s = WINDOW[algorithm][1]
    if algorithm in ("fixed_window", "sliding_window"):
        avoid_window_boundary(valkey.client, window_s, 60)
    by_plan = {p["name"]: p for p in plans}
    keep = {c["name"]: max([quota_of(c, p).limit for p in [None, *plans]]) for c in limits}
    model = Model(algorithm, window_s, keep)
    context = f"limits {limits}, plans {plans}"
    for i in range(requests):
        api_key = rng.choice([None, *API_KEYS])
        user = rng.choice(USERS)
        plan = by_plan.get(API_KEYS.get(api_key)) if api_key else None
        quotas = {("a", "127.0.0.1"): quota_of(limits[0], plan)}
        if user:
            quotas[("b", user)] = quota_of(limits[1], plan)
        headers = ([("X-API-Key", api_key)] if api_key else []) + ([("X-User", user)] if user else [])
        allowed, remaining = model.decide(quotas)
        report = rng.choice(REPORTS) if huge else None
        r = gw.get("/status/200" if report is None else f"/response-headers?{FIELD}={report}",
                   headers)
        where = (f"request {i} (key {api_key}, user {user}, reports {report}); {context}; "
                 f"model {model.state}")
        assert r.status == (200 if allowed else 429), f"{r.status}: {where}"
        if allowed and huge:
            model.force(("a", "127.0.0.1"), quotas[("a", "127.0.0.1")], report)
            wait_charged(valkey, algorithm, model)
        if allowed:
            shown = {n: v["r"] for n, v in parse_rl_list(r.header("ratelimit")).items()}
            assert shown == remaining, f"RateLimit {shown}, model {remaining}: {where}"
    check_counters(valkey, algorithm, model, context)
    if isinstance(valkey, ClusterStore):
        valkey.takebacks += metric_sum(gw, "sluice_valkey_compensations_total", result="done")
    gw.stop()
    return requests


def wait_charged(valkey, algorithm: str, model: Model) -> None:
    """Until limit "a" holds what the model says (its charge arrives with a later call)."""
    key = "rl:v2:a:{127.0.0.1}"
    expected = model.state.get(("a", "127.0.0.1"), 0)
    if expected == 0:
        return
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if algorithm == "token_bucket":
            debt_s = ((stored(valkey, key, algorithm) or 0) - server_time_us(valkey.client)) / 1e6
            if debt_s >= float(expected) - 120:
                return
        elif used(valkey, key, algorithm, WINDOW[algorithm][1]) == expected:
            return
        time.sleep(0.005)


def check_counters(valkey, algorithm: str, model: Model, context: str) -> None:
    """What Valkey holds under each key the model knows (and nothing else)."""
    c = valkey.client
    seen = []
    window_s = WINDOW[algorithm][1]
    for (name, part), expected in sorted(model.state.items()):
        # "a" is keyed by address (readable), "b" by header:X-User (hashed).
        key = f"rl:v2:{name}:{{{hashed_part(part) if name == 'b' else part}}}"
        seen.append(key)
        # (a take-back goes out after its refusal is answered: the last may still be on its way)
        deadline = time.monotonic() + 3
        if algorithm == "token_bucket":
            def debt():
                return ((stored(valkey, key, algorithm) or 0) - server_time_us(c)) / 1e6
            debt_s = debt()
            while debt_s > float(expected) + 0.001 and time.monotonic() < deadline:
                time.sleep(0.01)
                debt_s = debt()
            # The model lets nothing refill; the bucket did, for the seconds the test took.
            assert float(expected) - 120 <= debt_s <= float(expected) + 0.001, \
                f"{key}: TAT {debt_s:.3f} s ahead, model {float(expected):.3f}; {context}"
            continue
        got = used(valkey, key, algorithm, window_s)
        while got != expected and time.monotonic() < deadline:
            time.sleep(0.01)
            got = used(valkey, key, algorithm, window_s)
        assert got == expected, f"{key}: Valkey {got}, model {expected}; {context}"
    # A key the model never charged may exist only as a take-back left it: empty.
    deadline = time.monotonic() + 3
    while True:
        left = [k for k in sorted(set(limit_keys(c, "rl:v2:*")) - set(seen)) if not emptied(
            valkey, k, algorithm)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert left == [], f"keys the model does not know: {left}; {context}"


def emptied(valkey, key: str, algorithm: str) -> bool:
    if algorithm == "token_bucket":
        return (stored(valkey, key, algorithm) or 0) <= server_time_us(valkey.client)
    return used(valkey, key, algorithm, WINDOW[algorithm][1]) == 0


def run_model(sluice_factory, upstream, valkey, algorithm: str, budget: float,
              enough=lambda: True, more: float = 0) -> None:
    """Random configurations for `budget` seconds, and on (at most `more` seconds) until
    enough()."""
    seed = int(os.environ.get("SLUICE_MODEL_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"\nseed {seed} (SLUICE_MODEL_SEED={seed} replays it), {budget} s")
    rng = random.Random(f"{algorithm}-{seed}")
    deadline = time.monotonic() + budget
    sequences = decided = 0
    while (sequences == 0 or time.monotonic() < deadline or
           (not enough() and time.monotonic() < deadline + more)):
        decided += run_sequence(sluice_factory, upstream, valkey, algorithm, rng, 60)
        sequences += 1
    print(f"{algorithm}: {sequences} configurations, {decided} requests agreed")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gateway_decides_as_the_model(sluice_factory, upstream, valkey, algorithm):
    run_model(sluice_factory, upstream, valkey, algorithm,
              float(os.environ.get("SLUICE_MODEL_SECONDS", "6")))


class ClusterStore:
    """A 3-primary cluster where the model's checks read through a cluster client (what
    `valkey` offers them: client, new_client) and the gateway is configured by `options`."""

    def __init__(self, cluster: Cluster):
        self.port = cluster.ports[0]
        self.client = self.new_client(decode_responses=True)
        self.options = {"nodes": [f"127.0.0.1:{self.port}"], "key_prefix": "rl:v2"}
        self.takebacks = 0

    def new_client(self, decode_responses=True):
        return redis.RedisCluster(host="127.0.0.1", port=self.port,
                                  decode_responses=decode_responses)


@pytest.fixture
def model_cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gateway_decides_as_the_model_across_cluster_slots(sluice_factory, upstream,
                                                           model_cluster, algorithm):
    """Limit "a" (the address) and "b" (X-User) live in different slots for some users, so a
    refusal in one is a take-back in the other, which must leave the model's counters."""
    store = ClusterStore(model_cluster)
    slot_a = store.client.keyslot("rl:v2:a:{127.0.0.1}")
    other = [u for u in USERS if u and
             model_cluster.owner(store.client.keyslot(f"rl:v2:b:{{{hashed_part(u)}}}")) !=
             model_cluster.owner(slot_a)]
    assert other, "every user's key is on the address key's primary"
    run_model(sluice_factory, upstream, store, algorithm,
              float(os.environ.get("SLUICE_MODEL_SECONDS", "6")) / 2,
              enough=lambda: store.takebacks >= 10, more=30)
    print(f"{store.takebacks:.0f} take-backs")
    assert store.takebacks >= 10, "too few requests were taken back in another slot"
