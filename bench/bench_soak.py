"""bench.py soak: a fixed-rate keep-alive load on Sluice for minutes while Valkey is restarted
every minute; one line of figures every interval and a summary at the end (driven by
bench/soak.sh)."""

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import time

from bench_probe import HOST, metric_sum, pid_alive, sluice_metrics
from bench_idle import parse_response_head


class SoakConn:
    __slots__ = ("sock", "busy", "sent_at", "buf", "need", "status", "close_after", "out")

    def __init__(self):
        self.sock = None
        self.busy = False
        self.sent_at = 0.0
        self.buf = b""
        self.need = None
        self.status = None
        self.close_after = False
        self.out = b""


def proc_status(pid):
    """VmRSS (KiB) and open file descriptors of a process (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), None)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds
    except (OSError, StopIteration):
        return None, None


def percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, int(q / 100 * len(sorted_vals)))]


def fmt_ms(us):
    return "-" if us is None else f"{us / 1000:.1f}" if us >= 10000 else f"{us / 1000:.2f}"


def least_squares_slope(points):
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


class ValkeyRestarter:
    """SIGTERM the Valkey server every `every` seconds, wait for it to exit, keep it down for
    `downtime` seconds and start it again on the same port (same command line)."""

    def __init__(self, args, log):
        self.argv = json.loads(args.valkey_argv)
        self.pid = args.valkey_pid  # the first one was started by soak.sh
        self.proc = None           # later ones are ours
        self.every = args.restart_every
        self.downtime = args.valkey_downtime
        self.pidfile = args.valkey_pidfile
        self.log = log
        self.state = "up"
        self.t_term = self.t_down = 0.0
        self.next_at = self.every if self.every > 0 else float("inf")
        self.restarts = []
        self.events = []  # text for the current interval row

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return pid_alive(self.pid)

    def tick(self, t):
        if self.state == "up" and t >= self.next_at:
            self.next_at += self.every
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.state, self.t_term = "stopping", t
            self.restarts.append({"t_term": round(t, 3), "old_pid": self.pid})
        elif self.state == "stopping":
            if not self.alive():
                self.state, self.t_down = "down", t
                self.restarts[-1]["exit_s"] = round(t - self.t_term, 3)
            elif t - self.t_term > 10:
                os.kill(self.pid, signal.SIGKILL)
                self.restarts[-1]["killed"] = True
        elif self.state == "down" and t - self.t_down >= self.downtime:
            self.start()
            r = self.restarts[-1]
            r.update({"t_start": round(t, 3), "new_pid": self.pid,
                      "down_s": round(t - self.t_term, 3)})
            self.events.append(f"valkey restarted (down {r['down_s']:.1f}s)")
            self.state = "up"

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        if self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write(f"{self.pid}\n")

    def stop(self):
        """Stops the Valkey running now: ours, or still the one soak.sh started (no restart
        happened: soak.sh leaves that one to us too)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            return
        if self.state == "up" and pid_alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pid_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(self.pid):
                os.kill(self.pid, signal.SIGKILL)


def new_interval():
    return {"requests": 0, "status": {}, "errors": {}, "lat": []}


def count(d, k, n=1):
    d[k] = d.get(k, 0) + n


