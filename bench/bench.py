#!/usr/bin/python3
"""Helper of bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N                  print N free TCP ports on 127.0.0.1, one a line
  wait-http --port P --pid PID  wait until GET / on 127.0.0.1:P answers 200 "ok" (--tls: HTTPS)
  wait-valkey --port P          wait until a redis-server / valkey-server answers PING
  wrk-parse --in TXT --out JSON extract the WRKJSON line printed by wrk_report.lua
  probe ...                     CPU time, upstream counters, Valkey commandstats, Sluice metrics
  mem --pid PID                 print the memory (Pss, Rss, KiB) of a process and its children
  idle ...                      memory cost of N idle keep-alive client connections (--tls)
  report ...                    print the tables and write the JSON summary
  soak ...                      fixed-rate load for minutes, Valkey restarted every minute,
                                a line every 10 s (driven by bench/soak.sh)

run.sh drives everything; these are not meant to be stable interfaces.
"""

import argparse
import errno
import json
import os
import re
import resource
import selectors
import signal
import socket
import ssl
import statistics
import subprocess
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


def client_tls_context():
    """TLS client context for the benchmark's self-signed certificate (not verified)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_get(port, path="/", timeout=2.0, tls=False):
    scheme = "https" if tls else "http"
    kwargs = {"context": client_tls_context()} if tls else {}
    with urllib.request.urlopen(f"{scheme}://{HOST}:{port}{path}", timeout=timeout, **kwargs) as r:
        return r.status, r.read()


def wait_ready(args, what, probe):
    """Polls probe() (None when ready, else what it saw) every 0.1 s until args.timeout; fails
    at once when the process args.pid exits. Exit status 0 or 1."""
    deadline = time.monotonic() + args.timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        if args.pid and not pid_alive(args.pid):
            print(f"process {args.pid} exited while waiting for port {args.port}", file=sys.stderr)
            return 1
        try:
            last = probe()
            if last is None:
                return 0
        except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
            last = repr(e)
        time.sleep(0.1)
    print(f"{what} on port {args.port} not ready after {args.timeout}s: {last}", file=sys.stderr)
    return 1


def cmd_wait_http(args):
    def probe():
        status, body = http_get(args.port, args.path, tls=args.tls)
        if status == 200 and (args.any_body or body == args.body.encode()):
            return None
        return f"status {status}, body {body[:60]!r}"

    return wait_ready(args, "HTTP", probe)


def valkey_command(port, *argv, timeout=2.0):
    """Sends one command (RESP array) and returns the reply: str for simple/bulk strings,
    int for integers; raises RuntimeError for an error reply. Enough for PING and INFO."""
    payload = f"*{len(argv)}\r\n".encode()
    for a in argv:
        a = a.encode() if isinstance(a, str) else a
        payload += f"${len(a)}\r\n".encode() + a + b"\r\n"
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(payload)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed before the reply")
            buf += chunk
            end = buf.find(b"\r\n")
            if end < 0:
                continue
            kind, head = buf[:1], buf[1:end]
            if kind == b"+":
                return head.decode()
            if kind == b"-":
                raise RuntimeError(head.decode())
            if kind == b":":
                return int(head)
            if kind == b"$":
                n = int(head)
                if n < 0:
                    return None
                if len(buf) >= end + 2 + n + 2:
                    return buf[end + 2:end + 2 + n].decode(errors="replace")
                continue
            raise RuntimeError(f"unexpected reply {buf[:40]!r}")


def valkey_commandstats(port):
    """{command: calls} from INFO commandstats (None if Valkey does not answer)."""
    if not port:
        return None
    try:
        text = valkey_command(port, "INFO", "commandstats")
    except (OSError, RuntimeError):
        return None
    out = {}
    for line in text.splitlines():
        m = re.match(r"^cmdstat_([^:]+):calls=(\d+)", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def cmd_wait_valkey(args):
    def probe():
        reply = valkey_command(args.port, "PING", timeout=1.0)
        return None if reply == "PONG" else f"PING answered {reply!r}"

    return wait_ready(args, "Valkey", probe)


def cmd_valkey_monitor(args):
    """Runs a command (wrk) while a MONITOR connection counts what Valkey executes: commands
    sent by clients (round trips) apart from those a Lua script runs ([0 lua]), which
    INFO commandstats counts alike."""
    sock = socket.create_connection((HOST, args.port), timeout=5)
    sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            print("MONITOR: connection closed", file=sys.stderr)
            return 1
        buf += chunk
    if not buf.startswith(b"+OK"):
        print(f"MONITOR refused: {buf[:80]!r}", file=sys.stderr)
        return 1
    buf = buf[buf.index(b"\r\n") + 2:]
    sock.setblocking(False)
    client_cmds, script_cmds = {}, {}
    pat = re.compile(rb'^\+[0-9.]+ \[\d+ ([^\]]+)\] "([^"]*)"')

    def consume(data):
        nonlocal buf
        buf += data
        *lines, buf = buf.split(b"\r\n")
        for line in lines:
            m = pat.match(line)
            if not m:
                continue
            name = m.group(2).decode(errors="replace").lower()
            target = script_cmds if m.group(1) == b"lua" else client_cmds
            target[name] = target.get(name, 0) + 1

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with open(args.output, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + args.timeout
    stop_at = None
    while True:
        now = time.monotonic()
        if stop_at is None and proc.poll() is not None:
            stop_at = now + args.settle  # replies to requests in flight, then stop
        if (stop_at is not None and now >= stop_at) or now >= deadline:
            break
        for _ in sel.select(0.05):
            try:
                while True:
                    data = sock.recv(1 << 20)
                    if not data:
                        stop_at = now
                        break
                    consume(data)
            except BlockingIOError:
                pass
    sel.close()
    sock.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    with open(args.output, errors="replace") as f:
        m = re.search(r"^WRKJSON (\{.*\})\s*$", f.read(), re.M)
    requests = json.loads(m.group(1))["requests"] if m else None
    # The bench's own connection shows up as "monitor"; nothing else talks to this Valkey.
    client_cmds.pop("monitor", None)
    result = {"requests": requests, "client_commands": client_cmds, "script_commands": script_cmds}
    if requests:
        result["round_trips_per_req"] = sum(client_cmds.values()) / requests
        result["script_commands_per_req"] = sum(script_cmds.values()) / requests
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if requests:
        print(f"  MONITOR sample: {requests} requests, {sum(client_cmds.values())} commands from "
              f"clients ({result['round_trips_per_req']:.4f} per request: {client_cmds}), "
              f"{sum(script_cmds.values())} run by scripts ({script_cmds})")
    return 0


SLUICE_METRICS = ("sluice_ratelimit_decisions_total", "sluice_valkey_errors_total",
                  "sluice_valkey_calls_total", "sluice_valkey_reconnects_total",
                  "sluice_valkey_compensations_total",
                  "sluice_connections_open", "sluice_connections_total", "sluice_requests_total")


def sluice_metrics(admin_port, names=SLUICE_METRICS):
    """{'name{labels}': value} for the samples of `names` on Sluice's /metrics (None if down)."""
    if not admin_port:
        return None
    try:
        _, body = http_get(admin_port, "/metrics")
    except Exception:  # noqa: BLE001
        return None
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("# TYPE sluice_valkey_compensations_total "):
            # A family with no sample yet ({result="done"} appears with the first one): there
            # as 0, to tell a Sluice that counts none from one that does not count them.
            out.setdefault("sluice_valkey_compensations_total", 0.0)
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.startswith(names):
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def metric_sum(metrics, name, label_filter=""):
    """Sum of the samples of one metric family whose labels contain label_filter."""
    if metrics is None:
        return None
    return sum(v for k, v in metrics.items()
               if (k == name or k.startswith(name + "{")) and label_filter in k)


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def delta_dict(before, after):
    if before is None or after is None:
        return None
    keys = set(before) | set(after)
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(keys)
            if after.get(k, 0) - before.get(k, 0)}


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


