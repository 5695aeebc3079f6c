#!/usr/bin/env bash
# Sluice benchmark: Sluice against a reference nginx reverse proxy, same upstream, same load.
# See bench/README.md. Everything runs on 127.0.0.1 and stops by itself.
#
#   bench/run.sh                      # full run: idle-connection memory, then throughput
#   bench/run.sh --mode throughput    # only wrk      (--mode idle: only the memory test)
#   BENCH_DURATION=30s BENCH_CONNECTIONS=100 bench/run.sh
#
# Settings (environment):
#   SLUICE_BIN               use this binary instead of building build-release/sluice
#   BENCH_DURATION=10s       wrk duration of one measured run
#   BENCH_CONNECTIONS=50     wrk connections
#   BENCH_THREADS=1          wrk threads
#   BENCH_WARMUP=3s          wrk warm-up per gateway before the measured runs (0 = none)
#   BENCH_ROUNDS=3           measured runs per gateway, alternating order; the median is reported
#   BENCH_IDLE_CONNECTIONS=5000  idle keep-alive connections for the memory test
#   BENCH_MODE=all           all | throughput | idle
#   BENCH_VARIANTS="nginx sluice"   gateways to compare (columns); see "Variants" in README.md
#   BENCH_REFERENCE=nginx    the variant the ratios are computed against
#   BENCH_PIN=0              1: gateways on CPU 1, wrk + upstream on CPU 0 (taskset)
#   BENCH_STRICT=0           1: exit 1 when a target is missed
#   BENCH_RESULTS_DIR=bench/results
set -Eeuo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")

DURATION=${BENCH_DURATION:-10s}
CONNECTIONS=${BENCH_CONNECTIONS:-50}
THREADS=${BENCH_THREADS:-1}
WARMUP=${BENCH_WARMUP:-3s}
ROUNDS=${BENCH_ROUNDS:-3}
IDLE_CONNECTIONS=${BENCH_IDLE_CONNECTIONS:-5000}
MODE=${BENCH_MODE:-all}
VARIANTS=${BENCH_VARIANTS:-nginx sluice}
REFERENCE=${BENCH_REFERENCE:-nginx}
PIN=${BENCH_PIN:-0}
STRICT=${BENCH_STRICT:-0}
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}

# Targets (Sluice against the reference nginx).
RPS_RATIO_MIN=0.9
P99_RATIO_MAX=1.2
IDLE_KIB_MAX=16

usage() { sed -n '2,/^set -E/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --mode) MODE=$2; shift 2 ;;
    --mode=*) MODE=${1#*=}; shift ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --variants=*) VARIANTS=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODE" in all|throughput|idle) ;; *) echo "BENCH_MODE must be all, throughput or idle" >&2; exit 2 ;; esac
[[ " $VARIANTS " == *" $REFERENCE "* ]] || { echo "the reference '$REFERENCE' must be one of the variants" >&2; exit 2; }

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "error: $*" >&2; exit 1; }

# "10s", "2m", "500ms" or "10" -> whole seconds (rounded up, at least 1).
seconds() {
  local d=$1
  case "$d" in
    *ms) echo $(( (${d%ms} + 999) / 1000 )) ;;
    *s) echo "${d%s}" ;;
    *m) echo $(( ${d%m} * 60 )) ;;
    *h) echo $(( ${d%h} * 3600 )) ;;
    *) echo "$d" ;;
  esac
}

# ------------------------------------------------------------------ 1. tools
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || die "python3 is needed"
HELPER=("$PY" "$BENCH_DIR/bench.py")
export PATH="$PATH:/usr/sbin:/sbin"

if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
  log "installing wrk and nginx-light"
  SUDO=()
  [[ $EUID -eq 0 ]] || SUDO=(sudo)
  "${SUDO[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y nginx-light wrk
  # The package starts the system nginx on port 80; this benchmark does not use it.
fi
command -v wrk >/dev/null || die "wrk not found"
command -v nginx >/dev/null || die "nginx not found"
TASKSET_GW=() TASKSET_CLIENT=()
if [[ $PIN == 1 ]]; then
  command -v taskset >/dev/null || die "BENCH_PIN=1 needs taskset (util-linux)"
  [[ $(nproc) -ge 2 ]] || die "BENCH_PIN=1 needs 2 CPUs"
  TASKSET_GW=(taskset -c 1) TASKSET_CLIENT=(taskset -c 0)
fi

# ------------------------------------------------------------------ 2. build
if [[ -n ${SLUICE_BIN:-} ]]; then
  [[ -x $SLUICE_BIN ]] || die "SLUICE_BIN=$SLUICE_BIN is not executable"
