#!/usr/bin/env python3
"""What keys that end together cost Valkey's main thread, with and without the expiry spread.

200,000 keys of one fixed window of 20 s are written early in the window, then a client
probes Valkey with PING (one at a time) from 1 s before the window's end until the spread
is over (half the window) and a second more.
Two cases on one private server, one after the other:

- together: what the library wrote before the spread: every key `SET ... PXAT <window end>`,
  all in one millisecond;
- spread: the keys written by the library itself (the gateway's calls of 1,000 requests,
  through Sluice's codec), each with its random extra life of up to half the window.

Reported per case: the slowest PING across the end, how many PINGs took more than 5 and 25 ms,
and the expire-cycle events of Valkey's latency monitor (threshold 1 ms). The server is
REDIS_SERVER, else Valkey 8.0.1 built by ../shared/valkey/build.sh (~/.cache/valkey-8.0.1),
else the PATH's redis-server. Figures go to bench/results/expiry-storm.txt.

    /usr/bin/python3 bench/expiry_storm.py
"""

import os
import sys
import time

import sizing

KEYS = int(os.environ.get("STORM_KEYS", "200000"))
WINDOW_MS = 20_000


def client_ip(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def server_us(r) -> int:
    s, us = r.time()
    return s * 1_000_000 + us


def start_of_next_window(r) -> int:
    """Sleeps until 0.2 s into the next window; returns its end (us)."""
    now = server_us(r)
    window = WINDOW_MS * 1000
    start = (now // window + 1) * window + 200_000
    time.sleep((start - now) / 1e6)
    return (start // window + 1) * window


def write_together(r, _codec, end_us: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(KEYS):
        # The value a fixed window writes (window number, count), its expiry the window's end.
        pipe.set(f"rl:v2:probe:{{{client_ip(i)}}}", b"\x01\x00\x00\x00" + b"\x00" * 8,
                 pxat=end_us // 1000)
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()


def write_spread(r, codec, _end_us: int) -> None:
    limit = {"algorithm": "fixed_window", "limit": 1_000_000, "window_ms": WINDOW_MS}
    batches = [[[(f"rl:v2:probe:{{{client_ip(i)}}}", limit)]
                for i in range(b, min(b + 1000, KEYS))] for b in range(0, KEYS, 1000)]
    commands = codec.decide_commands(batches)
    codec.decide_call(r, commands[0])  # loads the library
    pipe = r.pipeline(transaction=False)
    for command in commands[1:]:
        pipe.execute_command(*command)
        if len(pipe) >= 20:
            pipe.execute()
    pipe.execute()


def run_case(r, codec, name: str, write) -> str:
    r.flushall()
    r.execute_command("LATENCY", "RESET")
    end_us = start_of_next_window(r)
    t0 = time.monotonic()
    write(r, codec, end_us)
    filled = time.monotonic() - t0
    assert server_us(r) < end_us, "the fill outlasted the window"
    assert r.dbsize() >= KEYS
    while server_us(r) < end_us - 1_000_000:
        time.sleep(0.05)
    pings = []
    while server_us(r) < end_us + (WINDOW_MS // 2 + 1000) * 1000:  # through the spread
        t = time.monotonic()
        r.ping()
        pings.append((time.monotonic() - t) * 1000)
    left = r.dbsize()
    events = [ms for _, ms in r.execute_command("LATENCY", "HISTORY", "expire-cycle")]
    return (f"{name:9} filled in {filled:4.1f} s, {len(pings)} PINGs across the end: slowest "
            f"{max(pings):5.1f} ms, > 5 ms {sum(p > 5 for p in pings)}, > 25 ms "
            f"{sum(p > 25 for p in pings)}; expire-cycle events (ms) {sorted(events)[-5:]} "
            f"of {len(events)}; keys left {left}")


def main():
    built = os.path.expanduser("~/.cache/valkey-8.0.1/valkey-server")
    if not os.environ.get("REDIS_SERVER") and os.path.exists(built):
        os.environ["REDIS_SERVER"] = built
    codec = sizing.use_codec()
    lines = []
    with sizing.private_server() as (r, _, server):
        r.config_set("latency-monitor-threshold", 1)
        info = r.info("server")
        version = info.get("valkey_version") or info.get("redis_version")
        lines.append(f"{KEYS} keys of one {WINDOW_MS // 1000} s fixed window; server {server} "
                     f"{version}; load average {os.getloadavg()[0]:.1f} at the start")
        for name, write in (("together", write_together), ("spread", write_spread)):
            lines.append(run_case(r, codec, name, write))
            print(lines[-1], flush=True)
    out = os.path.join(sizing.ROOT, "bench", "results", "expiry-storm.txt")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written to {out}")


if __name__ == "__main__":
    sys.exit(main())
