"""bench.py wrk-parse and report: one run's wrk output (with the probes taken around it) as
JSON, then the medians of the rounds, the tables, the targets checked, and the JSON summary in
bench/results/."""

import json
import os
import re
import statistics
import sys

from bench_probe import PROBE_COMMANDS, delta_dict, metric_sum, node_deltas


# ---------------------------------------------------------------- report


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt_us(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} us"


def write_summary(path, summary):
    """Writes a run's JSON summary (bench/results/<mode>-<stamp>.json) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"JSON summary: {path}")


def fmt_ratio(x):
    return "-" if x is None else f"{x:.3f}x"


def verdict(ok):
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def table(rows, header):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


FCALL_TOLERANCE = 0.005   # FCALL per request must round to at most 1.00 (batches: below)
CALLS_PER_REQ_MAX = 1.01    # every Valkey command per request, "about one round trip"


def summarize_runs(runs):
    """Medians (and sums of counts) over the rounds of one variant."""
    entry = {"rounds": runs}
    if not runs:
        return entry

    def med(key, sub=None):
        vals = [(d.get(sub) or {}).get(key) if sub else d.get(key) for d in runs]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    entry["rps"] = med("rps")
    entry["p50_us"] = med("p50", "latency_us")
    entry["p99_us"] = med("p99", "latency_us")
    entry["p999_us"] = med("p999", "latency_us")
    entry["gateway_cpu_us_per_req"] = med("gateway_cpu_us_per_req")
    entry["upstream_cpu_us_per_req"] = med("upstream_cpu_us_per_req")
    opened = [d["upstream_connections_opened"] for d in runs
              if d.get("upstream_connections_opened") is not None]
    entry["upstream_connections_opened"] = sum(opened) if opened else None
    upreq = [d["upstream_requests"] for d in runs if d.get("upstream_requests") is not None]
    entry["upstream_requests"] = sum(upreq) if upreq else None
    entry["requests"] = sum(d["requests"] for d in runs)
    entry["non2xx"] = sum(d["non2xx"] for d in runs)
    entry["socket_errors"] = sum(d["socket_errors"] for d in runs)
    entry["errors"] = {k: sum(d["errors"][k] for d in runs)
                       for k in ("connect", "read", "write", "status", "timeout")}
    if any("valkey_fcall_per_req" in d for d in runs):
        entry["valkey_fcall_per_req"] = med("valkey_fcall_per_req")
        entry["valkey_calls_per_req"] = med("valkey_calls_per_req")
        entry["valkey_cpu_us_per_req"] = med("valkey_cpu_us_per_req")
        calls = {}
        for d in runs:
            for k, v in (d.get("valkey_calls") or {}).items():
                calls[k] = calls.get(k, 0) + v
        entry["valkey_calls"] = calls
        entry["valkey_fcall_total"] = calls.get("fcall", 0)
    if any("decisions" in d for d in runs):
        dec, errs = {}, {}
        for d in runs:
            for k, v in (d.get("decisions") or {}).items():
                dec[k] = dec.get(k, 0) + v
            for k, v in (d.get("valkey_errors") or {}).items():
                errs[k] = errs.get(k, 0) + v
        entry["decisions"] = dec
        entry["valkey_errors"] = errs
    res = [d["resumed_handshakes"] for d in runs if d.get("resumed_handshakes") is not None]
    entry["resumed_handshakes"] = sum(res) if res else None
    return entry


def throughput_table(entries):
    """The table of keep-alive runs: (variant, summarize_runs() of its rounds) in order."""
    rows = []
    for v, e in entries:
        if "rps" not in e:
            rows.append([v, "no data"] + ["-"] * 7)
            continue
        per_round = " ".join(f"{d['rps'] / 1000:.1f}k" for d in e["rounds"])
        cpu = e.get("gateway_cpu_us_per_req")
        if cpu is not None and e.get("valkey_cpu_us_per_req") is not None:
            cpu_txt = f"{cpu:.1f} (+{e['valkey_cpu_us_per_req']:.1f} valkey)"
        else:
            cpu_txt = "-" if cpu is None else f"{cpu:.1f}"
        opened = e.get("upstream_connections_opened")
        rows.append([v, f"{e['rps']:,.0f}", fmt_us(e["p50_us"]), fmt_us(e["p99_us"]),
                     fmt_us(e["p999_us"]), cpu_txt,
                     "-" if opened is None else str(opened),
                     f"{e['non2xx']}/{e['socket_errors']}", per_round])
    return table(rows, ["gateway", "requests/s", "p50", "p99", "p99.9", "CPU us/req",
                        "upstream conns", "non-2xx/sock-err", "req/s per round"])


def comparisons(variants, ref, entries, args):
    """(variant, base, targets) for every variant but the reference. targets maps a figure
    (rps, p99, hs) to its bound; an empty dict means the row is for information only."""
    def first(pred):
        return next((v for v in variants if pred(entries[v])), None)

    plain_sluice = first(lambda e: e.get("kind", "sluice") == "sluice" and not e.get("tls")
                         and not e.get("limit"))
    nginx_tls = first(lambda e: e.get("kind") == "nginx" and e.get("tls"))
    plain = {"rps": (">=", args.rps_ratio_min), "p99": ("<=", args.p99_ratio_max)}
    out = []
    for v in variants:
        if v == ref:
            continue
        e = entries[v]
        kind = e.get("kind", "sluice")
        if kind == "sluice" and e.get("tls"):
            if nginx_tls:
                out.append((v, nginx_tls, dict(plain, hs=(">=", args.handshake_ratio_min))))
            if ref != nginx_tls:
                out.append((v, ref, {}))
        elif kind == "sluice" and e.get("limit"):
            if plain_sluice and plain_sluice != v:
                # Judged where both are saturated (capacity rounds) when those ran: with few
                # connections the requests/s of a closed loop measure latency.
                at_capacity = "rps" in (e.get("capacity") or {}) and \
                    "rps" in (entries[plain_sluice].get("capacity") or {})
                key = "cap" if at_capacity else "rps"
                out.append((v, plain_sluice, {key: (">=", args.limit_rps_ratio_min)}))
                if ref != plain_sluice:
                    out.append((v, ref, {}))
            else:
                out.append((v, ref, plain))
        elif kind == "sluice":
            out.append((v, ref, plain))
        else:
            out.append((v, ref, {}))
    return out


def check_value(value, bound):
    if value is None:
        return None
    op, limit = bound
    return value >= limit if op == ">=" else value <= limit


def cmd_wrk_parse(args):
    with open(args.input, errors="replace") as f:
        text = f.read()
    m = re.search(r"^WRKJSON (\{.*\})\s*$", text, re.M)
    if not m:
        print(f"{args.input}: no WRKJSON line (did wrk fail?)", file=sys.stderr)
        return 1
    data = json.loads(m.group(1))
    data["rps"] = data["requests"] / (data["duration_us"] / 1e6) if data["duration_us"] else 0.0
    data["non2xx"] = data["errors"]["status"]
    data["socket_errors"] = sum(data["errors"][k] for k in ("connect", "read", "write", "timeout"))
    before, after = load(args.before) if args.before else None, load(args.after) if args.after else None
    if before and after and data["requests"]:
        n = data["requests"]
        data["gateway_cpu_s"] = after["gateway_cpu_s"] - before["gateway_cpu_s"]
        data["gateway_cpu_us_per_req"] = data["gateway_cpu_s"] * 1e6 / n
        data["upstream_cpu_us_per_req"] = (after["upstream_cpu_s"] - before["upstream_cpu_s"]) * 1e6 / n
        if before.get("upstream_writes") is not None and after.get("upstream_writes") is not None:
            data["upstream_writes_per_req"] = (after["upstream_writes"] - before["upstream_writes"]) / n
        if before.get("upstream_accepts") is not None and after.get("upstream_accepts") is not None:
            # Each status query is one connection and one request of its own.
            data["upstream_connections_opened"] = after["upstream_accepts"] - before["upstream_accepts"] - 1
            data["upstream_requests"] = after["upstream_requests"] - before["upstream_requests"] - 1
        if before.get("valkey_commandstats") is not None and after.get("valkey_commandstats") is not None:
            stats = delta_dict(before["valkey_commandstats"], after["valkey_commandstats"])
            # The "before" probe's own INFO (and DBSIZE, with --valkey-nodes) is counted by the
            # "after" one: leave them out.
            for own in PROBE_COMMANDS:
                stats.pop(own, None)
            data["valkey_calls"] = stats
            data["valkey_fcall_per_req"] = stats.get("fcall", 0) / n
            data["valkey_calls_per_req"] = sum(stats.values()) / n
        if before.get("valkey_cpu_s") is not None and after.get("valkey_cpu_s") is not None:
            data["valkey_cpu_us_per_req"] = (after["valkey_cpu_s"] - before["valkey_cpu_s"]) * 1e6 / n
        if before.get("sluice") is not None and after.get("sluice") is not None:
            d = delta_dict(before["sluice"], after["sluice"])
            data["sluice_metrics_delta"] = {k: v for k, v in d.items()
                                            if not k.startswith(("sluice_connections_open",
                                                                 "sluice_requests_total"))}
            data["decisions"] = {}
            for k, v in d.items():
                m = re.match(r'^sluice_ratelimit_decisions_total\{.*outcome="([^"]+)"', k)
                if m:
                    data["decisions"][m.group(1)] = data["decisions"].get(m.group(1), 0) + v
            data["valkey_errors"] = {re.sub(r'.*kind="([^"]+)".*', r"\1", k): v for k, v in d.items()
                                     if k.startswith("sluice_valkey_errors_total")}
        if before.get("valkey_nodes") and after.get("valkey_nodes"):
            data["valkey_nodes"] = node_deltas(before["valkey_nodes"], after["valkey_nodes"], n)
        if before.get("sluice") is not None and after.get("sluice") is not None:
            # Calls Sluice sent (every node), and the compensating calls once Sluice counts them
            # (None while /metrics has no sluice_valkey_compensations_total).
            data["sluice_valkey_calls"] = (metric_sum(after["sluice"], "sluice_valkey_calls_total")
                                           - metric_sum(before["sluice"], "sluice_valkey_calls_total"))
            comp = "sluice_valkey_compensations_total"
            if any(k == comp or k.startswith(comp + "{") for k in after["sluice"]):
                data["compensations"] = metric_sum(after["sluice"], comp) - metric_sum(before["sluice"], comp)
                data["compensations_by_label"] = {
                    k[len(comp):] or "{}": v for k, v in
                    (delta_dict({k: v for k, v in before["sluice"].items() if k.startswith(comp)},
                                {k: v for k, v in after["sluice"].items() if k.startswith(comp)})
                     or {}).items()}
            else:
                data["compensations"] = None
        if before.get("resumed_lines") is not None and after.get("resumed_lines") is not None:
            data["resumed_handshakes"] = after["resumed_lines"] - before["resumed_lines"]
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    if args.label:
        lat = data["latency_us"]
        errs = ", ".join(f"{k} {v}" for k, v in data["errors"].items() if v) or "none"
        cpu = (f"   CPU {data['gateway_cpu_us_per_req']:5.1f} us/req"
               if "gateway_cpu_us_per_req" in data else "")
        up = (f"   upstream conns +{data['upstream_connections_opened']}"
              if "upstream_connections_opened" in data else "")
        extra = ""
        if "valkey_fcall_per_req" in data:
            extra += (f"   valkey: {data['valkey_fcall_per_req']:.3f} fcall/req, "
                      f"{data['valkey_calls_per_req']:.3f} calls/req")
        bad = {k: v for k, v in (data.get("decisions") or {}).items() if k != "allowed" and v}
        if bad:
            extra += f"   decisions not from Valkey: {bad}"
        if data.get("resumed_handshakes") is not None:
            extra += f"   resumed: {data['resumed_handshakes']}"
        if args.handshake:
            cpu = cpu.replace("us/req", "us/conn")
            print(f"{args.label:<28} {data['rps']:>9,.0f} conn/s{cpu}{up}   errors: {errs}{extra}")
        else:
            print(f"{args.label:<28} {data['rps']:>9,.0f} req/s   p50 {fmt_us(lat['p50']):>8}   "
                  f"p99 {fmt_us(lat['p99']):>8}{cpu}{up}   errors: {errs}{extra}")
    return 0


def collect_variants(args, variants):
    """Per variant: summarize_runs() of its keep-alive, handshake and capacity rounds, and
    what else run.sh left in --dir (MONITOR sample, idle test, extra facts)."""
    entries = {}
    for v in variants:
        runs = [d for d in (load(os.path.join(args.dir, f"wrk_{v}_{r}.json"))
                            for r in range(1, args.rounds + 1)) if d]
        entry = summarize_runs(runs)
        hs = [d for d in (load(os.path.join(args.dir, f"hs_{v}_{r}.json"))
                          for r in range(1, args.handshake_rounds + 1)) if d]
        if hs:
            entry["handshake"] = summarize_runs(hs)
        cap = [d for d in (load(os.path.join(args.dir, f"cap_{v}_{r}.json"))
                           for r in range(1, args.capacity_rounds + 1)) if d]
        if cap:
            entry["capacity"] = summarize_runs(cap)
        mon = load(os.path.join(args.dir, f"monitor_{v}.json"))
        if mon:
            entry["valkey_monitor"] = mon
        entry["idle"] = load(os.path.join(args.dir, f"idle_{v}.json"))
        extra = load(os.path.join(args.dir, f"extra_{v}.json"))
        if extra:
            entry.update(extra)
        entries[v] = entry
    return entries


def print_throughput(args, meta, summary, variants):
    """The keep-alive table, then the capacity table when those rounds ran."""
    E = summary["variants"]
    if args.rounds:
        print()
        print(f"== Throughput: wrk -t{meta['threads']} -c{meta['connections']} -d{meta['duration']}, "
              f"keep-alive, {args.rounds} round(s) alternating, median per metric ==")
        print(throughput_table([(v, E[v]) for v in variants]))

    cap_meta = meta.get("capacity") or {}
    cap_variants = [v for v in variants if "capacity" in E[v]]
    if args.capacity_rounds and cap_variants:
        print()
        print(f"== Capacity: wrk -t{meta['threads']} -c{cap_meta.get('connections')} "
              f"-d{meta['duration']}, each gateway saturated (what rate limiting costs in "
              f"requests/s is judged here), {args.capacity_rounds} round(s) alternating, median ==")
        print(throughput_table([(v, E[v]["capacity"]) for v in cap_variants]))


def print_handshakes(args, meta, summary, variants):
    """The table of new TLS connections per second."""
    E = summary["variants"]
    hm = meta.get("handshake") or {}
    tool = ("wrk -H 'Connection: close', TLS session reuse disabled (bench/noresume.c)"
            if hm.get("tool", "wrk") == "wrk"
            else f"openssl s_time -new, {hm.get('s_time_clients')} processes, handshake and "
                 f"close (no request)")
    print()
    print(f"== New TLS connections per second: one request per connection, full handshakes; "
          f"{tool}; -c{hm.get('connections')} -d{hm.get('duration')}, "
          f"{args.handshake_rounds} round(s) alternating, median ==")
    rows = []
    for v in variants:
        h = E[v].get("handshake")
        if not h or "rps" not in h:
            continue
        neg = E[v].get("tls_negotiated") or {}
        neg_txt = " ".join(x for x in (neg.get("Protocol version"), neg.get("Ciphersuite"),
                                       (neg.get("Server Temp Key") or "").split(",")[0])
                           if x) or "-"
        cpu = h.get("gateway_cpu_us_per_req")
        rows.append([v, f"{h['rps']:,.0f}", "-" if cpu is None else f"{cpu:.1f}",
                     "-" if h.get("resumed_handshakes") is None else str(h["resumed_handshakes"]),
                     f"{h['non2xx']}/{h['socket_errors']}",
                     " ".join(f"{d['rps']:,.0f}" for d in h["rounds"]), neg_txt])
    print(table(rows, ["gateway", "conn/s", "CPU us/conn", "resumed", "non-2xx/sock-err",
                       "conn/s per round", "negotiated"]))
    print("  resumed: TLS sessions that nginx reports as reused ($ssl_session_reused) during "
          "the runs; must be 0 for full handshakes")


def print_rate_limiting(args, summary, limit_variants):
    """Valkey commands per request of the variants with limits (checks: one FCALL, about one
    round trip)."""
    E = summary["variants"]
    print()
    print(f"== Rate limiting: Valkey commands per request (targets: 1 round trip per request: "
          f"FCALL <= 1.00, commands sent <= {CALLS_PER_REQ_MAX:.2f}; a worker's concurrent decisions "
          f"share one FCALL) ==")
    rows = []
    for v in limit_variants:
        e = E[v]
        es, cs = e.get("valkey_fcall_per_req"), e.get("valkey_calls_per_req")
        mon = e.get("valkey_monitor") or {}
        rt = mon.get("round_trips_per_req")
        ok_es = None if es is None else es <= 1.0 + FCALL_TOLERANCE
        ok_rt = None if rt is None else rt <= CALLS_PER_REQ_MAX
        summary["checks"].append({"variant": v, "check": "valkey_fcall_per_request",
                                  "value": es, "target": "<= 1.0", "result": verdict(ok_es)})
        summary["checks"].append({"variant": v, "check": "valkey_round_trips_per_request",
                                  "value": rt, "target": f"<= {CALLS_PER_REQ_MAX}",
                                  "result": verdict(ok_rt)})
        dec = e.get("decisions") or {}
        gw, vk = e.get("gateway_cpu_us_per_req"), e.get("valkey_cpu_us_per_req")
        n = e.get("requests") or 0
        cmds = ", ".join(f"{k} {c / n:.2f}" for k, c in sorted((e.get("valkey_calls") or {}).items())
                         ) if n else "-"
        rows.append([v, "-" if es is None else f"{es:.4f}", verdict(ok_es),
                     "-" if not es else f"{1 / es:.1f}",
                     "-" if cs is None else f"{cs:.4f}",
                     "-" if rt is None else f"{rt:.4f}", verdict(ok_rt),
                     "-" if vk is None else f"{vk:.1f}",
                     "-" if gw is None or vk is None else f"{gw + vk:.1f}",
                     ", ".join(f"{k} {int(c)}" for k, c in sorted(dec.items())) or "-"])
        e["valkey_commandstats_per_req"] = cmds
    print(table(rows, ["variant", "FCALL/req", "", "req/FCALL", "all cmdstats/req", "sent/req (MONITOR)", "",
                       "Valkey CPU us/req", "Sluice+Valkey CPU us/req", "decisions (Sluice)"]))
    for v in limit_variants:
        e = E[v]
        mon = e.get("valkey_monitor") or {}
        print(f"  {v}: INFO commandstats per request over the measured rounds: "
              f"{e.get('valkey_commandstats_per_req')}")
        if mon:
            print(f"  {v}: MONITOR sample ({mon.get('requests')} requests, separate run): sent by "
                  f"Sluice {mon.get('client_commands')}; run inside the Lua script "
                  f"{mon.get('script_commands')}")
    print("  commandstats (and total_commands_processed) also count the commands a script runs "
          "(redis.call), which are no round trips; MONITOR tells them apart ([0 lua]).")


def print_ratios(args, summary, pairs):
    """Each variant against its base (comparisons()), with the targets checked."""
    E = summary["variants"]
    print()
    names = {"rps": "requests/s", "p99": "p99", "hs": "new TLS connections/s",
             "cap": "requests/s at capacity"}
    ran = {"rps": bool(args.rounds), "p99": bool(args.rounds), "hs": bool(args.handshake_rounds),
           "cap": bool(args.capacity_rounds)}
    wanted = [f"{v}/{b} " + ", ".join(f"{names[k]} {op} {lim}x" for k, (op, lim) in tg.items()
                                      if ran[k])
              for v, b, tg in pairs if any(ran[k] for k in tg)]
    print(f"== Ratios (targets: {'; '.join(wanted) or 'none'}; no errors; 'info': no target) ==")
    rows = []
    for v, base, tg in pairs:
        e, b = E[v], E.get(base, {})
        values = {
            "rps": e["rps"] / b["rps"] if e.get("rps") and b.get("rps") else None,
            "p99": e["p99_us"] / b["p99_us"] if e.get("p99_us") and b.get("p99_us") else None,
            "hs": (e["handshake"]["rps"] / b["handshake"]["rps"]
                   if (e.get("handshake") or {}).get("rps") and (b.get("handshake") or {}).get("rps")
                   else None),
            "cap": (e["capacity"]["rps"] / b["capacity"]["rps"]
                    if (e.get("capacity") or {}).get("rps") and (b.get("capacity") or {}).get("rps")
                    else None),
        }
        comp = {"variant": v, "base": base, "info_only": not tg}
        cells = []
        for key in ("rps", "p99", "hs", "cap"):
            comp[f"{key}_ratio"] = values[key]
            if key in tg and ran[key]:
                ok = check_value(values[key], tg[key])
                name = {"rps": "rps_ratio", "p99": "p99_ratio", "hs": "handshake_ratio",
                        "cap": "capacity_rps_ratio"}[key]
                summary["checks"].append({"variant": v, "base": base, "check": name,
                                          "value": values[key],
                                          "target": f"{tg[key][0]} {tg[key][1]}",
                                          "result": verdict(ok)})
                cells += [fmt_ratio(values[key]), f"{tg[key][0]}{tg[key][1]} {verdict(ok)}"]
            else:
                cells += [fmt_ratio(values[key]), "info" if values[key] is not None else ""]
        if tg:
            runs_ok = "rps" in e or "handshake" in e
            err = e.get("non2xx", 0) + e.get("socket_errors", 0)
            for part in ("handshake", "capacity"):
                h = e.get(part) or {}
                err += h.get("non2xx", 0) + h.get("socket_errors", 0)
            ok_err = None if not runs_ok else err == 0
            if not any(c["variant"] == v and c["check"] == "no_errors" for c in summary["checks"]):
                summary["checks"].append({"variant": v, "check": "no_errors", "value": err,
                                          "result": verdict(ok_err)})
            cells.append(verdict(ok_err))
        else:
            cells.append("")
        summary["comparisons"].append(comp)
        rows.append([f"{v}/{base}"] + cells)
    print(table(rows, ["ratio", "requests/s", "target", "p99", "target",
                       "new TLS conn/s", "target", "req/s at capacity", "target", "errors"]))


def print_idle(args, summary, variants):
    """Memory of idle keep-alive connections (check: Sluice over plain HTTP), and what the
    later open/close cycles show."""
    E = summary["variants"]
    print()
    print(f"== Memory of idle keep-alive client connections "
          f"(target for Sluice over plain HTTP: <= {args.idle_kib_max:g} KiB per connection, "
          f"Pss; TLS: for information) ==")
    rows = []
    for v in variants:
        i = E[v]["idle"]
        if not i:
            continue
        if "before" not in i:
            rows.append([v, "not measured"] + ["-"] * 6 + [i.get("error", "-")])
            continue
        per_pss = i.get("pss_kib_per_conn")
        per_rss = i.get("rss_kib_per_conn")
        per_anon = i.get("anon_kib_per_conn")
        ok = None
        label = "(reference)"
        if E[v].get("kind", "sluice") == "sluice":
            if E[v].get("tls") or i.get("tls"):
                label = "(no target)"
            else:
                ok = (per_pss is not None and per_pss <= args.idle_kib_max
                      and i.get("still_open_at_measure") == i.get("target_connections"))
                summary["checks"].append({"variant": v, "check": "idle_kib_per_conn",
                                          "value": per_pss, "target": f"<= {args.idle_kib_max}",
                                          "result": verdict(ok)})
                label = verdict(ok)
        aft = i.get("after") or {}
        clo = i.get("after_close") or {}
        rows.append([
            v,
            f"{i.get('still_open_at_measure', 0)}/{i.get('target_connections')}",
            f"{i['before']['pss_kib'] / 1024:.1f}",
            f"{aft['pss_kib'] / 1024:.1f}" if aft else "-",
            f"{clo['pss_kib'] / 1024:.1f}" if clo else "-",
            "-" if per_pss is None else f"{per_pss:.2f}",
            "-" if per_rss is None else f"{per_rss:.2f}",
            "-" if per_anon is None else f"{per_anon:.2f}",
            label,
        ])
    print(table(rows, ["gateway", "open/target", "Pss before MiB", "with conns MiB",
                       "after close MiB", "KiB/conn (Pss)", "KiB/conn (Rss)",
                       "KiB/conn (Anon)", "target"]))
    for v in variants:
        i = E[v]["idle"]
        if not i:
            continue
        cycles = i.get("cycles") or []
        if len(cycles) > 1 and i.get("retained_growth_kib") is not None:
            later = ", ".join(f"{c['pss_kib_per_conn']:.2f}" for c in cycles[1:]
                              if c.get("pss_kib_per_conn") is not None)
            print(f"  {v}: {len(cycles)} open/close cycles; KiB/conn in later cycles: {later}; "
                  f"anonymous memory after close, per cycle: "
                  f"{', '.join(f'{k / 1024:.1f}' for k in i.get('retained_after_close_kib') or [])}"
                  f" MiB ({i['retained_growth_kib']:+d} KiB from cycle 1 to {len(cycles)})")
        for n, c in enumerate(cycles, 1):
            if c.get("errors") or c.get("failed"):
                print(f"  {v}: cycle {n}: idle-connection errors: {c.get('errors')}")
            m = c.get("gateway_open_connections_metric_after_close")
            if m is not None and m > 0:
                print(f"  {v}: cycle {n}: the gateway still reports {m:.0f} open connections "
                      f"after all were closed")


def variant_notes(v, e, args, meta):
    """Anything odd about one variant's runs, as sentences for the Notes."""
    cap_meta = meta.get("capacity") or {}
    notes = []
    # wrk does not count the requests in flight when it stops: up to one per connection.
    if e.get("upstream_requests") is not None:
        extra = e["upstream_requests"] - e.get("requests", 0)
        if not 0 <= extra <= meta.get("connections", 0) * len(e.get("rounds", [])):
            notes.append(f"{v}: wrk completed {e.get('requests')} requests but the upstream "
                         f"received {e['upstream_requests']}")
    if (e.get("upstream_connections_opened") or 0) > 2 * args.connections_hint:
        notes.append(f"{v}: opened {e['upstream_connections_opened']} upstream connections "
                     f"during the measured runs (keep-alive pool not reused?)")
    if e.get("errors") and any(e["errors"].values()):
        notes.append(f"{v}: wrk errors over all rounds: {e['errors']}")
    c = e.get("capacity") or {}
    if c.get("errors") and any(c["errors"].values()):
        notes.append(f"{v}: wrk errors in the capacity rounds: {c['errors']}")
    # (At most one per client connection and round: those beyond max_idle_connections
    # close between rounds.)
    if (c.get("upstream_connections_opened") or 0) > len(c.get("rounds", [])) * (
            cap_meta.get("connections") or 0):
        notes.append(f"{v}: opened {c['upstream_connections_opened']} upstream connections "
                     f"during the capacity rounds (keep-alive pool not reused?)")
    h = e.get("handshake") or {}
    if h.get("errors") and any(h["errors"].values()):
        notes.append(f"{v}: errors during the new-connection runs: {h['errors']}")
    if (h.get("upstream_connections_opened") or 0) > 2 * args.connections_hint:
        notes.append(f"{v}: opened {h['upstream_connections_opened']} upstream connections "
                     f"during the new-connection runs")
    if h.get("resumed_handshakes"):
        notes.append(f"{v}: {h['resumed_handshakes']} TLS sessions were resumed during the "
                     f"new-connection runs: handshakes/s is not comparable")
    bad = {k: n for k, n in (e.get("decisions") or {}).items() if k != "allowed" and n}
    if bad:
        notes.append(f"{v}: {int(sum(bad.values()))} decisions were not made by Valkey "
                     f"({', '.join(f'{k} {int(n)}' for k, n in sorted(bad.items()))}; "
                     f"Valkey errors: {e.get('valkey_errors')}): those requests cost no round "
                     f"trip, and requests/s is flattered")
    if e.get("limit") and e.get("requests"):
        # Every request decided by Valkey (one FCALL decides a batch of them).
        allowed = (e.get("decisions") or {}).get("allowed")
        if allowed is not None and abs(allowed - e["requests"]) > (
                meta.get("connections", 0) * len(e["rounds"])):
            notes.append(f"{v}: Sluice counted {int(allowed)} allowed decisions for "
                         f"{e['requests']} requests")
    if e.get("crashed"):
        notes.append(f"{v}: process died during the benchmark ({e.get('crash_phase')})")
    if e.get("exit_status") not in (None, 0):
        notes.append(f"{v}: exit status after SIGTERM was {e['exit_status']}")
    if e.get("stop_seconds") is not None and e["stop_seconds"] > 5:
        notes.append(f"{v}: took {e['stop_seconds']:.1f}s to exit after SIGTERM")
    i = e.get("idle") or {}
    if ((i.get("retained_growth_kib") or 0) > max(1024, 0.25 * i.get("target_connections", 0))
            and i.get("retained_growth_monotonic", True)):
        notes.append(f"{v}: memory after closing the idle connections grew by "
                     f"{i['retained_growth_kib']} KiB between the first and last cycle, at every "
                     f"cycle ({i.get('retained_after_close_kib')} KiB anonymous; possible leak)")
    for n, c in enumerate(i.get("cycles") or [], 1):
        if c.get("still_open_at_measure") != i.get("target_connections"):
            notes.append(f"{v}: idle cycle {n}: only {c.get('still_open_at_measure')} of "
                         f"{i.get('target_connections')} connections open when measured")
        m = c.get("gateway_open_connections_metric")
        if m is not None and m != c.get("established"):
            notes.append(f"{v}: idle cycle {n}: /metrics reports {m:.0f} open connections, "
                         f"the client holds {c.get('established')}")
        m = c.get("gateway_open_connections_metric_after_close")
        if m is not None and m > 0:
            notes.append(f"{v}: idle cycle {n}: /metrics still reports {m:.0f} open "
                         f"connections 1 s after the client closed them all")
    scrape = i.get("first_metrics_scrape") or {}
    if scrape.get("anon_kib", 0) > 1024:
        notes.append(f"{v}: the first GET /metrics on the admin port raised anonymous memory by "
                     f"{scrape['anon_kib'] / 1024:.1f} MiB (threads {scrape.get('threads_before')}"
                     f" -> {scrape.get('threads_after')}); measured before the idle test, so "
                     f"not counted in KiB/conn")
    if e.get("log_lines"):
        notes.append(f"{v}: {e['log_lines']} line(s) on stderr (see {e.get('log_file')})")
    return notes


