"""Operations: GET /metrics after real traffic. The text is validated by Debian's
`promtool check metrics` (package `prometheus`; the test fails without it) and by a strict parser
of our own (every sample belongs to a family with a TYPE, no series twice, histograms
cumulative), and the values are checked against the traffic that was sent: requests by route and
status, decisions by limit and outcome, Valkey latency / errors / reconnects, upstream latency and
errors, open connections, and counters summed over workers."""

import json
import math
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import (free_port, limit_cfg, metric_sum, parallel_requests, ratelimit_toml,
                      route_cfg, sluice_with_limits, wait_admin)
from harness.gateway import wait_until
from rawhttp import RawClient, build_request

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"(,|$)')


class Metrics:
    """A strict parse of the Prometheus text format as Sluice writes it."""

    def __init__(self, text: str):
        self.text = text
        self.types: dict = {}
        self.samples: list = []  # (name, {label: value}, float)
        seen = set()
        assert text.endswith("\n"), "exposition must end with a newline"
        for line in text.splitlines():
            assert line, "empty line in the exposition"
            if line.startswith("# HELP "):
                continue
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                assert name not in self.types, f"TYPE of {name} given twice"
                self.types[name] = kind
                continue
            assert not line.startswith("#"), f"unexpected comment {line!r}"
            m = _SAMPLE.match(line)
            assert m, f"bad sample line {line!r}"
            name, raw_labels, value = m.group(1), m.group(2) or "", m.group(3)
            labels = {}
            pos = 0
            while pos < len(raw_labels):
                lm = _LABEL.match(raw_labels, pos)
                assert lm, f"bad labels in {line!r}"
                assert lm.group(1) not in labels, f"label given twice in {line!r}"
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
            family = self.family_of(name)
            assert family in self.types, f"sample {name} without a TYPE"
            key = (name, tuple(sorted(labels.items())))
            assert key not in seen, f"series given twice: {line!r}"
            seen.add(key)
            self.samples.append((name, labels, float(value)))

    def family_of(self, name: str) -> str:
        if name in self.types:
            return name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and self.types.get(name[: -len(suffix)]) == "histogram":
                return name[: -len(suffix)]
        return name

    def get(self, name: str, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels` (exactly these values)."""
        return sum(v for n, l, v in self.samples
                   if n == name and all(l.get(k) == str(x) for k, x in labels.items()))

    def series(self, name: str) -> list:
        return [(l, v) for n, l, v in self.samples if n == name]

    def check_histogram(self, name: str, **labels) -> dict:
        """Buckets of one histogram series: increasing `le`, cumulative (never decreasing),
        +Inf last and equal to _count; _sum >= 0. Returns {le: count} and count/sum."""
        assert self.types.get(name) == "histogram", f"{name} is not a histogram: {self.types.get(name)}"
        buckets = [(l["le"], v) for l, v in self.series(name + "_bucket")
                   if {k: l.get(k) for k in labels} == {k: str(x) for k, x in labels.items()}
                   and set(l) == set(labels) | {"le"}]
        assert buckets, f"no buckets for {name}{labels}"
        assert buckets[-1][0] == "+Inf", f"+Inf bucket not last: {buckets}"
        bounds = [float(le) for le, _ in buckets[:-1]]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), bounds
        counts = [v for _, v in buckets]
        assert all(a <= b for a, b in zip(counts, counts[1:])), f"buckets not cumulative: {buckets}"
        count = self.get(name + "_count", **labels)
        total = self.get(name + "_sum", **labels)
        assert counts[-1] == count, f"+Inf bucket {counts[-1]} != _count {count}"
        assert total >= 0 and math.isfinite(total)
        return {"buckets": dict(buckets), "count": count, "sum": total}


def scrape(gw, requests=None, timeout=2.0) -> Metrics:
    """GET /metrics, parsed. With `requests`: first waits (up to timeout) until
    sluice_requests_total adds up to that number. A request is counted when its response has been
    handed to the socket, so a client may read the response a moment before the count moves."""
    deadline = time.monotonic() + timeout
    while True:
        status, text = gw.admin_get("/metrics")
        assert status == 200, text
        m = Metrics(text)
        if requests is None or m.get("sluice_requests_total") == requests \
                or time.monotonic() > deadline:
            return m
        time.sleep(0.01)


def promtool_check(text: str) -> None:
    """`promtool check metrics` must accept the exposition with no lint problem at all."""
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail("promtool not found (Debian: apt-get install prometheus): /metrics cannot be "
                    "validated", pytrace=False)
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        f"promtool check metrics: rc={p.returncode}\n{p.stdout}{p.stderr}\n--- input ---\n{text}"


EXPECTED_FAMILIES = {
    "sluice_requests_total": "counter",
    "sluice_ratelimit_decisions_total": "counter",
    "sluice_valkey_latency_seconds": "histogram",
    "sluice_valkey_errors_total": "counter",
    "sluice_valkey_calls_total": "counter",
    "sluice_valkey_reconnects_total": "counter",
    "sluice_upstream_latency_seconds": "histogram",
    "sluice_upstream_errors_total": "counter",
    "sluice_connections_open": "gauge",
    "sluice_connections_total": "counter",
    "sluice_config_reloads_total": "counter",
    "sluice_access_log_dropped_total": "counter",
    "sluice_ready": "gauge",
}


# ------------------------------------------------------------------ requests and decisions

def test_metrics_after_traffic_pass_promtool_and_count_routes_statuses_decisions(
        sluice_factory, upstream, valkey):
    """3 requests -> 200 and 2 -> 429 on route "api" (limit 3, count_denied: never answered from
    the deny cache, so each is one Valkey call), 1 -> 404 with route="", 3 on a shadow limit of 1
    -> 1 allowed + 2 shadow_denied, all forwarded."""
    limits = [limit_cfg("per_client", "fixed_window", 3, "1h", by=["header:X-Client"],
                        count_denied=True),
              limit_cfg("shadowed", "sliding_window", 1, "1h", by=["header:X-Client"],
                        shadow=True)]
    # No catch-all route: /nope is the gateway's 404.
    routes = [route_cfg("api", ["per_client"], match={"path_prefix": "/echo"}),
              route_cfg("preview", ["shadowed"], match={"path_prefix": "/status/"})]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, routes)
    before = scrape(gw)
    assert before.get("sluice_valkey_latency_seconds_count") == 0
    assert before.get("sluice_requests_total") == 0

    statuses = [gw.get("/echo", [("X-Client", "m1")]).status for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    assert gw.get("/nope").status == 404
    statuses = [gw.get("/status/200", [("X-Client", "m1")]).status for _ in range(3)]
    assert statuses == [200, 200, 200], "a shadow limit refused"

    m = scrape(gw, requests=9)
    promtool_check(m.text)
    for name, kind in EXPECTED_FAMILIES.items():
        assert m.types.get(name) == kind, f"{name}: TYPE {m.types.get(name)!r}, want {kind}"

    assert m.get("sluice_requests_total", route="api", status="200") == 3
    assert m.get("sluice_requests_total", route="api", status="429") == 2
    assert m.get("sluice_requests_total", route="", status="404") == 1
    assert m.get("sluice_requests_total", route="preview", status="200") == 3
    assert m.get("sluice_requests_total") == 9, m.series("sluice_requests_total")

    assert m.get("sluice_ratelimit_decisions_total", limit="per_client", outcome="allowed") == 3
    assert m.get("sluice_ratelimit_decisions_total", limit="per_client", outcome="denied") == 2
    assert m.get("sluice_ratelimit_decisions_total", limit="shadowed", outcome="allowed") == 1
    assert m.get("sluice_ratelimit_decisions_total", limit="shadowed", outcome="shadow_denied") == 2
    assert m.get("sluice_ratelimit_decisions_total", limit="shadowed", outcome="denied") == 0
    assert m.get("sluice_ratelimit_decisions_total") == 8

    # One Valkey call per decided request (one at a time here): the histogram grew by exactly
    # the decisions.
    h = m.check_histogram("sluice_valkey_latency_seconds")
    assert h["count"] == 8, h
    assert m.get("sluice_valkey_calls_total") == 8
    assert 0 < h["sum"] < 8 * 1.0, h  # each below the 1 s deadline
    assert m.get("sluice_valkey_errors_total") == 0

    # Upstream latency: the 6 forwarded requests.
    u = m.check_histogram("sluice_upstream_latency_seconds", upstream="app")
    assert u["count"] == 6, u
    assert m.get("sluice_upstream_errors_total") == 0
    assert m.get("sluice_ready") == 1
    assert m.get("sluice_config_reloads_total", result="success") == 0
    assert m.get("sluice_config_reloads_total", result="failure") == 0
    assert m.get("sluice_connections_total") == 9  # request_once: one connection each

    # The histogram keeps growing by the number of decisions.
    for i in range(4):
        assert gw.get("/echo", [("X-Client", f"more{i}")]).status == 200
    assert scrape(gw).check_histogram("sluice_valkey_latency_seconds")["count"] == 12


def test_metrics_on_error_outcomes_with_valkey_unreachable(sluice_factory, upstream):
    """Nothing listens on the Valkey port: every decision is error_allowed (on_error = allow) or
    error_denied (on_error = deny, 503), and each is a not_connected Valkey error."""
    limits = [limit_cfg("open", "fixed_window", 5, "1h", on_error="allow"),
              limit_cfg("closed", "fixed_window", 5, "1h", on_error="deny")]
    routes = [route_cfg("fail_open", ["open"], match={"host": "open.test"}),
              route_cfg("fail_closed", ["closed"], match={"host": "closed.test"})]
    gw = sluice_factory(upstream, routes=routes,
                        extra_toml=ratelimit_toml(free_port(), limits=limits,
                                                  valkey_options={"timeout": "25ms"}))
    assert [gw.get("/echo", [("Host", "open.test")]).status for _ in range(4)] == [200] * 4
    assert [gw.get("/echo", [("Host", "closed.test")]).status for _ in range(3)] == [503] * 3
    m = scrape(gw, requests=7)
    promtool_check(m.text)
    assert m.get("sluice_ratelimit_decisions_total", limit="open", outcome="error_allowed") == 4
    assert m.get("sluice_ratelimit_decisions_total", limit="closed", outcome="error_denied") == 3
    assert m.get("sluice_ratelimit_decisions_total", outcome="allowed") == 0
    assert m.get("sluice_requests_total", route="fail_open", status="200") == 4
    assert m.get("sluice_requests_total", route="fail_closed", status="503") == 3
    assert m.get("sluice_valkey_errors_total", kind="not_connected") == 7
    assert m.get("sluice_valkey_latency_seconds_count") == 0
    assert m.get("sluice_ready") == 0
    assert gw.admin_get("/ready")[0] == 503


def test_metrics_valkey_timeout_unresponsive_and_reconnects(sluice_factory, upstream, valkey):
    """A paused Valkey (SIGSTOP): the first decision runs into its deadline (kind="timeout"), the
    next ones fail fast (unresponsive / not_connected). A restarted Valkey: exactly one more
    reconnection (one worker)."""
    limits = [limit_cfg("lim", "fixed_window", 100, "1h", by=["header:X-Client"],
                        count_denied=True, on_error="allow")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            valkey_options={"timeout": "100ms"})
    assert gw.get("/echo", [("X-Client", "a")]).status == 200
    m = scrape(gw)
    assert m.get("sluice_valkey_errors_total") == 0
    assert m.get("sluice_valkey_reconnects_total") == 0

    valkey.pause()
    try:
        t0 = time.monotonic()
        assert gw.get("/echo", [("X-Client", "b")]).status == 200
        waited = time.monotonic() - t0
        assert waited >= 0.09, f"a decision on a paused Valkey took only {waited:.3f}s"
        assert metric_sum(gw, "sluice_valkey_errors_total", kind="timeout") == 1
        for i in range(3):
            assert gw.get("/echo", [("X-Client", f"c{i}")]).status == 200
        m = scrape(gw)
        assert m.get("sluice_valkey_errors_total", kind="timeout") == 1
        fast = (m.get("sluice_valkey_errors_total", kind="unresponsive") +
                m.get("sluice_valkey_errors_total", kind="not_connected"))
        assert fast == 3, m.series("sluice_valkey_errors_total")
        assert m.get("sluice_ratelimit_decisions_total", outcome="error_allowed") == 4
    finally:
        valkey.resume()
    wait_admin(gw, "/ready", 200, timeout=10)
    time.sleep(0.2)
    reconnects = metric_sum(gw, "sluice_valkey_reconnects_total")

    valkey.kill()
    wait_admin(gw, "/ready", 503, timeout=5)
    valkey.start()
    wait_admin(gw, "/ready", 200, timeout=10)
    assert metric_sum(gw, "sluice_valkey_reconnects_total") == reconnects + 1
    assert gw.get("/echo", [("X-Client", "after")]).status == 200
    m = scrape(gw)
    promtool_check(m.text)
    assert m.get("sluice_ratelimit_decisions_total", outcome="allowed") == 2


# ------------------------------------------------------------------ upstreams

def test_metrics_upstream_latency_and_errors_by_kind(sluice_factory, upstream_factory):
    good = upstream_factory("good")
    slow = upstream_factory("slow")
    resetter = upstream_factory("resetter")
    upstreams = [
        {"name": "good", "endpoints": [good]},
        {"name": "dead", "endpoints": [free_port()], "fail_timeout": "0s"},
        {"name": "slowup", "endpoints": [slow], "response_timeout": "300ms"},
        {"name": "resetter", "endpoints": [resetter]},
    ]
    routes = [route_cfg("to_dead", upstream="dead", match={"host": "dead.test"}),
              route_cfg("to_slow", upstream="slowup", match={"host": "slow.test"}),
              route_cfg("to_reset", upstream="resetter", match={"host": "reset.test"}),
              route_cfg("to_good", upstream="good")]
    gw = sluice_factory(upstreams=upstreams, routes=routes)

    for _ in range(3):
        assert gw.get("/echo").status == 200
    r = gw.get("/slow/250")
    assert r.status == 200 and r.json()["slept_ms"] == 250
    assert [gw.get("/echo", [("Host", "dead.test")]).status for _ in range(2)] == [502, 502]
    assert gw.get("/hang", [("Host", "slow.test")]).status == 504
    assert gw.get("/close-now", [("Host", "reset.test")]).status == 502

    m = scrape(gw, requests=8)
    promtool_check(m.text)
    assert m.get("sluice_upstream_errors_total", upstream="dead", kind="connect_failed") == 2
    assert m.get("sluice_upstream_errors_total", upstream="slowup", kind="response_timeout") == 1
    assert m.get("sluice_upstream_errors_total", upstream="resetter", kind="reset") == 1
    assert m.get("sluice_upstream_errors_total", upstream="good") == 0
    assert m.get("sluice_upstream_errors_total") == 4, m.series("sluice_upstream_errors_total")

    h = m.check_histogram("sluice_upstream_latency_seconds", upstream="good")
    assert h["count"] == 4, h
    assert h["sum"] >= 0.25, h
    assert h["buckets"]["0.25"] <= 3, h  # the 250 ms response is not below 0.25 s
    assert h["buckets"]["2.5"] == 4, h
    assert m.get("sluice_requests_total", route="to_dead", status="502") == 2
    assert m.get("sluice_requests_total", route="to_slow", status="504") == 1
    assert m.get("sluice_requests_total", route="to_reset", status="502") == 1

    # Upstream connections and requests, by upstream and protocol (every upstream's series from
    # the load): four requests to good over its pooled keep-alive connection(s), none to dead.
    def up(name, upstream):
        return m.get(name, upstream=upstream, protocol="http1")
    assert up("sluice_upstream_requests_total", "good") == 4
    assert 1 <= up("sluice_upstream_connections_total", "good") <= 4
    assert up("sluice_upstream_connections_open", "good") >= 1
    assert up("sluice_upstream_connections_total", "dead") == 0
    assert up("sluice_upstream_requests_total", "dead") == 0
    assert up("sluice_upstream_connections_open", "dead") == 0
    assert up("sluice_upstream_requests_total", "resetter") == 1
    assert up("sluice_upstream_connections_total", "resetter") == 1
    # The connection the upstream cut and the one that timed out are closed, not pooled.
    open_now = wait_until(lambda: [metric_sum(gw, "sluice_upstream_connections_open", upstream=u)
                                   for u in ("resetter", "slowup")], lambda v: v == [0, 0])
    assert open_now == [0, 0], open_now
    assert {l["protocol"] for l, _ in m.series("sluice_upstream_connections_total")} == {"http1"}


# ------------------------------------------------------------------ connections

def test_metrics_connections_open_follows_idle_keepalive_connections(sluice_factory, upstream):
    gw = sluice_factory(upstream)
    assert metric_sum(gw, "sluice_connections_open") == 0
    clients = [RawClient(gw.port) for _ in range(3)]
    try:
        for c in clients:
            c.request("GET", "/echo")
            r = c.read_response()
            assert r.status == 200 and "close" not in r.connection_tokens()
        assert metric_sum(gw, "sluice_connections_open") == 3
        assert metric_sum(gw, "sluice_connections_total") == 3
    finally:
        for c in clients:
            c.close()
    deadline = time.monotonic() + 3
    while metric_sum(gw, "sluice_connections_open") != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric_sum(gw, "sluice_connections_open") == 0
    assert metric_sum(gw, "sluice_connections_total") == 3


# ------------------------------------------------------------------ several workers

def test_metrics_counters_are_summed_over_two_workers(sluice_factory, upstream_factory, valkey,
                                                      tmp_path):
    """workers = 2, 240 one-request connections from 4 processes: both workers served (two
    request-id prefixes in the access log), and every counter is the total. (The test upstream
    gets a deep accept queue: 240 requests at once open many pooled connections.)"""
    upstream = upstream_factory("app", backlog=1024)
    log_path = tmp_path / "access.jsonl"
    limits = [limit_cfg("wide", "fixed_window", 100000, "1h", by=["header:X-Run"],
                        count_denied=True)]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, workers=2,
                            log={"access_log": str(log_path)},
                            upstream_options={"connect_timeout": "3s"})
    n = 240
    raw = build_request("GET", "/echo", [("X-Run", "sum"), ("Connection", "close")])
    results = parallel_requests(gw.port, [raw] * n, processes=4)
    assert [s for s, _ in results] == [200] * n

    m = scrape(gw, requests=n)
    promtool_check(m.text)
    assert m.get("sluice_requests_total", route="api", status="200") == n
    assert m.get("sluice_connections_total") == n
    assert m.get("sluice_ratelimit_decisions_total", limit="wide", outcome="allowed") == n
    # One observation per Valkey call; concurrent decisions of a worker share calls.
    calls = m.get("sluice_valkey_calls_total")
    assert 2 <= calls <= n
    assert m.check_histogram("sluice_valkey_latency_seconds")["count"] == calls
    assert m.check_histogram("sluice_upstream_latency_seconds", upstream="app")["count"] == n
    assert upstream.request_count == n

    deadline = time.monotonic() + 5
    lines = []
    while time.monotonic() < deadline:
        lines = log_path.read_text().splitlines()
        if len(lines) >= n:
            break
        time.sleep(0.05)
    assert len(lines) == n
    prefixes = {json.loads(l)["request_id"].rsplit("-", 1)[0] for l in lines}
    assert len(prefixes) == 2, f"not both workers served: {prefixes}"
