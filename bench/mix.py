#!/usr/bin/python3
"""Helper of bench/run.sh --mode mix, the production-like traffic mix (standard library only;
the shared pieces come from bench.py).

Subcommands:
  seed --port P --keys N --tenants T   put the tenants of the mix in Valkey: the API keys
                                       mk00000 .. mk<N-1> (those of bench/mix.lua), in T
                                       tenants, all on the plan "pro"
  check --port P --valkey-port V ...   one request with a tenant's key and one without through
                                       sluice+mix: the plan raises per_key, and the limits are
                                       keyed on the X-Forwarded-For address
  report ...                           the tables, the verdicts and the JSON summary
"""

import argparse
import http.client
import json
import os
import re
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (bench.py, beside this file)
from bench import fmt_ratio, table, verdict, write_summary  # noqa: E402

KEY_FORMAT = "mk{:05d}"          # the API keys of bench/mix.lua
TENANT_PREFIX = "sluice:apikey"  # [identity] tenant_key_prefix (default)
CHECK_ADDRESS = "203.0.113.7"    # the check's client address, not one of the mix's
# Commands Sluice sends itself; commandstats also counts those its scripts run (redis.call).
SENT = {"fcall", "sluice.decide", "sluice.undo", "sluice.lease", "sluice.version", "hmget",
        "function|load", "function", "ping", "info", "hello", "auth",
        "client|setname", "cluster|slots", "select"}


# ---------------------------------------------------------------- Valkey, HTTP


def resp(*argv):
    out = [f"*{len(argv)}\r\n".encode()]
    for a in argv:
        a = str(a).encode()
        out.append(f"${len(a)}\r\n".encode() + a + b"\r\n")
    return b"".join(out)


def read_reply(f):
    """One RESP2 reply from a buffered socket file: str, int, None, list; errors as
    RuntimeError objects (returned, not raised, so that a pipeline reads every reply)."""
    line = f.readline()
    if not line:
        raise OSError("connection closed before the reply")
    kind, body = line[:1], line[1:-2].decode(errors="replace")
    if kind == b"+":
        return body
    if kind == b"-":
        return RuntimeError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(body)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line[:40]!r}")


def valkey_pipeline(port, commands, timeout=10.0):
    """Sends every command (a list of argv) on one connection, returns the replies in order."""
    with socket.create_connection((bench.HOST, port), timeout=timeout) as s:
        s.sendall(b"".join(resp(*c) for c in commands))
        with s.makefile("rb") as f:
            return [read_reply(f) for _ in commands]


def cmd_seed(args):
    cmds = [["HSET", f"{TENANT_PREFIX}:{KEY_FORMAT.format(i)}",
             "tenant", f"tenant{i % args.tenants:03d}", "plan", "pro"] for i in range(args.keys)]
    replies = valkey_pipeline(args.port, cmds)
    errors = [r for r in replies if isinstance(r, Exception)]
    if errors:
        print(f"HSET failed {len(errors)} time(s): {errors[0]}", file=sys.stderr)
        return 1
    first = valkey_pipeline(args.port, [["HGETALL", cmds[0][1]]])[0] if cmds else None
    print(f"  mix: {args.keys} API keys of {args.tenants} tenants (plan pro) in Valkey "
          f"({TENANT_PREFIX}:<key>, e.g. {cmds[0][1] if cmds else '-'} = {first})")
    return 0


def policy_of(port, address, key):
    """(status, RateLimit-Policy) of GET / sent for `address` with API key `key`."""
    conn = http.client.HTTPConnection(bench.HOST, port, timeout=5)
    try:
        conn.request("GET", "/", headers={"X-Forwarded-For": address, "X-API-Key": key})
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("RateLimit-Policy") or ""
    finally:
        conn.close()


def quota(policy, limit):
    m = re.search(rf'"{re.escape(limit)}";q=(\d+)', policy)
    return int(m.group(1)) if m else None


def cmd_check(args):
    tenant_key = KEY_FORMAT.format(0)
    other_key = KEY_FORMAT.format(args.keys - 1)
    problems = []
    st1, pol1 = policy_of(args.port, CHECK_ADDRESS, tenant_key)
    st2, pol2 = policy_of(args.port, CHECK_ADDRESS, other_key)
    q1, q2 = quota(pol1, "per_key"), quota(pol2, "per_key")
    if st1 != 200 or st2 != 200:
        problems.append(f"statuses {st1} and {st2} (200 expected)")
    if args.tenant_keys >= 1 and args.keys > args.tenant_keys and not (q1 and q2 and q1 > q2):
        problems.append(f"per_key quota {q1} with a tenant's key, {q2} without: the plan of "
                        f"the tenants in Valkey does not apply")
    keys = valkey_pipeline(args.valkey_port,
                           [["KEYS", f"{args.key_prefix}:per_ip:{{{CHECK_ADDRESS}}}"]])[0]
    if not keys or isinstance(keys, Exception):
        problems.append(f"no per_ip key for {CHECK_ADDRESS} in Valkey ({keys}): the client "
                        f"address is not read from X-Forwarded-For")
    print(f"  mix check (sluice+mix): per_key quota {q1} with tenant key {tenant_key}, {q2} with "
          f"{other_key}; per_ip key of the X-Forwarded-For address: {keys}")
    for p in problems:
        print(f"  mix check: {p}", file=sys.stderr)
    return 1 if problems else 0