class SoakLoad:
    """The client side of a soak run: `args.connections` keep-alive connections, requests sent
    at a fixed rate (when every connection is busy, sending waits), the figures of the current
    interval (`iv`) and of the whole run (`totals`, `lat_all`, `samples`)."""

    def __init__(self, args, restarter, log):
        self.args = args
        self.restarter = restarter
        self.log = log
        self.sel = selectors.DefaultSelector()
        self.conns = [SoakConn() for _ in range(args.connections)]
        self.n_sent = 0
        self.totals = {"requests": 0, "status": {}, "errors": {}, "reconnects_client": 0}
        self.lat_all = []
        self.iv = new_interval()
        self.samples = []
        self.max_lag = 0.0
        self.rr = 0  # where free_conn() looks first
        self.next_row = args.interval
        self.prev = None
        self.t0 = None
        self.requests_bytes = [
            (f"GET {args.path} HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
             f"User-Agent: sluice-soak\r\nX-Client: c{i}\r\n\r\n").encode()
            for i in range(args.clients)]

    # -- connections

    def open_conn(self, c):
        s = socket.create_connection((HOST, self.args.port), timeout=2)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sock, c.busy, c.buf, c.need, c.out = s, False, b"", None, b""
        self.sel.register(s, selectors.EVENT_READ, c)

    def drop_conn(self, c, error=None, reconnect=True):
        if error:
            count(self.iv["errors"], error)
            count(self.totals["errors"], error)
        if c.sock is not None:
            self.sel.unregister(c.sock)
            c.sock.close()
            c.sock = None
        c.busy = False
        if not reconnect:
            return
        try:
            self.open_conn(c)
            self.totals["reconnects_client"] += 1
        except OSError as e:
            count(self.iv["errors"], f"connect: {e.strerror or e}")
            count(self.totals["errors"], f"connect: {e.strerror or e}")

    def free_conn(self):
        n = len(self.conns)
        for i in range(n):
            c = self.conns[(self.rr + i) % n]
            if not c.busy and c.sock is not None:
                self.rr = (self.rr + i + 1) % n
                return c
        return None

    def close(self):
        self.sel.close()
        for c in self.conns:
            if c.sock is not None:
                c.sock.close()

    # -- responses

    @staticmethod
    def parse(c):
        if c.need is None:
            head = parse_response_head(c.buf)
            if head is None:
                return False
            c.status, c.need, _, c.close_after, _ = head
        return len(c.buf) >= c.need

    def finish(self, c, now):
        lat = int((now - c.sent_at) * 1e6)
        self.iv["requests"] += 1
        self.totals["requests"] += 1
        self.iv["lat"].append(lat)
        count(self.iv["status"], c.status)
        count(self.totals["status"], c.status)
        c.busy, c.buf, c.need = False, c.buf[c.need:], None
        if c.close_after:
            self.drop_conn(c)

    # -- one turn of the loop

    def send_due(self, now, t):
        """Sends what is due (fixed rate; when every connection is busy, it waits)."""
        args = self.args
        while t < args.duration and self.t0 + self.n_sent / args.rate <= now:
            c = self.free_conn()
            if c is None:
                break
            self.max_lag = max(self.max_lag, now - (self.t0 + self.n_sent / args.rate))
            req = self.requests_bytes[self.n_sent % len(self.requests_bytes)]
            self.n_sent += 1
            try:
                n = c.sock.send(req)
                if n != len(req):
                    raise OSError(0, "short write")
                c.busy, c.sent_at = True, now
            except OSError as e:
                self.drop_conn(c, f"send: {e.strerror or e}")

    def read_ready(self, timeout):
        for key, _ in self.sel.select(timeout):
            c = key.data
            if c.sock is None:
                continue
            try:
                data = c.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as e:
                self.drop_conn(c, f"recv: {e.strerror or e}")
                continue
            if not data:
                self.drop_conn(c, "closed by Sluice" + (" mid-request" if c.busy else " (idle)"))
                continue
            if not c.busy:
                self.drop_conn(c, "unexpected data")
                continue
            c.buf += data
            if self.parse(c):
                self.finish(c, time.monotonic())

    def expire(self, now):
        for c in self.conns:
            if c.busy and now - c.sent_at > self.args.request_timeout:
                self.drop_conn(c, "timeout")

    # -- figures

    def sample(self, t):
        args = self.args
        rss, fds = proc_status(args.sluice_pid)
        m = sluice_metrics(args.admin_port) or {}
        dec = {}
        for k, val in m.items():
            mm = re.match(r'^sluice_ratelimit_decisions_total\{.*outcome="([^"]+)"', k)
            if mm:
                dec[mm.group(1)] = dec.get(mm.group(1), 0) + val
        return {"t": round(t, 1), "rss_kib": rss, "fds": fds,
                "conns_open": metric_sum(m, "sluice_connections_open") if m else None,
                "reconnects": metric_sum(m, "sluice_valkey_reconnects_total") if m else None,
                "valkey_errors": metric_sum(m, "sluice_valkey_errors_total") if m else None,
                "decisions": dec, "alive": pid_alive(args.sluice_pid)}

    def emit_row(self, t):
        """Samples Sluice, prints the interval's line, starts a new interval. False when Sluice
        is gone."""
        iv, prev = self.iv, self.prev
        s_ = self.sample(t)
        self.samples.append(s_)
        lat = sorted(iv["lat"])
        self.lat_all.extend(lat)
        st = iv["status"]
        ok = sum(n for k, n in st.items() if 200 <= k < 300)
        other = sum(n for k, n in st.items() if not 200 <= k < 300 and k not in (429, 503))
        fail_open = (sum(n for k, n in s_["decisions"].items() if k.startswith("error"))
                     - sum(n for k, n in prev["decisions"].items() if k.startswith("error")))
        events = list(self.restarter.events)
        self.restarter.events.clear()
        if not s_["alive"]:
            events.append("SLUICE IS GONE")
        if iv["errors"]:
            events.append("errors: " + ", ".join(f"{k} {n}" for k, n in iv["errors"].items()))
        s_.update({"requests": iv["requests"], "ok": ok, "s429": st.get(429, 0),
                   "s503": st.get(503, 0), "other": other, "errors": sum(iv["errors"].values()),
                   "p50_us": percentile(lat, 50), "p99_us": percentile(lat, 99),
                   "max_us": lat[-1] if lat else None, "fail_open": fail_open, "events": events})
        rate = iv["requests"] / (t - prev["t"]) if t > prev["t"] else 0
        self.log(f"{t:>5.0f}s {self.totals['requests']:>10,} {rate:>7.0f} "
                 f"{ok:>7} {st.get(429, 0):>5} {st.get(503, 0):>5} {other:>5} "
                 f"{sum(iv['errors'].values()):>6} {fmt_ms(s_['p50_us']):>7} "
                 f"{fmt_ms(s_['p99_us']):>7} {fmt_ms(s_['max_us']):>7} "
                 f"{(s_['rss_kib'] or 0) / 1024:>8.1f} "
                 f"{s_['fds'] if s_['fds'] is not None else '-':>5} "
                 f"{'-' if s_['conns_open'] is None else int(s_['conns_open']):>5} "
                 f"{'-' if s_['reconnects'] is None else int(s_['reconnects']):>6} "
                 f"{fail_open:>9.0f}  {'; '.join(events)}")
        self.prev = s_
        self.iv = new_interval()
        return s_["alive"]

    # -- the run

    def connect(self):
        for c in self.conns:
            self.open_conn(c)

    def start(self):
        """Takes the first sample; the run's clock starts here."""
        self.prev = self.sample(0.0)
        self.samples.append(self.prev)
        self.t0 = time.monotonic()

    def run(self, stop):
        """Until args.duration (and the replies still awaited), or a signal sets stop["why"]."""
        args = self.args
        while stop["why"] is None:
            now = time.monotonic()
            t = now - self.t0
            if t >= args.duration and not any(c.busy for c in self.conns):
                break
            if t >= args.duration + args.request_timeout:
                break
            self.restarter.tick(t)
            self.send_due(now, t)
            due = self.t0 + self.n_sent / args.rate
            self.read_ready(max(0.0, min(due - time.monotonic(), 0.05)))
            now = time.monotonic()
            self.expire(now)
            t = now - self.t0
            if t >= self.next_row and self.next_row <= args.duration:
                self.next_row += args.interval
                if not self.emit_row(t):
                    break
        for c in self.conns:
            if c.busy:
                self.drop_conn(c, "no reply by the end", reconnect=False)
        if self.iv["requests"] or self.iv["errors"] or self.restarter.events:
            self.emit_row(time.monotonic() - self.t0)


