#!/usr/bin/python3
"""Helper of bench/run.sh --mode rls, Sluice as Envoy's rate limit service (standard library
only; the shared pieces come from bench.py and mix.py).

Subcommands:
  requests --out F --calls N ...   the calls' requests for bench/rls_load.c: N gRPC-framed
                                   RateLimitRequest messages of domain "mix", each with the mix's
                                   two descriptors [remote_address=<one of the addresses of
                                   bench/mix.lua>] and [api_key=<one of its keys>], drawn
                                   uniformly from the seed
  report ...                       the tables, the targets and the JSON summary
"""

import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (bench.py, beside this file)
import mix  # noqa: E402
from bench import fmt_ratio, table, verdict, write_summary  # noqa: E402

DOMAIN = b"mix"


# ---------------------------------------------------------------- the calls' requests


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, data):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def descriptor(key, value):
    # RateLimitDescriptor { repeated Entry entries = 1 } with Entry { key = 1; value = 2 }
    return field(1, field(1, key) + field(2, value))


def address(i):
    """bench/mix.lua's i-th client address (198.18.0.0/15)."""
    return f"198.{18 + i // 65536}.{i // 256 % 256}.{i % 256}".encode()


def cmd_requests(args):
    rng = random.Random(args.seed)
    with open(args.out, "wb") as f:
        for _ in range(args.calls):
            ip = address(rng.randrange(args.addresses))
            key = mix.KEY_FORMAT.format(rng.randrange(args.keys)).encode()
            # RateLimitRequest { domain = 1; repeated RateLimitDescriptor descriptors = 2 }
            message = (field(1, DOMAIN) + field(2, descriptor(b"remote_address", ip)) +
                       field(2, descriptor(b"api_key", key)))
            f.write(b"\0" + len(message).to_bytes(4, "big") + message)
    return 0


# ---------------------------------------------------------------- report


def rls_counts(run_dir, v, rounds):
    """Calls answered OK and OVER_LIMIT over the rounds (rls_load's RLSJSON lines)."""
    ok = over = 0
    for r in range(1, rounds + 1):
        try:
            with open(os.path.join(run_dir, f"wrk_{v}_{r}.txt")) as f:
                m = re.search(r"^RLSJSON (\{.*\})\s*$", f.read(), re.M)
        except OSError:
            m = None
        if m:
            d = json.loads(m.group(1))
            ok, over = ok + d["ok"], over + d["over_limit"]
    return {"ok": ok, "over_limit": over}


def descriptor_results(e):
    """{result: count} of sluice_rls_descriptors_total over the rounds."""
    out = {}
    for d in e.get("rounds") or []:
        for k, v in (d.get("sluice_metrics_delta") or {}).items():
            m = re.match(r'^sluice_rls_descriptors_total\{.*result="([^"]+)"', k)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + v
    return out


def gateway_of(v):
    """The gateway variant whose requests a rate-limit-service variant's calls mirror."""
    return v.replace("sluice+rls", "sluice+mix")


