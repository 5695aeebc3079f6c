"""Robustness: Valkey fails while requests stream (killed and restarted, paused with SIGSTOP,
slowed by a busy script). A load process sends requests back to back on three routes: one whose
limit fails open (on_error = "allow"), one whose limit fails closed ("deny"), and one without
limits. Every request must be answered within the Valkey deadline plus a margin (none hangs),
by on_error while Valkey is away, exactly again soon after it is back; the route without limits
never waits; the gateway's memory is back at its baseline afterwards.

Numbers (latencies, RSS before/after) are printed (pytest -s) and summed up in README.md,
"Robustness: what was tried and what held"."""

import threading
import time

import pytest

from conftest import (Load, check_all_answered, check_unaffected, latency_summary, limit_cfg, metric_sum, records_of,
                      report_figures, route_cfg, rss_tolerance_kb, scaled, settled_rss_kb,
                      sluice_with_limits, status_counts, wait_admin)

# Latency, memory and descriptor bounds under load: measured without other tests beside them.
pytestmark = pytest.mark.alone


@pytest.fixture(autouse=True)
def _asan_small_quarantine(asan_small_quarantine):
    """A smaller ASan quarantine for RSS checks (conftest.asan_small_quarantine)."""


TIMEOUT_S = 0.1  # [valkey] timeout: the deadline of one decision
# On top of the deadline, for 2 cores shared by the gateway, Valkey, the upstream process and the
# load process: measured worst cases are the deadline + 7 ms, but such a machine has hiccups of
# 50-110 ms now and then (seen without any fault too). A decision that waited for Valkey instead
# of its deadline would take the whole outage (1.2 s) or busy script (500 ms): still caught.
MARGIN_S = scaled(0.25, 0.35)
RSS_TOLERANCE_KB = rss_tolerance_kb()  # see conftest.RSS_TOLERANCE_KB
THREADS = 3  # client threads per route

LIMITS = [
    limit_cfg("la", "fixed_window", 5, "1h", by=["header:X-Client"], on_error="allow"),
    limit_cfg("ld", "sliding_window", 5, "1h", by=["header:X-Client"], on_error="deny"),
]
ROUTES = [
    route_cfg("deny", ["ld"], match={"host": "deny.test"}),
    route_cfg("free", [], match={"host": "free.test"}),
    route_cfg("allow", ["la"], match={"path_prefix": "/status/"}),
]


def raw(host, client="load-{n}"):
    return (f"GET /status/200 HTTP/1.1\r\nHost: {host}\r\nX-Client: {client}\r\n\r\n").encode()


KINDS = {"allow": (raw("allow.test"), THREADS), "deny": (raw("deny.test"), THREADS),
         "free": (raw("free.test"), THREADS),
         "local": (b"GET /nowhere HTTP/1.1\r\nHost: allow.test\r\n\r\n", 1)}


LIMITED = ("allow", "deny")


def gateway(sluice_factory, upstream_process_factory, valkey, workers=2):
    up = upstream_process_factory("app")
    return sluice_with_limits(sluice_factory, up.address, valkey, LIMITS, ROUTES,
                              valkey_options={"timeout": f"{int(TIMEOUT_S * 1000)}ms"},
                              workers=workers)


def exact_again(gw, client_id, host):
    """A fresh key: exactly 5 requests pass, then 429."""
    got = [gw.get("/status/200", [("X-Client", client_id), ("Host", host)]).status
           for _ in range(8)]
    assert got == [200] * 5 + [429] * 3, f"decisions not exact ({host}): {got}"


def warm_up(gw, seconds=0.7):
    """The same load without a fault, then the RSS it leaves: the baseline."""
    recs = Load(gw.port, KINDS, duration=seconds).start().results()
    got = {(r.kind, r.status) for r in recs}
    assert got == {("allow", 200), ("deny", 200), ("free", 200), ("local", 404)}, got
    return settled_rss_kb(gw)


