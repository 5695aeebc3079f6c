#!/usr/bin/env bash
# Sluice soak test: a fixed, moderate load for a long time (default 10 minutes) on a
# rate-limited route whose limits fail open (on_error = "allow"), while the Valkey server
# (redis-server stands in) is stopped with SIGTERM and started again on the same port every
# minute. Every 10 s it prints the requests done, the non-2xx answers (429, 503, other), the
# client errors, latency, Sluice's RSS, its open file descriptors and connections, and
# sluice_valkey_reconnects_total; at the end a summary (RSS at start/end/max and whether it
# drifted, total errors, reconnects). See bench/README.md. Everything runs on 127.0.0.1 and
# stops by itself.
#
#   bench/soak.sh                       # 10 minutes
#   SOAK_DURATION=120 bench/soak.sh     # 2 minutes
#
# Settings (environment):
#   SLUICE_BIN               use this binary instead of building build-release/sluice
#   SOAK_DURATION=600        seconds of load (also "10m", "90s")
#   SOAK_RATE=2000           requests per second (fixed rate, Python load generator)
#   SOAK_CONNECTIONS=20      keep-alive client connections
#   SOAK_CLIENTS=10000       distinct X-Client header values (keys of the per_client limit)
#   SOAK_INTERVAL=10         seconds between two lines of the table
#   SOAK_RESTART_EVERY=60    seconds between two Valkey restarts (0: never)
#   SOAK_VALKEY_DOWNTIME=1   seconds Valkey stays down after it exited, before it starts again
#   SOAK_WORKERS=2           Sluice workers (event loops), each with its Valkey connection
#   SOAK_STRICT=0            1: exit 1 on errors, non-2xx answers, RSS drift or a crash
#   SOAK_RESULTS_DIR=bench/results   soak-latest.txt (the table), soak-latest.json, soak-run/
set -Eeuo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
# shellcheck source=bench/procs.sh
. "$BENCH_DIR/procs.sh"

DURATION=${SOAK_DURATION:-600}
RATE=${SOAK_RATE:-2000}
CONNECTIONS=${SOAK_CONNECTIONS:-20}
CLIENTS=${SOAK_CLIENTS:-10000}
INTERVAL=${SOAK_INTERVAL:-10}
RESTART_EVERY=${SOAK_RESTART_EVERY:-60}
DOWNTIME=${SOAK_VALKEY_DOWNTIME:-1}
WORKERS=${SOAK_WORKERS:-2}
STRICT=${SOAK_STRICT:-0}
RESULTS_DIR=${SOAK_RESULTS_DIR:-$BENCH_DIR/results}

case "${1:-}" in
  -h|--help) sed -n '2,/^set -E/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

log() { printf '[soak %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "error: $*" >&2; exit 1; }

seconds() {  # "10m", "90s", "600" -> whole seconds
  local d=$1
  case "$d" in
    *ms) echo $(( (${d%ms} + 999) / 1000 )) ;;
    *s) echo "${d%s}" ;;
    *m) echo $(( ${d%m} * 60 )) ;;
    *h) echo $(( ${d%h} * 3600 )) ;;
    *) echo "$d" ;;
  esac
}
DURATION=$(seconds "$DURATION")
[[ $DURATION =~ ^[0-9]+$ && $DURATION -gt 0 ]] || die "SOAK_DURATION must be a positive duration"

