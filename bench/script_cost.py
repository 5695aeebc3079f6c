#!/usr/bin/env python3
"""What one decision costs Valkey, on the production-like mix, without a gateway: batches of
requests (as one gateway worker sends them) with `per_ip` (sliding_window by one of 100,000
addresses) and `per_key` (token_bucket by one of 5,000 API keys), or one algorithm alone on
the addresses, decided by the real script (the library the gateway loads, called by its own
codec: sizing.use_codec()) on a private server. Prints the server's CPU time per decision (utime + stime from /proc) and
the script commands per decision (INFO commandstats); last, the floor of the mix: the same
calls to a function that only runs the commands every decision needs (TIME, MGET, a SET per
key) and replies, deciding nothing.

    /usr/bin/python3 bench/script_cost.py                 # redis-server from PATH
    REDIS_SERVER=/path/to/valkey-server /usr/bin/python3 bench/script_cost.py
    SCRIPT_COST_BATCH=13 SCRIPT_COST_DECISIONS=200000 ...  # requests per call, decisions
    SCRIPT_COST_CALLGRIND=1 ...   # the server under callgrind: instructions per decision
                                  # (repeatable whatever else the machine does; slow: use
                                  # SCRIPT_COST_DECISIONS=5000)
    SLUICE_CODEC_BIN=build/sluice_codec ...  # this codec tool (default: build-release's)
"""

import os
import random
import re
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sizing import private_server, use_codec  # noqa: E402

BATCH = int(os.environ.get("SCRIPT_COST_BATCH", "13"))
DECISIONS = int(os.environ.get("SCRIPT_COST_DECISIONS", "100000"))
ADDRESSES = [f"198.18.{i >> 8 & 255}.{i & 255}" if i < 65536 else
             f"198.19.{i >> 8 & 255}.{i & 255}" for i in range(100_000)]
API_KEYS = [f"key-{i:05d}" for i in range(5000)]

# name: [(algorithm, limit, window_ms, key source)]
CASES = {
    "mix (sliding_window by ip + token_bucket by key)": [
        ("sliding_window", 1_000_000, 60_000, "ip"), ("token_bucket", 1_000_000, 3_600_000, "key")],
    "fixed_window alone": [("fixed_window", 1_000_000, 60_000, "ip")],
    "sliding_window alone": [("sliding_window", 1_000_000, 60_000, "ip")],
    "token_bucket alone": [("token_bucket", 1_000_000, 60_000, "ip")],
    "sliding_log alone (small log)": [("sliding_log", 20, 1_000, "ip")],
}


# The floor of any script that decides on Valkey: the same call (KEYS, ARGV) doing only what
# every decision needs, TIME, one MGET, one SET per key (a 20-byte value with an expiry) and a
# reply of 3 integers per key (per limit of each request, but for the few keys that two
# requests of a call share: it does not read the call's layout), and no deciding at all. What
# a decision costs above it is the Lua that decides.
FLOOR_LIBRARY = """#!lua name=sluice_floor
local reply = {}
redis.register_function('sluice_floor', function(KEYS, ARGV)
  redis.call('TIME')
  redis.call('MGET', unpack(KEYS))
  for i = 1, #KEYS do redis.call('SET', KEYS[i], '01234567890123456789', 'PX', 60000) end
  local n = #KEYS * 3
  for i = 1, n do reply[i] = 0 end
  reply[n + 1] = nil
  return reply
end)
"""
FLOOR_CASE = "floor of the mix (TIME, MGET, SETs, reply; no Lua)"


def batch(limits, rng):
    """The requests of one call: BATCH of them, each with every limit (key, limit dict)."""
    requests = []
    for _ in range(BATCH):
        ip, key = rng.choice(ADDRESSES), rng.choice(API_KEYS)
        requests.append([(f"rl:v1:{'per_ip' if by == 'ip' else 'per_key'}:"
                          f"{{{ip if by == 'ip' else key}}}",
                          {"algorithm": algorithm, "limit": limit, "window_ms": window_ms})
                         for algorithm, limit, window_ms, by in limits])
    return requests


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def callgrind(pid, *args):
    return subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True,
                          text=True, check=True).stdout


def instructions(pid):
    """Instructions counted since the last zero, every thread (callgrind_control -e)."""
    out = callgrind(pid, "-e", "Ir")
    return sum(int(m.replace(",", "")) for m in re.findall(r"Th \d+\s+([\d,]+)", out))


def run_case(r, pid, codec, function, limits, use_callgrind=False):
    rng = random.Random(7)
    r.flushall()
    r.config_resetstat()
    calls = codec.decide_commands([batch(limits, rng) for _ in range(DECISIONS // BATCH)],
                                  function)
    if use_callgrind:
        callgrind(pid, "-z")
        callgrind(pid, "-i", "on")
    start = cpu_seconds(pid)
    pipe = r.pipeline(transaction=False)
    for command in calls:
        pipe.execute_command(*command)
        if len(pipe) >= 50:
            for reply in pipe.execute():
                assert isinstance(reply, list), reply
    pipe.execute()
    cpu = cpu_seconds(pid) - start
    decisions = len(calls) * BATCH
    if use_callgrind:
        cpu = instructions(pid) / 1e6  # (instructions per decision, printed as "us")
        callgrind(pid, "-i", "off")
    stats = r.info("commandstats")
    script_calls = sum(v["calls"] for k, v in stats.items()
                       if k not in ("cmdstat_fcall", "cmdstat_flushall", "cmdstat_config",
                                    "cmdstat_info"))
    return cpu / decisions * 1e6, script_calls / decisions


def main():
    use_callgrind = os.environ.get("SCRIPT_COST_CALLGRIND") == "1"
    codec = use_codec()
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               "--callgrind-out-file=/dev/null"] if use_callgrind else []
    with private_server(wrapper, decode_responses=True) as (r, proc, server):
        info = r.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        library, function = codec.decide_library()
        r.function_load(library, replace=True)
        r.function_load(FLOOR_LIBRARY, replace=True)
        print(f"{os.path.basename(server)} {version}: {DECISIONS} decisions per case, "
              f"{BATCH} requests per call\n")
        unit = "instructions/decision" if use_callgrind else "server CPU us/decision"
        print(f"{'case':50} {unit:>23} {'commands/decision':>18}")
        cases = [(name, function, limits) for name, limits in CASES.items()]
        cases.append((FLOOR_CASE, "sluice_floor", CASES[next(iter(CASES))]))
        for name, called, limits in cases:
            us, commands = run_case(r, proc.pid, codec, called, limits, use_callgrind)
            print(f"{name:50} {us:23.{0 if use_callgrind else 2}f} {commands:18.2f}")


if __name__ == "__main__":
    main()