else
  mkdir -p "$RESULTS_DIR"
  BUILD_LOG=$RESULTS_DIR/build.log
  log "building Sluice (Release) in build-release (log: $BUILD_LOG)"
  if ! { cmake -S "$ROOT" -B "$ROOT/build-release" -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$ROOT/build-release" --target sluice -j2; } >"$BUILD_LOG" 2>&1; then
    tail -n 30 "$BUILD_LOG" >&2
    die "build failed (if another engineer is editing src/, retry in a minute)"
  fi
  warnings=$(grep -c 'warning:' "$BUILD_LOG" || true)
  [[ $warnings == 0 ]] || log "the build printed $warnings compiler warning(s), see $BUILD_LOG"
  SLUICE_BIN=$ROOT/build-release/sluice
fi
SLUICE_BIN=$(realpath "$SLUICE_BIN")

# ------------------------------------------------------------------ process bookkeeping
WORK=$(mktemp -d /tmp/sluice-bench.XXXXXX)
chmod 755 "$WORK"
STARTED=()                 # every PID this script started, in order
declare -A GW_PID GW_PORT GW_ADMIN GW_LOG GW_KIND GW_EXIT GW_STOP_S GW_CRASH

descendants() {  # PIDs of the children of $1, recursively
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}

alive() {  # running and not a zombie
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $st && $st != Z* ]]
}

# Stops one started process (and its children): $2 = signal, waits up to $3 seconds, then KILL.
stop_pid() {
  local pid=$1 sig=${2:-TERM} wait_s=${3:-5} kids i
  kids=$(descendants "$pid")
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_s * 10; i++)); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  for k in $kids; do alive "$k" && kill -KILL "$k" 2>/dev/null; done
  wait "$pid" 2>/dev/null || true
}

forget_pid() {  # a PID that exited and was reaped: never signal it again (PIDs get reused)
  local p keep=()
  for p in "${STARTED[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}

# Runs "$@" as a registered child and waits for it. Waiting with `wait` (rather than running
# in the foreground) lets a signal to this script run the traps at once.
run_child() {
  "$@" &
  local p=$! rc=0
  STARTED+=("$p")
  wait "$p" || rc=$?
  forget_pid "$p"
  return "$rc"
}

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  [[ $rc -eq 0 ]] || log "stopping (exit status $rc): cleaning up" >&2
  for pid in "${STARTED[@]}"; do
    alive "$pid" && stop_pid "$pid" TERM 5
  done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mapfile -t FREE < <("${HELPER[@]}" free-ports 12)
next_port() { PORT_OUT=${FREE[0]}; FREE=("${FREE[@]:1}"); }

SOFT_NOFILE=$(ulimit -Sn)
HARD_NOFILE=$(ulimit -Hn)
[[ $HARD_NOFILE == unlimited ]] && HARD_NOFILE=1048576
NOFILE=$(( HARD_NOFILE < 65536 ? HARD_NOFILE : 65536 ))
(( NOFILE >= 2 * IDLE_CONNECTIONS + 512 )) \
  || log "warning: open-file limit $NOFILE is low for $IDLE_CONNECTIONS idle connections"

# ------------------------------------------------------------------ 3. nginx configs
NGINX_USER=""
[[ $EUID -eq 0 ]] && NGINX_USER="user root root;"  # workers must reach the temp dirs
nginx_main() {  # $1 = directory of the instance
  local d=$1
  mkdir -p "$d"
  cat <<EOF
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile $NOFILE;
pid $d/nginx.pid;
error_log $d/error.log warn;
$NGINX_USER
events {
    worker_connections 20000;
    use epoll;
}
http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $d/client_body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
EOF
}

start_nginx() {  # $1 = name, $2 = config file; sets PID_OUT
  local d=$WORK/$1
  "${TASKSET_NGINX[@]}" nginx -p "$d" -c "$2" -e "$d/error.log" >"$d/stdout.log" 2>&1 &
  PID_OUT=$!
  STARTED+=("$PID_OUT")
}

start_upstream() {
  local d=$WORK/upstream
  mkdir -p "$d"
  next_port; UPSTREAM_PORT=$PORT_OUT
  next_port; UPSTREAM_STATUS_PORT=$PORT_OUT
  { nginx_main "$d"
    cat <<EOF
    server {
        listen 127.0.0.1:$UPSTREAM_PORT backlog=4096;
        location / { return 200 "ok"; }
    }
    server {  # accepted connections and requests, to see how gateways use the upstream
        listen 127.0.0.1:$UPSTREAM_STATUS_PORT;
        location / { stub_status; }
    }
}
EOF
  } >"$d/nginx.conf"
  TASKSET_NGINX=("${TASKSET_CLIENT[@]}")
  start_nginx upstream "$d/nginx.conf"
  UPSTREAM_PID=$PID_OUT
  "${HELPER[@]}" wait-http --port "$UPSTREAM_PORT" --pid "$UPSTREAM_PID" \
    || die "the upstream nginx did not start: $(cat "$d/error.log" 2>/dev/null)"
  log "upstream nginx  pid $UPSTREAM_PID  127.0.0.1:$UPSTREAM_PORT"
}

