#!/usr/bin/python3
"""Helper of bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N [--avoid P...]   print N free TCP ports on 127.0.0.1, one a line (not P...)
  wait-http --port P --pid PID  wait until GET / on 127.0.0.1:P answers 200 "ok" (--tls: HTTPS)
  wait-valkey --port P          wait until a redis-server / valkey-server answers PING
  wrk-parse --in TXT --out JSON extract the WRKJSON line printed by wrk_report.lua
  probe ...                     CPU time, upstream counters, Valkey commandstats, Sluice metrics
  mem --pid PID                 print the memory (Pss, Rss, KiB) of a process and its children
  idle ...                      memory cost of N idle keep-alive client connections (--tls;
                                --h2: h2c connections that each made one request)
  wait-h2 --port P --pid PID    wait until GET / over h2c (prior knowledge) answers 200 "ok"
  h2load-json --in TXT --log L  append a WRKJSON line (like wrk_report.lua's) to h2load's output
  h2-report ...                 --mode h2: print the tables and write the JSON summary
  report ...                    print the tables and write the JSON summary
  soak ...                      fixed-rate load for minutes, Valkey restarted every minute,
                                a line every 10 s (driven by bench/soak.sh)

run.sh drives everything; these are not meant to be stable interfaces. The code is in
bench_probe.py (small tools, probes, memory), bench_idle.py, bench_soak.py and
bench_report.py (wrk-parse, report), bench_h2.py (--mode h2); mix.py and cluster.py import the shared pieces from here.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The subcommands, and what mix.py and cluster.py use (import bench).
from bench_h2 import (cmd_grpc_call, cmd_h2_report, cmd_h2load_json, cmd_h2up_pool,  # noqa: E402
                      cmd_h2up_report, cmd_wait_h2)
from bench_idle import cmd_idle  # noqa: E402
from bench_probe import (HOST, cmd_free_ports, cmd_mem, cmd_probe, cmd_valkey_monitor,  # noqa: E402,F401
                         cmd_wait_http, cmd_wait_valkey, glob_escape)
from bench_report import (cmd_report, cmd_wrk_parse, fmt_ratio, load, summarize_runs,  # noqa: E402,F401
                          table, throughput_table, verdict, write_summary)
from bench_soak import cmd_soak  # noqa: E402


def add_tool_commands(sub):
    """free-ports, wait-http, wait-valkey, valkey-monitor, wrk-parse."""
    s = sub.add_parser("free-ports")
    s.add_argument("n", type=int)
    s.add_argument("--avoid", type=int, nargs="*", default=[], help="ports not to hand out")
    s.set_defaults(func=cmd_free_ports)

    s = sub.add_parser("wait-http")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, default=0)
    s.add_argument("--path", default="/")
    s.add_argument("--body", default="ok")
    s.add_argument("--tls", action="store_true", help="HTTPS (certificate not verified)")
    s.add_argument("--any-body", action="store_true", help="any 200 will do")
    s.add_argument("--timeout", type=float, default=15)
    s.set_defaults(func=cmd_wait_http)

    s = sub.add_parser("wait-h2")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, default=0)
    s.add_argument("--path", default="/")
    s.add_argument("--body", default="ok")
    s.add_argument("--timeout", type=float, default=15)
    s.set_defaults(func=cmd_wait_h2)

    s = sub.add_parser("grpc-call")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--path", default="/bench.Echo/Call")
    s.add_argument("--headers", nargs="*", default=[], help="\"name: value\" ...")
    s.add_argument("--timeout", type=float, default=5)
    s.set_defaults(func=cmd_grpc_call)

    s = sub.add_parser("h2load-json")
    s.add_argument("--in", dest="input", required=True, help="h2load's output; the line is appended")
    s.add_argument("--log", required=True, help="h2load --log-file")
    s.set_defaults(func=cmd_h2load_json)

    s = sub.add_parser("wait-valkey")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, default=0)
    s.add_argument("--timeout", type=float, default=15)
    s.set_defaults(func=cmd_wait_valkey)

    s = sub.add_parser("valkey-monitor")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--output", required=True, help="the command's output (text)")
    s.add_argument("--out", required=True, help="JSON counts")
    s.add_argument("--settle", type=float, default=0.5)
    s.add_argument("--timeout", type=float, default=120)
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_valkey_monitor)

    s = sub.add_parser("wrk-parse")
    s.add_argument("--in", dest="input", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--label", default="")
    s.add_argument("--before", default="", help="probe JSON taken before the run")
    s.add_argument("--after", default="", help="probe JSON taken after the run")
    s.add_argument("--handshake", action="store_true", help="one connection per request")
    s.set_defaults(func=cmd_wrk_parse)


def add_measure_commands(sub):
    """probe, mem, idle, report, soak."""
    s = sub.add_parser("probe")
    s.add_argument("--pid", type=int, required=True, help="gateway")
    s.add_argument("--upstream-pid", type=int, required=True)
    s.add_argument("--status-port", type=int, default=0, help="upstream nginx stub_status")
    s.add_argument("--valkey-port", type=int, default=0, help="INFO commandstats")
    s.add_argument("--valkey-pid", type=int, default=0, help="CPU time of the Valkey server")
    s.add_argument("--admin-port", type=int, default=0, help="Sluice /metrics")
    s.add_argument("--count-lines", default="", help="a log of resumed TLS sessions")
    s.add_argument("--valkey-nodes", default="",
                   help="port:pid,...: per Valkey node CPU time, commandstats, DBSIZE (without "
                        "--valkey-port/--valkey-pid: their sums are the Valkey figures)")
    s.add_argument("--count-keys", default="", help="with --valkey-nodes: count PREFIX:* (SCAN)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_probe)

    s = sub.add_parser("mem")
    s.add_argument("--pid", type=int, required=True)
    s.set_defaults(func=cmd_mem)

    s = sub.add_parser("idle")
    s.add_argument("--name", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--admin-port", type=int, default=0)
    s.add_argument("--count", type=int, default=5000)
    s.add_argument("--tls", action="store_true", help="TLS connections (full handshakes)")
    s.add_argument("--h2", action="store_true", help="h2c (prior knowledge), one GET / each")
    s.add_argument("--batch", type=int, default=200)
    s.add_argument("--timeout", type=float, default=10, help="per batch, seconds")
    s.add_argument("--hold", type=float, default=2, help="seconds idle before measuring")
    s.add_argument("--settle", type=float, default=1)
    s.add_argument("--cycles", type=int, default=3,
                   help="open/close cycles; memory growth after the first hints at a leak")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_idle)

    s = sub.add_parser("report")
    s.add_argument("--dir", required=True)
    s.add_argument("--variants", required=True)
    s.add_argument("--reference", default="nginx")
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--handshake-rounds", type=int, default=0)
    s.add_argument("--capacity-rounds", type=int, default=0)
    s.add_argument("--meta", default="{}")
    s.add_argument("--rps-ratio-min", type=float, default=0.9)
    s.add_argument("--p99-ratio-max", type=float, default=1.2)
    s.add_argument("--idle-kib-max", type=float, default=16)
    s.add_argument("--limit-rps-ratio-min", type=float, default=0.85)
    s.add_argument("--handshake-ratio-min", type=float, default=0.9)
    s.add_argument("--connections-hint", type=int, default=64,
                   help="upstream connections above twice this are reported")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("h2-report")
    s.add_argument("--dir", required=True)
    s.add_argument("--variants", required=True)
    s.add_argument("--reference", default="nginx-h2")
    s.add_argument("--shapes", required=True, help="e.g. \"c10m10 c50m1\"")
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--meta", default="{}")
    s.add_argument("--rps-ratio-min", type=float, default=1.0)
    s.add_argument("--p99-ratio-max", type=float, default=1.2)
    s.add_argument("--idle-kib-max", type=float, default=32)
    s.add_argument("--mode", default="h2", help="h2 | grpc: the report's title")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_h2_report)

    s = sub.add_parser("h2up-report")
    s.add_argument("--dir", required=True)
    s.add_argument("--variants", required=True)
    s.add_argument("--reference", default="sluice")
    s.add_argument("--shapes", default="", help="h2load shapes, e.g. \"c10m10\"")
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--pool-protocols", default="http1 h2c")
    s.add_argument("--meta", default="{}")
    s.add_argument("--rps-ratio-min", type=float, default=0.9)
    s.add_argument("--cpu-ratio-max", type=float, default=1.15)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_h2up_report)

    s = sub.add_parser("h2up-pool")
    s.add_argument("--protocol", required=True)
    s.add_argument("--endpoints", type=int, required=True)
    s.add_argument("--mem-before", required=True)
    s.add_argument("--mem-after", required=True)
    s.add_argument("--probe-before", required=True)
    s.add_argument("--probe-after", required=True)
    s.add_argument("--wrk", default="", help="wrk-parse's JSON of the load that filled the pool")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_h2up_pool)

    s = sub.add_parser("soak")
    s.add_argument("--port", type=int, required=True, help="Sluice")
    s.add_argument("--admin-port", type=int, required=True)
    s.add_argument("--sluice-pid", type=int, required=True)
    s.add_argument("--workers", type=int, default=1, help="Sluice workers (expected reconnects)")
    s.add_argument("--valkey-pid", type=int, required=True, help="the Valkey server running now")
    s.add_argument("--valkey-argv", required=True, help="JSON: command line to start it again")
    s.add_argument("--valkey-pidfile", default="", help="the PID of the Valkey started last")
    s.add_argument("--duration", type=float, default=600)
    s.add_argument("--rate", type=float, default=2000)
    s.add_argument("--connections", type=int, default=20)
    s.add_argument("--clients", type=int, default=10000, help="distinct X-Client values")
    s.add_argument("--path", default="/api/soak")
    s.add_argument("--interval", type=float, default=10)
    s.add_argument("--restart-every", type=float, default=60)
    s.add_argument("--valkey-downtime", type=float, default=1)
    s.add_argument("--warmup", type=float, default=60, help="RSS trend measured after this")
    s.add_argument("--request-timeout", type=float, default=10)
    s.add_argument("--strict", action="store_true")
    s.add_argument("--out", required=True)
    s.add_argument("--table", default="", help="also write the printed lines here")
    s.set_defaults(func=cmd_soak)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    add_tool_commands(sub)
    add_measure_commands(sub)
    args = p.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()