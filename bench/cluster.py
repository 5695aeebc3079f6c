#!/usr/bin/python3
"""Helper of bench/run.sh --mode mix-cluster: the traffic mix against one Valkey node and
against a Valkey Cluster, side by side (standard library only; the shared pieces come from
bench.py and mix.py).

Subcommands:
  ports N [--avoid P...]           N free loopback ports whose cluster bus port (+10000) is
                                   free too, neither of them one of P... (ports run.sh handed
                                   out and has not bound yet)
  wait --nodes port:pid,...        wait until every node says cluster_state:ok
  seed --nodes ... --keys N --tenants T --out JSON
                                   the tenants of the mix, each hash on the primary of its slot
  check --port P --nodes ... --key-prefix K ...
                                   one request with a tenant's key and one without through
                                   sluice+mix@cluster: the plan applies, and the per_ip key of
                                   the X-Forwarded-For address is on the primary of its slot
  report ...                       the tables, the targets and the JSON summary
"""

import argparse
import json
import os
import random
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (bench.py, beside this file)
import mix  # noqa: E402
from bench import fmt_ratio, table, verdict, write_summary  # noqa: E402

SLOTS = 16384


# ---------------------------------------------------------------- slots


def crc16(data):
    """CRC16-CCITT (XMODEM), the hash of Valkey Cluster's key slots."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def key_slot(key):
    k = key.encode()
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1:end]
    return crc16(k) % SLOTS


def parse_nodes(spec):
    return [(int(p), int(pid)) for p, _, pid in (i.partition(":") for i in spec.split(","))]


def slot_owners(port):
    """[port owning slot s for s in 0..16383] from CLUSTER SLOTS of one node."""
    owners = [None] * SLOTS
    for entry in mix.valkey_pipeline(port, [["CLUSTER", "SLOTS"]])[0]:
        start, end, primary = entry[0], entry[1], entry[2]
        for s in range(start, end + 1):
            owners[s] = int(primary[1])
    return owners


# ---------------------------------------------------------------- subcommands


def cmd_ports(args):
    def free(port):
        try:
            with socket.socket() as s:
                s.bind((bench.HOST, port))
            return True
        except OSError:
            return False
    rng, out, avoid = random.Random(), [], set(args.avoid)
    for _ in range(1000):
        p = rng.randrange(20000, 30000)
        if p not in out and not {p, p + 10000} & avoid and free(p) and free(p + 10000):
            out.append(p)
            if len(out) == args.n:
                print("\n".join(map(str, out)))
                return 0
    print("no free port pairs (port, port + 10000) in 20000-39999", file=sys.stderr)
    return 1


def cmd_wait(args):
    nodes, deadline, last = parse_nodes(args.nodes), time.monotonic() + args.timeout, ""
    while time.monotonic() < deadline:
        try:
            states = []
            for port, _ in nodes:
                info = mix.valkey_pipeline(port, [["CLUSTER", "INFO"]])[0]
                if isinstance(info, Exception):
                    raise RuntimeError(str(info))
                fields = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
                states.append((fields.get("cluster_state"), fields.get("cluster_slots_assigned"),
                               fields.get("cluster_known_nodes")))
            last = str(states)
            if all(s == ("ok", str(SLOTS), str(len(nodes))) for s in states):
                return 0
        except (OSError, RuntimeError) as e:
            last = str(e)
        time.sleep(0.2)
    print(f"cluster not ready after {args.timeout} s: {last}", file=sys.stderr)
    return 1


def cmd_seed(args):
    nodes = parse_nodes(args.nodes)
    owners = slot_owners(nodes[0][0])
    by_node = {}
    for i in range(args.keys):
        key = f"{mix.TENANT_PREFIX}:{mix.KEY_FORMAT.format(i)}"
        by_node.setdefault(owners[key_slot(key)], []).append(
            ["HSET", key, "tenant", f"tenant{i % args.tenants:03d}", "plan", "pro"])
    for port, cmds in by_node.items():
        errors = [r for r in mix.valkey_pipeline(port, cmds) if isinstance(r, Exception)]
        if errors:
            print(f"HSET on {port} failed {len(errors)} time(s): {errors[0]}", file=sys.stderr)
            return 1
    counts = {str(p): len(by_node.get(p, [])) for p, _ in nodes}
    slots = {str(p): owners.count(p) for p, _ in nodes}
    with open(args.out, "w") as f:
        json.dump({"tenant_keys": counts, "slots": slots}, f)
    print(f"  mix: {args.keys} API keys of {args.tenants} tenants (plan pro) in the cluster, "
          f"per primary {counts}; slots per primary {slots}")
    return 0


def cmd_check(args):
    tenant_key, other_key = mix.KEY_FORMAT.format(0), mix.KEY_FORMAT.format(args.keys - 1)
    problems = []
    st1, pol1 = mix.policy_of(args.port, mix.CHECK_ADDRESS, tenant_key)
    st2, pol2 = mix.policy_of(args.port, mix.CHECK_ADDRESS, other_key)
    q1, q2 = mix.quota(pol1, "per_key"), mix.quota(pol2, "per_key")
    if st1 != 200 or st2 != 200:
        problems.append(f"statuses {st1} and {st2} (200 expected)")
    if args.tenant_keys >= 1 and args.keys > args.tenant_keys and not (q1 and q2 and q1 > q2):
        problems.append(f"per_key quota {q1} with a tenant's key, {q2} without: the plan of "
                        f"the tenants in the cluster does not apply")
    nodes = parse_nodes(args.nodes)
    name = f"{args.key_prefix}:per_ip:{{{mix.CHECK_ADDRESS}}}"
    owner = slot_owners(nodes[0][0])[key_slot(name)]
    found = {}
    for port, _ in nodes:
        keys = mix.valkey_pipeline(port, [["KEYS", bench.glob_escape(name)]])[0]
        if keys and not isinstance(keys, Exception):
            found[port] = keys
    if list(found) != [owner]:
        problems.append(f"the per_ip key {name} (slot {key_slot(name)}, primary {owner}) is on "
                        f"{list(found) or 'no node'}: the client address is not read from "
                        f"X-Forwarded-For, or the key layout is not key_prefix:limit:{{parts}}")
    print(f"  mix check (sluice+mix@cluster): per_key quota {q1} with tenant key {tenant_key}, "
          f"{q2} with {other_key}; per_ip key {name}: slot {key_slot(name)}, on "
          f"{list(found) or 'no node'} (owner {owner})")
    for p in problems:
        print(f"  mix check: {p}", file=sys.stderr)
    return 1 if problems else 0


# ---------------------------------------------------------------- report


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return a / b if a is not None and b else None


def cluster_entry(e):
    """Figures of the one-node / cluster comparison, from the rounds of one variant."""
    runs = e.get("rounds") or []
    n = e.get("requests") or 0
    decided = [sum(v for k, v in (d.get("decisions") or {}).items()) for d in runs]
    # Per decision Valkey made: not those decided by on_error (error_allowed, error_denied),
    # which cost Valkey nothing.
    by_valkey = [sum(v for k, v in (d.get("decisions") or {}).items() if not k.startswith("error_"))
                 for d in runs]
    per_decision = [d["valkey_cpu_us_per_req"] * d["requests"] / k
                    for d, k in zip(runs, by_valkey) if d.get("valkey_cpu_us_per_req") is not None and k]
    comps = [d.get("compensations") for d in runs]
    calls = [d.get("sluice_valkey_calls") for d in runs]
    out = {
        "decisions_per_req": sum(decided) / n if n else None,
        "valkey_cpu_us_per_decision": med(per_decision),
        "sluice_calls_per_req": sum(calls) / n if n and None not in calls and calls else None,
        "compensations_per_req": (sum(comps) / n if n and comps and None not in comps else None),
        "compensations": None if not comps or None in comps else sum(comps),
        "nodes": [],
    }
    ports = []
    for d in runs:
        for node in d.get("valkey_nodes") or []:
            if node["port"] not in ports:
                ports.append(node["port"])
    for port in ports:
        rows = [(d, next((x for x in d.get("valkey_nodes") or [] if x["port"] == port), {}))
                for d in runs]
        cpu_share, key_share = [], []
        for d, x in rows:
            tot_cpu = sum(y.get("cpu_s") or 0 for y in d.get("valkey_nodes") or [])
            if x.get("cpu_s") is not None and tot_cpu:
                cpu_share.append(x["cpu_s"] / tot_cpu)
            keys = [y.get("keys") for y in d.get("valkey_nodes") or []]
            if x.get("keys") is not None and None not in keys and sum(keys):
                key_share.append(x["keys"] / sum(keys))
        fc = sum((x.get("calls") or {}).get("fcall", 0) + (x.get("calls") or {}).get("sluice.decide", 0)
                 for _, x in rows)
        out["nodes"].append({
            "port": port,
            "cpu_us_per_req": med(x.get("cpu_us_per_req") for _, x in rows),
            "cpu_share": med(cpu_share),
            "fcall_per_req": fc / n if n else None,
            "keys": med(x.get("keys") for _, x in rows),
            "key_share": med(key_share),
            "dbsize": med(x.get("dbsize") for _, x in rows)})
    return out


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x, f="{:.2f}"):
    return "-" if x is None else f.format(x)


def cmd_report(args):
    meta = json.loads(args.meta)
    variants = args.variants.split()
    E = {v: mix.variant_entry(args.dir, v, args.rounds) for v in variants}
    for e in E.values():
        e["cluster"] = cluster_entry(e)
    seed = bench.load(os.path.join(args.dir, "cluster_seed.json")) or {}
    print(f"Run of {meta.get('date')}: Sluice {meta.get('git_commit')} ({meta.get('sluice_bin')}), "
          f"{meta.get('valkey_server')}, nginx {meta.get('nginx')}, {meta.get('wrk')}; "
          f"{meta.get('cpus')} CPU(s), load average {meta.get('load_average_start')} at the "
          f"start, {meta.get('load_average_end')} at the end")
    print(f"Cluster: {args.primaries} primaries, no replicas, slots per primary "
          f"{seed.get('slots')}; key_prefix of the cluster variants \"{args.key_prefix}\"; "
          + ("no run spans a minute boundary (BENCH_MINUTE_GUARD)" if meta.get("minute_guard")
             else "runs may span a minute boundary (BENCH_MINUTE_GUARD=0)"))
    print(f"\n== Traffic mix, one Valkey node and a cluster: wrk -t{meta.get('threads')} "
          f"-c{meta.get('connections')} -d{meta.get('duration')} with bench/mix.lua "
          f"({args.addresses:,} client addresses via X-Forwarded-For, {args.keys:,} API keys, "
          f"{args.tenant_keys:,} of them of {args.tenants} tenants in Valkey, seed {args.seed}); "
          f"{args.rounds} round(s) alternating, median per metric ==")
    print(bench.throughput_table(list(E.items())))

    # Pairs: X@cluster against X (one node).
    pairs = [(v, v[:-len("@cluster")]) for v in variants
             if v.endswith("@cluster") and v[:-len("@cluster")] in E]
    for v, e in E.items():
        base = dict(pairs).get(v)
        b = E[base] if base else None
        c = e["cluster"]
        e["versus_one_node"] = None if not b else {
            "one_node": base,
            "rps_ratio": ratio(e.get("rps"), b.get("rps")),
            "p99_ratio": ratio(e.get("p99_us"), b.get("p99_us")),
            "valkey_cpu_per_req_ratio": ratio(e.get("valkey_cpu_us_per_req"),
                                              b.get("valkey_cpu_us_per_req")),
            "valkey_cpu_per_decision_ratio": ratio(c["valkey_cpu_us_per_decision"],
                                                   b["cluster"]["valkey_cpu_us_per_decision"])}
    rows = []
    for v, e in E.items():
        c, r = e["cluster"], e["versus_one_node"] or {}
        pr = e.get("valkey_per_req") or {}
        rows.append([v, str(len(c["nodes"])), f"{e.get('rps') or 0:,.0f}", fmt_ratio(r.get("rps_ratio")),
                     fmt_ratio(r.get("p99_ratio")), num(e.get("valkey_cpu_us_per_req"), "{:.1f}"),
                     num(c["valkey_cpu_us_per_decision"], "{:.2f}"),
                     fmt_ratio(r.get("valkey_cpu_per_decision_ratio")),
                     num(c["decisions_per_req"], "{:.3f}"), num(pr.get("fcall"), "{:.3f}"),
                     num(c["sluice_calls_per_req"], "{:.3f}"),
                     num(c["compensations_per_req"], "{:.4f}"), num(pr.get("hmget"), "{:.4f}")])
    print("\n== One node and the cluster: Valkey CPU summed over the nodes, ratios of X@cluster to "
          "X (one node) ==")
    print(table(rows, ["variant", "nodes", "requests/s", "req/s / 1 node", "p99 / 1 node",
                       "Valkey CPU us/req", "us/decision", "/ 1 node", "decisions/req",
                       "FCALL/req", "Sluice calls/req", "compensations/req", "HMGET/req"]))
    print("  FCALL/req: commandstats over the nodes (decisions and compensations); Sluice "
          "calls/req: sluice_valkey_calls_total (FCALL and the tenant lookups, HMGET); "
          "compensations/req: sluice_valkey_compensations_total (\"-\": this Sluice has no such "
          "metric); us/decision: Valkey CPU over the decisions Valkey made "
          "(sluice_ratelimit_decisions_total but error_*)")

    rows = []
    for v, e in E.items():
        for i, node in enumerate(e["cluster"]["nodes"], 1):
            rows.append([v, f"{i} (:{node['port']})", num(node["cpu_us_per_req"], "{:.2f}"),
                         pct(node["cpu_share"]), num(node["fcall_per_req"], "{:.3f}"),
                         num(node["keys"], "{:,.0f}"), pct(node["key_share"]),
                         str(seed.get("tenant_keys", {}).get(str(node["port"]), "-"))
                         if v.endswith("@cluster") else "-",
                         num(node["dbsize"], "{:,.0f}")])
    print("\n== Per node: Valkey CPU per request of the variant and its share, FCALL per request, "
          "the variant's keys (key_prefix:*, counted after each round) and their share ==")
    print(table(rows, ["variant", "node", "CPU us/req", "CPU share", "FCALL/req", "keys",
                       "key share", "tenant hashes", "DBSIZE"]))

    lo, hi = args.share_target - args.share_tolerance, args.share_target + args.share_tolerance
    checks = []

    def add(v, name, value, low, high, target):
        ok = None if value is None else low <= value <= high
        checks.append({"variant": v, "kind": "target", "check": name, "value": value,
                       "target": target, "result": verdict(ok)})
    for v, base in pairs:
        e = E[v]
        add(v, f"{v}: Valkey CPU per decision / {base}'s",
            e["versus_one_node"]["valkey_cpu_per_decision_ratio"], 0,
            args.cpu_per_decision_ratio_max, f"<= {args.cpu_per_decision_ratio_max}")
        nodes = e["cluster"]["nodes"]
        if len(nodes) != args.primaries:
            add(v, f"{v}: primaries measured", None, 0, 0, str(args.primaries))
        for i, node in enumerate(nodes, 1):
            target = f"{lo:.2f} to {hi:.2f}"
            add(v, f"{v}: primary {i} share of the keys", node["key_share"], lo, hi, target)
            add(v, f"{v}: primary {i} share of the Valkey CPU", node["cpu_share"], lo, hi, target)
    if not pairs:
        add("-", "a variant X@cluster beside X", None, 0, 0, "both measured")
    checks += mix.health_checks(E, args, meta)
    for v, e in E.items():  # every request of the mix is allowed: nothing to take back
        if e["cluster"]["compensations"] is not None:
            checks.append({"variant": v, "kind": "health", "check": "compensations",
                           "value": e["cluster"]["compensations"], "target": "0",
                           "result": verdict(e["cluster"]["compensations"] == 0)})
    mix.print_checks(checks, "Targets of the cluster against one node")
    notes = mix.notes_of(E)
    if any(e["cluster"]["compensations"] is None for v, e in E.items() if v.endswith("@cluster")):
        notes.append("sluice_valkey_compensations_total is not on this Sluice's /metrics: "
                     "compensations shown as \"-\"")
    for v, e in E.items():
        if e["cluster"]["compensations"]:
            notes.append(f"{v}: {e['cluster']['compensations']:.0f} compensating calls, although "
                         f"every request of the mix is allowed")
    if "{" in args.key_prefix:
        notes.append(f"key_prefix \"{args.key_prefix}\" has a hash tag: every key of the cluster "
                     f"variants is in one slot, on one primary (no spread expected)")
    for n in notes:
        print(f"  note: {n}")
    failed = [c for c in checks if c["result"] == "FAIL"]
    overall = "FAIL" if failed else ("INCOMPLETE" if any(c["result"] == "n/a" for c in checks)
                                     else "PASS")
    print(f"Overall: {overall}" + (" (missed: " + "; ".join(c["check"] for c in failed) + ")"
                                   if failed else ""))
    summary = {
        "meta": meta,
        "mix": {k: getattr(args, k) for k in ("addresses", "keys", "tenant_keys", "tenants", "seed")},
        "cluster": {"primaries": args.primaries, "key_prefix": args.key_prefix, **seed},
        "targets": {k: getattr(args, k) for k in ("cpu_per_decision_ratio_max", "share_target",
                                                  "share_tolerance")},
        "variants": E, "checks": checks, "notes": notes, "overall": overall}
    write_summary(args.out, summary)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ports")
    s.add_argument("n", type=int)
    s.add_argument("--avoid", type=int, nargs="*", default=[])
    s.set_defaults(func=cmd_ports)
    s = sub.add_parser("wait")
    s.add_argument("--nodes", required=True)
    s.add_argument("--timeout", type=float, default=30)
    s.set_defaults(func=cmd_wait)
    s = sub.add_parser("seed")
    s.add_argument("--nodes", required=True)
    s.add_argument("--keys", type=int, required=True, help="API keys that belong to tenants")
    s.add_argument("--tenants", type=int, required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_seed)
    s = sub.add_parser("check")
    s.add_argument("--port", type=int, required=True, help="sluice+mix@cluster")
    s.add_argument("--nodes", required=True)
    s.add_argument("--key-prefix", required=True)
    s.add_argument("--tenant-keys", type=int, required=True)
    s.add_argument("--keys", type=int, required=True)
    s.set_defaults(func=cmd_check)
    s = sub.add_parser("report")
    for name in ("dir", "variants", "meta", "out", "key-prefix"):
        s.add_argument(f"--{name}", required=True)
    for name in ("rounds", "addresses", "keys", "tenant-keys", "tenants", "seed", "primaries"):
        s.add_argument(f"--{name}", type=int, required=True)
    for name in ("cpu-per-decision-ratio-max", "share-target", "share-tolerance"):
        s.add_argument(f"--{name}", type=float, required=True)
    s.set_defaults(func=cmd_report)
    args = p.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
