"""algorithm = "concurrency": requests in flight per key, shared by every gateway through
Valkey. Each slot is a lease in a sorted set (lua/concurrency.lua) that its gateway renews while
the request lasts and frees when it ends (response, client gone, upstream failure, WebSocket
closed); a gateway that dies loses its slots when their leases end."""

import signal
import threading
import time
from collections import Counter

from conftest import (TIMER_SLACK_S, hashed_part, limit_cfg, metric_sum, parse_rl_list,
                      sluice_with_limits, used, wait_metric, wait_until)
from rawhttp import RawClient
from test_websocket import handshake

KEY = "rl:v2:in_flight:{127.0.0.1}"


def in_flight(limit, lease=None, **kw):
    cfg = {"name": "in_flight", "algorithm": "concurrency", "by": ["ip"], "limit": limit, **kw}
    if lease:
        cfg["lease"] = lease
    return cfg


def held(valkey, key=KEY):
    """Live slots of the key (members whose lease has not ended)."""
    now_us = valkey.client.time()
    now_us = now_us[0] * 1_000_000 + now_us[1]
    return valkey.client.zcount(key, f"({now_us}", "+inf")


def wait_value(read, n, timeout):
    """read() until it gives n or the time is up; its last value."""
    return wait_until(read, lambda got: got == n, timeout, step=0.02)


def wait_held(valkey, n, timeout=3.0, key=KEY):
    return wait_value(lambda: held(valkey, key), n, timeout)


def wait_slots_metric(gw, n, timeout=3.0):
    return wait_metric(gw, "sluice_concurrency_slots_held", lambda v: v == n, timeout)


def one_slow_request(gw, target="/slow/1500", headers=()):
    """A request that holds its slot for a while, in a thread (join it)."""
    t = threading.Thread(target=lambda: gw.get(target, headers, timeout=10))
    t.start()
    return t


def slow_requests(ports, target, count):
    """`count` requests at once, spread over the gateways' ports; [(status, response, seconds)]
    in the order they were started."""
    out = [None] * count
    barrier = threading.Barrier(count)

    def one(i):
        barrier.wait()
        t0 = time.monotonic()
        with RawClient(ports[i % len(ports)], timeout=15) as c:
            c.request("GET", target)
            r = c.read_response()
        out[i] = (r.status, r, time.monotonic() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def check_slot_refusal(r, limit):
    assert r.status == 429, r
    assert r.header("retry-after") == "1", r.headers
    state = parse_rl_list(r.header("ratelimit"))
    assert state["in_flight"]["r"] == 0, state
    policy = r.header("ratelimit-policy").split(", ")
    assert f'"in_flight";q={limit}' in policy, policy  # slots: no window
    assert r.json()["violated-policies"] == ["in_flight"]


def test_slots_are_shared_by_two_gateways(sluice_factory, upstream, valkey):
    gws = [sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(4)], workers=2)
           for _ in range(2)]
    results = slow_requests([gw.port for gw in gws], "/slow/1500", 8)
    statuses = Counter(s for s, _, _ in results)
    assert statuses == {200: 4, 429: 4}, statuses
    for status, r, seconds in results:
        if status == 429:
            check_slot_refusal(r, 4)
            assert seconds < 1.0, "a refusal does not wait for a slot"
        else:
            assert seconds >= 1.4
            state = parse_rl_list(r.header("ratelimit"))
            assert 0 <= state["in_flight"]["r"] <= 3, state
    assert wait_held(valkey, 0) == 0, "every slot is freed when its response ends"
    assert upstream.request_count == 4
    # Freed, they serve again.
    again = slow_requests([gw.port for gw in gws], "/slow/200", 4)
    assert [s for s, _, _ in again] == [200] * 4
    assert wait_held(valkey, 0) == 0
    for gw in gws:
        assert wait_slots_metric(gw, 0) == 0