# ------------------------------------------------------------------ gateway variants
# A variant is a function variant_<name> (dashes become underscores) that starts one
# gateway proxying everything to 127.0.0.1:$UPSTREAM_PORT and sets:
#   GW_PID[name] GW_PORT[name] GW_LOG[name] GW_KIND[name]=nginx|sluice, GW_ADMIN[name] (or 0)
# It must register every process it starts in STARTED. To add a column (Sluice with a rate
# limit, Sluice over TLS, ...), write variant_<name> and add the name to BENCH_VARIANTS.

variant_nginx() {  # the reference: nginx as a keep-alive reverse proxy
  local name=$1 d=$WORK/$1
  mkdir -p "$d"
  next_port; local port=$PORT_OUT
  { nginx_main "$d"
    cat <<EOF
    upstream origin {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$port backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
        }
    }
}
EOF
  } >"$d/nginx.conf"
  TASKSET_NGINX=("${TASKSET_GW[@]}")
  start_nginx "$name" "$d/nginx.conf"
  GW_PID[$name]=$PID_OUT GW_PORT[$name]=$port GW_ADMIN[$name]=0 GW_KIND[$name]=nginx
  GW_LOG[$name]=$d/error.log
}

# $1 = port, $2 = admin port, $3 = extra lines of the route (e.g. 'limits = ["x"]').
# TOML on stdin ([valkey], [[limit]], ...) goes before the route.
sluice_config() {
  cat <<EOF
[server]
listen = "127.0.0.1:$1"
workers = 1

[admin]
listen = "127.0.0.1:$2"

[log]
level = "warn"
access_log = "off"

[[upstream]]
name = "origin"
endpoints = ["127.0.0.1:$UPSTREAM_PORT"]

EOF
  cat
  cat <<EOF

[[route]]
name = "all"
upstream = "origin"
${3:-}
EOF
}

start_sluice() {  # $1 = name, $2 = config file
  local d=$WORK/$1
  ( ulimit -n "$NOFILE"; exec "${TASKSET_GW[@]}" "$SLUICE_BIN" -c "$2" ) \
    >"$d/stdout.log" 2>"$d/stderr.log" &
  PID_OUT=$!
  STARTED+=("$PID_OUT")
}

variant_sluice() {  # Sluice, one worker, no limits (no Valkey needed)
  local name=$1 d=$WORK/$1
  mkdir -p "$d"
  next_port; local port=$PORT_OUT
  next_port; local admin=$PORT_OUT
  sluice_config "$port" "$admin" </dev/null >"$d/sluice.toml"
  "$SLUICE_BIN" --check-config -c "$d/sluice.toml" >"$d/check.log" 2>&1 \
    || die "Sluice refused its configuration: $(cat "$d/check.log")"
  start_sluice "$name" "$d/sluice.toml"
  GW_PID[$name]=$PID_OUT GW_PORT[$name]=$port GW_ADMIN[$name]=$admin GW_KIND[$name]=sluice
  GW_LOG[$name]=$d/stderr.log
}

