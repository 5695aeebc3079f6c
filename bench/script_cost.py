#!/usr/bin/env python3
"""What one decision costs Valkey, on the production-like mix, without a gateway: batches of
requests (as one gateway worker sends them) with `per_ip` (sliding_window by one of 100,000
addresses) and `per_key` (token_bucket by one of 5,000 API keys), or one algorithm alone on
the addresses, decided by the real script (the library the gateway loads, called by its own
codec: sizing.use_codec()) on a private server. Prints the server's CPU time per decision (utime + stime from /proc) and
the script commands per decision (INFO commandstats); last, the floor of the mix: the same
calls to a function that only runs the commands every decision needs (TIME, MGET, a SET per
key) and replies, deciding nothing.

Each engine decides the same calls: the Lua library (FCALL) and the native module
(sluice-valkey.so, loaded with --loadmodule: SLUICE.DECIDE with the FCALL's arguments after
the function's name), side by side, for each batch size (requests per call). The table is
also written to bench/results/script-cost[-callgrind].txt and .json (the latest run; history
is in git).

    /usr/bin/python3 bench/script_cost.py                 # redis-server from PATH
    REDIS_SERVER=/path/to/valkey-server /usr/bin/python3 bench/script_cost.py
    SCRIPT_COST_BATCH=13,1 SCRIPT_COST_DECISIONS=200000 ...  # requests per call (one or
                                  # more, comma-separated; default 13,1), decisions per case
    SCRIPT_COST_ENGINE=lua|module|both ...  # which engines (default both)
    SCRIPT_COST_CASE=token ...    # only the cases whose name holds this text
    SCRIPT_COST_CALLGRIND=1 ...   # the server under callgrind: instructions per decision
                                  # (repeatable whatever else the machine does; slow: use
                                  # SCRIPT_COST_DECISIONS=5000)
    SCRIPT_COST_KEYS=new|existing|both ...  # the keys' state (default both): new (every call
                                  # on an empty store: each write creates its key) or existing
                                  # (the same calls sent once before, unmeasured: each write
                                  # updates a key, as when a key is hit many times per window)
    SCRIPT_COST_CALLGRIND_OUT=/tmp/cg.out ...  # and keep its profile (every case measured) for
                                  # callgrind_annotate
    SLUICE_CODEC_BIN=build/sluice_codec ...  # this codec tool (default: build-release's)
    SLUICE_MODULE=build/sluice-valkey.so ...  # this module (default: build-release's)
"""

import json
import os
import random
import re
import subprocess
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sizing import ROOT, private_server, use_codec  # noqa: E402

BATCHES = [int(b) for b in os.environ.get("SCRIPT_COST_BATCH", "13,1").split(",") if b.strip()]
ENGINES = {"lua": ["lua"], "module": ["module"], "both": ["lua", "module"]}.get(
    os.environ.get("SCRIPT_COST_ENGINE", "both"))
ONLY = os.environ.get("SCRIPT_COST_CASE", "")  # the cases whose name holds this
KEY_STATES = {"new": ["new"], "existing": ["existing"], "both": ["new", "existing"]}.get(
    os.environ.get("SCRIPT_COST_KEYS", "both"))
if KEY_STATES is None:
    sys.exit("SCRIPT_COST_KEYS is new, existing or both")
if ENGINES is None or not BATCHES or min(BATCHES) < 1:
    sys.exit("SCRIPT_COST_ENGINE is lua, module or both; SCRIPT_COST_BATCH whole numbers >= 1")
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
    "concurrency alone (a slot per request)": [("concurrency", 1_000_000, 60_000, "ip")],
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


def use_module():
    """The module's path: SLUICE_MODULE, else build-release/sluice-valkey.so, built now (as
    use_codec() builds the codec tool)."""
    if os.environ.get("SLUICE_MODULE"):
        return os.path.abspath(os.environ["SLUICE_MODULE"])
    build = os.path.join(ROOT, "build-release")
    for command in (["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", build, "--target", "sluice_valkey", "-j2"]):
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit(f"cannot build the module: {' '.join(command)}")
    return os.path.join(build, "sluice-valkey.so")


def loading(module, wrapper):
    """private_server()'s wrapper that also loads the module: the server's command line
    (after `wrapper`) gets --loadmodule <module> at its end (exec: the pid stays the
    server's)."""
    return ["sh", "-c", 'exec "$@" --loadmodule "$0"', module, *wrapper]


def native(command):
    """The module's command of an FCALL: SLUICE.DECIDE and the FCALL's arguments after the
    function's name (what the gateway sends on the module engine)."""
    assert str(command[0]).upper() == "FCALL", command
    return ["SLUICE.DECIDE", *command[2:]]


def batch(limits, rng, size):
    """The requests of one call: `size` of them, each with every limit (key, limit dict)."""
    requests = []
    for _ in range(size):
        ip, key = rng.choice(ADDRESSES), rng.choice(API_KEYS)
        # (a concurrency limit takes a slot of its own name: the request's lease; drawn only
        # then, so that the other cases draw the same keys as before)
        lease = (f"lease-{rng.getrandbits(64):016x}"
                 if any(limit[0] == "concurrency" for limit in limits) else None)
        requests.append([(f"rl:v1:{'per_ip' if by == 'ip' else 'per_key'}:"
                          f"{{{ip if by == 'ip' else key}}}",
                          {"algorithm": algorithm, "limit": limit, "window_ms": window_ms,
                           **({"lease": lease} if algorithm == "concurrency" else {})})
                         for algorithm, limit, window_ms, by in limits])
    return requests


