#!/usr/bin/env python3
"""What one sliding_log decision costs Valkey when its key is full at the largest limit the
configuration allows (limit 10^6, a window of an hour, count_denied: a client that keeps
hammering), against the same decision on a key of 10 entries: both engines (the Lua library
by FCALL, the module by SLUICE.DECIDE), on a private server, the server's own time per call
(INFO commandstats usec_per_call) and its CPU time per decision (/proc). A decision reads the
entries that left the window and the one or two its reply names, and trims and adds a few: it
should cost about the same on both keys. Writes bench/results/sliding-log-full-<server>.txt
and .json (the latest run per server binary; history is in git). About a minute.

    /usr/bin/python3 bench/sliding_log_full.py                 # redis-server from PATH
    REDIS_SERVER=/path/to/valkey-server /usr/bin/python3 bench/sliding_log_full.py
    SLIDING_LOG_DECISIONS=5000 ...   # decisions per case (default 2000)
    SLUICE_MODULE=build/sluice-valkey.so SLUICE_CODEC_BIN=build/sluice_codec ...
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cost import cpu_seconds, loading, use_module  # noqa: E402
from sizing import ROOT, private_server, use_codec  # noqa: E402

DECISIONS = int(os.environ.get("SLIDING_LOG_DECISIONS", "2000"))
LIMIT = 1_000_000
SIZES = [10, LIMIT]


def fill(r, key, n, t):
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, 10_000):
        pipe.rpush(key, *[t] * min(10_000, n - i))
    pipe.expire(key, 3600)
    pipe.execute()


def main():
    codec = use_codec()
    module = use_module()
    source, _ = codec.decide_library()
    limit = {"algorithm": "sliding_log", "limit": LIMIT, "window_ms": 3_600_000,
             "count_denied": True, "keep": LIMIT}
    fcall = codec.decide_command([[("k", limit)]])
    rows = []
    with private_server(loading(module, ()), decode_responses=True) as (r, proc, server):
        r.function_load(source, replace=True)
        version = r.info("server").get("redis_version")
        s, us = r.time()
        t = str(s * 1_000_000 + us - 1_000_000)  # a second ago: in the window for the run
        for engine in ("lua", "module"):
            for size in SIZES:
                key = f"{engine}:{size}"
                fill(r, key, size, t)
                command = [*fcall[:3], key, *fcall[4:]]
                if engine == "module":
                    command = ["SLUICE.DECIDE", *command[2:]]
                r.config_resetstat()
                cpu0 = cpu_seconds(proc.pid)
                t0 = time.monotonic()
                for _ in range(DECISIONS):
                    r.execute_command(*command)
                wall = time.monotonic() - t0
                cpu = cpu_seconds(proc.pid) - cpu0
                stat = "cmdstat_fcall" if engine == "lua" else "cmdstat_sluice.decide"
                info = r.info("commandstats")[stat]
                assert info["calls"] == DECISIONS, info
                rows.append({"engine": engine, "entries": size, "decisions": DECISIONS,
                             "usec_per_call": info["usec_per_call"],
                             "cpu_us_per_decision": cpu * 1e6 / DECISIONS,
                             "wall_us_per_decision": wall * 1e6 / DECISIONS,
                             "entries_after": r.llen(key)})
                r.delete(key)
    lines = [f"sliding_log at limit {LIMIT:,}, window 1h, count_denied; {DECISIONS} decisions "
             f"per case, one request per call ({os.path.basename(server)} {version})",
             f"{'engine':8} {'entries':>10} {'us/call (server)':>17} {'CPU us/decision':>16}"]
    for row in rows:
        lines.append(f"{row['engine']:8} {row['entries']:>10,} {row['usec_per_call']:>17.1f} "
                     f"{row['cpu_us_per_decision']:>16.1f}")
    for engine in ("lua", "module"):
        few, full = [x for x in rows if x["engine"] == engine]
        lines.append(f"{engine}: a full key costs {full['usec_per_call'] / few['usec_per_call']:.2f}"
                     f" x a key of {few['entries']} entries")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = os.path.join(ROOT, "bench", "results", f"sliding-log-full-{os.path.basename(server)}")
    with open(out + ".txt", "w") as f:
        f.write(text)
    with open(out + ".json", "w") as f:
        json.dump({"server": os.path.basename(server), "version": version, "rows": rows}, f,
                  indent=2)


if __name__ == "__main__":
    main()