start_variant() {
  local name=$1 fn=variant_${1//-/_}
  declare -F "$fn" >/dev/null || die "unknown variant '$name' (no function $fn in run.sh)"
  "$fn" "$name"
  "${HELPER[@]}" wait-http --port "${GW_PORT[$name]}" --pid "${GW_PID[$name]}" \
    || die "$name did not answer 200 \"ok\" on GET /: $(tail -n 20 "${GW_LOG[$name]}" 2>/dev/null)"
  log "$(printf '%-14s pid %-7s 127.0.0.1:%s' "$name" "${GW_PID[$name]}" "${GW_PORT[$name]}")"
}

check_alive() {  # $1 = variant, $2 = phase; records a crash
  local v=$1
  [[ -n ${GW_CRASH[$v]:-} ]] && return 1
  if ! alive "${GW_PID[$v]}"; then
    wait "${GW_PID[$v]}" 2>/dev/null && GW_EXIT[$v]=0 || GW_EXIT[$v]=$?
    forget_pid "${GW_PID[$v]}"
    GW_CRASH[$v]=$2
    log "!! $v (pid ${GW_PID[$v]}) is gone during $2 (exit status ${GW_EXIT[$v]})"
    return 1
  fi
}

# ------------------------------------------------------------------ run
OUT=$WORK/out
mkdir -p "$OUT"
RUN_DIR=$RESULTS_DIR/last-run
mkdir -p "$RESULTS_DIR"
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "Sluice binary: $SLUICE_BIN"
log "mode $MODE; variants: $VARIANTS; reference: $REFERENCE; $(nproc) CPU(s); load average $LOAD_START"
if awk -v l="${LOAD_START%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
  log "warning: the machine is busy (load average $LOAD_START): figures will be noisy"
fi

start_upstream
for v in $VARIANTS; do start_variant "$v"; done

run_wrk() {  # $1 = variant, $2 = duration, $3 = output file (text)
  local v=$1 secs
  secs=$(seconds "$2")
  run_child timeout --signal=INT --kill-after=10 $((secs + 30)) \
    "${TASKSET_CLIENT[@]}" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$2" --latency \
    -s "$BENCH_DIR/wrk_report.lua" "http://127.0.0.1:${GW_PORT[$v]}/" >"$3" 2>&1 || true
}

probe() {  # $1 = variant, $2 = output: CPU time of the gateway and the upstream, upstream counters
  "${HELPER[@]}" probe --pid "${GW_PID[$1]}" --upstream-pid "$UPSTREAM_PID" \
    --status-port "$UPSTREAM_STATUS_PORT" --out "$2" || true
}

# 5. Memory of idle keep-alive connections, on gateways that have only been warmed up briefly,
#    so the difference measured is the cost of the connections and not of reused heap.
if [[ $MODE == all || $MODE == idle ]]; then
  log "idle-connection memory test: $IDLE_CONNECTIONS keep-alive connections per gateway"
  for v in $VARIANTS; do
    check_alive "$v" "startup" || continue
    run_wrk "$v" 1s "$OUT/prewarm_$v.txt"
    check_alive "$v" "pre-warm" || continue
    # (the helper raises its own open-file limit to the hard limit)
    run_child "${HELPER[@]}" idle --name "$v" --port "${GW_PORT[$v]}" --pid "${GW_PID[$v]}" \
      --admin-port "${GW_ADMIN[$v]}" --count "$IDLE_CONNECTIONS" --out "$OUT/idle_$v.json" \
      || log "idle test of $v failed"
    check_alive "$v" "idle-connection test" || true
    if [[ -f $OUT/idle_$v.json ]]; then
      "$PY" - "$OUT/idle_$v.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
per = d.get("pss_kib_per_conn")
print(f"  {d['name']:<14} {d.get('still_open_at_measure')}/{d.get('target_connections')} open, "
      f"Pss {d['before']['pss_kib']} -> {(d.get('after') or {}).get('pss_kib')} KiB, "
      + (f"{per:.2f} KiB per connection" if per is not None else "no figure")
      + (f"; gateway reports {d['gateway_open_connections_metric']:.0f} open"
         if d.get("gateway_open_connections_metric") is not None else "")
      + (f", errors {d['errors']}" if d.get("errors") else ""))
EOF
    fi
  done
fi

# 4. Throughput and latency.
if [[ $MODE == all || $MODE == throughput ]]; then
  if [[ $(seconds "$WARMUP") != 0 ]]; then
    for v in $VARIANTS; do
      check_alive "$v" "warm-up" || continue
      log "warming up $v ($WARMUP)"
      run_wrk "$v" "$WARMUP" "$OUT/warmup_$v.txt"
    done
  fi
  read -r -a order <<<"$VARIANTS"
  for ((r = 1; r <= ROUNDS; r++)); do
    list=("${order[@]}")
    if ((r % 2 == 0)); then  # alternate the order so neither gateway always runs first
      list=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do list+=("${order[i]}"); done
    fi
    for v in "${list[@]}"; do
      check_alive "$v" "throughput round $r" || continue
      sleep 1
      probe "$v" "$OUT/probe_${v}_${r}_before.json"
      run_wrk "$v" "$DURATION" "$RUN_DIR/wrk_${v}_$r.txt"
      probe "$v" "$OUT/probe_${v}_${r}_after.json"
      "${HELPER[@]}" wrk-parse --in "$RUN_DIR/wrk_${v}_$r.txt" --out "$OUT/wrk_${v}_$r.json" \
        --before "$OUT/probe_${v}_${r}_before.json" --after "$OUT/probe_${v}_${r}_after.json" \
        --label "round $r/$ROUNDS $v" \
        || { log "wrk output for $v:"; cat "$RUN_DIR/wrk_${v}_$r.txt"; }
      grep -E "Non-2xx|Socket errors" "$RUN_DIR/wrk_${v}_$r.txt" | sed "s/^/    $v: /" || true
      check_alive "$v" "throughput round $r" || true
    done
  done
fi

# 6. Stop the gateways: SIGTERM (nginx: SIGQUIT, its graceful stop), record status and time.
for v in $VARIANTS; do
  pid=${GW_PID[$v]}
  [[ -n ${GW_CRASH[$v]:-} ]] && continue
  sig=TERM; [[ ${GW_KIND[$v]} == nginx ]] && sig=QUIT
  t0=$(date +%s%N)
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "!! $v did not exit within 15s of SIG$sig; killing it"
    stop_pid "$pid" KILL 2
    GW_EXIT[$v]=killed
  else
    status=0; wait "$pid" 2>/dev/null || status=$?
    GW_EXIT[$v]=$status
  fi
  forget_pid "$pid"
  GW_STOP_S[$v]=$(( ($(date +%s%N) - t0) / 1000000 ))  # milliseconds
done

# Logs and configs of this run, for inspection.
for v in $VARIANTS upstream; do
  for f in "$WORK/$v"/*.log "$WORK/$v"/*.conf "$WORK/$v"/*.toml; do
    if [[ -f $f ]]; then cp "$f" "$RUN_DIR/${v}_$(basename "$f")"; fi
  done
done
cp "$OUT"/*.json "$RUN_DIR/" 2>/dev/null || true

for v in $VARIANTS; do
  lines=0
  [[ -f ${GW_LOG[$v]} ]] && lines=$(grep -cv '^[[:space:]]*$' "${GW_LOG[$v]}" || true)
  "$PY" - "$OUT/extra_$v.json" <<EOF
import json, sys
exit_status = "${GW_EXIT[$v]:-}"
json.dump({
    "kind": "${GW_KIND[$v]}",
    "crashed": bool("${GW_CRASH[$v]:-}"),
    "crash_phase": "${GW_CRASH[$v]:-}" or None,
    "exit_status": int(exit_status) if exit_status.isdigit() else (exit_status or None),
    "stop_seconds": int("${GW_STOP_S[$v]:-0}" or 0) / 1000,
    "log_lines": int("${lines:-0}"),
    "log_file": "$RUN_DIR/${v}_$(basename "${GW_LOG[$v]}")",
}, open(sys.argv[1], "w"))
EOF
done

meta=$("$PY" - <<EOF
import json, subprocess
def out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None
print(json.dumps({
    "date": "$(date -Is)",
    "mode": "$MODE",
    "duration": "$DURATION", "connections": $CONNECTIONS, "threads": $THREADS,
    "warmup": "$WARMUP", "rounds": $ROUNDS, "idle_connections": $IDLE_CONNECTIONS,
    "variants": "$VARIANTS".split(), "reference": "$REFERENCE",
    "pinned": "$PIN" == "1", "cpus": $(nproc),
    "load_average_start": "$LOAD_START", "load_average_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
    "sluice_bin": "$SLUICE_BIN",
    "git_commit": out(["git", "-C", "$ROOT", "rev-parse", "--short", "HEAD"]),
    "nginx": (out(["sh", "-c", "nginx -v 2>&1"]) or "").replace("nginx version: ", ""),
    "wrk": (out(["sh", "-c", "wrk -v 2>&1 | head -n1"]) or "").split(" [")[0],
    "nofile": $NOFILE,
}))
EOF
)

"${HELPER[@]}" report --dir "$OUT" --variants "$VARIANTS" --reference "$REFERENCE" \
  --rounds "$([[ $MODE == idle ]] && echo 0 || echo "$ROUNDS")" --meta "$meta" \
  --rps-ratio-min "$RPS_RATIO_MIN" --p99-ratio-max "$P99_RATIO_MAX" --idle-kib-max "$IDLE_KIB_MAX" \
  --connections-hint "$(( CONNECTIONS > 64 ? CONNECTIONS : 64 ))" \
  --out "$RESULTS_DIR/latest.json"
echo "Raw wrk output, logs and configs: $RUN_DIR"

if [[ $STRICT == 1 ]] && grep -q '"overall": "FAIL"' "$RESULTS_DIR/latest.json"; then
  exit 1
fi
exit 0
