"""bench.py's small tools and probes: free ports, waiting for a server, Valkey commands and
MONITOR, Sluice's /metrics, CPU time and memory of a process tree (bench/run.sh takes a probe
before and after every measured run)."""

import json
import os
import random
import re
import selectors
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

HOST = "127.0.0.1"


# ---------------------------------------------------------------- small tools


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def cmd_free_ports(args):
    """Free ports below the kernel's ephemeral range: the ports are taken minutes later, and
    one of the range could meanwhile be the local port of an outgoing connection (a load
    tool's, a gateway's to its upstream: thousands per run), which a listener then cannot
    bind. --avoid: ports handed out before and not bound yet (run.sh's own list), which a
    later call must not hand out again."""
    low, _ = ephemeral_range()
    first = max(1024, min(10000, low - 4 * args.n))
    avoid = set(args.avoid)
    candidates = [p for p in range(first, low) if p not in avoid]
    random.shuffle(candidates)
    socks = []
    try:
        for port in candidates:
            if len(socks) == args.n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((HOST, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < args.n:
            sys.exit(f"free-ports: only {len(socks)} free ports below {low}")
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
                  "sluice_connections_open", "sluice_connections_total", "sluice_requests_total",
                  "sluice_rls_descriptors_total")


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


def write_syscalls(root):
    """Write system calls (write, writev, send...: /proc/PID/io syscw) of a process and its
    descendants so far; None when unreadable."""
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("syscw:"))
        except (OSError, StopIteration, ValueError):
            return None
    return total


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
            "upstream_writes": write_syscalls(args.upstream_pid),
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
