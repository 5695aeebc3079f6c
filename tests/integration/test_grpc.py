"""gRPC calls (content-type application/grpc on an HTTP/2 stream) that the gateway answers
itself get gRPC's trailers-only answer, as PRODUCT.md says: HTTP 200 and one HEADERS frame with
END_STREAM carrying grpc-status and grpc-message: 8 RESOURCE_EXHAUSTED for a refusal (with
retry-after and the RateLimit fields), 14 UNAVAILABLE for a limit that fails closed, 4
DEADLINE_EXCEEDED when the upstream does not answer within the call's grpc-timeout, 12
UNIMPLEMENTED for no route. The grpc-status of every gRPC call (the gateway's, or the one an
upstream sent in its head or its trailers) is in the access log and in
sluice_grpc_requests_total.

Clients: python3-grpcio (a real gRPC client: it must read these answers as the statuses they
are) and harness/h2client.py (the frames themselves). The upstream is the test HTTP/1.1 server;
HTTP/2 upstreams (a real gRPC server behind the gateway) are another step. Run time: about 3 s."""

from __future__ import annotations

import json
import time
import urllib.parse

import grpc
import pytest

from conftest import (free_port, limit_cfg, metric_sum, parse_rl_list, ratelimit_toml, route_cfg,
                      sluice_with_limits)
from harness.gateway import wait_until
from harness.h2client import open_h2

GRPC = [("content-type", "application/grpc"), ("te", "trailers")]