def rss_trend(args, samples):
    """RSS after the warm-up: its least-squares slope and the drift it makes over the run."""
    rows = [s_ for s_ in samples if s_.get("rss_kib")]
    warm_t = min(args.warmup, args.duration / 5)
    warm = [s_ for s_ in rows if s_["t"] >= warm_t]
    slope = least_squares_slope([(s_["t"], s_["rss_kib"]) for s_ in warm])  # KiB per second
    span = (warm[-1]["t"] - warm[0]["t"]) if len(warm) > 1 else 0
    drift_kib = slope * span if slope is not None else None
    rss0 = warm[0]["rss_kib"] if warm else None
    drift_limit = max(2048, 0.05 * rss0) if rss0 else None
    drifted = None if drift_kib is None else drift_kib > drift_limit
    return {"rows": rows, "warm_t": warm_t, "slope": slope, "span": span, "drift_kib": drift_kib,
            "rss0": rss0, "drift_limit": drift_limit, "drifted": drifted}


def soak_summary(args, load, restarter, stopped_by, elapsed):
    """The JSON summary of a run (what bench/results/soak-latest.json holds)."""
    totals, samples, lat_all = load.totals, load.samples, load.lat_all
    lat_all.sort()
    tr = rss_trend(args, samples)
    rows, slope, drift_kib = tr["rows"], tr["slope"], tr["drift_kib"]
    reconnects = [s_["reconnects"] for s_ in samples if s_.get("reconnects") is not None]
    dec_end = samples[-1].get("decisions") or {}
    dec_start = samples[0].get("decisions") or {}
    decisions = {k: int(dec_end.get(k, 0) - dec_start.get(k, 0)) for k in dec_end}
    status = totals["status"]
    non2xx = {k: n for k, n in status.items() if not 200 <= k < 300}
    restarts_done = [r for r in restarter.restarts if "t_start" in r]
    return {
        "stopped_by": stopped_by, "elapsed_s": round(elapsed, 1), "rate_target": args.rate,
        "requests": totals["requests"], "rate_achieved": totals["requests"] / elapsed if elapsed else 0,
        "max_send_lag_s": round(load.max_lag, 3), "status": {str(k): n for k, n in status.items()},
        "non2xx": {str(k): n for k, n in non2xx.items()}, "errors": totals["errors"],
        "client_reconnects": totals["reconnects_client"],
        "latency_us": {"p50": percentile(lat_all, 50), "p99": percentile(lat_all, 99),
                       "p999": percentile(lat_all, 99.9), "max": lat_all[-1] if lat_all else None},
        "rss_kib": {"start": rows[0]["rss_kib"] if rows else None,
                    "after_warmup": tr["rss0"], "end": rows[-1]["rss_kib"] if rows else None,
                    "max": max(s_["rss_kib"] for s_ in rows) if rows else None,
                    "min": max(0, min(s_["rss_kib"] for s_ in rows)) if rows else None},
        "rss_slope_kib_per_min": None if slope is None else round(slope * 60, 1),
        "rss_drift_kib": None if drift_kib is None else round(drift_kib),
        "rss_drift_limit_kib": tr["drift_limit"], "rss_drifted": tr["drifted"],
        "fds": {"start": samples[0].get("fds"), "end": samples[-1].get("fds"),
                "max": max((s_["fds"] for s_ in samples if s_.get("fds") is not None), default=None)},
        "valkey_restarts": len(restarts_done), "valkey_restart_detail": restarter.restarts,
        "valkey_reconnects_total": reconnects[-1] if reconnects else None,
        "decisions": decisions, "sluice_alive_at_end": pid_alive(args.sluice_pid),
        "samples": samples,
    }