# ---------------------------------------------------------------- report


def decisions_by_limit(runs):
    """{limit: {outcome: count}} summed over the rounds (from Sluice's /metrics deltas)."""
    out = {}
    for d in runs:
        for k, v in (d.get("sluice_metrics_delta") or {}).items():
            m = re.match(r'^sluice_ratelimit_decisions_total\{limit="([^"]+)",outcome="([^"]+)"', k)
            if m:
                per = out.setdefault(m.group(1), {})
                per[m.group(2)] = per.get(m.group(2), 0) + v
    return out


def variant_entry(directory, v, rounds):
    runs = [d for d in (bench.load(os.path.join(directory, f"wrk_{v}_{r}.json"))
                        for r in range(1, rounds + 1)) if d]
    e = bench.summarize_runs(runs)
    e.update(bench.load(os.path.join(directory, f"extra_{v}.json")) or {})
    n = e.get("requests") or 0
    calls = e.get("valkey_calls") or {}
    if n and calls:
        sent = sum(c for k, c in calls.items() if k in SENT)
        # (a decision: an FCALL of the functions, or the module's command)
        e["valkey_per_req"] = {"fcall": (calls.get("fcall", 0) + calls.get("sluice.decide", 0)) / n,
                               "hmget": calls.get("hmget", 0) / n,
                               "script_commands": (sum(calls.values()) - sent) / n,
                               "all": sum(calls.values()) / n}
    e["decisions_by_limit"] = decisions_by_limit(runs)
    return e


def derived(e, plain, ref):
    """Ratios to nginx, CPU above plain Sluice, and the sum with Valkey."""
    def ratio(a, b):
        return a / b if a and b else None
    gw, vk = e.get("gateway_cpu_us_per_req"), e.get("valkey_cpu_us_per_req")
    pc = (plain or {}).get("gateway_cpu_us_per_req")
    return {"rps_ratio": ratio(e.get("rps"), (ref or {}).get("rps")),
            "p99_ratio": ratio(e.get("p99_us"), (ref or {}).get("p99_us")),
            "own_cpu_us_per_req": None if gw is None or pc is None else gw - pc,
            "total_cpu_us_per_req": None if gw is None else gw + (vk or 0)}


def limits_row(v, e):
    d, pr = e["derived"], e.get("valkey_per_req") or {}

    def num(x, f="{:.2f}"):
        return "-" if x is None else f.format(x)
    dec = "; ".join(f"{lim} " + ", ".join(f"{o} {int(c)}" for o, c in sorted(oc.items()))
                    for lim, oc in sorted(e["decisions_by_limit"].items())) or "-"
    return [v, fmt_ratio(d["rps_ratio"]), fmt_ratio(d["p99_ratio"]),
            num(e.get("gateway_cpu_us_per_req"), "{:.1f}"),
            num(d["own_cpu_us_per_req"], "{:+.1f}"), num(e.get("valkey_cpu_us_per_req"), "{:.1f}"),
            num(d["total_cpu_us_per_req"], "{:.1f}"), num(pr.get("fcall"), "{:.3f}"),
            num(pr.get("hmget"), "{:.4f}"), num(pr.get("script_commands")), num(pr.get("all")),
            dec]


