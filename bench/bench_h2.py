"""bench.py pieces of bench/run.sh --mode h2 (see bench/h2.sh): a minimal h2c client (prior
knowledge, raw frames, no HPACK decoder: enough for one GET and its answer), h2load's output
turned into the WRKJSON line that wrk-parse reads, and the mode's report."""

import json
import os
import re
import socket
import statistics
import struct
import sys
import time

from bench_probe import HOST
from bench_report import fmt_ratio, fmt_us, load, table, verdict, write_summary

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
# HPACK static table: the :status values a server sends indexed (RFC 7541 appendix A).
STATUS_INDEXED = {0x88: 200, 0x89: 204, 0x8a: 206, 0x8b: 304, 0x8c: 400, 0x8d: 404, 0x8e: 500}


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def h2_request(port, path="/"):
    """Preface, an empty SETTINGS (the defaults) and GET path on stream 1, END_STREAM."""
    authority = f"{HOST}:{port}".encode()
    block = b"\x82\x86"  # :method GET, :scheme http (indexed)
    if path == "/":
        block += b"\x84"  # :path / (indexed)
    else:
        block += b"\x04" + bytes([len(path)]) + path.encode()  # literal, name :path (4)
    block += b"\x01" + bytes([len(authority)]) + authority  # literal, name :authority (1)
    return PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_STREAM | END_HEADERS, 1, block)


class H2Reader:
    """Frames the server sends on one connection: acks its SETTINGS (reply() gives the bytes
    to send), records stream 1's status and end, and GOAWAY / RST_STREAM."""

    def __init__(self):
        self.buf = b""
        self.status = None
        self.body = b""
        self.done = False
        self.error = None
        self.frames = 0
        self.out = b""

    def feed(self, data):
        self.buf += data
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            ftype, flags = self.buf[3], self.buf[4]
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = self.buf[9:9 + length]
            self.buf = self.buf[9 + length:]
            self.frames += 1
            if ftype == SETTINGS and not flags & ACK:
                self.out += frame(SETTINGS, ACK, 0)
            elif ftype == GOAWAY:
                code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else -1
                self.error = self.error or f"GOAWAY (error code {code})"
            elif ftype == RST_STREAM and stream == 1:
                self.error = self.error or "RST_STREAM on the request"
            elif ftype == HEADERS and stream == 1:
                if self.status is None and payload:
                    self.status = STATUS_INDEXED.get(payload[0], -1)
                self.done = self.done or bool(flags & END_STREAM)
            elif ftype == DATA and stream == 1:
                self.body += payload
                self.done = self.done or bool(flags & END_STREAM)

    def reply(self):
        out, self.out = self.out, b""
        return out


