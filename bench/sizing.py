#!/usr/bin/env python3
"""Valkey memory per client for each algorithm, measured on a private redis-server with the
real scripts (the library the gateway loads, called by its own codec: see use_codec()). For
each case, N clients each make `requests` allowed requests; the table shows used_memory growth
per client, MEMORY USAGE of one client's keys, and the projection for 100,000 active clients.

    /usr/bin/python3 bench/sizing.py            # N = 100,000 clients per case
    REDIS_SERVER=/path/to/valkey-server /usr/bin/python3 bench/sizing.py
    SLUICE_CODEC_BIN=build/sluice_codec ...     # this codec tool (default: build-release's)
"""

import contextlib
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


def use_codec():
    """tests/integration/decide_codec.py: the library Sluice loads and its calls, from Sluice's
    own codec (the sluice_codec tool): SLUICE_CODEC_BIN, else build-release/sluice_codec,
    built now (Release, like bench/run.sh's gateway; nothing to do when it is up to date)."""
    if not os.environ.get("SLUICE_CODEC_BIN"):
        build = os.path.join(ROOT, "build-release")
        for command in (["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                        ["cmake", "--build", build, "--target", "sluice_codec", "-j2"]):
            if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
                sys.exit(f"cannot build the codec tool: {' '.join(command)}")
        os.environ["SLUICE_CODEC_BIN"] = os.path.join(build, "sluice_codec")
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import decide_codec
    return decide_codec


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
    codec = use_codec()
    with private_server() as (r, _, server):
        library, _ = codec.decide_library()
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
            lim = {"algorithm": algorithm, "limit": limit, "window_ms": window}
            for first in range(0, clients, 2000):
                # One call per request, of one limit on the client's key.
                keys = [f"rl:v1:lim:{{10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}}}"
                        for i in range(first, min(clients, first + 2000))]
                for command in codec.decide_commands([[(key, lim)]] for key in keys):
                    for j in range(requests):
                        pipe.execute_command(*command)
                    if len(pipe) >= 2000:
                        pipe.execute()
            pipe.execute()
            after = r.info("memory")["used_memory"]
            per_client = (after - before) / clients
            usage = r.memory_usage("rl:v1:lim:{10.0.0.1}", samples=0) or 0
            print(f"{name:34} {per_client:13.0f} {usage:13d} {per_client * 100_000 / 2**20:14.1f} MiB")


if __name__ == "__main__":
    main()
