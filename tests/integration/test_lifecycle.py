"""Process lifecycle: SIGTERM/SIGINT drain (requests in flight finish, new connections refused,
exit 0), drain_timeout, several workers sharing the port (SO_REUSEPORT)."""

import os
import signal
import threading
import time

import pytest

from conftest import EXIT_SLACK_S, connection_refused
from rawhttp import RawClient


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_request_in_flight(sluice_factory, upstream, signum):
    gw = sluice_factory(upstream, server={"drain_timeout": "5s"})
    idle = gw.client()
    idle.request("GET", "/echo?idle")
    assert idle.read_response().status == 200
    busy = gw.client(timeout=10)
    busy.request("GET", "/slow/1500")
    assert upstream.wait_for(lambda u: u.request_count == 2, 3)

    t0 = time.monotonic()
    gw.send_signal(signum)
    # stops accepting
    assert connection_refused(gw.port, 1.0), "new connections still accepted while draining"
    # an idle keep-alive connection is closed
    assert idle.is_closed(2), "idle keep-alive connection left open while draining"
    # the request in flight completes
    assert gw.alive(), "exited with a request in flight"
    r = busy.read_response()
    assert r.status == 200 and r.json()["slept_ms"] == 1500
    assert "close" in r.connection_tokens()
    assert busy.is_closed(2)
    busy.close()
    idle.close()
    rc = gw.wait(10)
    assert rc == 0, gw.stderr()
    # Out once the 1.5 s request is done, long before drain_timeout (5 s).
    assert time.monotonic() - t0 < 1.5 + EXIT_SLACK_S


def test_sigterm_idle_gateway_exits_quickly(sluice_factory, upstream):
    gw = sluice_factory(upstream)
    assert gw.get("/echo").status == 200
    t0 = time.monotonic()
    gw.send_signal(signal.SIGTERM)
    assert gw.wait(10) == 0, gw.stderr()
    assert time.monotonic() - t0 < EXIT_SLACK_S


def test_drain_timeout_cuts_long_requests(sluice_factory, upstream):
    gw = sluice_factory(upstream, server={"drain_timeout": "500ms"})
    c = gw.client(timeout=10)
    c.request("GET", "/slow/4000")
    assert upstream.wait_for(lambda u: u.request_count == 1, 3)
    t0 = time.monotonic()
    gw.send_signal(signal.SIGTERM)
    rc = gw.wait(10)
    elapsed = time.monotonic() - t0
    assert rc == 0, gw.stderr()
    assert 0.4 <= elapsed < 0.5 + EXIT_SLACK_S, elapsed
    assert c.is_closed(1)
    c.close()


def test_sigterm_with_pipelined_requests_waiting(sluice_factory, upstream):
    """The request in flight is answered; the gateway closes afterwards and exits 0."""
    gw = sluice_factory(upstream, server={"drain_timeout": "5s"})
    with gw.client(timeout=10) as c:
        c.request("GET", "/slow/800")
        assert upstream.wait_for(lambda u: u.request_count == 1, 3)
        gw.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        r = c.read_response()
        assert r.status == 200
        assert "close" in r.connection_tokens()
        assert c.is_closed(3)
    assert gw.wait(10) == 0


def test_two_workers_both_serve(sluice_factory, upstream):
    """Each worker has its own upstream pool: one-request connections spread over the two
    workers (SO_REUSEPORT) reach the upstream over exactly two pooled connections."""
    gw = sluice_factory(upstream, workers=2)
    assert gw.threads() >= 3  # main + 2 workers
    for i in range(40):
        with gw.client() as c:
            c.request("GET", f"/echo?i={i}")
            assert c.read_response().status == 200
    assert upstream.request_count == 40
    assert upstream.connection_count == 2, upstream.stats()["connections"]
    assert all(c.requests > 1 for c in upstream.connections)


def test_one_worker_uses_one_pool(sluice_factory, upstream):
    """Control for the test above."""
    gw = sluice_factory(upstream, workers=1)
    for i in range(20):
        with gw.client() as c:
            c.request("GET", f"/echo?i={i}")
            assert c.read_response().status == 200
    assert upstream.connection_count == 1


def test_workers_zero_means_one_per_core(sluice_factory, upstream):
    gw = sluice_factory(upstream, workers=0)
    cores = os.cpu_count() or 1
    assert gw.threads() >= cores + 1, (gw.threads(), cores)
    for i in range(10):
        assert gw.get(f"/echo?i={i}").status == 200


def test_two_workers_drain_on_sigterm(sluice_factory, upstream):
    gw = sluice_factory(upstream, workers=2, server={"drain_timeout": "5s"})
    results = []
    clients = [gw.client(timeout=10) for _ in range(8)]
    for i, c in enumerate(clients):
        c.request("GET", f"/slow/800?i={i}")
    assert upstream.wait_for(lambda u: u.request_count == 8, 3)
    gw.send_signal(signal.SIGTERM)
    assert connection_refused(gw.port, 1.0)
    for c in clients:
        r = c.read_response()
        results.append(r.status)
        c.close()
    assert results == [200] * 8
    assert gw.wait(10) == 0


def test_healthz(sluice):
    status, body = sluice.admin_get("/healthz")
    assert status == 200