def h2_get(port, path="/", timeout=2.0):
    """(status, body) of GET path over h2c with prior knowledge."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(h2_request(port, path))
        r = H2Reader()
        deadline = time.monotonic() + timeout
        while not r.done and r.error is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no complete h2 answer")
            data = s.recv(65536)
            if not data:
                raise ConnectionError("closed before the answer ended")
            r.feed(data)
            if r.out:
                s.sendall(r.reply())
        if r.error:
            raise ConnectionError(r.error)
        return r.status, r.body


def cmd_wait_h2(args):
    from bench_probe import wait_ready

    def probe():
        status, body = h2_get(args.port, args.path)
        return None if status == 200 and body == args.body.encode() else \
            f"status {status}, body {body[:60]!r}"

    return wait_ready(args, "h2c", probe)


# ---------------------------------------------------------------- h2load -> WRKJSON


def percentile(sorted_vals, p):
    if not sorted_vals:
        return 0
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def cmd_h2load_json(args):
    """Appends to --in (h2load's output) a WRKJSON line like wrk_report.lua's: requests and
    duration from h2load's summary, status and errors from its counters, latency from the
    per-request log (--log-file: microseconds from a request's start to its response's end;
    h2load 1.52 prints no percentiles)."""
    with open(args.input, errors="replace") as f:
        text = f.read()
    fin = re.search(r"^finished in ([0-9.]+)(ms|s|m), ([0-9.]+) req/s", text, re.M)
    req = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", text, re.M)
    codes = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text, re.M)
    traffic = re.search(r"^traffic: .*\((\d+)\) total", text, re.M)
    if not (fin and req and codes):
        print(f"{args.input}: no h2load summary (did h2load fail?)", file=sys.stderr)
        return 1
    secs = float(fin.group(1)) * {"ms": 1e-3, "s": 1, "m": 60}[fin.group(2)]
    lat, statuses = [], {}
    try:
        with open(args.log) as f:
            for line in f:
                parts = line.split("\t")
                if len(parts) >= 3:
                    statuses[parts[1]] = statuses.get(parts[1], 0) + 1
                    lat.append(int(parts[2]))
    except OSError as e:
        print(f"{args.log}: {e}", file=sys.stderr)
    lat.sort()
    done, succeeded = int(req.group(3)), int(req.group(4))
    non2xx = sum(int(codes.group(i)) for i in (2, 3, 4))
    # (failed: errored and timed out included)
    errors = {"connect": 0, "read": int(req.group(5)) - int(req.group(7)), "write": 0, "status": non2xx,
              "timeout": int(req.group(7))}
    # Requests that were started but not done when the duration ended are not errors.
    data = {"requests": done, "duration_us": int(secs * 1e6),
            "bytes": int(traffic.group(1)) if traffic else 0, "errors": errors,
            "latency_us": {"min": lat[0] if lat else 0, "max": lat[-1] if lat else 0,
                           "mean": statistics.fmean(lat) if lat else 0,
                           "stdev": statistics.pstdev(lat) if len(lat) > 1 else 0,
                           **{k: percentile(lat, p) for k, p in
                              (("p50", 50), ("p75", 75), ("p90", 90), ("p99", 99), ("p999", 99.9))}},
            "h2load": {"succeeded": succeeded, "failed": int(req.group(5)),
                       "logged": len(lat), "log_statuses": statuses}}
    with open(args.input, "a") as f:
        f.write("WRKJSON " + json.dumps(data) + "\n")
    return 0


# ---------------------------------------------------------------- report


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def ratio(a, b):
    return a / b if a is not None and b else None


RUNS_HEADER = ["variant", "req/s", "ratio", "p50", "p99", "p99 ratio", "max", "GW us/req",
               "Valkey us/req", "upstream conns", "errors", "decisions"]


def runs_table(directory, prefix, variants, rounds, ref):
    """The measured runs {prefix}_{variant}_{round}.json (wrk-parse's) of every variant: per
    variant its medians and ratios against ref, the table's rows (RUNS_HEADER) and notes with
    the per-round ratios."""
    per = {}
    rows = []
    for v in variants:
        runs = [load(os.path.join(directory, f"{prefix}_{v}_{r}.json"))
                for r in range(1, rounds + 1)]
        runs = [dict(d, round=r) for r, d in enumerate(runs, 1) if d]
        e = {"rounds": runs,
             "rps": med([d.get("rps") for d in runs]),
             "p50_us": med([d["latency_us"]["p50"] for d in runs]),
             "p99_us": med([d["latency_us"]["p99"] for d in runs]),
             "max_us": med([d["latency_us"]["max"] for d in runs]),
             "gateway_cpu_us_per_req": med([d.get("gateway_cpu_us_per_req") for d in runs]),
             "upstream_cpu_us_per_req": med([d.get("upstream_cpu_us_per_req") for d in runs]),
             "upstream_writes_per_req": med([d.get("upstream_writes_per_req") for d in runs]),
             "valkey_cpu_us_per_req": med([d.get("valkey_cpu_us_per_req") for d in runs]),
             "upstream_connections_opened": med([d.get("upstream_connections_opened") for d in runs]),
             "non2xx": sum(d.get("non2xx", 0) for d in runs),
             "socket_errors": sum(d.get("socket_errors", 0) for d in runs),
             "decisions": {}}
        for d in runs:
            for k, n in (d.get("decisions") or {}).items():
                e["decisions"][k] = e["decisions"].get(k, 0) + n
        e["requests"] = sum(d.get("requests", 0) for d in runs)
        per[v] = e
    r_rps, r_p99 = (per.get(ref) or {}).get("rps"), (per.get(ref) or {}).get("p99_us")
    for v in variants:
        e = per[v]
        e["rps_ratio"] = ratio(e["rps"], r_rps) if v != ref else None
        e["p99_ratio"] = ratio(e["p99_us"], r_p99) if v != ref else None
        e["cpu_ratio"] = (ratio(e["gateway_cpu_us_per_req"], per[ref]["gateway_cpu_us_per_req"])
                          if v != ref and ref in per else None)
        dec = e["decisions"]
        rows.append([v, f"{e['rps']:.0f}" if e["rps"] else "-", fmt_ratio(e["rps_ratio"]),
                     fmt_us(e["p50_us"]), fmt_us(e["p99_us"]), fmt_ratio(e["p99_ratio"]),
                     fmt_us(e["max_us"]),
                     f"{e['gateway_cpu_us_per_req']:.1f}" if e["gateway_cpu_us_per_req"] else "-",
                     f"{e['valkey_cpu_us_per_req']:.1f}" if e["valkey_cpu_us_per_req"] else "-",
                     f"{e['upstream_connections_opened']:.0f}" if e["upstream_connections_opened"] is not None else "-",
                     str(e["non2xx"] + e["socket_errors"]),
                     (", ".join(f"{k} {n:.0f}" for k, n in sorted(dec.items())) or "-")])
    # The same round's runs are seconds apart: their ratios show how much of a ratio of
    # medians is the machine's noise (another process taking a CPU for a while).
    notes = []
    ref_runs = {d.get("round"): d for d in per.get(ref, {}).get("rounds", [])}
    for v in variants:
        if v == ref:
            continue
        pairs = [(d, ref_runs.get(d.get("round"))) for d in per[v]["rounds"]]
        rr = [ratio(d.get("rps"), o.get("rps")) for d, o in pairs if o]
        pr = [ratio(d["latency_us"]["p99"], o["latency_us"]["p99"]) for d, o in pairs if o]
        per[v]["round_rps_ratios"], per[v]["round_p99_ratios"] = rr, pr
        if rr:
            notes.append(f"  {v}: per round, requests/s ratio "
                         + " ".join(fmt_ratio(x) for x in rr) + f" (median {fmt_ratio(med(rr))}), "
                         + "p99 ratio " + " ".join(fmt_ratio(x) for x in pr)
                         + f" (median {fmt_ratio(med(pr))})")
    return per, rows, notes


def finish_report(lines, summary, out):
    """The checks' table and the overall verdict after the report's lines; prints the report
    and writes the summary JSON (`out`)."""
    checks = summary["checks"]
    lines.append("Checks")
    lines.append(table([[c["check"], fmt_ratio(c["value"]) if isinstance(c["value"], float)
                         and "KiB" not in c["check"] else
                         (f"{c['value']:.2f}" if isinstance(c["value"], float) else str(c["value"])),
                         c["target"], verdict(c["ok"])] for c in checks],
                       ["check", "value", "target", "verdict"]))
    summary["overall"] = "FAIL" if any(c["ok"] is False for c in checks) else "PASS"
    lines.append(f"overall: {summary['overall']}")
    print("\n".join(lines))
    write_summary(out, summary)
    return 0


def cmd_h2_report(args):
    meta = json.loads(args.meta)
    variants = args.variants.split()
    shapes = args.shapes.split()
    ref = args.reference
    summary = {"meta": meta, "mode": args.mode, "reference": ref, "shapes": {}, "idle": {},
               "targets": {"rps_ratio_min": args.rps_ratio_min, "p99_ratio_max": args.p99_ratio_max,
                           "idle_kib_max": args.idle_kib_max}, "checks": []}
    title = ("Unary gRPC calls (h2c both sides; requests/s are calls/s)" if args.mode == "grpc"
             else "HTTP/2 (h2c, prior knowledge)")
    lines = [f"{title}: h2load -t1, {meta.get('duration')} per run, "
             f"{args.rounds} round(s) in alternating order, medians; {meta.get('cpus')} CPU(s), "
             f"load average {meta.get('load_average_start')} -> {meta.get('load_average_end')}",
             f"Sluice {meta.get('git_commit')} ({meta.get('sluice_bin')}), nginx {meta.get('nginx')}, "
             f"{meta.get('h2load')}", ""]
    checks = summary["checks"]
    for shape in shapes:
        per, rows, notes = runs_table(args.dir, f"h2_{shape}", variants, args.rounds, ref)
        summary["shapes"][shape] = per
        lines.append(f"h2load {shape.replace('c', '-c').replace('m', ' -m', 1)} -t1 (requests/s ratio and p99 "
                     f"ratio against {ref})")
        lines.append(table(rows, RUNS_HEADER))
        lines.extend(notes)
        lines.append("")
        for v in variants:
            if v == ref:
                continue
            e = per[v]
            limited = "limit" in v or "mix" in v
            if not limited:
                checks.append({"check": f"{shape} requests/s, {v} / {ref}", "value": e["rps_ratio"],
                               "target": f">= {args.rps_ratio_min}",
                               "ok": None if e["rps_ratio"] is None else e["rps_ratio"] >= args.rps_ratio_min})
                checks.append({"check": f"{shape} p99, {v} / {ref}", "value": e["p99_ratio"],
                               "target": f"<= {args.p99_ratio_max}",
                               "ok": None if e["p99_ratio"] is None else e["p99_ratio"] <= args.p99_ratio_max})
            checks.append({"check": f"{shape} {v}: non-2xx and errors", "value": e["non2xx"] + e["socket_errors"],
                           "target": "0", "ok": bool(e["rounds"]) and e["non2xx"] + e["socket_errors"] == 0})
            if limited:
                dec = e["decisions"]
                bad = sum(n for k, n in dec.items() if k != "allowed")
                checks.append({"check": f"{shape} {v}: decisions other than allowed", "value": bad,
                               "target": "0", "ok": bool(dec) and bad == 0})
    rows = []
    for v in variants:
        d = load(os.path.join(args.dir, f"idle_{v}.json"))
        if not d:
            continue
        summary["idle"][v] = d
        rows.append([v, f"{d.get('still_open_at_measure')}/{d.get('target_connections')}",
                     f"{d['before']['rss_kib']} -> {(d.get('after') or {}).get('rss_kib')}",
                     f"{d['rss_kib_per_conn']:.2f}" if d.get("rss_kib_per_conn") is not None else "-",
                     f"{d['pss_kib_per_conn']:.2f}" if d.get("pss_kib_per_conn") is not None else "-",
                     f"{d['anon_kib_per_conn']:.2f}" if d.get("anon_kib_per_conn") is not None else "-",
                     ", ".join(f"{c.get('rss_kib_per_conn', 0):.1f}" for c in d.get("cycles", [])),
                     f"{d['gateway_open_connections_metric']:.0f}"
                     if d.get("gateway_open_connections_metric") is not None else "-",
                     ", ".join(f"{k}: {n}" for k, n in (d.get("errors") or {}).items()) or "-"])
        if d.get("kind") != "nginx" and not v.startswith("nginx"):
            per = d.get("rss_kib_per_conn")
            checks.append({"check": f"idle h2 connection, {v}: RSS KiB per connection",
                           "value": per, "target": f"<= {args.idle_kib_max}",
                           "ok": None if per is None else
                           per <= args.idle_kib_max and d.get("still_open_at_measure") == d.get("target_connections")})
    if rows:
        lines.append(f"Idle h2c connections (each: preface, SETTINGS, one GET /, its answer read, "
                     f"SETTINGS acked, then idle; first cycle's figures)")
        lines.append(table(rows, ["variant", "open", "RSS KiB", "RSS KiB/conn", "Pss KiB/conn",
                                  "Anon KiB/conn", "RSS KiB/conn per cycle", "gw open", "errors"]))
        lines.append("")
    return finish_report(lines, summary, args.out)


# ---------------------------------------------------------------- --mode h2-upstream


def h2up_origins(variants, ref):
    """The variants by origin, each origin's variants with the reference they are measured
    against: [(origin, reference, variants)]. A variant named *-h2o has h2o as its origin
    (its reference: sluice-h2o, the HTTP/1.1 upstream to h2o), the others the upstream nginx
    (reference: ref)."""
    out = []
    for origin, of in (("nginx", lambda v: not v.endswith("-h2o")), ("h2o", lambda v: v.endswith("-h2o"))):
        group = [v for v in variants if of(v)]
        if not group:
            continue
        r = ref if origin == "nginx" else "sluice-h2o"
        out.append((origin, r if r in group else group[0], group))
    return out


def origin_note(v, e):
    """The origin's side of a variant's runs (medians): its CPU and its write system calls per
    request (an HTTP/2 origin that writes each stream's frames on their own makes several)."""
    cpu, writes = e.get("upstream_cpu_us_per_req"), e.get("upstream_writes_per_req")
    return (f"  {v}: origin CPU {'-' if cpu is None else f'{cpu:.1f}'} us/req, "
            f"origin write calls {'-' if writes is None else f'{writes:.2f}'} per request")


def cmd_h2up_report(args):
    """--mode h2-upstream (bench/h2_upstream.sh): the plain proxy with an h2c upstream against
    the same with an HTTP/1.1 upstream, for HTTP/1.1 clients (wrk) and HTTP/2 clients (h2load
    shapes), on each origin (nginx; h2o), and the memory of idle pooled upstream connections
    of either protocol."""
    meta = json.loads(args.meta)
    variants = args.variants.split()
    origins = h2up_origins(variants, args.reference)
    summary = {"meta": meta, "mode": "h2-upstream", "reference": args.reference,
               "references": {o: r for o, r, _ in origins}, "loads": {}, "pool": {},
               "targets": {"rps_ratio_min": args.rps_ratio_min, "cpu_ratio_max": args.cpu_ratio_max},
               "checks": []}
    checks = summary["checks"]
    lines = [f"Upstream protocols: the same Sluice (one worker, no limit) with an h2c upstream and "
             f"with an HTTP/1.1 upstream, to one origin speaking both (nginx {meta.get('nginx')}; "
             f"h2o for the *-h2o variants), "
             f"{meta.get('duration')} per run, {args.rounds} round(s) in alternating order, medians; "
             f"{meta.get('cpus')} CPU(s){', Sluice alone on CPU 1 (BENCH_PIN)' if meta.get('pinned') else ''}, "
             f"load average {meta.get('load_average_start')} -> {meta.get('load_average_end')}",
             f"Sluice {meta.get('git_commit')} ({meta.get('sluice_bin')}), {meta.get('wrk')}, "
             f"{meta.get('h2load')}", ""]
    loads = [("wrk", f"HTTP/1.1 clients: wrk -c{meta.get('connections')} -t{meta.get('threads')} keep-alive")]
    loads += [(f"h2_{shape}", f"HTTP/2 clients: h2load {shape.replace('c', '-c').replace('m', ' -m', 1)} -t1")
              for shape in args.shapes.split()]
    for (prefix, title), (origin, ref, group) in ((ld, og) for ld in loads for og in origins):
        per, rows, notes = runs_table(args.dir, prefix, group, args.rounds, ref)
        summary["loads"].setdefault(prefix, {}).update(per)
        lines.append(f"{title}, origin {origin} (ratios against {ref}; GW us/req: Sluice's CPU "
                     f"per request)")
        lines.append(table(rows, RUNS_HEADER))
        lines.extend(notes)
        lines.extend(origin_note(v, per[v]) for v in group)
        lines.append("")
        for v in group:
            e = per[v]
            checks.append({"check": f"{prefix} {v}: non-2xx and errors",
                           "value": e["non2xx"] + e["socket_errors"], "target": "0",
                           "ok": bool(e["rounds"]) and e["non2xx"] + e["socket_errors"] == 0})
            if v == ref:
                continue
            checks.append({"check": f"{prefix} requests/s, {v} / {ref}", "value": e["rps_ratio"],
                           "target": f">= {args.rps_ratio_min}",
                           "ok": None if e["rps_ratio"] is None else e["rps_ratio"] >= args.rps_ratio_min})
            checks.append({"check": f"{prefix} CPU per request, {v} / {ref}", "value": e["cpu_ratio"],
                           "target": f"<= {args.cpu_ratio_max}",
                           "ok": None if e["cpu_ratio"] is None else e["cpu_ratio"] <= args.cpu_ratio_max})
    rows = []
    for proto in args.pool_protocols.split():
        d = load(os.path.join(args.dir, f"pool_{proto}.json"))
        if not d:
            checks.append({"check": f"idle pooled {proto} connections measured", "value": None,
                           "target": "a figure", "ok": False})
            continue
        summary["pool"][proto] = d
        rows.append([proto, str(d["endpoints"]), str(d["connections"]), str(d["requests"]),
                     f"{d['before']['rss_kib']} -> {d['after']['rss_kib']}",
                     f"{d['rss_kib_per_conn']:.2f}" if d.get("rss_kib_per_conn") is not None else "-",
                     f"{d['pss_kib_per_conn']:.2f}" if d.get("pss_kib_per_conn") is not None else "-",
                     f"{d['anon_kib_per_conn']:.2f}" if d.get("anon_kib_per_conn") is not None else "-"])
        # (the readiness check's requests opened a connection or two before the "before")
        ok = d.get("rss_kib_per_conn") is not None and d["connections"] >= 0.95 * d["endpoints"]
        checks.append({"check": f"idle pooled {proto} connection: RSS KiB each (stated)",
                       "value": d.get("rss_kib_per_conn"),
                       "target": "a figure, >= 95% of the endpoints pooled", "ok": ok})
    if rows:
        lines.append("Idle pooled upstream connections: a fresh Sluice with one upstream of N endpoints "
                     "(one nginx port each), one client connection sending requests round-robin "
                     "until each endpoint has its pooled connection, then idle; memory after minus "
                     "before, per upstream connection the origin accepted")
        lines.append(table(rows, ["protocol", "endpoints", "upstream conns", "requests", "RSS KiB",
                                  "RSS KiB/conn", "Pss KiB/conn", "Anon KiB/conn"]))
        lines.append("")
    return finish_report(lines, summary, args.out)


def cmd_h2up_pool(args):
    """Writes the pool figure of one protocol (--out) from the memory (bench.py mem) and the
    probes (bench.py probe: the origin's accepted connections) before and after."""
    before, after = load(args.mem_before), load(args.mem_after)
    pb, pa = load(args.probe_before), load(args.probe_after)
    wrk = load(args.wrk) or {}
    if not (before and after and pb and pa) or pa.get("upstream_accepts") is None:
        print("h2up-pool: a measure is missing", file=sys.stderr)
        return 1
    # (the "before" probe's own stub_status query is one accepted connection)
    conns = pa["upstream_accepts"] - pb["upstream_accepts"] - 1
    d = {"protocol": args.protocol, "endpoints": args.endpoints, "connections": conns,
         "requests": wrk.get("requests", 0), "before": before, "after": after}
    for k in ("rss_kib", "pss_kib", "anon_kib"):
        d[k.replace("_kib", "_kib_per_conn")] = (after[k] - before[k]) / conns if conns > 0 else None
    with open(args.out, "w") as f:
        json.dump(d, f)
    print(f"  pooled {args.protocol}: {conns} upstream connections for {args.endpoints} endpoints, "
          f"RSS {before['rss_kib']} -> {after['rss_kib']} KiB"
          + (f", {d['rss_kib_per_conn']:.2f} KiB per connection" if d["rss_kib_per_conn"] is not None else ""))
    return 0


# ---------------------------------------------------------------- --mode grpc


def cmd_grpc_call(args):
    """One unary call over h2c (python3-h2): POST path with content-type application/grpc,
    te: trailers and the bench's request message; 0 when the answer is 200, application/grpc,
    a whole message frame and grpc-status 0 in the trailers."""
    import h2.config
    import h2.connection
    import h2.events

    message = b"\x00\x00\x00\x00\x07\x0a\x05bench"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":authority", f"{HOST}:{args.port}"),
               (":path", args.path), ("content-type", "application/grpc"), ("te", "trailers")]
    for h in args.headers:
        name, _, value = h.partition(":")
        headers.append((name.strip().lower(), value.strip()))
    conn.send_headers(1, headers)
    conn.send_data(1, message, end_stream=True)
    head, body, trailers, problem = {}, b"", {}, None
    deadline = time.monotonic() + args.timeout
    with socket.create_connection((HOST, args.port), timeout=args.timeout) as s:
        s.sendall(conn.data_to_send())
        done = False
        while not done and time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                problem = "the connection closed before the call ended"
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    head = {k.decode() if isinstance(k, bytes) else k:
                            v.decode() if isinstance(v, bytes) else v for k, v in ev.headers}
                elif isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    trailers = {k.decode() if isinstance(k, bytes) else k:
                                v.decode() if isinstance(v, bytes) else v for k, v in ev.headers}
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = True
            s.sendall(conn.data_to_send())
    grpc_status = trailers.get("grpc-status", head.get("grpc-status"))
    if problem is None:
        if head.get(":status") != "200":
            problem = f"status {head.get(':status')}"
        elif not head.get("content-type", "").startswith("application/grpc"):
            problem = f"content-type {head.get('content-type')!r}"
        elif len(body) < 5 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
            problem = f"the reply is not one message frame: {body[:20]!r}"
        elif grpc_status != "0":
            problem = f"grpc-status {grpc_status!r} (trailers {trailers})"
    print(f"  grpc call to {args.port}{args.path}: "
          + (f"status 200, {len(body)}-byte reply, grpc-status 0" if problem is None else problem))
    return 0 if problem is None else 1