def test_slots_in_flight_are_visible_and_remaining_counts_free_slots(sluice_factory, upstream,
                                                                    valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(3)])
    first = one_slow_request(gw)
    assert wait_held(valkey, 1) == 1
    # (Valkey holds the slot a moment before the gateway has read the reply that took it.)
    assert wait_slots_metric(gw, 1) == 1
    r = gw.get("/status/200")
    assert r.status == 200
    # The slot of this request was taken too when the header was written: 3 - 2 left.
    assert parse_rl_list(r.header("ratelimit"))["in_flight"]["r"] == 1
    first.join(10)
    assert wait_held(valkey, 0) == 0


def test_slot_freed_when_the_client_leaves(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(1)])
    c = RawClient(gw.port, timeout=5)
    c.request("GET", "/hang")
    assert wait_held(valkey, 1) == 1
    check_slot_refusal(gw.get("/status/200"), 1)
    c.close()
    assert wait_held(valkey, 0) == 0, "the slot is freed when the client leaves"
    assert gw.get("/status/200").status == 200


def test_slot_freed_when_the_upstream_fails(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(1)])
    assert gw.get("/close-now").status == 502
    assert wait_held(valkey, 0) == 0
    assert gw.get("/status/200").status == 200
    assert wait_held(valkey, 0) == 0


def test_websocket_holds_its_slot_while_open(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(1)])
    with RawClient(gw.port, timeout=5) as ws:
        _, r = handshake(ws)
        assert r.status == 101, r
        time.sleep(0.2)
        assert held(valkey) == 1
        check_slot_refusal(gw.get("/status/200"), 1)
    assert wait_held(valkey, 0) == 0, "the slot is freed when the tunnel closes"
    assert gw.get("/status/200").status == 200


def test_lease_is_renewed_while_the_request_lasts(sluice_factory, upstream, valkey):
    # (Renewed every third of the lease: a loaded machine has 1.3 s of margin.)
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(1, lease="2s")])
    first = one_slow_request(gw, "/slow/4500")
    assert wait_held(valkey, 1) == 1
    time.sleep(3.0)  # one and a half leases: held only because the gateway renews it
    assert held(valkey) == 1
    check_slot_refusal(gw.get("/status/200"), 1)
    assert metric_sum(gw, "sluice_concurrency_lease_calls_total", op="renew",
                      result="done") >= 2
    first.join(10)
    assert wait_held(valkey, 0) == 0


def test_slots_of_a_killed_gateway_are_freed_when_their_lease_ends(sluice_factory, upstream,
                                                                  valkey):
    lease_s = 2.0
    limits = [in_flight(2, lease="2s")]
    doomed = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    other = sluice_with_limits(sluice_factory, upstream, valkey, limits)
    clients = []
    for _ in range(2):
        c = RawClient(doomed.port, timeout=5)
        c.request("GET", "/hang")
        clients.append(c)
    assert wait_held(valkey, 2) == 2
    doomed.stop(signal.SIGKILL, timeout=5)
    doomed.stopped = True  # (killed on purpose: not a failed exit)
    killed_at = time.monotonic()
    check_slot_refusal(other.get("/status/200"), 2)
    # Free at most a lease (and the last renewal's third of it) after the kill.
    while other.get("/status/200").status == 429:
        assert time.monotonic() - killed_at < lease_s + TIMER_SLACK_S + 0.5, "slots leaked"
        time.sleep(0.05)
    waited = time.monotonic() - killed_at
    assert waited >= lease_s * 2 / 3 - TIMER_SLACK_S, f"freed after {waited:.2f}s: too early"
    for c in clients:
        c.close()
    assert wait_held(valkey, 0, timeout=lease_s + 1) == 0


def test_a_request_refused_by_a_rate_limit_takes_no_slot(sluice_factory, upstream, valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "fixed_window", 1, "1h"), in_flight(5)])
    first = one_slow_request(gw)
    assert wait_held(valkey, 1) == 1
    for _ in range(3):
        r = gw.get("/status/200")
        assert r.status == 429
        assert r.json()["violated-policies"] == ["per_ip"]
        assert held(valkey) == 1, "a request refused by a rate limit takes no slot"
    first.join(10)
    assert wait_held(valkey, 0) == 0