def report_notes(args, meta, summary, variants):
    """Every variant's notes, and whether the TLS variants negotiated alike."""
    E = summary["variants"]
    notes = []
    for v in variants:
        notes += variant_notes(v, E[v], args, meta)
    negotiated = {v: (E[v].get("tls_negotiated") or {}) for v in variants if E[v].get("tls")}
    suites = {(n.get("Protocol version"), n.get("Ciphersuite"),
               (n.get("Server Temp Key") or "").split(",")[0]) for n in negotiated.values() if n}
    if len(suites) > 1:
        notes.append("the TLS variants negotiate different parameters: "
                     + "; ".join(f"{v}: {n}" for v, n in negotiated.items()))
    return notes


def cmd_report(args):
    meta = json.loads(args.meta)
    variants = args.variants.split()
    ref = args.reference
    targets = {"rps_ratio_min": args.rps_ratio_min, "p99_ratio_max": args.p99_ratio_max,
               "idle_kib_per_conn_max": args.idle_kib_max,
               "limit_rps_ratio_min": args.limit_rps_ratio_min,
               "handshake_ratio_min": args.handshake_ratio_min,
               "valkey_fcall_per_request_max": 1.0,
               "valkey_fcall_per_request_tolerance": FCALL_TOLERANCE,
               "valkey_calls_per_request_max": CALLS_PER_REQ_MAX}
    summary = {"meta": meta, "targets": targets, "variants": {}, "comparisons": [], "checks": []}

    summary["variants"] = collect_variants(args, variants)
    E = summary["variants"]
    pairs = comparisons(variants, ref, E, args)

    mode = meta.get("mode", "all")
    print_throughput(args, meta, summary, variants)
    if args.handshake_rounds and any("handshake" in E[v] for v in variants):
        print_handshakes(args, meta, summary, variants)
    limit_variants = [v for v in variants if "valkey_fcall_per_req" in E[v] or E[v].get("limit")]
    if args.rounds and limit_variants:
        print_rate_limiting(args, summary, limit_variants)
    if args.rounds or args.handshake_rounds:
        print_ratios(args, summary, pairs)
    if mode in ("all", "idle"):
        print_idle(args, summary, variants)

    # Anything odd goes into notes, printed last.
    notes = report_notes(args, meta, summary, variants)
    summary["notes"] = notes

    failed = [c for c in summary["checks"] if c["result"] == "FAIL"]
    unknown = [c for c in summary["checks"] if c["result"] == "n/a"]
    summary["overall"] = "FAIL" if failed else ("INCOMPLETE" if unknown else "PASS")
    print()
    if notes:
        print("Notes:")
        for n in notes:
            print(f"  - {n}")
    print(f"Overall: {summary['overall']}"
          + (f" ({', '.join(c['variant'] + ':' + c['check'] for c in failed)})" if failed else ""))
    write_summary(args.out, summary)
    return 0
