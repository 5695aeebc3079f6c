#!/usr/bin/python3
"""Helper of bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N                  print N free TCP ports on 127.0.0.1, one a line
  wait-http --port P --pid PID  wait until GET / on 127.0.0.1:P answers 200 "ok"
  wrk-parse --in TXT --out JSON extract the WRKJSON line printed by wrk_report.lua
  mem --pid PID                 print the memory (Pss, Rss, KiB) of a process and its children
  idle ...                      memory cost of N idle keep-alive client connections
  report ...                    print the tables and write the JSON summary

run.sh drives everything; these are not meant to be stable interfaces.
"""

import argparse
import errno
import json
import os
import re
import resource
import selectors
import socket
import statistics
import sys
import time
import urllib.request

HOST = "127.0.0.1"


# ---------------------------------------------------------------- small tools


def cmd_free_ports(args):
    socks = []
    try:
        for _ in range(args.n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        for s in socks:
            print(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def http_get(port, path="/", timeout=2.0):
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
        return r.status, r.read()


def cmd_wait_http(args):
    deadline = time.monotonic() + args.timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        if args.pid and not pid_alive(args.pid):
            print(f"process {args.pid} exited while waiting for port {args.port}", file=sys.stderr)
            return 1
        try:
            status, body = http_get(args.port, args.path)
            if status == 200 and body == args.body.encode():
                return 0
            last = f"status {status}, body {body[:60]!r}"
        except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
            last = repr(e)
        time.sleep(0.1)
    print(f"port {args.port} not ready after {args.timeout}s: {last}", file=sys.stderr)
    return 1


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
        if before.get("upstream_accepts") is not None and after.get("upstream_accepts") is not None:
            # Each status query is one connection and one request of its own.
            data["upstream_connections_opened"] = after["upstream_accepts"] - before["upstream_accepts"] - 1
            data["upstream_requests"] = after["upstream_requests"] - before["upstream_requests"] - 1
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    if args.label:
        lat = data["latency_us"]
        errs = ", ".join(f"{k} {v}" for k, v in data["errors"].items() if v) or "none"
        cpu = (f"   CPU {data['gateway_cpu_us_per_req']:5.1f} us/req"
               if "gateway_cpu_us_per_req" in data else "")
        up = (f"   upstream conns +{data['upstream_connections_opened']}"
              if "upstream_connections_opened" in data else "")
        print(f"{args.label:<24} {data['rps']:>9,.0f} req/s   p50 {fmt_us(lat['p50']):>8}   "
              f"p99 {fmt_us(lat['p99']):>8}{cpu}{up}   errors: {errs}")
    return 0


def cpu_seconds(root):
    """utime + stime of a process and its descendants, in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / ticks


def stub_status(port):
    """accepts and requests of an nginx stub_status page (None if unavailable)."""
    if not port:
        return None, None
    try:
        _, body = http_get(port, "/")
        nums = body.decode().splitlines()[2].split()
        return int(nums[0]), int(nums[2])
    except Exception:  # noqa: BLE001
        return None, None


def cmd_probe(args):
    accepts, requests = stub_status(args.status_port)
    data = {"time": time.monotonic(), "gateway_cpu_s": cpu_seconds(args.pid),
            "upstream_cpu_s": cpu_seconds(args.upstream_pid),
            "upstream_accepts": accepts, "upstream_requests": requests}
    with open(args.out, "w") as f:
        json.dump(data, f)
    return 0


# ---------------------------------------------------------------- memory


def tree_pids(root):
    """root and all its descendants (nginx: master + workers)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def process_memory(pid):
    """KiB: Pss, Rss and Anonymous from smaps_rollup (falls back to VmRSS).

    Pss also moves when other processes that map the same libraries start or exit;
    Anonymous (heap, stacks) does not, so it is the one used to look for leaks."""
    mem = {"pss_kib": None, "rss_kib": None, "anon_kib": None}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Rss"):
                    mem[key.lower() + "_kib"] = int(rest.split()[0])
                elif key == "Anonymous":
                    mem["anon_kib"] = int(rest.split()[0])
    except OSError:
        pass
    if mem["rss_kib"] is None:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    mem["rss_kib"] = int(line.split()[1])
    if mem["pss_kib"] is None:
        mem["pss_kib"] = mem["rss_kib"]
    return mem


def tree_memory(root):
    pids = tree_pids(root)
    total = {"pss_kib": 0, "rss_kib": 0, "anon_kib": 0, "pids": pids}
    for pid in pids:
        m = process_memory(pid)
        for k in ("pss_kib", "rss_kib", "anon_kib"):
            total[k] += m[k] or 0
    return total


def cmd_mem(args):
    print(json.dumps(tree_memory(args.pid)))


# ---------------------------------------------------------------- idle connections


def raise_nofile(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(needed, soft)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft


class Conn:
    __slots__ = ("sock", "state", "out", "buf", "need", "status", "error")

    def __init__(self, sock, request):
        self.sock = sock
        self.state = "connect"
        self.out = request
        self.buf = b""
        self.need = None  # total bytes of head + body once the head is parsed
        self.status = None
        self.error = None


def parse_head(c):
    """Returns True when the whole response (head + Content-Length body) is in c.buf."""
    if c.need is None:
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = c.buf[:end].decode("latin-1").split("\r\n")
        parts = head[0].split(" ", 2)
        c.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
        length, close = None, False
        for line in head[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and "close" in value:
                close = True
            elif name == "transfer-encoding":
                c.error = "chunked response (unexpected for this upstream)"
        if length is None:
            c.error = c.error or "response without Content-Length"
            length = 0
        if close:
            c.error = c.error or "response has Connection: close"
        c.need = end + 4 + length
    return len(c.buf) >= c.need


def open_idle_connections(port, count, batch, timeout):
    request = (f"GET / HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
               f"User-Agent: sluice-bench-idle\r\nAccept: */*\r\n\r\n").encode()
    sel = selectors.DefaultSelector()
    done, failed = [], []
    t0 = time.monotonic()
    for start in range(0, count, batch):
        pending = {}
        for _ in range(min(batch, count - start)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            c = Conn(s, request)
            rc = s.connect_ex((HOST, port))
            if rc not in (0, errno.EINPROGRESS):
                c.error = f"connect: {os.strerror(rc)}"
                failed.append(c)
                s.close()
                continue
            pending[s.fileno()] = c
            sel.register(s, selectors.EVENT_WRITE, c)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for key, mask in sel.select(0.5):
                c = key.data
                finished = False
                try:
                    if c.state == "connect":
                        err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if err:
                            raise OSError(err, f"connect: {os.strerror(err)}")
                        c.state = "send"
                    if c.state == "send":
                        n = c.sock.send(c.out)
                        c.out = c.out[n:]
                        if not c.out:
                            c.state = "recv"
                            sel.modify(c.sock, selectors.EVENT_READ, c)
                        continue
                    data = c.sock.recv(65536)
                    if not data:
                        raise OSError(0, "closed by the gateway before the response ended")
                    c.buf += data
                    finished = parse_head(c)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    c.error = e.strerror or str(e)
                    finished = True
                if finished:
                    sel.unregister(c.sock)
                    del pending[c.sock.fileno()]
                    if c.error is None and c.status != 200:
                        c.error = f"status {c.status}"
                    if c.error is None:
                        c.state = "idle"
                        c.buf = b""
                        done.append(c)
                    else:
                        failed.append(c)
                        c.sock.close()
        for c in pending.values():
            c.error = "timed out waiting for the response"
            sel.unregister(c.sock)
            c.sock.close()
            failed.append(c)
    sel.close()
    return done, failed, time.monotonic() - t0


def count_still_open(conns):
    """An idle keep-alive socket must not be readable: readable means EOF, RST or junk."""
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    closed = 0
    for key, _ in sel.select(0):
        c = key.data
        try:
            data = c.sock.recv(1, socket.MSG_PEEK)
            closed += 1
            c.error = "unexpected data on an idle connection" if data else "closed by the gateway"
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            closed += 1
            c.error = e.strerror or str(e)
    sel.close()
    return len(conns) - closed


def admin_open_connections(admin_port):
    if not admin_port:
        return None
    try:
        _, body = http_get(admin_port, "/metrics")
        m = re.search(rb"^sluice_connections_open(?:\{[^}]*\})?\s+([0-9.e+]+)\s*$", body, re.M)
        return float(m.group(1)) if m else None
    except Exception:  # noqa: BLE001
        return None


def threads(root, pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("Threads:"))
        except (OSError, StopIteration, ValueError):
            pass
    return total


def mem_of(m):
    return {k: m[k] for k in ("pss_kib", "rss_kib", "anon_kib")} if m else None


def idle_cycle(args, count):
    """Open `count` idle connections, measure, close them, measure again."""
    before = tree_memory(args.pid)
    done, failed, elapsed = open_idle_connections(args.port, count, args.batch, args.timeout)
    time.sleep(args.hold)
    after = tree_memory(args.pid) if pid_alive(args.pid) else None
    still_open = count_still_open(done)
    metric_open = admin_open_connections(args.admin_port)
    errors = {}
    for c in failed + [c for c in done if c.error]:
        errors[c.error] = errors.get(c.error, 0) + 1
    for c in done:
        c.sock.close()
    time.sleep(args.settle)
    alive = pid_alive(args.pid)
    cycle = {
        "established": len(done),
        "failed": len(failed),
        "still_open_at_measure": still_open,
        "open_time_s": round(elapsed, 3),
        "gateway_open_connections_metric": metric_open,
        "gateway_open_connections_metric_after_close": admin_open_connections(args.admin_port),
        "errors": errors,
        "pids": before["pids"],
        "before": mem_of(before),
        "after": mem_of(after),
        "after_close": mem_of(tree_memory(args.pid)) if alive else None,
        "gateway_alive_after": alive,
    }
    if after and done:
        cycle["pss_kib_per_conn"] = (after["pss_kib"] - before["pss_kib"]) / len(done)
        cycle["rss_kib_per_conn"] = (after["rss_kib"] - before["rss_kib"]) / len(done)
        cycle["anon_kib_per_conn"] = (after["anon_kib"] - before["anon_kib"]) / len(done)
    return cycle


def cmd_idle(args):
    limit = raise_nofile(args.count + 256)
    count = args.count
    if limit < count + 64:
        print(f"warning: RLIMIT_NOFILE is {limit}; opening {limit - 64} connections "
              f"instead of {count}", file=sys.stderr)
        count = max(limit - 64, 1)
    result = {"name": args.name, "requested": args.count, "target_connections": count,
              "hold_s": args.hold, "cycles": []}
    if not pid_alive(args.pid):
        result["error"] = "gateway not running before the test"
    else:
        time.sleep(args.settle)
        if args.admin_port:
            # The test reads /metrics; read it once first, so that whatever the first scrape
            # allocates is in every figure (Prometheus scrapes all the time in production),
            # and record what that first scrape cost.
            m0 = tree_memory(args.pid)
            t0 = threads(args.pid, m0["pids"])
            admin_open_connections(args.admin_port)
            time.sleep(args.settle)
            m1 = tree_memory(args.pid)
            result["first_metrics_scrape"] = {"before": mem_of(m0), "after": mem_of(m1),
                                              "anon_kib": m1["anon_kib"] - m0["anon_kib"],
                                              "threads_before": t0,
                                              "threads_after": threads(args.pid, m1["pids"])}
        for _ in range(args.cycles):
            result["cycles"].append(idle_cycle(args, count))
            if not result["cycles"][-1]["gateway_alive_after"]:
                break
        # The first cycle gives the figures; later ones show whether memory keeps growing
        # when the same number of connections comes and goes (a leak) or is reused.
        result.update({k: v for k, v in result["cycles"][0].items()})
        cycles = result["cycles"]
        if len(cycles) > 1 and cycles[0]["after_close"] and cycles[-1]["after_close"]:
            result["retained_growth_kib"] = (cycles[-1]["after_close"]["anon_kib"]
                                             - cycles[0]["after_close"]["anon_kib"])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if "error" not in result else 1


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


def cmd_report(args):
    meta = json.loads(args.meta)
    variants = args.variants.split()
    ref = args.reference
    targets = {"rps_ratio_min": args.rps_ratio_min, "p99_ratio_max": args.p99_ratio_max,
               "idle_kib_per_conn_max": args.idle_kib_max}
    summary = {"meta": meta, "targets": targets, "variants": {}, "checks": []}

    # Throughput: median of each metric over the rounds.
    for v in variants:
        runs = []
        for r in range(1, args.rounds + 1):
            d = load(os.path.join(args.dir, f"wrk_{v}_{r}.json"))
            if d:
                runs.append(d)
        entry = {"rounds": runs}
        if runs:
            entry["rps"] = statistics.median(d["rps"] for d in runs)
            entry["p50_us"] = statistics.median(d["latency_us"]["p50"] for d in runs)
            entry["p99_us"] = statistics.median(d["latency_us"]["p99"] for d in runs)
            entry["p999_us"] = statistics.median(d["latency_us"]["p999"] for d in runs)
            cpu = [d["gateway_cpu_us_per_req"] for d in runs if "gateway_cpu_us_per_req" in d]
            entry["gateway_cpu_us_per_req"] = statistics.median(cpu) if cpu else None
            ucpu = [d["upstream_cpu_us_per_req"] for d in runs if "upstream_cpu_us_per_req" in d]
            entry["upstream_cpu_us_per_req"] = statistics.median(ucpu) if ucpu else None
            opened = [d["upstream_connections_opened"] for d in runs
                      if d.get("upstream_connections_opened") is not None]
            entry["upstream_connections_opened"] = sum(opened) if opened else None
            upreq = [(d["upstream_requests"], d["requests"]) for d in runs
                     if d.get("upstream_requests") is not None]
            entry["upstream_requests"] = sum(u for u, _ in upreq) if upreq else None
            entry["requests"] = sum(d["requests"] for d in runs)
            entry["non2xx"] = sum(d["non2xx"] for d in runs)
            entry["socket_errors"] = sum(d["socket_errors"] for d in runs)
            entry["errors"] = {k: sum(d["errors"][k] for d in runs)
                               for k in ("connect", "read", "write", "status", "timeout")}
        entry["idle"] = load(os.path.join(args.dir, f"idle_{v}.json"))
        extra = load(os.path.join(args.dir, f"extra_{v}.json"))
        if extra:
            entry.update(extra)
        summary["variants"][v] = entry

    mode = meta.get("mode", "all")
    if mode in ("all", "throughput"):
        print()
        print(f"== Throughput: wrk -t{meta['threads']} -c{meta['connections']} -d{meta['duration']}, "
              f"{args.rounds} round(s) alternating, median per metric ==")
        rows = []
        for v in variants:
            e = summary["variants"][v]
            if "rps" not in e:
                rows.append([v, "no data"] + ["-"] * 7)
                continue
            per_round = " ".join(f"{d['rps'] / 1000:.1f}k" for d in e["rounds"])
            cpu = e.get("gateway_cpu_us_per_req")
            opened = e.get("upstream_connections_opened")
            rows.append([v, f"{e['rps']:,.0f}", fmt_us(e["p50_us"]), fmt_us(e["p99_us"]),
                         fmt_us(e["p999_us"]), "-" if cpu is None else f"{cpu:.1f}",
                         "-" if opened is None else str(opened),
                         f"{e['non2xx']}/{e['socket_errors']}", per_round])
        print(table(rows, ["gateway", "requests/s", "p50", "p99", "p99.9", "CPU us/req",
                           "upstream conns", "non-2xx/sock-err", "req/s per round"]))

        refe = summary["variants"].get(ref, {})
        print()
        print(f"== Ratios against {ref} (targets: requests/s >= {args.rps_ratio_min}x, "
              f"p99 <= {args.p99_ratio_max}x, no errors) ==")
        rows = []
        for v in variants:
            if v == ref:
                continue
            e = summary["variants"][v]
            rps_ratio = p99_ratio = None
            if "rps" in e and "rps" in refe and refe["rps"]:
                rps_ratio = e["rps"] / refe["rps"]
            if "p99_us" in e and "p99_us" in refe and refe["p99_us"]:
                p99_ratio = e["p99_us"] / refe["p99_us"]
            e["rps_ratio"], e["p99_ratio"] = rps_ratio, p99_ratio
            ok_rps = None if rps_ratio is None else rps_ratio >= args.rps_ratio_min
            ok_p99 = None if p99_ratio is None else p99_ratio <= args.p99_ratio_max
            ok_err = None if "rps" not in e else (e["non2xx"] == 0 and e["socket_errors"] == 0)
            for name, ok, value in (("rps_ratio", ok_rps, rps_ratio), ("p99_ratio", ok_p99, p99_ratio),
                                    ("no_errors", ok_err, None)):
                summary["checks"].append({"variant": v, "check": name, "value": value,
                                          "result": verdict(ok)})
            rows.append([f"{v}/{ref}", fmt_ratio(rps_ratio), verdict(ok_rps),
                         fmt_ratio(p99_ratio), verdict(ok_p99), verdict(ok_err)])
        print(table(rows, ["ratio", "requests/s", "", "p99", "", "errors"]))

    if mode in ("all", "idle"):
        print()
        print(f"== Memory of idle keep-alive client connections "
              f"(target for Sluice: <= {args.idle_kib_max:g} KiB per connection, Pss) ==")
        rows = []
        for v in variants:
            i = summary["variants"][v]["idle"]
            if not i or "before" not in i:
                rows.append([v, "not measured"] + ["-"] * 6 + [(i or {}).get("error", "-")])
                continue
            per_pss = i.get("pss_kib_per_conn")
            per_rss = i.get("rss_kib_per_conn")
            per_anon = i.get("anon_kib_per_conn")
            ok = None
            if v != ref:
                ok = (per_pss is not None and per_pss <= args.idle_kib_max
                      and i.get("still_open_at_measure") == i.get("target_connections"))
                summary["checks"].append({"variant": v, "check": "idle_kib_per_conn",
                                          "value": per_pss, "result": verdict(ok)})
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
                "(reference)" if v == ref else verdict(ok),
            ])
        print(table(rows, ["gateway", "open/target", "Pss before MiB", "with conns MiB",
                           "after close MiB", "KiB/conn (Pss)", "KiB/conn (Rss)",
                           "KiB/conn (Anon)", "target"]))
        for v in variants:
            i = summary["variants"][v]["idle"]
            if not i:
                continue
            cycles = i.get("cycles") or []
            if len(cycles) > 1 and i.get("retained_growth_kib") is not None:
                later = ", ".join(f"{c['pss_kib_per_conn']:.2f}" for c in cycles[1:]
                                  if c.get("pss_kib_per_conn") is not None)
                print(f"  {v}: {len(cycles)} open/close cycles; KiB/conn in later cycles: {later}; "
                      f"anonymous memory after close grew {i['retained_growth_kib']} KiB from cycle 1 to "
                      f"cycle {len(cycles)}")
            for n, c in enumerate(cycles, 1):
                if c.get("errors") or c.get("failed"):
                    print(f"  {v}: cycle {n}: idle-connection errors: {c.get('errors')}")
                m = c.get("gateway_open_connections_metric_after_close")
                if m is not None and m > 0:
                    print(f"  {v}: cycle {n}: the gateway still reports {m:.0f} open connections "
                          f"after all were closed")

    # Anything odd goes into notes, printed last.
    notes = []
    for v in variants:
        e = summary["variants"][v]
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
        if e.get("crashed"):
            notes.append(f"{v}: process died during the benchmark ({e.get('crash_phase')})")
        if e.get("exit_status") not in (None, 0):
            notes.append(f"{v}: exit status after SIGTERM was {e['exit_status']}")
        if e.get("stop_seconds") is not None and e["stop_seconds"] > 5:
            notes.append(f"{v}: took {e['stop_seconds']:.1f}s to exit after SIGTERM")
        i = e.get("idle") or {}
        if (i.get("retained_growth_kib") or 0) > max(1024, 0.25 * i.get("target_connections", 0)):
            notes.append(f"{v}: memory after closing the idle connections grew by "
                         f"{i['retained_growth_kib']} KiB between the first and last cycle "
                         f"(possible leak)")
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
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"JSON summary: {args.out}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("free-ports")
    s.add_argument("n", type=int)
    s.set_defaults(func=cmd_free_ports)

    s = sub.add_parser("wait-http")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pid", type=int, default=0)
    s.add_argument("--path", default="/")
    s.add_argument("--body", default="ok")
    s.add_argument("--timeout", type=float, default=15)
    s.set_defaults(func=cmd_wait_http)

    s = sub.add_parser("wrk-parse")
    s.add_argument("--in", dest="input", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--label", default="")
    s.add_argument("--before", default="", help="probe JSON taken before the run")
    s.add_argument("--after", default="", help="probe JSON taken after the run")
    s.set_defaults(func=cmd_wrk_parse)

    s = sub.add_parser("probe")
    s.add_argument("--pid", type=int, required=True, help="gateway")
    s.add_argument("--upstream-pid", type=int, required=True)
    s.add_argument("--status-port", type=int, default=0, help="upstream nginx stub_status")
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
    s.add_argument("--batch", type=int, default=200)
    s.add_argument("--timeout", type=float, default=10, help="per batch, seconds")
    s.add_argument("--hold", type=float, default=2, help="seconds idle before measuring")
    s.add_argument("--settle", type=float, default=1)
    s.add_argument("--cycles", type=int, default=2,
                   help="open/close cycles; memory growth after the first hints at a leak")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_idle)

    s = sub.add_parser("report")
    s.add_argument("--dir", required=True)
    s.add_argument("--variants", required=True)
    s.add_argument("--reference", default="nginx")
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--meta", default="{}")
    s.add_argument("--rps-ratio-min", type=float, default=0.9)
    s.add_argument("--p99-ratio-max", type=float, default=1.2)
    s.add_argument("--idle-kib-max", type=float, default=16)
    s.add_argument("--connections-hint", type=int, default=64,
                   help="upstream connections above twice this are reported")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_report)

    args = p.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
