"""Operations: GET /healthz and GET /ready. /ready is 503 until Valkey answers (on every worker)
and 503 as soon as a drain starts, while /healthz stays 200 as long as the process runs."""

import signal
import time

from conftest import limit_cfg, metric_sum, sluice_with_limits, wait_admin
from rawhttp import RawClient


def test_ready_503_until_valkey_answers_then_200(sluice_factory, upstream, valkey):
    """The gateway starts while Valkey is stopped: /ready 503 (and sluice_ready 0), /healthz
    200; once Valkey runs, /ready answers 200 within a few seconds on both workers."""
    valkey.stop()
    limits = [limit_cfg("lim", "fixed_window", 100, "1h")]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits, workers=2,
                            wait_ready=False, valkey_options={"timeout": "50ms"})
    for _ in range(5):
        status, body = gw.admin_get("/ready")
        assert status == 503, body
        assert gw.admin_get("/healthz")[0] == 200
        time.sleep(0.1)
    assert metric_sum(gw, "sluice_ready") == 0
    assert gw.get("/echo").status == 200  # on_error = allow meanwhile

    valkey.start()
    took = wait_admin(gw, "/ready", 200, timeout=10)
    # Measured 0.05-0.9 s: Valkey starts some 0.7 s after the gateway, whose attempts back off
    # from 100 ms doubling (with jitter), so the next one may be due 0.8 s later. 5 s is the
    # backoff's cap: this catches a client that stops retrying or overruns it.
    assert took < 5, f"/ready took {took:.1f}s to see Valkey"
    assert metric_sum(gw, "sluice_ready") == 1
    assert gw.admin_get("/healthz")[0] == 200
    # Every worker answers with Valkey now (connections spread over both workers).
    for _ in range(20):
        assert gw.get("/echo").status == 200
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="error_allowed") == 1
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", outcome="allowed") == 20


def test_ready_without_valkey_is_200(sluice):
    assert sluice.admin_get("/ready")[0] == 200
    assert sluice.admin_get("/healthz")[0] == 200


def test_ready_503_as_soon_as_drain_starts_healthz_still_200(sluice_factory, upstream):
    """SIGTERM with a slow request in flight: /ready answers 503 at once while /healthz answers
    200 for the whole drain; the request completes and the process exits 0."""
    gw = sluice_factory(upstream, server={"drain_timeout": "5s"})
    assert gw.admin_get("/ready")[0] == 200
    busy = RawClient(gw.port, timeout=10)
    busy.request("GET", "/slow/1500")
    assert upstream.wait_for(lambda u: u.request_count == 1, 3)

    gw.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    took = wait_admin(gw, "/ready", 503, timeout=1)
    assert took < 0.5, f"/ready still 200 {took:.2f}s into the drain"
    samples = []
    while time.monotonic() - t0 < 1.0:
        samples.append((gw.admin_get("/healthz")[0], gw.admin_get("/ready")[0]))
        time.sleep(0.05)
    assert samples and all(s == (200, 503) for s in samples), samples
    assert gw.alive(), "exited with a request in flight"
    r = busy.read_response()
    assert r.status == 200 and r.json()["slept_ms"] == 1500
    assert "close" in r.connection_tokens()
    busy.close()
    assert gw.wait(10) == 0, gw.stderr()