def check_every_answer(recs, load):
    """No request hung or failed at the socket; limited routes within deadline + margin;
    requests that never ask Valkey (the route without limits, a 404) not slowed at all."""
    check_all_answered(recs, load)
    # (own: without the stalls of the whole machine during the request, see conftest's
    # _STALL_PROBE; a decision that waited for Valkey still shows the whole fault)
    late = [(r.kind, round(r.dt, 3), round(r.stall, 3)) for r in recs
            if r.kind in LIMITED and r.own > TIMEOUT_S + MARGIN_S]
    assert not late, f"answered after deadline + margin ({TIMEOUT_S + MARGIN_S}s): {late[:20]}"
    return {"free": check_unaffected(recs, "free", 200),
            "local": check_unaffected(recs, "local", 404)}


def outage_test(gw, valkey, fault, heal, tag):
    """Load; fault() after 0.7 s, heal() 1.2 s later; the load goes on for 0.5 s after /ready
    says Valkey is back. Returns the figures."""
    base_kb = warm_up(gw)
    exact_again(gw, f"{tag}-before", "allow.test")
    load = Load(gw.port, KINDS, duration=20).start()
    time.sleep(0.7)
    t_fault = time.monotonic()
    fault()
    t_down = time.monotonic()  # fault() returned: Valkey is gone (or frozen) from here on
    time.sleep(1.2)
    t_heal = time.monotonic()
    heal()
    took = wait_admin(gw, "/ready", 200, timeout=10)
    t_ready = time.monotonic()
    load.end_at(t_ready + 0.5)
    recs = load.results()
    check_every_answer(recs, load)

    # Done before the fault: fresh keys everywhere, so every decision allows.
    before = [r for r in records_of(recs, "deny") if r.t0 + r.dt < t_fault]
    assert before and {r.status for r in before} == {200}, status_counts(before)
    # Valkey away: on_error decides. Requests started in the 50 ms after it went away may still
    # have been decided by it (killed: the reply was on its way; paused: not yet frozen), and
    # requests started in the 50 ms before it came back may be decided by it again (a request
    # reaches the gateway a little after the client started it).
    down_allow = records_of(recs, "allow", t_down + 0.05, t_heal - 0.05)
    down_deny = records_of(recs, "deny", t_down + 0.05, t_heal - 0.05)
    assert down_allow and {r.status for r in down_allow} == {200}, status_counts(down_allow)
    odd = [(round(r.t0 - t_down, 3), round(r.dt, 3), r.status) for r in down_deny if r.status != 503]
    assert down_deny and not odd, (status_counts(down_deny), odd[:20])
    # Back: decisions by Valkey again as soon as /ready says so.
    after = records_of(recs, "deny", t_ready + 0.05)
    odd = [(round(r.t0 - t_ready, 3), round(r.dt, 3), r.status) for r in after if r.status != 200]
    assert after and not odd, \
        f"fail-closed route after Valkey came back: {status_counts(after)}: {odd[:20]}"
    # 5 s: the reconnect backoff's cap (after a 1.2 s outage the next attempt is due within
    # 1.6 s); this catches a client that stops retrying, not a backoff a step too long.
    assert took < 5, f"{took:.1f}s until /ready after Valkey came back"
    exact_again(gw, f"{tag}-after", "allow.test")
    exact_again(gw, f"{tag}-after", "deny.test")

    after_kb = settled_rss_kb(gw)
    assert gw.alive()
    figures = dict(requests=len(recs),
                   down_allow=latency_summary(down_allow), down_deny=latency_summary(down_deny),
                   free=latency_summary(records_of(recs, "free")),
                   local=latency_summary(records_of(recs, "local")),
                   all_limited_max_ms=latency_summary([r for r in recs if r.kind in LIMITED])["max"],
                   ready_after_s=round(took, 2), rss_base_kb=base_kb, rss_after_kb=after_kb)
    assert after_kb <= base_kb + RSS_TOLERANCE_KB, figures
    return figures


