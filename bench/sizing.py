#!/usr/bin/env python3
"""Valkey memory per client for each algorithm, measured on a private redis-server with the
real scripts (lua/*.lua composed as lua/decide.lua documents). For each case, N clients each
make `requests` allowed requests; the table shows used_memory growth per client, MEMORY USAGE
of one client's keys, and the projection for 100,000 active clients.

    /usr/bin/python3 bench/sizing.py            # N = 100,000 clients per case
    REDIS_SERVER=/path/to/valkey-server /usr/bin/python3 bench/sizing.py
"""

import contextlib
import glob
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(os.environ.get("SIZING_CLIENTS", "100000"))


def decide_library():
    """(source, function name) of the function library Sluice loads, composed from lua/ as
    lua/decide.lua's header documents."""
    body = "local ALGORITHMS = {}\n"
    for path in sorted(glob.glob(os.path.join(ROOT, "lua", "*.lua"))):
        name = os.path.basename(path)[:-4]
        if name == "decide":
            continue
        with open(path) as f:
            body += f"ALGORITHMS['{name}'] = function(KEYS, ARGV)\n{f.read()}\nend\n"
    with open(os.path.join(ROOT, "lua", "decide.lua")) as f:
        body += f.read()
    tag = hashlib.sha1(body.encode()).hexdigest()[:16]
    function = f"sluice_decide_{tag}"
    return f"#!lua name=sluice_{tag}\nlocal FUNCTION_NAME = '{function}'\n{body}", function


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


CASES = [
    # name, algorithm, limit, window_ms, requests per client, share of the N clients
    # (windows long enough that nothing expires while the case runs)
    ("fixed_window", "fixed_window", 100, 3_600_000, 1, 1),
    ("sliding_window", "sliding_window", 100, 3_600_000, 1, 1),
    ("token_bucket", "token_bucket", 100, 86_400_000, 1, 1),
    ("sliding_log, 1 request", "sliding_log", 100, 3_600_000, 1, 1),
    ("sliding_log, 10 requests", "sliding_log", 100, 3_600_000, 10, 0.2),
    ("sliding_log, 100 requests (full)", "sliding_log", 100, 3_600_000, 100, 0.02),
]


@contextlib.contextmanager
def private_server(wrapper=(), **client_options):
    """A redis-server (REDIS_SERVER, else the PATH's) on a free loopback port, without
    persistence, stopped on exit: yields (client, process, server path). `wrapper` runs it
    (valgrind, say)."""
    server = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not server:
        sys.exit("redis-server is required (or REDIS_SERVER)")
    work = tempfile.mkdtemp()
    port = free_port()
    proc = subprocess.Popen([*wrapper, server, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", work],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port, **client_options)
        deadline = time.monotonic() + (60 if wrapper else 5)
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield r, proc, server
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main():
    with private_server() as (r, _, server):
        library, function = decide_library()
        r.function_load(library, replace=True)
        print(f"{N} clients per case, keys like rl:v1:<limit>:{{203.0.113.7}} (IPv4 text)")
        print(f"server: {server} {r.info('server').get('redis_version')}\n")
        print(f"{'algorithm':34} {'bytes/client':>13} {'MEMORY USAGE':>13} {'per 100k clients':>17}")
        for name, algorithm, limit, window, requests, share in CASES:
            clients = int(N * share)
            r.flushall()
            time.sleep(0.2)
            before = r.info("memory")["used_memory"]
            pipe = r.pipeline(transaction=False)
            for i in range(clients):
                key = f"rl:v1:lim:{{10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}}}"
                for j in range(requests):
                    # decide.lua's layout: one definition (algorithm, limit, window, burst,
                    # count_denied, shadow, keep), then this request ("1:1": the definition,
                    # cost 1, on the call's one key)
                    pipe.fcall(function, 1, key, "1", algorithm, limit, window, limit, "0", "0",
                                 limit, "1:1")
                if len(pipe) >= 2000:
                    pipe.execute()
            pipe.execute()
            after = r.info("memory")["used_memory"]
            per_client = (after - before) / clients
            usage = r.memory_usage("rl:v1:lim:{10.0.0.1}", samples=0) or 0
            print(f"{name:34} {per_client:13.0f} {usage:13d} {per_client * 100_000 / 2**20:14.1f} MiB")


if __name__ == "__main__":
    main()