# ------------------------------------------------------------------ tools
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || die "python3 is needed"
HELPER=("$PY" "$BENCH_DIR/bench.py")
export PATH="$PATH:/usr/sbin:/sbin"
APT=()
command -v nginx >/dev/null || APT+=(nginx-light)
command -v valkey-server >/dev/null || command -v redis-server >/dev/null || APT+=(redis-server)
if ((${#APT[@]})); then
  log "installing ${APT[*]}"
  SUDO=()
  [[ $EUID -eq 0 ]] || SUDO=(sudo)
  "${SUDO[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y "${APT[@]}"
fi
VALKEY_BIN=$(command -v valkey-server || command -v redis-server) || die "no valkey-server"

build_sluice

# ------------------------------------------------------------------ process bookkeeping
WORK=$(mktemp -d /tmp/sluice-soak.XXXXXX)
chmod 755 "$WORK"
VALKEY_PIDFILE=$WORK/valkey.pid   # the Valkey the load generator started last

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  [[ $rc -eq 0 ]] || log "stopping (exit status $rc): cleaning up" >&2
  stop_started
  # A Valkey the load generator started and could not stop (it was killed): only if it is
  # still that server on that port.
  if [[ -s $VALKEY_PIDFILE ]]; then
    pid=$(cat "$VALKEY_PIDFILE")
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--port $VALKEY_PORT "; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mapfile -t FREE < <("${HELPER[@]}" free-ports 5)
UPSTREAM_PORT=${FREE[0]} VALKEY_PORT=${FREE[1]} PORT=${FREE[2]} ADMIN_PORT=${FREE[3]}
NGINX_USER=""
[[ $EUID -eq 0 ]] && NGINX_USER="user root root;"

# ------------------------------------------------------------------ upstream, Valkey, Sluice
d=$WORK/upstream
mkdir -p "$d"
cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
$NGINX_USER
events { worker_connections 4096; }
http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $d/client_body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$UPSTREAM_PORT backlog=4096;
        location / { return 200 "ok"; }
    }
}
EOF
nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" >"$d/stdout.log" 2>&1 &
UPSTREAM_PID=$!
STARTED+=("$UPSTREAM_PID")
"${HELPER[@]}" wait-http --port "$UPSTREAM_PORT" --pid "$UPSTREAM_PID" || die "upstream nginx did not start"

mkdir -p "$WORK/valkey"
# The same command line starts it again after every restart (bench.py soak).
VALKEY_ARGV=("$VALKEY_BIN" --bind 127.0.0.1 --port "$VALKEY_PORT" --save '' --appendonly no
             --dir "$WORK/valkey" --logfile "$WORK/valkey/valkey.log" --daemonize no)
"${VALKEY_ARGV[@]}" >/dev/null 2>&1 &
VALKEY_PID=$!
STARTED+=("$VALKEY_PID")
"${HELPER[@]}" wait-valkey --port "$VALKEY_PORT" --pid "$VALKEY_PID" || die "Valkey did not start"

d=$WORK/sluice
mkdir -p "$d"
cat >"$d/sluice.toml" <<EOF
[server]
listen = "127.0.0.1:$PORT"
workers = $WORKERS

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[log]
level = "warn"
access_log = "off"

[valkey]
address = "127.0.0.1:$VALKEY_PORT"

[[upstream]]
name = "origin"
endpoints = ["127.0.0.1:$UPSTREAM_PORT"]

# Two limits decided in one script; neither ever refuses. Valkey down: requests go through.
[[limit]]
name = "per_ip"
algorithm = "fixed_window"
by = ["ip"]
limit = 1000000000
window = "1h"
on_error = "allow"

[[limit]]
name = "per_client"
algorithm = "sliding_window"
by = ["header:X-Client"]
limit = 1000000000
window = "1m"
on_error = "allow"

[[route]]
name = "api"
match = { path_prefix = "/api/" }
upstream = "origin"
limits = ["per_ip", "per_client"]

[[route]]
name = "all"
upstream = "origin"
EOF
"$SLUICE_BIN" --check-config -c "$d/sluice.toml" >"$d/check.log" 2>&1 \
  || die "Sluice refused its configuration: $(cat "$d/check.log")"
NOFILE=$(ulimit -Hn); [[ $NOFILE == unlimited || $NOFILE -gt 65536 ]] && NOFILE=65536
( ulimit -n "$NOFILE"; exec "$SLUICE_BIN" -c "$d/sluice.toml" ) >"$d/stdout.log" 2>"$d/stderr.log" &
SLUICE_PID=$!
STARTED+=("$SLUICE_PID")
"${HELPER[@]}" wait-http --port "$PORT" --pid "$SLUICE_PID" \
  || die "Sluice did not start: $(tail -n 20 "$d/stderr.log")"
"${HELPER[@]}" wait-http --port "$ADMIN_PORT" --path /ready --any-body --pid "$SLUICE_PID" \
  || die "Sluice is not ready (every worker connected to Valkey): $(tail -n 20 "$d/stderr.log")"

log "Sluice $SLUICE_BIN pid $SLUICE_PID (127.0.0.1:$PORT, $WORKERS workers); Valkey $(basename "$VALKEY_BIN") pid $VALKEY_PID (127.0.0.1:$VALKEY_PORT); upstream nginx pid $UPSTREAM_PID"
log "$(nproc) CPU(s), load average $(cut -d' ' -f1-3 /proc/loadavg); $DURATION s at $RATE req/s"

# ------------------------------------------------------------------ the soak
mkdir -p "$RESULTS_DIR"
RUN_DIR=$RESULTS_DIR/soak-run
rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR"
strict=(); [[ $STRICT == 1 ]] && strict=(--strict)
soak_rc=0
run_child timeout --signal=TERM --kill-after=20 $((DURATION + 120)) \
  "${HELPER[@]}" soak --port "$PORT" --admin-port "$ADMIN_PORT" --sluice-pid "$SLUICE_PID" \
  --workers "$WORKERS" --valkey-pid "$VALKEY_PID" \
  --valkey-argv "$("$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${VALKEY_ARGV[@]}")" \
  --valkey-pidfile "$VALKEY_PIDFILE" --duration "$DURATION" --rate "$RATE" \
  --connections "$CONNECTIONS" --clients "$CLIENTS" --interval "$INTERVAL" \
  --restart-every "$RESTART_EVERY" --valkey-downtime "$DOWNTIME" "${strict[@]}" \
  --out "$RESULTS_DIR/soak-latest.json" --table "$RESULTS_DIR/soak-latest.txt" || soak_rc=$?
# The load generator stopped (SIGTERM) the first Valkey and owns the ones it started.
forget_pid "$VALKEY_PID"

# ------------------------------------------------------------------ stop Sluice, report
exit_note=""
if alive "$SLUICE_PID"; then
  t0=$(date +%s%N)
  kill -TERM "$SLUICE_PID"
  for ((i = 0; i < 150; i++)); do alive "$SLUICE_PID" || break; sleep 0.1; done
  if alive "$SLUICE_PID"; then
    stop_pid "$SLUICE_PID" KILL 2
    exit_note="did not exit within 15 s of SIGTERM (killed)"
  else
    st=0; wait "$SLUICE_PID" 2>/dev/null || st=$?
    exit_note="exit status $st after SIGTERM, in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  fi
else
  st=0; wait "$SLUICE_PID" 2>/dev/null || st=$?
  exit_note="DIED during the soak (exit status $st)"
fi
forget_pid "$SLUICE_PID"
lines=$(grep -cv '^[[:space:]]*$' "$d/stderr.log" || true)
{
  echo "  Sluice: $exit_note; $lines line(s) on stderr (level warn), by message:"
  sed -E 's/^[^]]*\] *//; s/[0-9]+(\.[0-9]+)?(ms|s)?/N/g' "$d/stderr.log" | sort | uniq -c | sort -rn | head -n 8 \
    | sed 's/^/    /'
} | tee -a "$RESULTS_DIR/soak-latest.txt"
cp "$d/sluice.toml" "$d/stderr.log" "$RUN_DIR/" 2>/dev/null || true
cp "$WORK/valkey/valkey.log" "$RUN_DIR/" 2>/dev/null || true
"$PY" - "$RESULTS_DIR/soak-latest.json" "$exit_note" "$lines" <<'EOF'
import json, sys
path, note, lines = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0)
try:
    d = json.load(open(path))
except (OSError, ValueError):
    sys.exit(0)
d["sluice_stop"] = note
d["sluice_stderr_lines"] = lines
json.dump(d, open(path, "w"), indent=1)
EOF
echo "Table: $RESULTS_DIR/soak-latest.txt; JSON: $RESULTS_DIR/soak-latest.json; logs: $RUN_DIR"
[[ $STRICT == 1 && ( $soak_rc != 0 || $exit_note != "exit status 0"* ) ]] && exit 1
exit 0
