"""bench.py idle: the memory cost of N idle keep-alive client connections (plain or TLS), over
several open/measure/close cycles."""

import errno
import json
import os
import re
import resource
import selectors
import socket
import ssl
import sys
import time

from bench_h2 import H2Reader, h2_request
from bench_probe import HOST, client_tls_context, http_get, pid_alive, tree_memory


# ---------------------------------------------------------------- idle connections


def raise_nofile(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(needed, soft)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft


class Conn:
    __slots__ = ("sock", "state", "out", "buf", "need", "status", "error", "h2")

    def __init__(self, sock, request):
        self.sock = sock
        self.state = "connect"
        self.out = request
        self.buf = b""
        self.need = None  # total bytes of head + body once the head is parsed
        self.status = None
        self.error = None
        self.h2 = None  # H2Reader (--h2)


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


def parse_h2(c, data):
    """--h2: True when stream 1 ended (or the connection failed); sends the SETTINGS ack."""
    c.h2.feed(data)
    out = c.h2.reply()
    if out:
        c.sock.sendall(out)  # a few bytes on a socket with an empty send buffer
    if c.h2.error:
        c.error = c.h2.error
        return True
    if c.h2.done:
        c.status = c.h2.status
        return True
    return False


def open_idle_connections(port, count, batch, timeout, tls=False, h2=False):
    request = (f"GET / HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
               f"User-Agent: sluice-bench-idle\r\nAccept: */*\r\n\r\n").encode()
    if h2:  # h2c with prior knowledge: preface, SETTINGS, GET / on stream 1
        request = h2_request(port)
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
            if h2:
                c.h2 = H2Reader()
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
                        if c.h2:
                            finished = parse_h2(c, data)
                            break
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
            elif c.h2:
                # h2: frames may still come (a late SETTINGS ack, WINDOW_UPDATE); only EOF,
                # an error or a GOAWAY mean the gateway gave the connection up.
                data = c.sock.recv(65536)
                if data:
                    c.h2.feed(data)
                    if not c.h2.error:
                        continue
                    c.error = c.h2.error
                    closed += 1
                    continue
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
                                                   tls=args.tls, h2=args.h2)
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
              "hold_s": args.hold, "tls": args.tls, "h2": args.h2, "cycles": []}
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