def log_soak_summary(args, summary, load, elapsed, log):
    """The summary's lines, after the table."""
    totals, stopped_by = load.totals, summary["stopped_by"]
    tr = rss_trend(args, load.samples)
    status = totals["status"]
    non2xx = {k: n for k, n in status.items() if not 200 <= k < 300}
    total_errors = sum(totals["errors"].values())
    restarts_done = summary["valkey_restarts"]
    decisions = summary["decisions"]
    log()
    log("== Soak summary ==")
    log(f"  ran {elapsed:.0f} s{' (stopped by ' + stopped_by + ')' if stopped_by else ''}: "
        f"{totals['requests']:,} requests, {summary['rate_achieved']:.0f} req/s "
        f"(target {args.rate:g}; largest send delay {load.max_lag * 1000:.0f} ms)")
    log("  responses: " + ", ".join(f"{k} {n:,}" for k, n in sorted(status.items()))
        + f"; non-2xx {sum(non2xx.values())}; client errors {total_errors}"
        + (f" ({totals['errors']})" if total_errors else "")
        + f"; client reconnections {totals['reconnects_client']}")
    la = summary["latency_us"]
    log(f"  latency: p50 {fmt_ms(la['p50'])} ms, p99 {fmt_ms(la['p99'])} ms, "
        f"p99.9 {fmt_ms(la['p999'])} ms, max {fmt_ms(la['max'])} ms")
    r = summary["rss_kib"]
    if tr["rows"]:
        log(f"  Sluice RSS: start {r['start'] / 1024:.1f} MiB, after warm-up ({tr['warm_t']:.0f} s) "
            f"{(tr['rss0'] or 0) / 1024:.1f} MiB, end {r['end'] / 1024:.1f} MiB, max {r['max'] / 1024:.1f} MiB, "
            f"min {r['min'] / 1024:.1f} MiB; trend after warm-up "
            f"{summary['rss_slope_kib_per_min']:+.1f} KiB/min = {tr['drift_kib']:+.0f} KiB over "
            f"{tr['span']:.0f} s -> drift: {'YES' if tr['drifted'] else 'no'} "
            f"(threshold {tr['drift_limit']:.0f} KiB)")
    f = summary["fds"]
    log(f"  Sluice open fds: start {f['start']}, end {f['end']}, max {f['max']}")
    log(f"  Valkey: {restarts_done} restart(s); sluice_valkey_reconnects_total "
        f"{summary['valkey_reconnects_total']:.0f} (expected {restarts_done} x "
        f"{args.workers} worker(s) = {restarts_done * args.workers}); decisions "
        + ", ".join(f"{k} {n:,}" for k, n in sorted(decisions.items())))
    log(f"  Sluice alive at the end: {'yes' if summary['sluice_alive_at_end'] else 'NO'}")