def grpc_call(port, method="/pkg.Svc/Method", timeout=5.0):
    """One unary call with an empty message; returns the grpc.RpcError it ends with."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=timeout)
    return info.value


def assert_trailers_only(s, grpc_status):
    """One HEADERS frame with END_STREAM: :status 200, application/grpc, the grpc-status."""
    assert s.status == 200 and s.ended and s.body == b"" and s.trailers == [], s
    assert s.header("content-type") == "application/grpc", s
    assert s.header("grpc-status") == str(grpc_status), s


def records(path, n, timeout=5.0):
    out = []

    def read():
        out[:] = [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []
        return out
    wait_until(read, lambda recs: len(recs) >= n, timeout)
    return out


def test_no_route_is_unimplemented(sluice_factory, upstream):
    gw = sluice_factory(upstream, routes=[route_cfg("echo", match={"path_prefix": "/echo"})])
    e = grpc_call(gw.port)
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e
    assert e.details() == "no route matches this request", e
    with open_h2(gw.port) as c:
        s = c.response(c.request("POST", "/pkg.Svc/Method", GRPC, b"\x00\x00\x00\x00\x00"))
        assert_trailers_only(s, 12)
        # The same path without gRPC's content-type: an HTTP answer.
        s = c.response(c.request("POST", "/pkg.Svc/Method", [], b"x"))
        assert s.status == 404 and s.header("grpc-status") is None, s
    assert upstream.request_count == 0


def test_a_refusal_is_resource_exhausted_with_retry_information(sluice_factory, upstream, valkey):
    limits = [limit_cfg("grpc_calls", "fixed_window", 1, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    assert gw.get("/echo?first=1").status == 200  # the one allowed
    e = grpc_call(gw.port)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
    assert e.details().startswith("rate limited by grpc_calls; retry after "), e.details()
    meta = dict(e.trailing_metadata())
    assert meta["retry-after"].isdigit() and int(meta["retry-after"]) >= 1, meta
    assert parse_rl_list(meta["ratelimit"])["grpc_calls"]["r"] == 0, meta
    assert "grpc_calls" in parse_rl_list(meta["ratelimit-policy"]), meta
    with open_h2(gw.port) as c:
        sid = c.request("POST", "/pkg.Svc/Method", GRPC, b"\x00\x00\x00\x00\x00")
        s = c.response(sid)
        assert_trailers_only(s, 8)
        assert s.header("grpc-message").startswith("rate limited by grpc_calls"), s
        assert s.header("retry-after") is not None and s.header("ratelimit") is not None, s
    assert upstream.request_count == 1


def test_limits_key_on_metadata_as_on_headers(sluice_factory, upstream, valkey):
    """by = ["header:x-user"]: a call's metadata is its header fields. One call per user per
    hour: alice's second call is refused, bob's first is not."""
    limits = [limit_cfg("per_user", "fixed_window", 1, "1h", by=["header:x-user"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits)

    def call(user):
        with grpc.insecure_channel(f"127.0.0.1:{gw.port}") as channel:
            method = channel.unary_unary("/echo", request_serializer=None,
                                         response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:  # /echo answers JSON, not gRPC
                method(b"", timeout=5, metadata=[("x-user", user)])
        return info.value.code()
    assert call("alice") != grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call("alice") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call("bob") != grpc.StatusCode.RESOURCE_EXHAUSTED
    users = [hv for r in upstream.requests for n, hv in r["headers"] if n.lower() == "x-user"]
    assert users == ["alice", "bob"], upstream.requests


def test_fail_closed_is_unavailable_within_the_deadline(sluice_factory, upstream):
    limits = [limit_cfg("closed", "fixed_window", 5, "1h", on_error="deny")]
    gw = sluice_factory(upstream, routes=[route_cfg("api", ["closed"])],
                        extra_toml=ratelimit_toml(free_port(), limits=limits,
                                                  valkey_options={"timeout": "50ms"}))
    t0 = time.monotonic()
    e = grpc_call(gw.port, timeout=5.0)
    elapsed = time.monotonic() - t0
    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    assert "fails closed" in e.details(), e.details()
    assert elapsed < 1.0, elapsed
    assert "retry-after" in dict(e.trailing_metadata())
    assert upstream.request_count == 0


def test_grpc_timeout_bounds_the_upstream_wait(sluice, upstream):
    """response_timeout is 30 s; the call's grpc-timeout of 300 ms is the shorter: 504,
    answered as DEADLINE_EXCEEDED after about 300 ms."""
    with open_h2(sluice.port) as c:
        t0 = time.monotonic()
        s = c.response(c.request("POST", "/slow/3000", GRPC + [("grpc-timeout", "300m")],
                                 b"\x00\x00\x00\x00\x00"), timeout=5)
        elapsed = time.monotonic() - t0
        assert_trailers_only(s, 4)
        assert 0.25 <= elapsed < 2.0, elapsed
        # A malformed grpc-timeout is no deadline: the upstream answers as usual.
        s = c.response(c.request("POST", "/slow/100", GRPC + [("grpc-timeout", "1x")], b"x"),
                       timeout=5)
        assert s.status == 200 and s.json()["slept_ms"] == 100, s


def test_a_grpc_timeout_of_zero_has_expired_already(sluice, upstream):
    """grpc-timeout 0S, 0m, 0u or 0n is a deadline that has passed, not "no deadline":
    DEADLINE_EXCEEDED at once, and the upstream never called."""
    with open_h2(sluice.port) as c:
        for value in ("0S", "0m", "0u", "0n", "00000000H"):
            t0 = time.monotonic()
            s = c.response(c.request("POST", "/slow/3000", GRPC + [("grpc-timeout", value)],
                                     b"\x00\x00\x00\x00\x00"), timeout=5)
            assert_trailers_only(s, 4)
            assert time.monotonic() - t0 < 1.0, value
        s = c.response(c.request("POST", "/slow/500", GRPC + [("grpc-timeout", "1n")], b"x"),
                       timeout=5)  # 1 ns rounds up to 1 ms: the upstream is called
        assert_trailers_only(s, 4)
    # The one call that went upstream timed out there. (Not the upstream's own record: 1 ms
    # after the request left, the gateway may close the connection before a busy upstream read
    # it.)
    assert metric_sum(sluice, "sluice_upstream_errors_total", kind="response_timeout") == 1
    assert len(upstream.requests) <= 1, upstream.requests


def test_grpc_status_in_the_access_log_and_metrics(sluice_factory, upstream, tmp_path):
    log_path = tmp_path / "access.jsonl"
    gw = sluice_factory(upstream, log={"access_log": str(log_path)},
                        routes=[route_cfg("svc", match={"path_prefix": "/trailers/"})])
    q = urllib.parse.urlencode([("grpc-status", "5"), ("grpc-message", "not found")])
    with open_h2(gw.port) as c:
        # The upstream's grpc-status, in the trailers of its chunked answer.
        s = c.response(c.request("POST", f"/trailers/7?{q}", GRPC, b"x"))
        assert s.status == 200 and ("grpc-status", "5") in s.trailers, s
        # The gateway's own: no route.
        assert_trailers_only(c.response(c.request("POST", "/pkg.Svc/Nope", GRPC, b"x")), 12)
        # Not a gRPC call: no grpc_status.
        assert c.response(c.request("GET", "/trailers/1")).status == 200
    recs = records(log_path, 3)
    by_path = {r["path"]: r for r in recs}
    assert by_path["/trailers/7"]["grpc_status"] == 5 and by_path["/trailers/7"]["status"] == 200
    assert by_path["/pkg.Svc/Nope"]["grpc_status"] == 12
    assert by_path["/pkg.Svc/Nope"]["status"] == 200
    assert "grpc_status" not in by_path["/trailers/1"], by_path["/trailers/1"]
    assert metric_sum(gw, "sluice_grpc_requests_total", route="svc", grpc_status="5") == 1
    assert metric_sum(gw, "sluice_grpc_requests_total", route="", grpc_status="12") == 1
    assert metric_sum(gw, "sluice_grpc_requests_total") == 2