def test_a_request_refused_for_lack_of_a_slot_is_charged_nothing(sluice_factory, upstream,
                                                                 valkey):
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [limit_cfg("per_ip", "fixed_window", 10, "1h"), in_flight(1)])
    first = one_slow_request(gw)
    assert wait_held(valkey, 1) == 1
    for _ in range(3):
        check_slot_refusal(gw.get("/status/200"), 1)
    assert used(valkey, "rl:v2:per_ip:{127.0.0.1}", "fixed_window", 3600) == 1
    first.join(10)


def test_plans_raise_the_slots_of_their_tenants(sluice_factory, upstream, valkey):
    limit = in_flight(1)
    limit["by"] = ["api_key"]
    gw = sluice_with_limits(
        sluice_factory, upstream, valkey, [limit],
        plans=[{"name": "pro", "limits": {"in_flight": 2}}],
        tenants=[{"name": "acme", "plan": "pro", "api_keys": ["key_pro"]}])
    key = f"rl:v2:in_flight:{{{hashed_part('key_pro')}}}"
    hdr = [("X-API-Key", "key_pro")]
    first = one_slow_request(gw, headers=hdr)
    assert wait_held(valkey, 1, key=key) == 1
    r = gw.get("/status/200", hdr)
    assert r.status == 200, r
    assert r.header("ratelimit-policy") == '"in_flight";q=2'
    first.join(10)
    assert wait_held(valkey, 0, key=key) == 0


def test_admin_shows_free_slots_and_delete_frees_them(sluice_factory, upstream, valkey):
    from test_admin_limits import admin, peek
    gw = sluice_with_limits(sluice_factory, upstream, valkey, [in_flight(3)])
    c = RawClient(gw.port, timeout=5)
    c.request("GET", "/hang")
    assert wait_held(valkey, 1) == 1
    body = peek(gw, "/limits/in_flight?ip=127.0.0.1")
    assert body["algorithm"] == "concurrency" and body["key"] == KEY
    assert body["quota"] == 3 and body["remaining"] == 2, body
    assert admin(gw, "DELETE", "/limits/in_flight?ip=127.0.0.1").status == 204
    assert held(valkey) == 0, "a reset frees every slot of the client"
    c.close()


def _slots_taken_while_valkey_paused(gw, valkey, paused_s):
    """Two requests at once while Valkey is paused: both decisions go out, time out and are
    answered by on_error (allow); Valkey resumes after `paused_s` and runs them."""
    valkey.pause()
    try:
        results = slow_requests([gw.port], "/status/200", 2)
        assert [s for s, _, _ in results] == [200, 200], results
        time.sleep(max(0.0, paused_s - max(sec for _, _, sec in results)))
    finally:
        valkey.resume()
    return time.monotonic()


def test_slot_is_freed_even_when_its_decision_timed_out(sluice_factory, upstream, valkey):
    # Issue 23, item 2. Paused shorter than the stall limit (10 x 200 ms: the connection stays
    # and the late replies come on it), then longer (the connection is replaced): either way
    # Valkey runs the queued decisions when it resumes, and the releases that the suspect
    # connection refused are sent once it answers, within about a resend round.
    gw = sluice_with_limits(sluice_factory, upstream, valkey,
                            [in_flight(2, lease="30s", on_error="allow")], workers=1,
                            valkey_options={"timeout": "200ms"})
    for paused_s in (0.8, 3.0):
        resumed = _slots_taken_while_valkey_paused(gw, valkey, paused_s)
        time.sleep(0.3)  # (Valkey has run what was waiting for it)
        freed = wait_held(valkey, 0, timeout=3.0)
        took = time.monotonic() - resumed
        assert freed == 0, f"paused {paused_s}s: {freed} slots still held {took:.1f}s after"
        again = slow_requests([gw.port], "/slow/300", 2)
        assert [s for s, _, _ in again] == [200, 200], (paused_s, again)
        # (releases may go out in one call; those of `again` follow its responses)
        assert wait_metric(gw, "sluice_concurrency_lease_calls_total", lambda v: v >= 2,
                           op="release", result="done") >= 2
    assert wait_slots_metric(gw, 0) == 0