def cmd_report(args):
    meta = json.loads(args.meta)
    variants = args.variants.split()
    E = {v: mix.variant_entry(args.dir, v, args.rounds) for v in variants}
    for v, e in E.items():
        if v.startswith("sluice+rls"):
            e["calls"] = rls_counts(args.run_dir, v, args.rounds)
            e["descriptor_results"] = descriptor_results(e)
    print(f"Run of {meta.get('date')}: Sluice {meta.get('git_commit')} ({meta.get('sluice_bin')}), "
          f"{meta.get('valkey_server')}; {meta.get('cpus')} CPU(s), load average "
          f"{meta.get('load_average_start')} at the start, {meta.get('load_average_end')} at "
          f"the end")
    print(f"\n== The traffic mix ({args.addresses:,} client addresses, {args.keys:,} API keys, "
          f"seed {args.seed}): through the gateway, wrk -t{meta.get('threads')} "
          f"-c{meta.get('connections')} with bench/mix.lua; as ShouldRateLimit calls with its two "
          f"descriptors, bench/rls_load.c with {args.rls_connections} h2c connections x "
          f"{args.rls_streams} calls in flight ({args.calls:,} distinct calls, cycled); "
          f"-d{meta.get('duration')}, {args.rounds} round(s) alternating, median per metric; "
          f"requests/s of an rls variant are calls/s ==")
    print(bench.throughput_table([(v, e) for v, e in E.items()]))

    rows, checks = [], []

    def add(v, name, value, hi, target):
        ok = None if value is None else value <= hi
        checks.append({"variant": v, "kind": "target", "check": name, "value": value,
                       "target": target, "result": verdict(ok)})

    def ratio(a, b):
        return a / b if a is not None and b else None

    def per_round(e, g, key):
        return [ratio(a.get(key), b.get(key))
                for a, b in zip(e.get("rounds") or [], g.get("rounds") or [])]

    def rounds_text(values):
        shown = [f"{v:.2f}" for v in values if v is not None]
        return " ".join(shown) if shown else "-"

    plain = E.get("sluice") or {}
    for v, e in E.items():
        if not v.startswith("sluice+rls"):
            continue
        g = E.get(gateway_of(v)) or {}
        own, vk = e.get("gateway_cpu_us_per_req"), e.get("valkey_cpu_us_per_req")
        e["derived"] = {
            "valkey_cpu_ratio": ratio(vk, g.get("valkey_cpu_us_per_req")),
            "own_cpu_ratio": ratio(own, g.get("gateway_cpu_us_per_req")),
            "own_cpu_ratio_plain": ratio(own, plain.get("gateway_cpu_us_per_req")),
            "rps_ratio": ratio(e.get("rps"), g.get("rps")),
            # Round r of the call against round r of the gateway (the rounds alternate the
            # variants, so the two ran close in time): how much the machine moved the ratio.
            "own_cpu_ratio_per_round": per_round(e, g, "gateway_cpu_us_per_req"),
            "valkey_cpu_ratio_per_round": per_round(e, g, "valkey_cpu_us_per_req"),
        }
        d = e["derived"]
        rows.append([v, gateway_of(v),
                     "-" if own is None else f"{own:.1f}",
                     "-" if g.get("gateway_cpu_us_per_req") is None
                     else f"{g['gateway_cpu_us_per_req']:.1f}",
                     fmt_ratio(d["own_cpu_ratio"]), fmt_ratio(d["own_cpu_ratio_plain"]),
                     "-" if vk is None else f"{vk:.1f}",
                     "-" if g.get("valkey_cpu_us_per_req") is None
                     else f"{g['valkey_cpu_us_per_req']:.1f}",
                     fmt_ratio(d["valkey_cpu_ratio"]), fmt_ratio(d["rps_ratio"]),
                     "-" if e.get("valkey_fcall_per_req") is None
                     else f"{e['valkey_fcall_per_req']:.3f}",
                     f"OK {e['calls']['ok']}, OVER_LIMIT {e['calls']['over_limit']}",
                     ", ".join(f"{k} {int(n)}" for k, n in sorted(e["descriptor_results"].items()))
                     or "-"])
        add(v, f"Valkey CPU per call / per request of {gateway_of(v)}", d["valkey_cpu_ratio"],
            args.valkey_cpu_ratio_max, f"<= {args.valkey_cpu_ratio_max}")
        add(v, f"Sluice CPU per call / per proxied request of {gateway_of(v)}",
            d["own_cpu_ratio"], args.own_cpu_ratio_max, f"<= {args.own_cpu_ratio_max}")
        failed = e["errors"]["status"] + e["socket_errors"] if "errors" in e else None
        checks.append({"variant": v, "kind": "health", "check": "calls that failed",
                       "value": failed, "target": "0",
                       "result": verdict(None if failed is None else failed == 0)})
        over = e["calls"]["over_limit"]
        checks.append({"variant": v, "kind": "health", "check": "calls OVER_LIMIT (the mix's "
                       "limits allow every call)", "value": over, "target": "0",
                       "result": verdict(over == 0)})
    print("\n== The rate limit service against the gateway on the same mix: CPU per call and "
          "per request (Sluice; Valkey), calls/s over the gateway's requests/s, Valkey FCALLs "
          "per call, the calls' answers and Sluice's count of their descriptors ==")
    print(table(rows, ["variant", "gateway", "Sluice us/call", "us/req", "ratio",
                       "/ plain sluice", "Valkey us/call", "us/req", "ratio", "calls/s ratio",
                       "FCALL/call", "answers", "descriptors"]))
    print("\nThe same ratios round by round (a call's round against the gateway's round of the "
          "same number):")
    print(table([[v, rounds_text(e["derived"]["own_cpu_ratio_per_round"]),
                  rounds_text(e["derived"]["valkey_cpu_ratio_per_round"])]
                 for v, e in E.items() if v.startswith("sluice+rls")],
                ["variant", "Sluice CPU ratio per round", "Valkey CPU ratio per round"]))
    print("\n== Targets ==")
    print(table([[c["variant"], c["check"],
                  "-" if c["value"] is None else (f"{c['value']:.3f}"
                                                  if isinstance(c["value"], float)
                                                  else str(c["value"])),
                  c["target"], c["result"]] for c in checks],
                ["variant", "check", "value", "target", "result"]))
    failed = [c for c in checks if c["result"] == "FAIL"]
    overall = "FAIL" if failed else ("INCOMPLETE" if any(c["result"] == "n/a" for c in checks)
                                     else "PASS")
    print(f"Overall: {overall}" + (" (missed: " + "; ".join(f"{c['variant']} {c['check']}"
                                                          for c in failed) + ")" if failed else ""))
    write_summary(args.out, {"meta": meta, "variants": E, "checks": checks, "overall": overall,
                             "mix": {"addresses": args.addresses, "keys": args.keys,
                                     "seed": args.seed, "calls": args.calls},
                             "load": {"connections": args.rls_connections,
                                      "streams": args.rls_streams},
                             "targets": {"valkey_cpu_ratio_max": args.valkey_cpu_ratio_max,
                                         "own_cpu_ratio_max": args.own_cpu_ratio_max}})
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requests")
    r.add_argument("--out", required=True)
    r.add_argument("--calls", type=int, default=200000)
    r.add_argument("--addresses", type=int, default=100000)
    r.add_argument("--keys", type=int, default=5000)
    r.add_argument("--seed", type=int, default=1)
    r.set_defaults(fn=cmd_requests)
    s = sub.add_parser("report")
    for name in ("--dir", "--run-dir", "--variants", "--meta", "--out"):
        s.add_argument(name, required=True)
    for name, default in (("--rounds", 3), ("--addresses", 100000), ("--keys", 5000),
                          ("--seed", 1), ("--calls", 200000), ("--rls-connections", 5),
                          ("--rls-streams", 10)):
        s.add_argument(name, type=int, default=default)
    s.add_argument("--valkey-cpu-ratio-max", type=float, default=1.1)
    s.add_argument("--own-cpu-ratio-max", type=float, default=0.6)
    s.set_defaults(fn=cmd_report)
    args = p.parse_args()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