def test_valkey_killed_under_load_and_restarted(sluice_factory, upstream_process_factory,
                                                valkey):
    gw = gateway(sluice_factory, upstream_process_factory, valkey)
    figures = outage_test(gw, valkey, valkey.kill, valkey.start, "killed")
    assert metric_sum(gw, "sluice_ratelimit_decisions_total", limit="ld",
                      outcome="error_denied") >= figures["down_deny"]["n"]
    report_figures("valkey killed", **figures)


def test_valkey_paused_under_load_and_resumed(sluice_factory, upstream_process_factory, valkey):
    gw = gateway(sluice_factory, upstream_process_factory, valkey)
    figures = outage_test(gw, valkey, valkey.pause, valkey.resume, "paused")
    report_figures("valkey paused", **figures)


BUSY_SCRIPT = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
local n = 0
while true do
  n = n + 1
  local u = redis.call('TIME')
  if u[1] * 1000000 + u[2] - start >= tonumber(ARGV[1]) then return n end
end
"""


BUSY_MS = 500  # longer than the deadline + margin: a decision that waited for it is caught


def test_valkey_slowed_by_busy_scripts(sluice_factory, upstream_process_factory, valkey):
    """Another client keeps Valkey busy: 500 ms scripts (a script blocks the whole server) with
    100 ms gaps. Limited routes are decided within their deadline (by on_error when Valkey is
    late, by Valkey in the gaps), the route without limits is not slowed at all."""
    gw = gateway(sluice_factory, upstream_process_factory, valkey)
    base_kb = warm_up(gw)
    busy = valkey.new_client(socket_timeout=10)
    stop = threading.Event()
    spans = []

    def hog():
        while not stop.is_set():
            t0 = time.monotonic()
            busy.eval(BUSY_SCRIPT, 0, BUSY_MS * 1000)
            spans.append((t0, time.monotonic()))
            stop.wait(0.1)

    load = Load(gw.port, KINDS, duration=20).start()
    time.sleep(0.5)
    t_slow = time.monotonic()
    th = threading.Thread(target=hog)
    th.start()
    time.sleep(1.6)
    stop.set()
    th.join(5)
    t_fast = time.monotonic()
    busy.close()
    load.end_at(t_fast + 0.3)
    recs = load.results()
    check_every_answer(recs, load)

    slow_allow = records_of(recs, "allow", t_slow, t_fast)
    slow_deny = records_of(recs, "deny", t_slow, t_fast)
    assert {r.status for r in slow_allow} == {200}, status_counts(slow_allow)
    assert set(status_counts(slow_deny)) <= {200, 503}, status_counts(slow_deny)
    # The decisions that fell to on_error are the ones Valkey was too late for.
    assert status_counts(slow_deny).get(503, 0) >= len(spans), \
        f"{len(spans)} busy scripts, but only {status_counts(slow_deny)} on the fail-closed route"
    free_before = records_of(recs, "free", t_to=t_slow)
    free_slow = records_of(recs, "free", t_slow, t_fast)
    wait_admin(gw, "/ready", 200, timeout=10)
    exact_again(gw, "slow-after", "allow.test")
    exact_again(gw, "slow-after", "deny.test")
    after_kb = settled_rss_kb(gw)
    figures = dict(requests=len(recs), busy_scripts=len(spans),
                   script_ms=[round((b - a) * 1000) for a, b in spans[:3]],
                   slow_allow=latency_summary(slow_allow), slow_deny=latency_summary(slow_deny),
                   slow_deny_statuses=status_counts(slow_deny),
                   free_before=latency_summary(free_before), free_slow=latency_summary(free_slow),
                   rss_base_kb=base_kb, rss_after_kb=after_kb)
    report_figures("valkey slow", **figures)
    assert after_kb <= base_kb + RSS_TOLERANCE_KB, figures
