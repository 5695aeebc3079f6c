"""Sluice as Envoy's rate limit service ([rls], PRODUCT.md "Rate limit service for Envoy"):
envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit and grpc.health.v1.Health/Check on
the [rls] listener (h2c), called as Envoy calls them, by a grpcio client whose messages are
built from protocol/envoy_rls.proto and protocol/grpc_health.proto (protoc --python_out).

The limits are envoyproxy/ratelimit's YAML ([rls] config), counted on a real redis-server in
fixed windows (aligned as that service aligns them): per-descriptor statuses, the RateLimit
fields for Envoy's response, all-or-nothing across descriptors (and charge = "each" for that
service's way), hits_addend, a limit override, unlimited, shadow_mode, bad messages
(INVALID_ARGUMENT, nothing charged), Valkey down (on_error, within the deadline), health;
Sluice's own limits by [[rls.descriptor]], concurrency slots taken and freed by calls.
Run time: about 10 s."""

from __future__ import annotations

import http.client
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from conftest import TIMER_SLACK_S, free_port, metric_sum, ratelimit_toml, route_cfg
from harness.gateway import wait_admin, wait_until
from harness.valkey import avoid_window_boundary, hashed_part

ROOT = Path(__file__).resolve().parents[2]
SHOULD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH = "/grpc.health.v1.Health/Check"

EDGE_YAML = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: api_key
    descriptors:
      - key: path
        value: /login
        rate_limit:
          unit: hour
          requests_per_unit: 2
  - key: internal
    rate_limit:
      unlimited: true
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: closed
    rate_limit:
      unit: hour
      requests_per_unit: 0
"""


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The messages' Python classes, made by protoc from the repository's .proto files."""
    out = tmp_path_factory.mktemp("proto")
    subprocess.run(["protoc", f"-I{ROOT / 'protocol'}", f"--python_out={out}",
                    "envoy_rls.proto", "grpc_health.proto"], check=True)
    sys.path.insert(0, str(out))
    try:
        rls = importlib.import_module("envoy_rls_pb2")
        health = importlib.import_module("grpc_health_pb2")
    finally:
        sys.path.remove(str(out))
    return rls, health


def start_rls(sluice_factory, upstream, valkey, tmp_path, yaml_files=None, rls_options="",
              valkey_options=None, wait_ready=True, workers=1, time_client=None, server=None):
    folder = tmp_path / "ratelimit"
    folder.mkdir(exist_ok=True)
    for name, text in (yaml_files or {"edge.yaml": EDGE_YAML}).items():
        (folder / name).write_text(text)
    port = free_port()
    toml = ratelimit_toml(valkey, valkey_options=valkey_options) + (
        f'\n[rls]\nlisten = "127.0.0.1:{port}"\nconfig = "ratelimit"\n{rls_options}\n')
    gw = sluice_factory(upstream, routes=[route_cfg("api")], extra_toml=toml,
                        log={"access_log": str(tmp_path / f"access{port}.log")},
                        workers=workers, server=server)
    gw.rls_port = port
    if wait_ready:
        wait_admin(gw, "/ready", 200)
        avoid_window_boundary(time_client or valkey.client, 3600, 8.0)
    return gw


class Client:
    def __init__(self, pb, port):
        self.rls, self.health = pb
        # Its own connection (grpcio would share one among channels to the same address).
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.use_local_subchannel_pool", 1)])
        self.should = self.channel.unary_unary(
            SHOULD, request_serializer=self.rls.RateLimitRequest.SerializeToString,
            response_deserializer=self.rls.RateLimitResponse.FromString)
        self.check = self.channel.unary_unary(
            HEALTH, request_serializer=self.health.HealthCheckRequest.SerializeToString,
            response_deserializer=self.health.HealthCheckResponse.FromString)

    def request(self, *descriptors, domain="edge", hits_addend=0):
        """descriptors: lists of (key, value) pairs, or dicts with entries/hits_addend/limit."""
        req = self.rls.RateLimitRequest(domain=domain, hits_addend=hits_addend)
        for d in descriptors:
            if not isinstance(d, dict):
                d = {"entries": d}
            out = req.descriptors.add()
            for key, value in d["entries"]:
                out.entries.add(key=key, value=value)
            if "hits_addend" in d:
                out.hits_addend.value = d["hits_addend"]
            if "limit" in d:
                out.limit.requests_per_unit, out.limit.unit = d["limit"]
        return req

    def call(self, *descriptors, timeout=5.0, **kw):
        return self.should(self.request(*descriptors, **kw), timeout=timeout)

    def close(self):
        self.channel.close()


