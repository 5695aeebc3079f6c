"""The dashboard of the local stack: `promtool check config` (Debian's package `prometheus`; the
test fails without it) accepts conf/prometheus/prometheus.yml, which scrapes the admin listener of
the compose service `sluice`; the Grafana provisioning files parse and point at the paths and the
datasource that docker-compose.yml and the dashboard use; and every metric that a PromQL
expression of conf/grafana/dashboards/sluice.json names (and every label it selects or groups by)
is one that a real Sluice exposes on GET /metrics after real traffic, a refusal included."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import REPO, free_port, limit_cfg, route_cfg, sluice_with_limits
from harness.h2client import open_h2
from test_operations_metrics import Metrics, scrape

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS_YML = REPO / "conf" / "prometheus" / "prometheus.yml"
GRAFANA = REPO / "conf" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "sluice.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "sluice.yml"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Words of PromQL that look like identifiers but name no metric.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "atan2", "inf", "nan"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r'\$\{[^}]*\}|\[\[[^\]]*\]\]|\$[A-Za-z_][A-Za-z0-9_]*')
_GROUPING = re.compile(r'\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)')
_SELECTOR = re.compile(r'(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}')
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*""')
_IDENT = re.compile(r'(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?')
_COUNTER_FUNCS = re.compile(r'\b(rate|irate|increase|resets)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)')


def parse_promql(expr: str) -> tuple:
    """(metric names, {metric: label names selected in its braces}, label names grouped by) of a
    PromQL expression as Grafana stores it ($variables allowed). Names are identifiers followed
    by `{` or `[`, or bare (inside functions or alone); function names, keywords, numbers,
    durations, strings and the label lists of by/without/on/ignoring/group_* are not."""
    s = _STRING.sub('""', expr)          # matcher values: "$route", "denied|error_denied", ...
    s = _GRAFANA_VAR.sub("1m", s)       # $__rate_interval, ${limit}, [[x]]: a duration or value
    s = re.sub(r'\[[^\[\]]*\]', " ", s)  # range and subquery selectors
    grouped = set()
    for m in _GROUPING.finditer(s):
        grouped.update(l.strip() for l in m.group(2).split(",") if l.strip())
    s = _GROUPING.sub(" ", s)  # `sum by (le) (x)` -> `sum  (x)`: sum stays a call
    selected = {}
    for m in _SELECTOR.finditer(s):
        selected.setdefault(m.group(1), set()).update(_MATCHER.findall(m.group(2)))
    assert not re.search(r'\{\s*[^}\s]', _SELECTOR.sub(r"\1 ", s)), \
        f"a selector without a metric name ({{__name__=...}}) in {expr!r}: name it"
    s = _SELECTOR.sub(r"\1 ", s)
    names = set()
    for m in _IDENT.finditer(s):
        name, call = m.group(1), m.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names, selected, grouped


def test_parse_promql_finds_metrics_not_functions_labels_or_variables():
    names, selected, grouped = parse_promql(
        'histogram_quantile(0.99, sum by (upstream, le) (rate(x_bucket{a="b", c=~"$route"}'
        '[$__rate_interval]))) / on (instance) group_left ignoring(z) y_total offset 5m'
        ' + sum without(k) (z) * 2e3 > bool 0.5 and sum(rate(w[1m:10s]))')
    assert names == {"x_bucket", "y_total", "z", "w"}, names
    assert selected == {"x_bucket": {"a", "c"}}, selected
    assert grouped == {"upstream", "le", "instance", "z", "k"}, grouped
    names, selected, grouped = parse_promql(
        'sum by (limit) (rate(d_total{limit=~"${limit}",outcome=~"denied|error_denied"}[5m]))\n'
        '/\nsum by (limit) (rate(d_total{limit=~"${limit}"}[$__range]))')
    assert names == {"d_total"} and selected == {"d_total": {"limit", "outcome"}}, (names, selected)
    assert grouped == {"limit"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))  # panels of a collapsed row


def dashboard_queries(d: dict) -> list:
    """(where, PromQL expression) of every query of dashboard `d`, panels and variables."""
    queries = []
    for p in all_panels(d["panels"]):
        for t in p.get("targets", []):
            assert t.get("expr", "").strip(), f"panel {p['title']!r}: target without expr: {t}"
            queries.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r'\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_]\w*)\s*\)\s*', q)
        assert m, f"variable ${v['name']}: want label_values(metric, label), got {q!r}"
        # label_values(sel, label): the selector must name the metric and the label must be its.
        queries.append((f"variable ${v['name']}", f"sum by ({m.group(2)}) ({m.group(1)})"))
    return queries


def family_of(name: str, types: dict) -> str:
    if name in types:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) == "histogram":
            return base
    return ""


def check_dashboard_against(m: Metrics, d: dict) -> list:
    """What dashboard `d` asks for that this exposition lacks (empty: nothing)."""
    problems = []
    labels_of = {}  # family -> label names seen on its samples
    for name, labels, _ in m.samples:
        labels_of.setdefault(m.family_of(name), set()).update(labels)
    for where, expr in dashboard_queries(d):
        names, selected, grouped = parse_promql(expr)
        if not names:
            problems.append(f"{where}: names no metric: {expr!r}")
        families = set()
        for name in sorted(names):
            family = family_of(name, m.types)
            if not family:
                problems.append(f"{where}: {name} is not exposed by Sluice")
                continue
            families.add(family)
            if m.types[family] == "histogram" and name == family:
                problems.append(f"{where}: histogram {name} queried without _bucket/_sum/_count")
            if name.endswith("_bucket") and m.types[family] == "histogram" \
                    and "histogram_quantile" in expr and "le" not in grouped:
                problems.append(f"{where}: {name} aggregated without keeping le")
        for fn, name in _COUNTER_FUNCS.findall(_STRING.sub('""', expr)):
            family = family_of(name, m.types)
            if family and m.types[family] == "gauge":
                problems.append(f"{where}: {fn}() of the gauge {name}")
        for name, labels in selected.items():
            family = family_of(name, m.types)
            known = labels_of.get(family)
            if family and known is not None:
                extra = labels - known - TARGET_LABELS - ({"le"} if name.endswith("_bucket") else set())
                if extra:
                    problems.append(f"{where}: {name} has no label {sorted(extra)} "
                                    f"(it has {sorted(known)})")
        # by (...) labels: each must be a label of at least one queried family that has samples.
        known = set(TARGET_LABELS)
        sampled = [f for f in families if f in labels_of]
        for f in sampled:
            known |= labels_of[f]
        if any(m.types.get(f) == "histogram" for f in families):
            known.add("le")
        if sampled and grouped - known:
            problems.append(f"{where}: grouped by unknown label(s) {sorted(grouped - known)} "
                            f"(the queried metrics have {sorted(known)})")
    return problems


# ------------------------------------------------------------------ Prometheus

def test_promtool_accepts_the_prometheus_configuration():
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail("promtool not found (Debian: apt-get install prometheus): "
                    "conf/prometheus/prometheus.yml cannot be checked", pytrace=False)
    p = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS_YML)], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, f"promtool check config: rc={p.returncode}\n{p.stdout}{p.stderr}"
    assert "SUCCESS" in p.stdout, p.stdout + p.stderr


def compose_services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def mounts(service: dict) -> dict:
    """host path (relative to the repo, `./` dropped) -> (container path, options)."""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split(":")
        if parts[0].startswith("./"):
            out[parts[0][2:]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def test_prometheus_scrapes_the_admin_listener_of_the_compose_sluice():
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    toml = (REPO / "conf" / "docker" / "sluice.toml").read_text()
    admin = re.search(r'^\[admin\]\s*\n(?:#.*\n|\s*\n)*listen\s*=\s*"([^"]+)"', toml, re.M)
    assert admin, "no [admin] listen in conf/docker/sluice.toml"
    admin_port = admin.group(1).rsplit(":", 1)[1]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    job = jobs["sluice"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"sluice:{admin_port}"], targets
    assert cfg["global"]["scrape_interval"] == "5s"

    services = compose_services()
    assert "sluice" in services
    prom = services["prometheus"]
    assert prom["image"].startswith("prom/prometheus:")
    assert mounts(prom)["conf/prometheus/prometheus.yml"] == ("/etc/prometheus/prometheus.yml", "ro")
    assert prom["ports"] == ["127.0.0.1:9090:9090"]


# ------------------------------------------------------------------ Grafana provisioning

def test_grafana_provisioning_points_at_prometheus_and_the_dashboard():
    services = compose_services()
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    m = mounts(grafana)
    assert m["conf/grafana/provisioning"] == ("/etc/grafana/provisioning", "ro"), m
    dashboards_dir, _ = m["conf/grafana/dashboards"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{dashboards_dir}/sluice.json"

    # Grafana reads every file of provisioning/datasources and provisioning/dashboards.
    ds = yaml.safe_load(DATASOURCES.read_text())
    assert ds["apiVersion"] == 1
    [source] = ds["datasources"]
    assert source["type"] == "prometheus"
    prom_port = services["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{prom_port}", source["url"]
    assert source["access"] == "proxy" and source["isDefault"] is True
    assert source["jsonData"]["timeInterval"] == yaml.safe_load(
        PROMETHEUS_YML.read_text())["global"]["scrape_interval"]

    prov = yaml.safe_load(PROVIDERS.read_text())
    assert prov["apiVersion"] == 1
    [provider] = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == dashboards_dir, (provider, dashboards_dir)

    # The dashboard: every panel and query on that datasource, ids unique, inside the grid.
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in all_panels(d["panels"])]
    assert len(ids) == len(set(ids)), ids
    for p in all_panels(d["panels"]):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat"), (p["title"], p["type"])
        assert p["datasource"] == {"type": "prometheus", "uid": source["uid"]}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == source["uid"], (p["title"], t)
    for v in d["templating"]["list"]:
        assert v["datasource"]["uid"] == source["uid"], v["name"]
    titles = {p["title"] for p in all_panels(d["panels"])}
    for want in ("Requests by route and status", "Decisions by limit and outcome",
                 "Refused share per limit", "Valkey latency", "Upstream latency",
                 "Open connections"):
        assert want in titles, (want, sorted(titles))


# ------------------------------------------------------------------ queries against a real Sluice

def pb_field(number, data):
    """A length-delimited protobuf field (lengths below 128 here)."""
    return bytes([number << 3 | 2, len(data)]) + data


def test_every_metric_the_dashboard_queries_is_exposed_by_sluice(sluice_factory, upstream, valkey,
                                                                tmp_path):
    """A gateway with a limit of 2 on route "api" and one on route "other": 2 allowed, 1 refused
    (429), 1 allowed on "other", a 404 (no route), a 502 (an upstream nobody listens on), a gRPC
    call with no route (grpc-status 12) and a ShouldRateLimit call to its [rls] listener. Then
    every metric of every dashboard query must be in its GET /metrics, with the labels it selects
    and groups by (checked on the families that have samples); and a bogus metric must be
    caught."""
    limits = [limit_cfg("per_client", "fixed_window", 2, "1h", by=["header:X-Client"]),
              limit_cfg("per_ip", "sliding_window", 100, "1m")]
    routes = [route_cfg("api", ["per_client"], match={"path_prefix": "/echo"}),
              route_cfg("other", ["per_ip"], match={"path_prefix": "/status/"}),
              route_cfg("broken", ["per_ip"], match={"path_prefix": "/broken"}, upstream="dead")]
    upstreams = [{"name": "app", "endpoints": [upstream]},
                 {"name": "dead", "endpoints": [free_port()], "fail_timeout": "0s"}]
    (tmp_path / "ratelimit").mkdir()
    (tmp_path / "ratelimit" / "edge.yaml").write_text(
        "domain: edge\ndescriptors:\n  - key: remote_address\n"
        "    rate_limit: {unit: hour, requests_per_unit: 5}\n")
    rls_port = free_port()
    gw = sluice_with_limits(sluice_factory, None, valkey, limits, routes, upstreams=upstreams,
                            extra_toml=f'[rls]\nlisten = "127.0.0.1:{rls_port}"\n'
                                       'config = "ratelimit"\n')
    statuses = [gw.get("/echo", [("X-Client", "d1")]).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert gw.get("/status/200").status == 200
    assert gw.get("/nope").status == 404
    assert gw.get("/broken").status == 502
    with open_h2(gw.port) as c:  # a gRPC call with no route: grpc-status 12
        s = c.response(c.request("POST", "/pkg.Svc/Nope", [("content-type", "application/grpc")],
                                 b"\x00\x00\x00\x00\x00"))
        assert s.status == 200 and s.header("grpc-status") == "12", s
    # ShouldRateLimit {domain: edge, descriptors: [[remote_address=192.0.2.1]]}, framed.
    message = pb_field(1, b"edge") + pb_field(2, pb_field(1, pb_field(1, b"remote_address") +
                                                   pb_field(2, b"192.0.2.1")))
    with open_h2(rls_port) as c:
        s = c.response(c.request(
            "POST", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            [("content-type", "application/grpc"), ("te", "trailers")],
            b"\x00" + len(message).to_bytes(4, "big") + message))
        assert s.status == 200 and dict(s.trailers).get("grpc-status") == "0", s

    m = scrape(gw, requests=8)
    assert m.get("sluice_ratelimit_decisions_total", limit="per_client", outcome="denied") == 1
    assert m.get("sluice_requests_total", route="api", status="429") == 1
    assert m.get("sluice_upstream_errors_total", upstream="dead", kind="connect_failed") == 1
    assert m.get("sluice_rls_descriptors_total", domain="edge", pattern="remote_address",
                 result="within_limit") == 1

    queries = dashboard_queries(dashboard())
    assert len(queries) >= 10, queries
    problems = check_dashboard_against(m, dashboard())
    assert not problems, "the dashboard queries what Sluice does not expose:\n" + "\n".join(problems)

    # Every family the issue names is on the dashboard.
    used = set()
    for _, expr in queries:
        used |= {family_of(n, m.types) for n in parse_promql(expr)[0]}
    for family in ("sluice_requests_total", "sluice_ratelimit_decisions_total",
                   "sluice_valkey_latency_seconds", "sluice_upstream_latency_seconds",
                   "sluice_connections_open", "sluice_valkey_errors_total",
                   "sluice_grpc_requests_total", "sluice_rls_descriptors_total"):
        assert family in used, family
    assert any(f.startswith("sluice_valkey_node_") for f in used)

    # The check itself: a metric Sluice does not have, a wrong label, a gauge in rate().
    d = dashboard()
    panel = next(p for p in d["panels"] if p.get("targets"))
    panel["targets"] = panel["targets"] + [
        {"refId": "X", "expr": 'sum(rate(sluice_bogus_total{route="api"}[5m]))'},
        {"refId": "Y", "expr": 'sum by (route) (rate(sluice_requests_total{rout="api"}[5m]))'},
        {"refId": "Z", "expr": "rate(sluice_connections_open[5m])"},
        {"refId": "W", "expr": "histogram_quantile(0.5, sum(rate(sluice_valkey_latency_seconds_bucket[5m])))"},
    ]
    bad = "\n".join(check_dashboard_against(m, d))
    assert "sluice_bogus_total is not exposed" in bad, bad
    assert "has no label ['rout']" in bad, bad
    assert "rate() of the gauge sluice_connections_open" in bad, bad
    assert "aggregated without keeping le" in bad, bad