PROBE_COMMANDS = ("info", "dbsize", "scan")  # what the probes themselves send to Valkey


def node_deltas(before, after, n):
    """Per Valkey node (--valkey-nodes probes): CPU per request, commands (commandstats) per
    request, and the keys counted after the run."""
    out = []
    for b, a in zip(before, after):
        node = {"port": a["port"], "keys": a.get("keys"), "dbsize": a.get("dbsize")}
        if b.get("cpu_s") is not None and a.get("cpu_s") is not None:
            node["cpu_s"] = a["cpu_s"] - b["cpu_s"]
            node["cpu_us_per_req"] = node["cpu_s"] * 1e6 / n
        if b.get("commandstats") is not None and a.get("commandstats") is not None:
            stats = delta_dict(b["commandstats"], a["commandstats"])
            for own in PROBE_COMMANDS:
                stats.pop(own, None)
            node["calls"] = stats
            node["fcall_per_req"] = stats.get("fcall", 0) / n
        out.append(node)
    return out


def glob_escape(text):
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def valkey_count_keys(port, prefix):
    """Keys named prefix:* on one node (SCAN), or None if it does not answer."""
    pattern, cursor, count = glob_escape(prefix) + ":*", "0", 0
    try:
        with socket.create_connection((HOST, port), timeout=10) as s, s.makefile("rb") as f:
            while True:
                argv = ["SCAN", cursor, "MATCH", pattern, "COUNT", "10000"]
                s.sendall(f"*{len(argv)}\r\n".encode()
                          + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in argv))
                line = f.readline()          # *2
                if not line.startswith(b"*2"):
                    return None
                n = int(f.readline()[1:])    # $len of the cursor
                cursor = f.read(n + 2)[:-2].decode()
                k = int(f.readline()[1:])    # *count of the keys
                for _ in range(k):
                    f.read(int(f.readline()[1:]) + 2)
                count += k
                if cursor == "0":
                    return count
    except (OSError, ValueError):
        return None