@pytest.fixture
def client_factory(pb):
    clients = []

    def make(port):
        clients.append(Client(pb, port))
        return clients[-1]
    yield make
    for c in clients:
        c.close()


def codes(pb, response):
    rls = pb[0]
    return [rls.RateLimitResponse.Code.Name(s.code) for s in response.statuses]


def test_per_descriptor_statuses_and_the_fields_for_envoys_answer(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    c = client_factory(gw.rls_port)
    rls = pb[0]
    ip = [("remote_address", "203.0.113.7")]
    for remaining in (2, 1, 0):
        r = c.call(ip)
        assert r.overall_code == rls.RateLimitResponse.OK, r
        (s,) = r.statuses
        assert s.code == rls.RateLimitResponse.OK, r
        assert s.current_limit.requests_per_unit == 3, r
        assert s.current_limit.unit == rls.HOUR, r
        assert s.limit_remaining == remaining, r
        assert 0 < s.duration_until_reset.seconds <= 3600, r
    r = c.call(ip)
    assert r.overall_code == rls.RateLimitResponse.OVER_LIMIT, r
    assert codes(pb, r) == ["OVER_LIMIT"] and r.statuses[0].limit_remaining == 0, r
    # The RateLimit fields Envoy adds to its 429 (IETF by default, as the gateway sends them).
    fields = {h.key.lower(): h.value for h in r.response_headers_to_add}
    assert "ratelimit-policy" in fields and "ratelimit" in fields, r
    assert fields["ratelimit-policy"] == '"edge.remote_address";q=3;w=3600', fields
    assert fields["ratelimit"].startswith('"edge.remote_address";r=0;t='), fields
    # Another address has its own counter; no limit for an unknown key or domain: OK, no limit.
    assert c.call([("remote_address", "203.0.113.8")]).overall_code == rls.RateLimitResponse.OK
    r = c.call([("unknown", "x")])
    assert r.overall_code == rls.RateLimitResponse.OK and not r.statuses[0].HasField(
        "current_limit"), r
    assert c.call(ip, domain="nobody").overall_code == rls.RateLimitResponse.OK
    # Nested descriptors: the value must match; unlimited; shadow_mode never refuses; 0 always.
    login = [("api_key", "k1"), ("path", "/login")]
    assert codes(pb, c.call(login)) == ["OK"]
    assert codes(pb, c.call(login)) == ["OK"]
    assert codes(pb, c.call(login)) == ["OVER_LIMIT"]
    assert codes(pb, c.call([("api_key", "k1"), ("path", "/other")])) == ["OK"]
    r = c.call([("internal", "yes")])
    assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 2**32 - 1, r
    for _ in range(3):
        assert c.call([("trial", "t")]).overall_code == rls.RateLimitResponse.OK
    assert codes(pb, c.call([("closed", "c")])) == ["OVER_LIMIT"]
    # Each descriptor a limit applied to, by domain, pattern and result.
    def counted(pattern, result):
        return metric_sum(gw, "sluice_rls_descriptors_total", domain="edge", pattern=pattern,
                          result=result)
    assert counted("remote_address", "within_limit") == 3  # 2 and 1 left, and the other address
    assert counted("remote_address", "near_limit") == 1    # 0 left: a fifth of 3 or less
    assert counted("remote_address", "over_limit") == 1
    assert counted("api_key.path_/login", "over_limit") == 1
    assert counted("trial", "shadow_over_limit") == 2
    assert counted("closed", "over_limit") == 1
    assert counted("internal", "within_limit") == 1
    # The calls are requests of their own route: counted, and in the access log.
    assert metric_sum(gw, "sluice_requests_total", route="rls:should_rate_limit") >= 14
    assert metric_sum(gw, "sluice_grpc_requests_total", route="rls:should_rate_limit",
                      grpc_status="0") >= 14
    log = tmp_path / f"access{gw.rls_port}.log"
    records = wait_until(lambda: [json.loads(l) for l in log.read_text().splitlines()]
                         if log.exists() else [], lambda recs: len(recs) >= 14, timeout=5)
    rec = [r for r in records if r.get("route") == "rls:should_rate_limit"][-1]
    assert rec["status"] == 200 and rec["grpc_status"] == 0 and rec["path"] == SHOULD, rec


def test_one_call_is_all_or_nothing_unless_charge_is_each(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    c = client_factory(gw.rls_port)
    rls = pb[0]
    ip = [("remote_address", "198.51.100.1")]
    login = [("api_key", "k2"), ("path", "/login")]
    c.call(login)
    c.call(login)  # the login limit is spent
    r = c.call(ip, login)
    assert codes(pb, r) == ["OK", "OVER_LIMIT"] and r.overall_code == rls.RateLimitResponse.OVER_LIMIT
    # Nothing was charged to the address: it still has its 3.
    assert c.call(ip).statuses[0].limit_remaining == 2

    gw2 = start_rls(sluice_factory, upstream, valkey, tmp_path, rls_options='charge = "each"')
    c2 = client_factory(gw2.rls_port)
    ip2 = [("remote_address", "198.51.100.2")]
    login2 = [("api_key", "k3"), ("path", "/login")]
    c2.call(login2)
    c2.call(login2)
    assert codes(pb, c2.call(ip2, login2)) == ["OK", "OVER_LIMIT"]
    # envoyproxy/ratelimit's way: the address was charged although the call was refused.
    assert c2.call(ip2).statuses[0].limit_remaining == 1


def test_hits_addend_and_a_limit_override(sluice_factory, upstream, valkey, tmp_path, pb,
                                          client_factory):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    c = client_factory(gw.rls_port)
    rls = pb[0]
    ip = [("remote_address", "192.0.2.1")]
    r = c.call(ip, hits_addend=2)
    assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 1, r
    # A descriptor's own hits_addend wins; 0 checks without charging.
    r = c.call({"entries": ip, "hits_addend": 0}, hits_addend=5)
    assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 1, r
    assert codes(pb, c.call(ip, hits_addend=2)) == ["OVER_LIMIT"]
    # Any value a client can send is bounded: never wraps into an allowance.
    r = c.call({"entries": [("remote_address", "192.0.2.2")], "hits_addend": 2**64 - 1})
    assert codes(pb, r) == ["OVER_LIMIT"], r
    assert codes(pb, c.call([("remote_address", "192.0.2.2")])) == ["OK"]
    # An override replaces the configured limit for this call's descriptor.
    over = {"entries": [("remote_address", "192.0.2.3")], "limit": (5, rls.MINUTE)}
    r = c.call(over)
    assert r.statuses[0].current_limit.requests_per_unit == 5, r
    assert metric_sum(gw, "sluice_rls_descriptors_total", domain="edge", pattern="override",
                      result="within_limit") == 1
    assert r.statuses[0].current_limit.unit == rls.MINUTE, r


def test_bad_messages_are_invalid_argument_and_charge_nothing(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    c = client_factory(gw.rls_port)
    ip = ("remote_address", "192.0.2.9")
    bad = {
        "no domain": c.request([ip], domain=""),
        "no descriptor": c.request(),
        "no entries": c.request([]),
        "empty key": c.request([("", "v")]),
        "65 descriptors": c.request(*[[ip]] * 65),
        "17 entries": c.request([ip] * 17),
        "a long value": c.request([("remote_address", "v" * 1025)]),
    }
    for what, req in bad.items():
        with pytest.raises(grpc.RpcError) as info:
            c.should(req, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, info.value)
    # Bytes that are no message at all.
    raw = c.channel.unary_unary(SHOULD)
    for body in (b"\xff\xff\xff", b"\x0a\x05ab"):
        with pytest.raises(grpc.RpcError) as info:
            raw(body, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (body, info.value)
    # Past gRPC's 4 MiB receive limit: refused before the rest is read.
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\x0a" + b"\x80\x80\x80\x03" + b"d" * (6 << 20), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
    # Nothing was charged by any of them.
    assert c.call([ip]).statuses[0].limit_remaining == 2
    # Another method of the service, or another service: UNIMPLEMENTED. The gateway's own
    # listener does not serve the rate limit service.
    with pytest.raises(grpc.RpcError) as info:
        c.channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Other")(
            b"", timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(f"127.0.0.1:{gw.port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(SHOULD)(c.request([ip]).SerializeToString(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Not gRPC (HTTP/1.1 here): an HTTP answer.
    conn = http.client.HTTPConnection("127.0.0.1", gw.rls_port, timeout=5)
    conn.request("POST", SHOULD, body=b"x", headers={"Content-Type": "application/grpc"})
    answer = conn.getresponse()
    assert answer.status == 415, (answer.status, answer.read())
    conn.close()


def test_health_is_serving_only_while_valkey_answers(sluice_factory, upstream, valkey, tmp_path,
                                                     pb, client_factory):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    c = client_factory(gw.rls_port)
    health = pb[1]
    serving = health.HealthCheckResponse.SERVING
    assert c.check(health.HealthCheckRequest(), timeout=5).status == serving
    assert c.check(health.HealthCheckRequest(
        service="envoy.service.ratelimit.v3.RateLimitService"), timeout=5).status == serving
    with pytest.raises(grpc.RpcError) as info:
        c.check(health.HealthCheckRequest(service="other"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    valkey.stop()
    status = wait_until(lambda: c.check(health.HealthCheckRequest(), timeout=5).status,
                        lambda s: s == health.HealthCheckResponse.NOT_SERVING, timeout=10)
    assert status == health.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_valkey_down_is_decided_by_on_error_within_the_deadline(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory, on_error):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path,
                   rls_options=f'on_error = "{on_error}"', valkey_options={"timeout": "200ms"})
    c = client_factory(gw.rls_port)
    rls = pb[0]
    ip = [("remote_address", "192.0.2.20")]
    assert c.call(ip).overall_code == rls.RateLimitResponse.OK
    valkey.pause()  # connected, never answering: each call waits for its deadline
    try:
        for _ in range(3):
            started = time.monotonic()
            r = c.call(ip, timeout=5)
            took = time.monotonic() - started
            want = rls.RateLimitResponse.OK if on_error == "allow" else \
                rls.RateLimitResponse.OVER_LIMIT
            assert r.overall_code == want, r
            assert took < 1.0, took  # [valkey] timeout 200ms, and a margin
            # Unknown: no remaining, no reset; no RateLimit fields to add.
            assert not r.response_headers_to_add, r
        assert metric_sum(gw, "sluice_rls_descriptors_total", domain="edge",
                          pattern="remote_address", result="error") == 3
    finally:
        valkey.resume()


HAMMER = """
import sys, grpc
port, n, request = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    call = channel.unary_unary(sys.argv[4])
    futures = [call.future(request, timeout=30) for _ in range(n)]
    # overall_code is field 1: OK is 08 01, OVER_LIMIT 08 02.
    print(sum(1 for f in futures if f.result().startswith(bytes([8, 1]))))
"""


def test_exact_under_8_processes_on_two_instances_of_two_workers(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    """One descriptor's 50 per hour, asked for 240 times at once by 8 client processes over
    two gateways of two workers each on one Valkey: exactly 50 calls are OK."""
    yaml = {"edge.yaml": "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n"
                         "      unit: hour\n      requests_per_unit: 50\n"}
    gateways = [start_rls(sluice_factory, upstream, valkey, tmp_path, yaml_files=yaml, workers=2)
                for _ in range(2)]
    request = client_factory(gateways[0].rls_port).request([("tenant", "acme")])
    hexed = request.SerializeToString().hex()
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(gateways[i % 2].rls_port), "30",
                               hexed, SHOULD], stdout=subprocess.PIPE, text=True)
             for i in range(8)]
    allowed = 0
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        allowed += int(out.strip())
    assert allowed == 50
    r = client_factory(gateways[1].rls_port).call([("tenant", "acme")], hits_addend=0)
    assert r.statuses[0].limit_remaining == 0, r


@pytest.fixture
def valkey_cluster(tmp_path):
    from test_valkey_cluster import Cluster
    c = Cluster(tmp_path)
    yield c
    c.stop()


def test_on_a_cluster_a_call_over_two_slots_is_still_all_or_nothing(
        sluice_factory, upstream, valkey_cluster, tmp_path, pb, client_factory):
    """Descriptor values are the keys' hash tags: a call's descriptors land on different
    primaries, each counted on the owner of its slot, and a refusal on one takes back the
    charge made on the other."""
    import redis
    cluster = valkey_cluster
    nodes = [f"127.0.0.1:{p}" for p in cluster.ports]
    clock = redis.Redis(host="127.0.0.1", port=cluster.ports[0], socket_timeout=5)
    gw = start_rls(sluice_factory, upstream, None, tmp_path, valkey_options={"nodes": nodes},
                   time_client=clock)
    c = client_factory(gw.rls_port)
    login = [("api_key", "k9"), ("path", "/login")]
    assert codes(pb, c.call(login)) == ["OK"]
    assert codes(pb, c.call(login)) == ["OK"]
    login_owner = next(p for p in cluster.ports
                       if cluster.cli(p, "--scan", "--pattern", "*rls.*").strip())

    def owner_of(ip):
        key = f"rl:v2:rls.edge.remote_address:{{{hashed_part(ip)}}}"
        return cluster.owner(int(cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", key))), key
    ip = next(f"192.0.2.{i}" for i in range(1, 200) if owner_of(f"192.0.2.{i}")[0] != login_owner)
    owner, key = owner_of(ip)
    r = c.call([("remote_address", ip)], login)
    assert codes(pb, r) == ["OK", "OVER_LIMIT"], r
    # The address's charge on its own primary was taken back: 3 left, 2 after this call.
    assert c.call([("remote_address", ip)]).statuses[0].limit_remaining == 2
    assert cluster.cli(owner, "EXISTS", key) == "1"
    # One take-back, done.
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="done") == 1
    assert metric_sum(gw, "sluice_valkey_compensations_total", result="failed") == 0


def test_a_reload_moves_the_listener_and_changes_the_limits(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    from test_operations_reload import reload
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    rls = pb[0]
    ip = [("remote_address", "192.0.2.77")]
    assert client_factory(gw.rls_port).call(ip).statuses[0].current_limit.requests_per_unit == 3
    # New YAML and a new port: served there at once, with the new limits.
    (tmp_path / "ratelimit" / "edge.yaml").write_text(EDGE_YAML.replace(
        "requests_per_unit: 3", "requests_per_unit: 7"))
    new_port = free_port()
    text = gw.config_path.read_text()
    reload(gw, text.replace(f"127.0.0.1:{gw.rls_port}", f"127.0.0.1:{new_port}"))
    r = client_factory(new_port).call(ip)
    assert r.overall_code == rls.RateLimitResponse.OK, r
    assert r.statuses[0].current_limit.requests_per_unit == 7, r
    assert r.statuses[0].limit_remaining == 5, r  # the same counter, the new limit
    with pytest.raises(grpc.RpcError) as info:
        client_factory(gw.rls_port).call(ip, timeout=2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # A YAML file that service would refuse: the reload is refused, the service goes on.
    (tmp_path / "ratelimit" / "edge.yaml").write_text("domain: edge\nratelimit: 1\n")
    reload(gw, gw.config_path.read_text(), expect="failure")
    assert client_factory(new_port).call(ip).statuses[0].limit_remaining == 4
    # Without [rls], nothing listens there any more (a connection made before is served on).
    reload(gw, text[:text.index("[rls]")])
    with pytest.raises(grpc.RpcError) as info:
        client_factory(new_port).call(ip, timeout=2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_toml_patterns_decide_with_sluice_limits_shared_with_the_gateway(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    """[[rls.descriptor]] maps a descriptor pattern to a [[limit]]: the gateway's requests and
    Envoy's calls from one address count in one counter; the limit's own algorithm, cost and
    on_error apply."""
    from conftest import limit_cfg, sluice_with_limits
    rls = pb[0]
    port = free_port()
    limits = [limit_cfg("per_ip", "fixed_window", 5, "1h"),
              limit_cfg("per_user", "token_bucket", 10, "1h", by=["header:X-User"], burst=4,
                        cost=2, on_error="deny")]
    gw = sluice_with_limits(
        sluice_factory, upstream, valkey, limits, [route_cfg("api", ["per_ip"])],
        extra_toml=f'[rls]\nlisten = "127.0.0.1:{port}"\non_error = "allow"\n'
                   '[[rls.descriptor]]\ndomain = "edge"\nentries = ["remote_address"]\n'
                   'limit = "per_ip"\n'
                   '[[rls.descriptor]]\ndomain = "edge"\nentries = ["path=/login", "user"]\n'
                   'limit = "per_user"\n',
        valkey_options={"timeout": "200ms"})
    c = client_factory(port)
    assert [gw.get("/echo").status for _ in range(2)] == [200, 200]
    r = c.call([("remote_address", "127.0.0.1")])
    assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 2, r
    assert r.statuses[0].current_limit.name == "per_ip", r
    assert r.statuses[0].current_limit.unit == rls.HOUR, r
    fields = {h.key.lower(): h.value for h in r.response_headers_to_add}
    assert fields["ratelimit-policy"] == '"per_ip";q=5;w=3600', fields
    assert codes(pb, c.call([("remote_address", "127.0.0.1")], hits_addend=2)) == ["OK"]
    assert gw.get("/echo").status == 429  # the calls spent the gateway's quota for this address
    assert codes(pb, c.call([("remote_address", "127.0.0.1")])) == ["OVER_LIMIT"]
    assert metric_sum(gw, "sluice_rls_descriptors_total", domain="edge", pattern="remote_address",
                      result="over_limit") == 1
    # A token bucket of burst 4, cost 2 per hit: two calls pass, the third does not.
    login = [("path", "/login"), ("user", "u1")]
    assert [codes(pb, c.call(login))[0] for _ in range(3)] == ["OK", "OK", "OVER_LIMIT"]
    assert codes(pb, c.call([("path", "/other"), ("user", "u1")])) == ["OK"]  # no limit
    # Valkey silent: each limit's own on_error (per_user denies; [rls] on_error is the YAML's).
    valkey.pause()
    try:
        r = c.call([("path", "/login"), ("user", "u2")], [("remote_address", "10.1.1.1")])
        assert codes(pb, r) == ["OVER_LIMIT", "OK"], r
    finally:
        valkey.resume()


def test_a_concurrency_limit_takes_a_named_slot_that_the_stream_done_call_frees(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    """A [[rls.descriptor]] on a concurrency limit: a call takes the slot its request_id names
    (as the gateway's requests take theirs, in one counter), the call Envoy sends when the
    stream is done (apply_on_stream_done, a pattern with release = true) frees it, on any
    instance; a slot nobody frees ends with its lease; a call refused takes nothing."""
    from conftest import sluice_with_limits
    port, other_port = free_port(), free_port()
    limits = [{"name": "in_flight", "algorithm": "concurrency", "by": ["ip"], "limit": 2,
               "lease": "2s"},
              {"name": "per_ip", "algorithm": "fixed_window", "by": ["ip"], "limit": 100,
               "window": "1h"}]
    patterns = ('[[rls.descriptor]]\ndomain = "edge"\n'
                'entries = ["remote_address", "request_id"]\nlimit = "in_flight"\n'
                'slot = "request_id"\n'
                '[[rls.descriptor]]\ndomain = "edge"\n'
                'entries = ["remote_address", "request_id", "sluice=release"]\n'
                'limit = "in_flight"\nslot = "request_id"\nrelease = true\n'
                '[[rls.descriptor]]\ndomain = "edge"\nentries = ["tenant"]\nlimit = "per_ip"\n')
    gws = [sluice_with_limits(sluice_factory, upstream, valkey, limits,
                              [route_cfg("api", ["in_flight"])],
                              extra_toml=f'[rls]\nlisten = "127.0.0.1:{p}"\n' + patterns)
           for p in (port, other_port)]
    c, other = client_factory(port), client_factory(other_port)
    key = "rl:v2:in_flight:{10.0.0.1}"

    def take(rid, via=c):
        return codes(pb, via.call([("remote_address", "10.0.0.1"), ("request_id", rid)]))[0]

    def free(rid, via=c):
        r = via.call([("remote_address", "10.0.0.1"), ("request_id", rid), ("sluice", "release")])
        assert codes(pb, r) == ["OK"], r

    def held(of=key):
        now = valkey.client.time()
        return valkey.client.zcount(of, f"({now[0] * 1_000_000 + now[1]}", "+inf")

    assert [take("r1"), take("r1"), take("r2"), take("r3")] == ["OK", "OVER_LIMIT", "OK",
                                                                "OVER_LIMIT"]
    assert held() == 2
    r = c.call([("remote_address", "10.0.0.1"), ("request_id", "r3")])
    assert r.statuses[0].current_limit.requests_per_unit == 2, r
    assert r.statuses[0].limit_remaining == 0, r
    # The stream-done call, on the other instance, frees r1's slot: r3 gets one.
    free("r1", via=other)
    wait_until(held, lambda n: n == 1, 3.0, step=0.02)
    assert take("r3", via=other) == "OK"
    # Freeing a slot twice, or one never taken, changes nothing.
    free("r1")
    free("never")
    assert take("r4") == "OVER_LIMIT" and held() == 2
    # A call refused by another of its descriptors takes no slot (all-or-nothing).
    assert codes(pb, c.call([("tenant", "t")], hits_addend=100)) == ["OK"]
    r = c.call([("remote_address", "10.0.0.1"), ("request_id", "r5")], [("tenant", "t")])
    assert codes(pb, r) == ["OVER_LIMIT", "OVER_LIMIT"], r
    free("r2")
    free("r3")
    wait_until(held, lambda n: n == 0, 3.0, step=0.02)
    r = c.call([("remote_address", "10.0.0.1"), ("request_id", "r5")], [("tenant", "t")])
    assert codes(pb, r) == ["OK", "OVER_LIMIT"] and held() == 0, r
    # The gateway's requests from an address count in the same slots as the calls for it.
    local = [("remote_address", "127.0.0.1")]
    assert [codes(pb, c.call(local + [("request_id", rid)]))[0] for rid in ("g1", "g2")] == \
        ["OK", "OK"]
    assert gws[0].get("/echo").status == 429
    c.call(local + [("request_id", "g1"), ("sluice", "release")])
    wait_until(lambda: held("rl:v2:in_flight:{127.0.0.1}"), lambda n: n == 1, 3.0, step=0.02)
    assert gws[1].get("/echo").status == 200
    # A slot nobody frees ends with its lease (2 s): nothing renews a call's slot.
    assert [take("r6"), take("r7")] == ["OK", "OK"]
    t0 = time.monotonic()
    wait_until(held, lambda n: n == 0, 2.0 + TIMER_SLACK_S + 1.0, step=0.05)
    assert time.monotonic() - t0 > 1.0
    assert take("r8") == "OK"
    # A slot needs a name: an empty request_id is refused without asking Valkey.
    assert take("") == "OVER_LIMIT"


README_EXAMPLES = {
    "1.yaml": """domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
""",
    "2.yaml": """domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
""",
    "3.yaml": """domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
""",
    "4a.yaml": """domain: example4a
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
""",
    "4b.yaml": """domain: example4b
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
""",
    "5.yaml": """domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
""",
    "6.yaml": """domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
""",
    "7.yaml": """domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
""",
    "9.yaml": """domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 22}
""",
    "11.yaml": """domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
""",
}


def test_envoyproxy_ratelimit_readme_examples_get_the_answers_it_documents(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory):
    """The configuration examples of envoyproxy/ratelimit's README (1-7, 9, 11), loaded as they
    are, give the answers that README describes."""
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path, yaml_files=README_EXAMPLES)
    c = client_factory(gw.rls_port)
    rls = pb[0]

    def limit_of(r, i=0):
        s = r.statuses[i]
        if not s.HasField("current_limit"):
            return None
        return s.current_limit.requests_per_unit, rls.RateLimitUnit.Name(s.current_limit.unit)

    # 1: two values of one key, 500 per second each; another value has no limit.
    assert limit_of(c.call([("database", "users")], domain="mongo_cps")) == (500, "SECOND")
    assert limit_of(c.call([("database", "default")], domain="mongo_cps")) == (500, "SECOND")
    assert limit_of(c.call([("database", "other")], domain="mongo_cps")) is None
    # 2: nested (5 marketing messages a day per number) and 100 a day per number; both
    # descriptors in one call, a logical OR of the two decisions.
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    number = [("to_number", "2061111111")]
    r = c.call(marketing, number, domain="messaging")
    assert [limit_of(r, 0), limit_of(r, 1)] == [(5, "DAY"), (100, "DAY")], r
    assert [s.limit_remaining for s in r.statuses] == [4, 99], r
    r = c.call(marketing, number, domain="messaging", hits_addend=4)
    assert r.overall_code == rls.RateLimitResponse.OK, r
    r = c.call(marketing, number, domain="messaging")
    assert codes(pb, r) == ["OVER_LIMIT", "OK"], r  # 99 left: nothing charged (all or nothing)
    assert r.statuses[1].limit_remaining == 95, r
    other = [("message_type", "marketing"), ("to_number", "2062222222")]
    assert codes(pb, c.call(other, domain="messaging")) == ["OK"]  # a number of its own
    # 3: the most specific match first: 50.0.0.5 is blocked (0 per second), others get 10.
    assert limit_of(c.call([("remote_address", "50.0.0.1")], domain="edge_proxy_per_ip")) == \
        (10, "SECOND")
    r = c.call([("remote_address", "50.0.0.5")], domain="edge_proxy_per_ip")
    assert codes(pb, r) == ["OVER_LIMIT"] and limit_of(r) == (0, "SECOND"), r
    # 4: a descriptor of two entries matches two levels only.
    two = [("key", "value"), ("subkey", "subvalue")]
    assert limit_of(c.call(two, domain="example4a")) is None
    assert limit_of(c.call(two, domain="example4b")) == (300, "SECOND")
    # 5: unlimited is OK with limit_remaining MaxUint32; azure 100 per minute.
    r = c.call([("ldap", "x")], domain="internal")
    assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 2**32 - 1, r
    assert limit_of(c.call([("azure", "x")], domain="internal")) == (100, "MINUTE")
    # 6: user-a in shadow mode is never limited; user-b is, at 20 per second.
    r = c.call([("service", "auth-service"), ("user", "user-a")], domain="example6",
               hits_addend=11)
    assert codes(pb, r) == ["OK"], r
    r = c.call([("service", "auth-service"), ("user", "user-b")], domain="example6",
               hits_addend=21)
    assert codes(pb, r) == ["OVER_LIMIT"], r
    # 7: replaces: in a call with both, the replaced limit does not apply.
    one = [("key_1", "value_1"), ("user", "bkthomps")]
    both = [("key_2", "value_2"), ("user", "bkthomps")]
    assert limit_of(c.call(one, domain="example7")) == (5, "SECOND")
    assert limit_of(c.call(both, domain="example7")) == (10, "SECOND")
    r = c.call(one, both, domain="example7")
    assert [limit_of(r, 0), limit_of(r, 1)] == [None, (10, "SECOND")], r
    # 9: wildcards, trailing, in the middle, several.
    assert limit_of(c.call([("key1", "valueXYZ")], domain="example9")) == (20, "MINUTE")
    assert limit_of(c.call([("path", "/api/123/action")], domain="example9")) == (21, "MINUTE")
    assert limit_of(c.call([("path", "/api/123/other")], domain="example9")) is None
    assert limit_of(c.call([("route", "/api/v1/resource/123/action")], domain="example9")) == \
        (22, "MINUTE")
    # 11: share_threshold: every files/* value counts in one threshold; files_no_share/* not.
    for name in ("files/a.pdf", "files/b.csv"):
        assert codes(pb, c.call([("files", name)], domain="example11", hits_addend=5)) == ["OK"]
    assert codes(pb, c.call([("files", "files/c.txt")], domain="example11")) == ["OVER_LIMIT"]
    assert codes(pb, c.call([("files_no_share", "files_no_share/a.pdf")], domain="example11",
                            hits_addend=10)) == ["OK"]
    assert codes(pb, c.call([("files_no_share", "files_no_share/b.csv")],
                            domain="example11")) == ["OK"]


def test_the_listener_serves_tls_with_rls_tls(sluice_factory, upstream, valkey, tmp_path, pb,
                                              tls_pki):
    """[rls.tls]: gRPC over TLS (ALPN h2), the certificate its own; the calls as over h2c."""
    cert = tls_pki.certs["default"]
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path,
                   rls_options=f'[rls.tls]\ncert = "{cert.cert}"\nkey = "{cert.key}"\n')
    rls = pb[0]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls_pki.certs["root"].cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{gw.rls_port}", credentials,
                             options=[("grpc.ssl_target_name_override", "default.test"),
                                      ("grpc.use_local_subchannel_pool", 1)]) as channel:
        should = channel.unary_unary(SHOULD,
                                     request_serializer=rls.RateLimitRequest.SerializeToString,
                                     response_deserializer=rls.RateLimitResponse.FromString)
        request = rls.RateLimitRequest(domain="edge")
        request.descriptors.add().entries.add(key="remote_address", value="192.0.2.50")
        r = should(request, timeout=5)
        assert codes(pb, r) == ["OK"] and r.statuses[0].limit_remaining == 2, r
    # Plain h2c is not answered on a TLS listener.
    with grpc.insecure_channel(f"127.0.0.1:{gw.rls_port}",
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(SHOULD)(b"", timeout=3)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                     grpc.StatusCode.DEADLINE_EXCEEDED), info.value


def test_the_listener_has_the_http2_flood_limits(sluice_factory, upstream, valkey, tmp_path, pb,
                                                 client_factory):
    """Rapid Reset against the rate limit service's listener: GOAWAY ENHANCE_YOUR_CALM, as on
    the gateway's; Envoy's calls on another connection go on being answered."""
    from harness.h2client import open_h2
    from test_http2 import assert_calmed, flood, provoking_frames
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path)
    with open_h2(gw.rls_port) as c:
        sent = flood(c, lambda sid: provoking_frames(c, "rapid_reset", sid))
        time.sleep(0.2)
    assert_calmed(c, sent)
    assert metric_sum(gw, "sluice_http2_goaways_total", reason="enhance_your_calm") >= 1
    assert codes(pb, client_factory(gw.rls_port).call([("remote_address", "192.0.2.60")])) == \
        ["OK"]


@pytest.mark.parametrize("mode", ["legacy", "none"])
def test_the_fields_for_envoy_follow_server_rate_limit_headers(
        sluice_factory, upstream, valkey, tmp_path, pb, client_factory, mode):
    gw = start_rls(sluice_factory, upstream, valkey, tmp_path,
                   server={"rate_limit_headers": mode})
    r = client_factory(gw.rls_port).call([("remote_address", "192.0.2.70")])
    fields = {h.key.lower(): h.value for h in r.response_headers_to_add}
    if mode == "none":
        assert fields == {}, r
    else:
        assert fields["x-ratelimit-limit"] == "3" and fields["x-ratelimit-remaining"] == "2", r
        assert "ratelimit" not in fields and "ratelimit-policy" not in fields, r
