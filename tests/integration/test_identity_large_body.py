"""A route whose limits read the body, with a bound larger than what the gateway buffers before
it stops reading a client: the admission still gets the whole body (no stall, no 408)."""

import json

from conftest import limit_cfg, route_cfg, sluice_with_limits


def test_body_larger_than_the_backpressure_mark_is_read_to_decide(sluice_factory, upstream,
                                                                 valkey):
    routes = [route_cfg("login", ["per_user"], match={"path": "/echo/login"},
                        max_buffered_body_bytes=1024 * 1024)]
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_user", "sliding_log", 2, "1h", by=["json:user"])],
                            routes=routes, server={"idle_timeout": "3s"})
    body = json.dumps({"user": "alice", "padding": "x" * (400 * 1024)}).encode()
    statuses = []
    for _ in range(3):
        r = gw.request("POST", "/echo/login", [("Content-Type", "application/json")], body)
        statuses.append(r.status)
        if r.status == 200:
            assert r.json()["body_len"] == len(body)
    assert statuses == [200, 200, 429]