def checks_of(E, args, meta):
    """The targets of sluice+mix, and for every variant: no errors, every decision allowed
    (Sluice decides the requests wrk completed, and up to one in flight per connection)."""
    checks = []

    def add(v, name, value, lo, hi, target, kind="health"):
        ok = None if value is None else lo <= value <= hi
        checks.append({"variant": v, "kind": kind, "check": name, "value": value,
                       "target": target, "result": verdict(ok)})
    m = E.get("sluice+mix")
    if m:
        d, inf = m["derived"], float("inf")
        add("sluice+mix", "requests/s / nginx (mix)", d["rps_ratio"], args.rps_ratio_min, inf,
            f">= {args.rps_ratio_min}", "target")
        add("sluice+mix", "p99 / nginx (mix)", d["p99_ratio"], 0, args.p99_ratio_max,
            f"<= {args.p99_ratio_max}", "target")
        add("sluice+mix", "Valkey CPU us/req", m.get("valkey_cpu_us_per_req"), 0,
            args.valkey_cpu_us_max, f"<= {args.valkey_cpu_us_max}", "target")
        add("sluice+mix", "Sluice CPU us/req - plain sluice's (mix)", d["own_cpu_us_per_req"],
            -inf, args.own_cpu_us_max, f"<= {args.own_cpu_us_max}", "target")
    mm = E.get("sluice+mix+module")
    if mm and args.module_targets:
        rps, p99, vk, own = (float(x) for x in args.module_targets.split(","))
        d, inf, v = mm["derived"], float("inf"), "sluice+mix+module"
        add(v, "requests/s / nginx (mix, module)", d["rps_ratio"], rps, inf, f">= {rps}",
            "target")
        add(v, "p99 / nginx (mix, module)", d["p99_ratio"], 0, p99, f"<= {p99}", "target")
        add(v, "Valkey CPU us/req (module)", mm.get("valkey_cpu_us_per_req"), 0, vk, f"<= {vk}",
            "target")
        add(v, "Sluice CPU us/req - plain sluice's (mix, module)", d["own_cpu_us_per_req"], -inf,
            own, f"<= {own}", "target")
    return checks + health_checks(E, args, meta)


def health_checks(E, args, meta):
    """Every variant: measured, no errors, every decision allowed, decisions = requests (up to
    one in flight per connection and round)."""
    checks = []

    def add(v, name, value, lo, hi, target):
        ok = None if value is None else lo <= value <= hi
        checks.append({"variant": v, "kind": "health", "check": name, "value": value,
                       "target": target, "result": verdict(ok)})
    slack = meta.get("connections", 0) * args.rounds
    for v, e in E.items():
        if not e.get("rounds"):
            add(v, "measured", None, 0, 0, "some rounds")
            continue
        add(v, "non-2xx + socket errors", e["non2xx"] + e["socket_errors"], 0, 0, "0")
        if e.get("limit") and not e["decisions_by_limit"]:
            add(v, "decisions not allowed: none counted", None, 0, 0, "0")
        for lim, oc in sorted(e["decisions_by_limit"].items()):
            add(v, f"{lim}: decisions not allowed",
                int(sum(c for o, c in oc.items() if o != "allowed")), 0, 0, "0")
            add(v, f"{lim}: decided - requests", int(sum(oc.values()) - e["requests"]),
                0, slack, f"0 to {slack}")
    return checks


def print_checks(checks, title="Targets of sluice+mix"):
    targets = [c for c in checks if c["kind"] == "target"]
    print(f"\n== {title} (information; BENCH_STRICT=1 makes a miss fail the run) ==")
    print(table([[c["check"], "-" if c["value"] is None else f"{c['value']:.3f}", c["target"],
                  c["result"]] for c in targets], ["check", "value", "target", "result"]))
    rows, by_variant = [], {}
    for c in checks:
        if c["kind"] != "target":
            by_variant.setdefault(c["variant"], []).append(c)
    for v, cs in by_variant.items():
        def values(word):
            return ", ".join(f"{c['check'].split(':')[0]} {c['value']}" for c in cs
                             if word in c["check"]) or "-"
        results = {c["result"] for c in cs}
        rows.append([v, values("errors").replace("non-2xx + socket errors ", ""),
                     values("not allowed"), values("decided - requests"),
                     next((r for r in ("FAIL", "n/a") if r in results), "PASS")])
    print("\n== Every variant: no errors, every decision allowed (decided - requests: the requests "
          "in flight when wrk stopped, at most one per connection and round) ==")
    print(table(rows, ["variant", "non-2xx + socket errors", "decisions not allowed",
                       "decided - requests", "result"]))


def notes_of(E):
    notes = []
    for v, e in E.items():
        if e.get("crashed"):
            notes.append(f"{v}: process died during the benchmark ({e.get('crash_phase')})")
        if e.get("exit_status") not in (None, 0):
            notes.append(f"{v}: exit status after SIGTERM was {e['exit_status']}")
        if e.get("log_lines"):
            notes.append(f"{v}: {e['log_lines']} line(s) on stderr (see {e.get('log_file')})")
        if e.get("errors") and any(e["errors"].values()):
            notes.append(f"{v}: wrk errors over all rounds: {e['errors']}")
        failed_open = sum(oc.get("error_allowed", 0) for oc in e["decisions_by_limit"].values())
        if failed_open:
            notes.append(f"{v}: {int(failed_open)} decisions failed open (error_allowed; Valkey "
                         f"errors seen by Sluice: {e.get('valkey_errors')}): Valkey did not answer "
                         f"within [valkey] timeout (25 ms), or a call had timed out just before "
                         f"(unresponsive); those requests cost no round trip")
    return notes