def probe_nodes(spec, count_keys):
    """--valkey-nodes port:pid,...: CPU time first (all nodes), then INFO commandstats and
    DBSIZE; with --count-keys (the probe after a run) the keys prefix:* per node, last."""
    nodes = []
    for item in spec.split(","):
        port, _, pid = item.partition(":")
        nodes.append({"port": int(port), "pid": int(pid), "cpu_s": cpu_seconds(int(pid))})
    for node in nodes:
        node["commandstats"] = valkey_commandstats(node["port"])
        try:
            node["dbsize"] = valkey_command(node["port"], "DBSIZE")
        except (OSError, RuntimeError):
            node["dbsize"] = None
    if count_keys:
        for node in nodes:
            node["keys"] = valkey_count_keys(node["port"], count_keys)
    return nodes


def cmd_probe(args):
    accepts, requests = stub_status(args.status_port)
    data = {"time": time.monotonic(), "gateway_cpu_s": cpu_seconds(args.pid),
            "upstream_cpu_s": cpu_seconds(args.upstream_pid),
            "upstream_accepts": accepts, "upstream_requests": requests}
    if args.valkey_port:
        data["valkey_commandstats"] = valkey_commandstats(args.valkey_port)
    if args.valkey_pid:
        data["valkey_cpu_s"] = cpu_seconds(args.valkey_pid)
    if args.admin_port:
        data["sluice"] = sluice_metrics(args.admin_port)
    if args.valkey_nodes:
        nodes = probe_nodes(args.valkey_nodes, args.count_keys)
        data["valkey_nodes"] = nodes
        if not args.valkey_port:  # a cluster: commands and CPU summed over the nodes
            stats = [n["commandstats"] for n in nodes]
            data["valkey_commandstats"] = None if None in stats else {
                k: sum(st.get(k, 0) for st in stats) for k in set().union(*stats)}
        if not args.valkey_pid:
            data["valkey_cpu_s"] = sum(n["cpu_s"] for n in nodes)
    if args.count_lines:
        data["resumed_lines"] = count_lines(args.count_lines)
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


