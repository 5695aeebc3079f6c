"""A real gRPC server (python3-grpcio) behind the gateway over h2c ([[upstream]] protocol =
"h2c"), a real gRPC client in front: unary, server-streaming (1,000 messages),
client-streaming and bidirectional calls pass with their metadata and trailers; an upstream's
error status and message reach the client (a trailers-only answer stays one); the access log
carries each call's grpc-status. Run time: some 3 s."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import pytest

from conftest import free_port
from harness.gateway import wait_until


def _echo(request, context):
    metadata = dict(context.invocation_metadata())
    if metadata.get("x-fail"):
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: " + metadata["x-fail"])
    context.send_initial_metadata((("x-user-seen", metadata.get("x-user", "")),))
    context.set_trailing_metadata((("x-trail", "t1"), ("x-bin-bin", b"\x00\x01")))
    return request


def _stream(request, context):
    for i in range(1000):
        yield b"m%d" % i


def _collect(requests, context):
    return b"".join(requests)


def _upper(requests, context):
    for message in requests:
        yield message.upper()


@pytest.fixture
def grpc_upstream():
    handler = grpc.method_handlers_generic_handler("pkg.Svc", {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Collect": grpc.stream_unary_rpc_method_handler(_collect),
        "Upper": grpc.stream_stream_rpc_method_handler(_upper),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield port
    server.stop(0)


def test_grpc_calls_through_an_h2c_upstream(sluice_factory, grpc_upstream, tmp_path):
    log = tmp_path / "access.log"
    gw = sluice_factory(upstreams=[{"name": "grpc", "endpoints": [f"127.0.0.1:{grpc_upstream}"],
                                    "protocol": "h2c"}],
                        log={"access_log": str(log)})
    with grpc.insecure_channel(f"127.0.0.1:{gw.port}") as channel:
        reply, call = channel.unary_unary("/pkg.Svc/Echo").with_call(
            b"hello", metadata=(("x-user", "u1"),), timeout=5)
        assert reply == b"hello"
        assert ("x-user-seen", "u1") in call.initial_metadata()
        trailers = dict(call.trailing_metadata())
        assert trailers["x-trail"] == "t1" and trailers["x-bin-bin"] == b"\x00\x01", trailers

        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/pkg.Svc/Echo")(b"x", metadata=(("x-fail", "k9"),), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "no such thing: k9"

        messages = list(channel.unary_stream("/pkg.Svc/Stream")(b"", timeout=20))
        assert len(messages) == 1000 and messages[0] == b"m0" and messages[-1] == b"m999"

        assert channel.stream_unary("/pkg.Svc/Collect")(
            iter([b"a", b"b", b"c"]), timeout=5) == b"abc"
        assert list(channel.stream_stream("/pkg.Svc/Upper")(
            iter([b"x", b"y"]), timeout=5)) == [b"X", b"Y"]

    def records():
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    wait_until(records, lambda rs: len(rs) >= 5)
    statuses = [(r["path"], r["grpc_status"]) for r in records()]
    assert statuses == [("/pkg.Svc/Echo", 0), ("/pkg.Svc/Echo", 5), ("/pkg.Svc/Stream", 0),
                        ("/pkg.Svc/Collect", 0), ("/pkg.Svc/Upper", 0)], statuses
    assert all(r["status"] == 200 and r["protocol"] == "h2" for r in records())