def check(reply):
    """A decided call: its time and integers (a request that failed is a string)."""
    assert isinstance(reply, list) and all(isinstance(v, int) for v in reply), reply


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


def send(r, calls):
    pipe = r.pipeline(transaction=False)
    for command in calls:
        pipe.execute_command(*command)
        if len(pipe) >= 50:
            for reply in pipe.execute():
                check(reply)
    for reply in pipe.execute():
        check(reply)


def run_case(r, pid, codec, function, limits, size, engine, existing, use_callgrind=False):
    """(server CPU us, or instructions, per decision; script commands per decision) of
    DECISIONS decisions in calls of `size` requests, by `engine` (the same calls on either:
    the same keys, from an empty store; with `existing`, the calls sent once before)."""
    rng = random.Random(7)
    r.flushall()
    calls = codec.decide_commands([batch(limits, rng, size)
                                   for _ in range(max(1, DECISIONS // size))], function)
    if engine == "module":
        calls = [native(command) for command in calls]
    if existing:
        send(r, calls)
    r.config_resetstat()
    if use_callgrind:
        callgrind(pid, "-z")
        callgrind(pid, "-i", "on")
    start = cpu_seconds(pid)
    send(r, calls)
    cpu = cpu_seconds(pid) - start
    decisions = len(calls) * size
    if use_callgrind:
        cpu = instructions(pid) / 1e6  # (instructions per decision, printed as "us")
        callgrind(pid, "-i", "off")
    stats = r.info("commandstats")
    script_calls = sum(v["calls"] for k, v in stats.items()
                       if k not in ("cmdstat_fcall", "cmdstat_sluice.decide", "cmdstat_flushall",
                                    "cmdstat_config", "cmdstat_info"))
    return cpu / decisions * 1e6, script_calls / decisions


def main():
    use_callgrind = os.environ.get("SCRIPT_COST_CALLGRIND") == "1"
    codec = use_codec()
    profile = os.environ.get("SCRIPT_COST_CALLGRIND_OUT") or "/dev/null"
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={profile}"] if use_callgrind else []
    module = use_module() if "module" in ENGINES else None
    if module:
        wrapper = loading(module, wrapper)
    with private_server(wrapper, decode_responses=True) as (r, proc, server):
        info = r.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        library, function = codec.decide_library()
        r.function_load(library, replace=True)
        r.function_load(FLOOR_LIBRARY, replace=True)
        unit = "instructions/decision" if use_callgrind else "server CPU us/decision"
        lines = [f"{os.path.basename(server)} {version}: {DECISIONS} decisions per case, "
                 f"requests per call {', '.join(map(str, BATCHES))}; {unit}; engines "
                 f"{', '.join(ENGINES)}" + (f" (module {module})" if module else "") +
                 f"; load average {os.getloadavg()[0]:.1f} at the start", ""]
        print(lines[0] + "\n", flush=True)
        header = f"{'case':50} {'keys':>8} {'per call':>8}" + "".join(f" {e:>10}" for e in ENGINES)
        if len(ENGINES) == 2:
            header += f" {'module/lua':>10}"
        header += "".join(f" {e + ' cmds/dec':>15}" for e in ENGINES)
        lines += [header, "-" * len(header)]
        print(header, flush=True)
        cases = [(name, function, limits) for name, limits in CASES.items()]
        if "lua" in ENGINES:  # (the floor is a Lua function)
            cases.append((FLOOR_CASE, "sluice_floor", CASES[next(iter(CASES))]))
        cases = [c for c in cases if ONLY in c[0]]
        figures = []
        for name, called, limits, keys, size in [(n, c, li, k, b) for n, c, li in cases
                                                 for k in KEY_STATES for b in BATCHES]:
            row = {"case": name, "keys": keys, "requests_per_call": size}
            for engine in ENGINES:
                if called == "sluice_floor" and engine == "module":
                    continue  # (the floor is a Lua function)
                cost, commands = run_case(r, proc.pid, codec, called, limits, size, engine,
                                          keys == "existing", use_callgrind)
                row[engine] = cost
                row[engine + "_commands"] = commands
            figures.append(row)
            digits = 0 if use_callgrind else 2
            text = f"{name:50} {keys:>8} {size:8d}"
            for engine in ENGINES:
                text += (f" {row[engine]:10.{digits}f}" if engine in row else f" {'-':>10}")
            if len(ENGINES) == 2:
                text += (f" {row['module'] / row['lua']:9.2f}x" if "module" in row
                         else f" {'-':>10}")
            for engine in ENGINES:
                text += (f" {row[engine + '_commands']:15.2f}" if engine in row
                         else f" {'-':>15}")
            lines.append(text)
            print(text, flush=True)
    stem = os.path.join(ROOT, "bench", "results",
                        "script-cost" + ("-callgrind" if use_callgrind else ""))
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump({"server": os.path.basename(server), "version": version,
                   "decisions_per_case": DECISIONS, "unit": unit, "engines": ENGINES,
                   "module": module, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "figures": figures}, f, indent=1)
    print(f"written to {stem}.txt and .json")


if __name__ == "__main__":
    main()