def parse_response_head(buf):
    """The head of the response at the start of buf: None while incomplete, else (status,
    head and body length, Content-Length or None, Connection: close, chunked)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    length, close, chunked = None, False, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and "close" in value:
            close = True
        elif name == "transfer-encoding":
            chunked = True
    return status, end + 4 + (length or 0), length, close, chunked


def parse_head(c):
    """Returns True when the whole response (head + Content-Length body) is in c.buf."""
    if c.need is None:
        head = parse_response_head(c.buf)
        if head is None:
            return False
        c.status, c.need, length, close, chunked = head
        if chunked:
            c.error = "chunked response (unexpected for this upstream)"
        if length is None:
            c.error = c.error or "response without Content-Length"
        if close:
            c.error = c.error or "response has Connection: close"
    return len(c.buf) >= c.need


def open_idle_connections(port, count, batch, timeout, tls=False):
    request = (f"GET / HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
               f"User-Agent: sluice-bench-idle\r\nAccept: */*\r\n\r\n").encode()
    tls_ctx = client_tls_context() if tls else None  # a fresh session each time: full handshakes
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
                        if tls_ctx:
                            sel.unregister(c.sock)
                            c.sock = tls_ctx.wrap_socket(c.sock, do_handshake_on_connect=False)
                            sel.register(c.sock, selectors.EVENT_WRITE, c)
                            c.state = "handshake"
                    if c.state == "handshake":
                        c.sock.do_handshake()
                        c.state = "send"
                    if c.state == "send":
                        n = c.sock.send(c.out)
                        c.out = c.out[n:]
                        if not c.out:
                            c.state = "recv"
                            sel.modify(c.sock, selectors.EVENT_READ, c)
                        continue
                    while True:
                        data = c.sock.recv(65536)
                        if not data:
                            raise OSError(0, "closed by the gateway before the response ended")
                        c.buf += data
                        finished = parse_head(c)
                        if finished or not tls_ctx or not c.sock.pending():
                            break
                except ssl.SSLWantReadError:
                    sel.modify(c.sock, selectors.EVENT_READ, c)
                    continue
                except ssl.SSLWantWriteError:
                    sel.modify(c.sock, selectors.EVENT_WRITE, c)
                    continue
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
            if isinstance(c.sock, ssl.SSLSocket):
                data = c.sock.recv(1)  # TLS: a record that is not application data reads as nothing
            else:
                data = c.sock.recv(1, socket.MSG_PEEK)
            closed += 1
            c.error = "unexpected data on an idle connection" if data else "closed by the gateway"
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
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
    done, failed, elapsed = open_idle_connections(args.port, count, args.batch, args.timeout,
                                                   tls=args.tls)
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
              "hold_s": args.hold, "tls": args.tls, "cycles": []}
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
        if len(cycles) > 1 and all(c["after_close"] for c in cycles):
            after = [c["after_close"]["anon_kib"] for c in cycles]
            result["retained_growth_kib"] = after[-1] - after[0]
            result["retained_after_close_kib"] = after
            # A leak grows from every cycle to the next; the allocator's caches go up and down.
            result["retained_growth_monotonic"] = all(b >= a for a, b in zip(after, after[1:]))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if "error" not in result else 1


# ---------------------------------------------------------------- soak


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
    sel = selectors.DefaultSelector()
    conns = [SoakConn() for _ in range(args.connections)]
    n_sent = 0
    totals = {"requests": 0, "status": {}, "errors": {}, "reconnects_client": 0}
    lat_all = []
    iv = {"requests": 0, "status": {}, "errors": {}, "lat": []}
    samples = []
    max_lag = 0.0

    def count(d, k, n=1):
        d[k] = d.get(k, 0) + n

    def open_conn(c):
        s = socket.create_connection((HOST, args.port), timeout=2)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sock, c.busy, c.buf, c.need, c.out = s, False, b"", None, b""
        sel.register(s, selectors.EVENT_READ, c)

    def drop_conn(c, error=None, reconnect=True):
        if error:
            count(iv["errors"], error)
            count(totals["errors"], error)
        if c.sock is not None:
            sel.unregister(c.sock)
            c.sock.close()
            c.sock = None
        c.busy = False
        if not reconnect:
            return
        try:
            open_conn(c)
            totals["reconnects_client"] += 1
        except OSError as e:
            count(iv["errors"], f"connect: {e.strerror or e}")
            count(totals["errors"], f"connect: {e.strerror or e}")

    def finish(c, now):
        lat = int((now - c.sent_at) * 1e6)
        iv["requests"] += 1
        totals["requests"] += 1
        iv["lat"].append(lat)
        count(iv["status"], c.status)
        count(totals["status"], c.status)
        c.busy, c.buf, c.need = False, c.buf[c.need:], None
        if c.close_after:
            drop_conn(c)

    def parse(c):
        if c.need is None:
            head = parse_response_head(c.buf)
            if head is None:
                return False
            c.status, c.need, _, c.close_after, _ = head
        return len(c.buf) >= c.need

    def sample(t):
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

    for c in conns:
        open_conn(c)
    requests_bytes = [
        (f"GET {args.path} HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
         f"User-Agent: sluice-soak\r\nX-Client: c{i}\r\n\r\n").encode()
        for i in range(args.clients)]

    header = (f"{'time':>6} {'requests':>10} {'req/s':>7} {'2xx':>7} {'429':>5} {'503':>5} "
              f"{'other':>5} {'errors':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
              f"{'RSS MiB':>8} {'fds':>5} {'conns':>5} {'reconn':>6} {'fail-open':>9}  events")
    log(f"soak: {args.rate:g} req/s over {args.connections} keep-alive connections for "
        f"{args.duration:g} s; Valkey restarted every {args.restart_every:g} s "
        f"(SIGTERM, {args.valkey_downtime:g} s down, same port); a line every {args.interval:g} s")
    log(header)
    start_sample = sample(0.0)
    samples.append(start_sample)
    t0 = time.monotonic()
    state = {"next_row": args.interval, "prev": start_sample, "rr": 0}

    def emit_row(t):
        nonlocal iv
        prev = state["prev"]
        s_ = sample(t)
        samples.append(s_)
        lat = sorted(iv["lat"])
        lat_all.extend(lat)
        st = iv["status"]
        ok = sum(n for k, n in st.items() if 200 <= k < 300)
        other = sum(n for k, n in st.items() if not 200 <= k < 300 and k not in (429, 503))
        fail_open = (sum(n for k, n in s_["decisions"].items() if k.startswith("error"))
                     - sum(n for k, n in prev["decisions"].items() if k.startswith("error")))
        events = list(restarter.events)
        restarter.events.clear()
        if not s_["alive"]:
            events.append("SLUICE IS GONE")
        if iv["errors"]:
            events.append("errors: " + ", ".join(f"{k} {n}" for k, n in iv["errors"].items()))
        s_.update({"requests": iv["requests"], "ok": ok, "s429": st.get(429, 0),
                   "s503": st.get(503, 0), "other": other, "errors": sum(iv["errors"].values()),
                   "p50_us": percentile(lat, 50), "p99_us": percentile(lat, 99),
                   "max_us": lat[-1] if lat else None, "fail_open": fail_open, "events": events})
        rate = iv["requests"] / (t - prev["t"]) if t > prev["t"] else 0
        log(f"{t:>5.0f}s {totals['requests']:>10,} {rate:>7.0f} "
            f"{ok:>7} {st.get(429, 0):>5} {st.get(503, 0):>5} {other:>5} "
            f"{sum(iv['errors'].values()):>6} {fmt_ms(s_['p50_us']):>7} "
            f"{fmt_ms(s_['p99_us']):>7} {fmt_ms(s_['max_us']):>7} "
            f"{(s_['rss_kib'] or 0) / 1024:>8.1f} {s_['fds'] if s_['fds'] is not None else '-':>5} "
            f"{'-' if s_['conns_open'] is None else int(s_['conns_open']):>5} "
            f"{'-' if s_['reconnects'] is None else int(s_['reconnects']):>6} "
            f"{fail_open:>9.0f}  {'; '.join(events)}")
        state["prev"] = s_
        iv = {"requests": 0, "status": {}, "errors": {}, "lat": []}
        return s_["alive"]

    def free_conn():
        n = len(conns)
        for i in range(n):
            c = conns[(state["rr"] + i) % n]
            if not c.busy and c.sock is not None:
                state["rr"] = (state["rr"] + i + 1) % n
                return c
        return None

    try:
        while stop["why"] is None:
            now = time.monotonic()
            t = now - t0
            if t >= args.duration and not any(c.busy for c in conns):
                break
            if t >= args.duration + args.request_timeout:
                break
            restarter.tick(t)
            # Send what is due (fixed rate; when every connection is busy, it waits).
            while t < args.duration and t0 + n_sent / args.rate <= now:
                c = free_conn()
                if c is None:
                    break
                max_lag = max(max_lag, now - (t0 + n_sent / args.rate))
                req = requests_bytes[n_sent % len(requests_bytes)]
                n_sent += 1
                try:
                    n = c.sock.send(req)
                    if n != len(req):
                        raise OSError(0, "short write")
                    c.busy, c.sent_at = True, now
                except OSError as e:
                    drop_conn(c, f"send: {e.strerror or e}")
            due = t0 + n_sent / args.rate
            timeout = max(0.0, min(due - time.monotonic(), 0.05))
            for key, _ in sel.select(timeout):
                c = key.data
                if c.sock is None:
                    continue
                try:
                    data = c.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    drop_conn(c, f"recv: {e.strerror or e}")
                    continue
                if not data:
                    drop_conn(c, "closed by Sluice" + (" mid-request" if c.busy else " (idle)"))
                    continue
                if not c.busy:
                    drop_conn(c, "unexpected data")
                    continue
                c.buf += data
                if parse(c):
                    finish(c, time.monotonic())
            now = time.monotonic()
            for c in conns:
                if c.busy and now - c.sent_at > args.request_timeout:
                    drop_conn(c, "timeout")
            t = now - t0
            if t >= state["next_row"] and state["next_row"] <= args.duration:
                state["next_row"] += args.interval
                if not emit_row(t):
                    break
        for c in conns:
            if c.busy:
                drop_conn(c, "no reply by the end", reconnect=False)
        if iv["requests"] or iv["errors"] or restarter.events:
            emit_row(time.monotonic() - t0)
    finally:
        restarter.stop()
        sel.close()
        for c in conns:
            if c.sock is not None:
                c.sock.close()

    # ---- summary
    elapsed = time.monotonic() - t0
    lat_all.sort()
    rows = [s_ for s_ in samples if s_.get("rss_kib")]
    warm_t = min(args.warmup, args.duration / 5)
    warm = [s_ for s_ in rows if s_["t"] >= warm_t]
    slope = least_squares_slope([(s_["t"], s_["rss_kib"]) for s_ in warm])  # KiB per second
    span = (warm[-1]["t"] - warm[0]["t"]) if len(warm) > 1 else 0
    drift_kib = slope * span if slope is not None else None
    rss0 = warm[0]["rss_kib"] if warm else None
    drift_limit = max(2048, 0.05 * rss0) if rss0 else None
    drifted = None if drift_kib is None else drift_kib > drift_limit
    reconnects = [s_["reconnects"] for s_ in samples if s_.get("reconnects") is not None]
    dec_end = samples[-1].get("decisions") or {}
    dec_start = samples[0].get("decisions") or {}
    decisions = {k: int(dec_end.get(k, 0) - dec_start.get(k, 0)) for k in dec_end}
    status = totals["status"]
    non2xx = {k: n for k, n in status.items() if not 200 <= k < 300}
    restarts_done = [r for r in restarter.restarts if "t_start" in r]
    summary = {
        "stopped_by": stop["why"], "elapsed_s": round(elapsed, 1), "rate_target": args.rate,
        "requests": totals["requests"], "rate_achieved": totals["requests"] / elapsed if elapsed else 0,
        "max_send_lag_s": round(max_lag, 3), "status": {str(k): n for k, n in status.items()},
        "non2xx": {str(k): n for k, n in non2xx.items()}, "errors": totals["errors"],
        "client_reconnects": totals["reconnects_client"],
        "latency_us": {"p50": percentile(lat_all, 50), "p99": percentile(lat_all, 99),
                       "p999": percentile(lat_all, 99.9), "max": lat_all[-1] if lat_all else None},
        "rss_kib": {"start": rows[0]["rss_kib"] if rows else None,
                    "after_warmup": rss0, "end": rows[-1]["rss_kib"] if rows else None,
                    "max": max(s_["rss_kib"] for s_ in rows) if rows else None,
                    "min": max(0, min(s_["rss_kib"] for s_ in rows)) if rows else None},
        "rss_slope_kib_per_min": None if slope is None else round(slope * 60, 1),
        "rss_drift_kib": None if drift_kib is None else round(drift_kib),
        "rss_drift_limit_kib": drift_limit, "rss_drifted": drifted,
        "fds": {"start": samples[0].get("fds"), "end": samples[-1].get("fds"),
                "max": max((s_["fds"] for s_ in samples if s_.get("fds") is not None), default=None)},
        "valkey_restarts": len(restarts_done), "valkey_restart_detail": restarter.restarts,
        "valkey_reconnects_total": reconnects[-1] if reconnects else None,
        "decisions": decisions, "sluice_alive_at_end": pid_alive(args.sluice_pid),
        "samples": samples,
    }
    total_errors = sum(totals["errors"].values())
    log()
    log("== Soak summary ==")
    log(f"  ran {elapsed:.0f} s{' (stopped by ' + stop['why'] + ')' if stop['why'] else ''}: "
        f"{totals['requests']:,} requests, {summary['rate_achieved']:.0f} req/s "
        f"(target {args.rate:g}; largest send delay {max_lag * 1000:.0f} ms)")
    log(f"  responses: " + ", ".join(f"{k} {n:,}" for k, n in sorted(status.items()))
        + f"; non-2xx {sum(non2xx.values())}; client errors {total_errors}"
        + (f" ({totals['errors']})" if total_errors else "")
        + f"; client reconnections {totals['reconnects_client']}")
    la = summary["latency_us"]
    log(f"  latency: p50 {fmt_ms(la['p50'])} ms, p99 {fmt_ms(la['p99'])} ms, "
        f"p99.9 {fmt_ms(la['p999'])} ms, max {fmt_ms(la['max'])} ms")
    r = summary["rss_kib"]
    if rows:
        log(f"  Sluice RSS: start {r['start'] / 1024:.1f} MiB, after warm-up ({warm_t:.0f} s) "
            f"{(rss0 or 0) / 1024:.1f} MiB, end {r['end'] / 1024:.1f} MiB, max {r['max'] / 1024:.1f} MiB, "
            f"min {r['min'] / 1024:.1f} MiB; trend after warm-up "
            f"{summary['rss_slope_kib_per_min']:+.1f} KiB/min = {drift_kib:+.0f} KiB over {span:.0f} s "
            f"-> drift: {'YES' if drifted else 'no'} (threshold {drift_limit:.0f} KiB)")
    f = summary["fds"]
    log(f"  Sluice open fds: start {f['start']}, end {f['end']}, max {f['max']}")
    log(f"  Valkey: {len(restarts_done)} restart(s); sluice_valkey_reconnects_total "
        f"{summary['valkey_reconnects_total']:.0f} (expected {len(restarts_done)} x "
        f"{args.workers} worker(s) = {len(restarts_done) * args.workers}); decisions "
        + ", ".join(f"{k} {n:,}" for k, n in sorted(decisions.items())))
    log(f"  Sluice alive at the end: {'yes' if summary['sluice_alive_at_end'] else 'NO'}")
    summary["table"] = out_lines
    if table_file:
        table_file.close()
    with open(args.out, "w") as fobj:
        json.dump(summary, fobj, indent=1)
    ok = (summary["sluice_alive_at_end"] and total_errors == 0 and not non2xx and not drifted)
    return 0 if ok or not args.strict else 1



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
        summary["variants"][v] = entry
    E = summary["variants"]
    pairs = comparisons(variants, ref, E, args)

    mode = meta.get("mode", "all")
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

    if args.handshake_rounds and any("handshake" in E[v] for v in variants):
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

    limit_variants = [v for v in variants if "valkey_fcall_per_req" in E[v] or E[v].get("limit")]
    if args.rounds and limit_variants:
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

    if args.rounds or args.handshake_rounds:
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

    if mode in ("all", "idle"):
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

    # Anything odd goes into notes, printed last.
    notes = []
    for v in variants:
        e = E[v]
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
    negotiated = {v: (E[v].get("tls_negotiated") or {}) for v in variants if E[v].get("tls")}
    suites = {(n.get("Protocol version"), n.get("Ciphersuite"),
               (n.get("Server Temp Key") or "").split(",")[0]) for n in negotiated.values() if n}
    if len(suites) > 1:
        notes.append("the TLS variants negotiate different parameters: "
                     + "; ".join(f"{v}: {n}" for v, n in negotiated.items()))
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
    s.add_argument("--tls", action="store_true", help="HTTPS (certificate not verified)")
    s.add_argument("--any-body", action="store_true", help="any 200 will do")
    s.add_argument("--timeout", type=float, default=15)
    s.set_defaults(func=cmd_wait_http)

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

    args = p.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