def print_tables(E, args, meta, one_key):
    names = {v: (f"{v} (one key)" if v in one_key else v) for v in E}
    print(f"Run of {meta.get('date')}: Sluice {meta.get('git_commit')} ({meta.get('sluice_bin')}), "
          f"{meta.get('valkey_server')}, nginx {meta.get('nginx')}, {meta.get('wrk')}; "
          f"{meta.get('cpus')} CPU(s), load average {meta.get('load_average_start')} at the "
          f"start, {meta.get('load_average_end')} at the end")
    print(f"\n== Traffic mix: wrk -t{meta.get('threads')} -c{meta.get('connections')} "
          f"-d{meta.get('duration')} with bench/mix.lua ({args.addresses:,} client addresses "
          f"via X-Forwarded-For, {args.keys:,} API keys, {args.tenant_keys:,} of them of "
          f"{args.tenants} tenants in Valkey, seed {args.seed}); one-key variants: wrk's one "
          f"request; {args.rounds} round(s) alternating, median per metric ==")
    print(bench.throughput_table([(names[v], e) for v, e in E.items()]))
    rows = [limits_row(names[v], e) for v, e in E.items() if v != "nginx"]
    print("\n== Rate limiting on the mix: ratios to nginx (same requests), CPU per request "
          "(Sluice, above plain sluice, Valkey, both), Valkey commands per request "
          "(commandstats), Sluice's decisions ==")
    print(table(rows, ["variant", "req/s / nginx", "p99 / nginx", "Sluice CPU us/req",
                       "- plain sluice", "Valkey CPU us/req", "Sluice+Valkey", "FCALL/req",
                       "HMGET/req", "in scripts/req", "all cmds/req", "decisions"]))
    print("  in scripts/req: the commands the Lua scripts run (commandstats counts them too, "
          "they are no round trips); HMGET: tenant lookups (cache misses, tenant_cache_ttl)")


def cmd_report(args):
    meta = json.loads(args.meta)
    variants, one_key = args.variants.split(), set(args.one_key.split())
    E = {v: variant_entry(args.dir, v, args.rounds) for v in variants}
    plain = E.get("sluice") if "sluice" not in one_key else None
    for v, e in E.items():
        same_traffic = (v in one_key) == ("nginx" in one_key)
        e["derived"] = derived(e, plain if v not in one_key else None,
                               E.get("nginx") if same_traffic else None)
    print_tables(E, args, meta, one_key)
    checks = checks_of(E, args, meta)
    print_checks(checks)
    notes = notes_of(E)
    for n in notes:
        print(f"  note: {n}")
    failed = [c for c in checks if c["result"] == "FAIL"]
    overall = "FAIL" if failed else ("INCOMPLETE" if any(c["result"] == "n/a" for c in checks)
                                     else "PASS")
    print(f"Overall: {overall}" + (" (missed: " + "; ".join(f"{c['variant']} {c['check']}"
                                                          for c in failed) + ")" if failed else ""))
    mix = {k: getattr(args, k) for k in ("addresses", "keys", "tenant_keys", "tenants", "seed")}
    targets = {k: getattr(args, k) for k in ("rps_ratio_min", "p99_ratio_max",
                                             "valkey_cpu_us_max", "own_cpu_us_max")}
    write_summary(args.out, {"meta": meta, "mix": mix, "one_key": sorted(one_key),
                             "targets": targets, "variants": E, "checks": checks, "notes": notes,
                             "overall": overall})
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--keys", type=int, required=True, help="API keys that belong to tenants")
    s.add_argument("--tenants", type=int, required=True)
    s.set_defaults(func=cmd_seed)
    s = sub.add_parser("check")
    s.add_argument("--port", type=int, required=True, help="sluice+mix")
    s.add_argument("--valkey-port", type=int, required=True)
    s.add_argument("--key-prefix", required=True, help="[valkey] key_prefix of sluice+mix")
    s.add_argument("--tenant-keys", type=int, required=True)
    s.add_argument("--keys", type=int, required=True)
    s.set_defaults(func=cmd_check)
    s = sub.add_parser("report")
    for name in ("dir", "variants", "meta", "out"):
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--one-key", default="", help="variants driven by wrk's one static request")
    for name in ("rounds", "addresses", "keys", "tenant-keys", "tenants", "seed"):
        s.add_argument(f"--{name}", type=int, required=True)
    for name in ("rps-ratio-min", "p99-ratio-max", "valkey-cpu-us-max", "own-cpu-us-max"):
        s.add_argument(f"--{name}", type=float, required=True)
    s.add_argument("--module-targets", default="",
                   help="sluice+mix+module: rps ratio min, p99 ratio max, Valkey CPU us max, "
                        "own CPU us max (comma-separated)")
    s.set_defaults(func=cmd_report)
    args = p.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