def cmd_soak(args):
    """Fixed-rate keep-alive load on Sluice for a long time while Valkey is restarted every
    minute; one line of figures every `interval` seconds and a summary at the end."""
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out_lines = []
    table_file = open(args.table, "w") if args.table else None

    def log(line=""):
        print(line, flush=True)
        out_lines.append(line)
        if table_file:
            table_file.write(line + "\n")
            table_file.flush()

    restarter = ValkeyRestarter(args, log)
    load = SoakLoad(args, restarter, log)
    header = (f"{'time':>6} {'requests':>10} {'req/s':>7} {'2xx':>7} {'429':>5} {'503':>5} "
              f"{'other':>5} {'errors':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
              f"{'RSS MiB':>8} {'fds':>5} {'conns':>5} {'reconn':>6} {'fail-open':>9}  events")
    try:
        load.connect()
        log(f"soak: {args.rate:g} req/s over {args.connections} keep-alive connections for "
            f"{args.duration:g} s; Valkey restarted every {args.restart_every:g} s "
            f"(SIGTERM, {args.valkey_downtime:g} s down, same port); a line every {args.interval:g} s")
        log(header)
        load.start()
        load.run(stop)
    finally:
        restarter.stop()
        load.close()

    elapsed = time.monotonic() - load.t0
    summary = soak_summary(args, load, restarter, stop["why"], elapsed)
    log_soak_summary(args, summary, load, elapsed, log)
    summary["table"] = out_lines
    if table_file:
        table_file.close()
    with open(args.out, "w") as fobj:
        json.dump(summary, fobj, indent=1)
    total_errors = sum(load.totals["errors"].values())
    ok = (summary["sluice_alive_at_end"] and total_errors == 0 and not summary["non2xx"]
          and not summary["rss_drifted"])
    return 0 if ok or not args.strict else 1
