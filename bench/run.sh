#!/usr/bin/env bash
# Sluice benchmark: Sluice against a reference nginx reverse proxy, same upstream, same load.
# See bench/README.md. Everything runs on 127.0.0.1 and stops by itself.
#
#   bench/run.sh                      # full run: idle-connection memory, keep-alive throughput,
#                                     # then new TLS connections per second
#   bench/run.sh --mode throughput    # only wrk keep-alive  (--mode idle: only the memory test;
#                                     # --mode handshake: only new TLS connections)
#   bench/run.sh --mode mix           # the traffic mix (bench/mix.lua): many addresses, API keys
#                                     # and tenants, every algorithm; see bench/mix.sh
#   bench/run.sh --mode mix-cluster   # the mix against one Valkey node and a three-primary
#                                     # Valkey Cluster, side by side; see bench/cluster.sh
#   bench/run.sh --mode h2            # HTTP/2 (h2c, prior knowledge): h2load against nginx
#                                     # `listen http2` and Sluice, idle h2c memory; see bench/h2.sh
#   bench/run.sh --mode h2-upstream   # the plain proxy with an h2c upstream against the same
#                                     # with an HTTP/1.1 upstream (wrk and h2load), and the memory
#                                     # of idle pooled upstream connections; see bench/h2_upstream.sh
#   bench/run.sh --mode grpc          # unary gRPC calls: h2load against nginx grpc_pass and
#                                     # Sluice, h2c both sides; see bench/grpc.sh
#   bench/run.sh --mode rls           # Sluice as Envoy's rate limit service: the mix as
#                                     # ShouldRateLimit calls (bench/rls_load.c) against the
#                                     # same mix through the gateway, both engines; see bench/rls.sh
#   bench/run.sh --variants "nginx sluice sluice+limit"
#   BENCH_DURATION=30s BENCH_CONNECTIONS=100 bench/run.sh
#
# Settings (environment):
#   SLUICE_BIN               use this binary instead of building build-release/sluice
#   BENCH_VALKEY_MODULE      the Valkey module every Valkey loads (default: sluice-valkey.so
#                            beside SLUICE_BIN); the +module variants decide with it
#   BENCH_DURATION=10s       wrk duration of one measured run
#   BENCH_CONNECTIONS=50     wrk connections
#   BENCH_CAPACITY_CONNECTIONS=200  wrk connections of the capacity rounds: plain Sluice and
#                            Sluice with limits again, each saturated (its worker always busy),
#                            where the cost of rate limiting in requests/s is judged (0: skip)
#   BENCH_THREADS=1          wrk threads
#   BENCH_WARMUP=3s          wrk warm-up per gateway before the measured runs (0 = none)
#   BENCH_ROUNDS=3           measured runs per gateway, alternating order; the median is reported
#                            (--mode mix-cluster: 5)
#   BENCH_IDLE_CONNECTIONS=5000  idle keep-alive connections for the memory test (--mode h2:
#                            BENCH_H2_IDLE_CONNECTIONS, 2000 idle h2c connections)
#   BENCH_H2_SHAPES="c10m10 c50m1"  --mode h2: h2load load shapes, cNmM = -cN -mM (-t1)
#   BENCH_H2UP_SHAPES=c10m10 --mode h2-upstream: its h2load shapes
#   BENCH_H2UP_POOL_ENDPOINTS=500  --mode h2-upstream: endpoints (pooled connections) of the
#                            idle pooled connection test (0: skip it)
#   BENCH_H2UP_SPREAD_STREAMS=25  --mode h2-upstream: max_concurrent_streams of the
#                            sluice-h2c-spread variant
#   BENCH_GRPC_SHAPES="c10m10 c50m1"  --mode grpc: its h2load shapes
#   BENCH_MODE=all           all | throughput | idle | handshake | mix | mix-cluster | h2 |
#                            h2-upstream | grpc | rls
#   BENCH_RLS_CONNECTIONS=5 BENCH_RLS_STREAMS=10  --mode rls: h2c connections of the calls, and
#                            calls in flight on each
#   BENCH_RLS_CALLS=200000   --mode rls: distinct calls, cycled
#   BENCH_VARIANTS="nginx sluice sluice+limit nginx-tls sluice-tls"
#                            gateways to compare (columns); see "Variants" in README.md
#                            (--mode mix: "nginx sluice sluice+mix sluice+mix:fixed_window
#                            sluice+mix:sliding_window sluice+mix:token_bucket
#                            sluice+mix:sliding_log sluice+limit"; --mode mix-cluster:
#                            "sluice+mix sluice+mix@cluster", and any sluice+mix:ALGO@cluster;
#                            --mode h2: "nginx-h2 sluice sluice+limit sluice+mix";
#                            --mode h2-upstream: "sluice sluice-h2c"; --mode grpc:
#                            "nginx-grpc sluice sluice+mix")
#   BENCH_MIX_ADDRESSES=100000 BENCH_MIX_KEYS=5000 BENCH_MIX_TENANT_KEYS=1000
#   BENCH_MIX_TENANTS=100 BENCH_MIX_SEED=1  the mix: client addresses, API keys, keys of
#                            tenants in Valkey, tenants, random seed (see bench/mix.sh)
#   BENCH_MIX_ONE_KEY=sluice+limit  variants of --mode mix driven by wrk's one static request
#   BENCH_VALKEY_SERVER      the server for the variants with limits (default: valkey-server
#                            on the PATH, else redis-server)
#   BENCH_VALKEY_CLI         --mode mix-cluster: the client that creates the cluster (default:
#                            valkey-cli or redis-cli beside the server, else on the PATH)
#   BENCH_CLUSTER_PRIMARIES=3  --mode mix-cluster: primaries of the cluster (no replicas)
#   BENCH_CLUSTER_KEY_PREFIX=rl:v1  --mode mix-cluster: key_prefix of the @cluster variants
#                            (without a hash tag keys spread over the slots; "{rl}:v1" for a
#                            Sluice that demands a tag in cluster mode: all in one slot)
#   BENCH_IDLE_VARIANTS=     variants of the idle-connection memory test (default: all of them)
#   BENCH_REFERENCE=nginx    the variant plain Sluice is compared with (sluice+limit is compared
#                            with sluice, sluice-tls with nginx-tls; --mode mix-cluster:
#                            sluice+mix, unused; --mode h2-upstream: sluice; --mode grpc:
#                            nginx-grpc)
#   BENCH_HANDSHAKE_DURATION=$BENCH_DURATION   one measured run of new TLS connections
#   BENCH_HANDSHAKE_CONNECTIONS=$BENCH_CONNECTIONS  concurrent connections of that run
#   BENCH_HANDSHAKE_TOOL=wrk wrk (-H "Connection: close", session reuse disabled) | s_time
#                            (openssl s_time -new, BENCH_HANDSHAKE_CLIENTS processes, handshakes
#                            without a request)
#   BENCH_TLS_KEY=ec         certificate key: ec (ECDSA P-256) | rsa (RSA 2048)
#   BENCH_MONITOR_DURATION=3s  extra run of each variant with limits, watched with Valkey
#                            MONITOR, to count the commands Sluice sends per request
#   BENCH_IDLE_CYCLES=3      open/measure/close cycles of the idle-connection test
#   BENCH_PIN=0              1: gateways on CPU 1, wrk + upstream + Valkey on the other CPUs
#                            (taskset; CPU 0 on a machine of two)
#   BENCH_MINUTE_GUARD=0     1 (default of --mode mix-cluster): no measured keep-alive run spans
#                            a minute boundary, where the mix's one-minute keys all expire (the
#                            run waits until 2 s past it)
#   BENCH_STRICT=0           1: exit 1 when a target is missed
#   BENCH_RESULTS_DIR=bench/results
#   BENCH_GIT_COMMIT         the commit the report names (default: the checkout's HEAD; for a
#                            binary built elsewhere, or bench scripts run from a copy)
set -Eeuo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
# shellcheck source=bench/procs.sh
. "$BENCH_DIR/procs.sh"

DURATION=${BENCH_DURATION:-10s}
CONNECTIONS=${BENCH_CONNECTIONS:-50}
CAPACITY_CONNECTIONS=${BENCH_CAPACITY_CONNECTIONS:-200}
THREADS=${BENCH_THREADS:-1}
WARMUP=${BENCH_WARMUP:-3s}
ROUNDS=${BENCH_ROUNDS:-3}
IDLE_CONNECTIONS=${BENCH_IDLE_CONNECTIONS:-5000}
MODE=${BENCH_MODE:-all}
VARIANTS=${BENCH_VARIANTS:-}
IDLE_VARIANTS=${BENCH_IDLE_VARIANTS:-}
REFERENCE=${BENCH_REFERENCE:-}
HANDSHAKE_DURATION=${BENCH_HANDSHAKE_DURATION:-}
HANDSHAKE_CONNECTIONS=${BENCH_HANDSHAKE_CONNECTIONS:-}
HANDSHAKE_TOOL=${BENCH_HANDSHAKE_TOOL:-wrk}
HANDSHAKE_CLIENTS=${BENCH_HANDSHAKE_CLIENTS:-8}
MONITOR_DURATION=${BENCH_MONITOR_DURATION:-3s}
IDLE_CYCLES=${BENCH_IDLE_CYCLES:-3}
TLS_KEY=${BENCH_TLS_KEY:-ec}
PIN=${BENCH_PIN:-0}
STRICT=${BENCH_STRICT:-0}
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}

# Targets (Sluice against the reference nginx).
RPS_RATIO_MIN=0.9          # sluice / nginx and sluice-tls / nginx-tls, keep-alive requests/s
P99_RATIO_MAX=1.2          # the same pairs, p99 latency
IDLE_KIB_MAX=16            # Sluice (plain HTTP), Pss per idle keep-alive connection
LIMIT_RPS_RATIO_MIN=0.85   # sluice+limit / sluice, requests/s at capacity (rate limiting costs <= 15%)
HANDSHAKE_RATIO_MIN=0.9    # sluice-tls / nginx-tls, new TLS connections (full handshakes) per second

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
case "$MODE" in all|throughput|idle|handshake|mix|mix-cluster|h2|h2-upstream|grpc|rls) ;;
  *) echo "BENCH_MODE must be all, throughput, idle, handshake, mix, mix-cluster, h2, h2-upstream, grpc or rls" >&2
     exit 2 ;;
esac
MIX_MODE=0  # the modes of the traffic mix: mix, mix-cluster, rls
[[ $MODE == mix || $MODE == mix-cluster || $MODE == rls ]] && MIX_MODE=1
# shellcheck source=bench/mix.sh
. "$BENCH_DIR/mix.sh"
# shellcheck source=bench/rls.sh
. "$BENCH_DIR/rls.sh"
# shellcheck source=bench/cluster.sh
. "$BENCH_DIR/cluster.sh"
# shellcheck source=bench/h2.sh
. "$BENCH_DIR/h2.sh"
# shellcheck source=bench/h2_upstream.sh
. "$BENCH_DIR/h2_upstream.sh"
[[ $MODE != h2-upstream ]] || H2_SHAPES=$H2UP_SHAPES
# shellcheck source=bench/grpc.sh
. "$BENCH_DIR/grpc.sh"
[[ $MODE != grpc ]] || H2_SHAPES=$GRPC_SHAPES
# The modes whose clients are h2load alone, one client address and one API key (the mix's
# limits raised for them: see mix_limit_toml).
H2_CLIENTS=0
[[ $MODE == h2 || $MODE == grpc ]] && H2_CLIENTS=1
if [[ -z $VARIANTS ]]; then
  VARIANTS="nginx sluice sluice+limit nginx-tls sluice-tls"
  [[ $MODE == mix ]] && VARIANTS=$MIX_VARIANTS
  [[ $MODE == mix-cluster ]] && VARIANTS=$CLUSTER_VARIANTS
  [[ $MODE == h2 ]] && VARIANTS=$H2_VARIANTS
  [[ $MODE == h2-upstream ]] && VARIANTS=$H2UP_VARIANTS
  [[ $MODE == grpc ]] && VARIANTS=$GRPC_VARIANTS
  [[ $MODE == rls ]] && VARIANTS=$RLS_VARIANTS
fi
if [[ -z $REFERENCE ]]; then
  REFERENCE=nginx
  [[ $MODE == mix-cluster ]] && REFERENCE=${VARIANTS%% *}
  [[ $MODE == h2 ]] && REFERENCE=nginx-h2
  [[ $MODE == h2-upstream ]] && REFERENCE=sluice
  [[ $MODE == grpc ]] && REFERENCE=nginx-grpc
  [[ $MODE == rls ]] && REFERENCE=sluice
fi
[[ $MODE == h2 ]] && IDLE_CONNECTIONS=$H2_IDLE_CONNECTIONS
[[ $MODE == mix-cluster && -z ${BENCH_ROUNDS:-} ]] && ROUNDS=5
MINUTE_GUARD=${BENCH_MINUTE_GUARD:-$([[ $MODE == mix-cluster ]] && echo 1 || echo 0)}
case "$TLS_KEY" in ec|rsa) ;; *) echo "BENCH_TLS_KEY must be ec or rsa" >&2; exit 2 ;; esac
case "$HANDSHAKE_TOOL" in wrk|s_time) ;; *) echo "BENCH_HANDSHAKE_TOOL must be wrk or s_time" >&2; exit 2 ;; esac
[[ " $VARIANTS " == *" $REFERENCE "* ]] || { echo "the reference '$REFERENCE' must be one of the variants" >&2; exit 2; }
IDLE_VARIANTS=${IDLE_VARIANTS:-$VARIANTS}
for v in $IDLE_VARIANTS; do
  [[ " $VARIANTS " == *" $v "* ]] || { echo "idle variant '$v' is not in BENCH_VARIANTS" >&2; exit 2; }
done
HANDSHAKE_DURATION=${HANDSHAKE_DURATION:-$DURATION}
HANDSHAKE_CONNECTIONS=${HANDSHAKE_CONNECTIONS:-$CONNECTIONS}
needs() {  # $1 = glob on variant names: is one of them asked for?
  local v; for v in $VARIANTS; do [[ $v == $1 ]] && return 0; done; return 1
}

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

APT=()
command -v wrk >/dev/null || APT+=(wrk)
[[ $MODE != h2* && $MODE != grpc ]] || command -v h2load >/dev/null || APT+=(nghttp2-client)
[[ $MODE != grpc ]] || "$PY" -c "import h2" 2>/dev/null || APT+=(python3-h2)
command -v nginx >/dev/null || APT+=(nginx-light)  # nginx-light has the ssl module
! needs '*h2o*' || command -v h2o >/dev/null || APT+=(h2o)
if [[ $MODE == rls ]]; then  # bench/rls_load.c is built here
  command -v cc >/dev/null || APT+=(gcc libc6-dev)
  [[ -f /usr/include/nghttp2/nghttp2.h ]] || APT+=(libnghttp2-dev)
fi
if { needs '*limit*' || needs '*mix*'; } && [[ -z ${BENCH_VALKEY_SERVER:-} ]] &&
   ! command -v valkey-server >/dev/null && ! command -v redis-server >/dev/null; then
  APT+=(redis-server)
fi
if needs '*tls*'; then
  command -v openssl >/dev/null || APT+=(openssl)
  [[ $HANDSHAKE_TOOL != wrk ]] || command -v cc >/dev/null || APT+=(gcc libc6-dev)
fi
if ((${#APT[@]})); then
  log "installing ${APT[*]}"
  SUDO=()
  [[ $EUID -eq 0 ]] || SUDO=(sudo)
  "${SUDO[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y "${APT[@]}"
  # The packages start the system nginx and h2o (port 80) and redis-server (6379); the benchmark
  # uses neither: it starts its own on free ports.
fi
command -v wrk >/dev/null || die "wrk not found"
command -v nginx >/dev/null || die "nginx not found"
[[ $MODE != h2* && $MODE != grpc ]] || command -v h2load >/dev/null || die "h2load not found (nghttp2-client)"
! needs '*h2o*' || command -v h2o >/dev/null || die "h2o not found (package h2o)"
TASKSET_GW=() TASKSET_CLIENT=()
if [[ $PIN == 1 ]]; then
  command -v taskset >/dev/null || die "BENCH_PIN=1 needs taskset (util-linux)"
  cpus=$(nproc)
  ((cpus >= 2)) || die "BENCH_PIN=1 needs 2 CPUs"
  # The gateway (one worker) alone on CPU 1; the load, the origin and Valkey on every other
  # CPU (0, and 2 and up where there are more): with 4 or more, the gateway sets the pace.
  others=0
  ((cpus == 2)) || others="0,2-$((cpus - 1))"
  TASKSET_GW=(taskset -c 1) TASKSET_CLIENT=(taskset -c "$others")
fi

# ------------------------------------------------------------------ 2. build
build_sluice

# ------------------------------------------------------------------ process bookkeeping
WORK=$(mktemp -d /tmp/sluice-bench.XXXXXX)
chmod 755 "$WORK"
declare -A GW_PID GW_PORT GW_ADMIN GW_LOG GW_KIND GW_EXIT GW_STOP_S GW_CRASH
declare -A GW_TLS GW_VALKEY GW_RESUMED_LOG   # 1 = HTTPS listener; 1 = uses Valkey; nginx log
declare -A GW_SCRIPT                         # wrk script (default: wrk_report.lua)
declare -A GW_CLUSTER GW_KEY_PREFIX          # 1 = uses the Valkey Cluster; its key_prefix
declare -A GW_ORIGIN_PID GW_ORIGIN_STATUS     # its origin when not the upstream nginx (pid; 0)

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ $rc -eq 0 ]] || log "stopping (exit status $rc): cleaning up" >&2
  stop_started
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mapfile -t FREE < <("${HELPER[@]}" free-ports 32)
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
EOF
    [[ $MODE != h2-upstream ]] || h2up_origin_server
    [[ $MODE != grpc ]] || grpc_origin_server "$d"
    echo "}"
  } >"$d/nginx.conf"
  TASKSET_NGINX=("${TASKSET_CLIENT[@]}")
  start_nginx upstream "$d/nginx.conf"
  UPSTREAM_PID=$PID_OUT
  "${HELPER[@]}" wait-http --port "$UPSTREAM_PORT" --pid "$UPSTREAM_PID" \
    || die "the upstream nginx did not start: $(cat "$d/error.log" 2>/dev/null)"
  log "upstream nginx  pid $UPSTREAM_PID  127.0.0.1:$UPSTREAM_PORT"
}

# ------------------------------------------------------------------ shared pieces, on demand
VALKEY_PORT=0 VALKEY_PID=0 VALKEY_BIN=""
ensure_valkey() {  # one Valkey (redis-server stands in) for every variant with limits
  [[ $VALKEY_PORT == 0 ]] || return 0
  local d=$WORK/valkey
  mkdir -p "$d"
  VALKEY_BIN=${BENCH_VALKEY_SERVER:-$(command -v valkey-server || command -v redis-server)} \
    || die "valkey-server or redis-server is needed for the rate-limit variants"
  next_port; VALKEY_PORT=$PORT_OUT
  "${TASKSET_CLIENT[@]}" "$VALKEY_BIN" --bind 127.0.0.1 --port "$VALKEY_PORT" --save '' \
    --appendonly no "${VALKEY_MODULE_ARGS[@]}" --dir "$d" --logfile "$d/valkey.log" --daemonize no >"$d/stdout.log" 2>&1 &
  VALKEY_PID=$!
  STARTED+=("$VALKEY_PID")
  "${HELPER[@]}" wait-valkey --port "$VALKEY_PORT" --pid "$VALKEY_PID" \
    || die "$VALKEY_BIN did not start: $(tail -n 5 "$d/valkey.log" 2>/dev/null)"
  log "valkey ($(basename "$VALKEY_BIN")) pid $VALKEY_PID  127.0.0.1:$VALKEY_PORT"
}

TLS_CERT="" TLS_KEYFILE=""
ensure_tls_cert() {  # one self-signed certificate, made now, for every TLS variant
  [[ -z $TLS_CERT ]] || return 0
  local d=$WORK/tls key=()
  mkdir -p "$d"
  command -v openssl >/dev/null || die "openssl is needed for the TLS variants"
  case "$TLS_KEY" in
    ec) key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1) ;;
    rsa) key=(-newkey rsa:2048) ;;
  esac
  openssl req -x509 "${key[@]}" -sha256 -nodes -days 2 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$d/server.key" -out "$d/server.crt" >"$d/openssl.log" 2>&1 \
    || die "openssl could not make a certificate: $(cat "$d/openssl.log")"
  TLS_CERT=$d/server.crt TLS_KEYFILE=$d/server.key
  log "TLS certificate: $(openssl x509 -in "$TLS_CERT" -noout -text | grep -m1 'Public Key Algorithm' | sed 's/^ *//'), self-signed, made now"
}

# ------------------------------------------------------------------ gateway variants
# A variant is a function variant_<name> (dashes and pluses become underscores:
# sluice+limit -> variant_sluice_limit) that starts one gateway proxying everything to
# 127.0.0.1:$UPSTREAM_PORT and sets:
#   GW_PID[name] GW_PORT[name] GW_LOG[name] GW_KIND[name]=nginx|sluice, GW_ADMIN[name] (or 0)
#   and, when they apply, GW_TLS[name]=1 (HTTPS), GW_VALKEY[name]=1 (uses $VALKEY_PORT),
#   GW_RESUMED_LOG[name] (a log that gets one line per resumed TLS session).
# It must register every process it starts in STARTED. To add a column, write
# variant_<name> and add the name to BENCH_VARIANTS.

variant_nginx() {  # the reference: nginx as a keep-alive reverse proxy
  nginx_proxy "$1" ""
}

variant_nginx_tls() {  # nginx terminating TLS (same certificate as sluice-tls), same upstream
  ensure_tls_cert
  nginx_proxy "$1" tls
  GW_TLS[$1]=1
  GW_RESUMED_LOG[$1]=$WORK/$1/resumed.log
}

# $1 = name, $2 = "tls", "h2" (HTTP/2 in clear: h2c only), "grpc" (h2c, grpc_pass to the
# origin's gRPC server: bench/grpc.sh) or ""
nginx_proxy() {
  local name=$1 d=$WORK/$1 listen_ssl="" tls_conf="" tls_http="" origin_port=$UPSTREAM_PORT
  local pass='proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;'
  mkdir -p "$d"
  next_port; local port=$PORT_OUT
  [[ $2 == h2 || $2 == grpc ]] && listen_ssl=" http2"
  if [[ $2 == grpc ]]; then
    origin_port=$UPSTREAM_GRPC_PORT
    pass='grpc_pass grpc://origin;
            grpc_set_header X-Forwarded-For $proxy_add_x_forwarded_for;'
  fi
  # Idle upstream connections kept: at least one per request in flight, else nginx closes
  # and reopens upstream connections under load (--mode h2 and grpc: -c x -m of the largest
  # shape; grpc_pass too sends one call per upstream connection at a time).
  local keepalive=$(( CONNECTIONS > 64 ? CONNECTIONS : 64 ))
  [[ $H2_CLIENTS != 1 ]] || keepalive=$(h2_concurrency "$keepalive")
  if [[ $2 == tls ]]; then
    listen_ssl=" ssl"
    tls_http="map \$ssl_session_reused \$bench_resumed { r 1; default 0; }
    log_format bench_resumed '\$ssl_session_reused \$ssl_protocol \$ssl_cipher';"
    # Defaults otherwise (session tickets on, no shared session cache), like Sluice. Resumed
    # sessions (none expected: the handshake test never offers one) get a line in resumed.log.
    tls_conf="ssl_certificate $TLS_CERT;
        ssl_certificate_key $TLS_KEYFILE;
        ssl_protocols TLSv1.2 TLSv1.3;
        access_log $d/resumed.log bench_resumed if=\$bench_resumed;"
  fi
  { nginx_main "$d"
    cat <<EOF
    $tls_http
    upstream origin {
        server 127.0.0.1:$origin_port;
        keepalive $keepalive;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$port$listen_ssl backlog=4096;
        $tls_conf
        location / {
            $pass
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
# TOML on stdin ([valkey], [[limit]], ...) goes before the route; in --mode mix, first
# MIX_IDENTITY_TOML.
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
endpoints = [${SLUICE_ENDPOINTS:-"\"127.0.0.1:$UPSTREAM_PORT\""}]
${SLUICE_PROTOCOL:+protocol = \"$SLUICE_PROTOCOL\"}
${SLUICE_UPSTREAM_STREAMS:+max_concurrent_streams = $SLUICE_UPSTREAM_STREAMS}

EOF
  [[ $MIX_MODE == 1 || $H2_CLIENTS == 1 ]] && printf '%s\n' "$MIX_IDENTITY_TOML"
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
  sluice_variant "$1" "" </dev/null
}

# Sluice with one limit on the route that always allows: every request costs one decision
# (one FCALL) in Valkey.
variant_sluice_limit() {
  ensure_valkey
  sluice_variant "$1" 'limits = ["bench"]' <<EOF
[valkey]
address = "127.0.0.1:$VALKEY_PORT"

[[limit]]
name = "bench"
algorithm = "fixed_window"
by = ["ip"]
limit = 1000000000
window = "1h"
on_error = "allow"
EOF
  GW_VALKEY[$1]=1
}

variant_sluice_tls() {  # Sluice terminating TLS, same certificate as nginx-tls
  ensure_tls_cert
  sluice_variant "$1" "" <<EOF
[server.tls]
cert = "$TLS_CERT"
key = "$TLS_KEYFILE"
EOF
  GW_TLS[$1]=1
}

sluice_variant() {  # $1 = name, $2 = extra route lines; TOML on stdin (see sluice_config)
  local name=$1 d=$WORK/$1
  mkdir -p "$d"
  next_port; local port=$PORT_OUT
  next_port; local admin=$PORT_OUT
  sluice_config "$port" "$admin" "$2" >"$d/sluice.toml"
  local hint=""
  [[ ${GW_CLUSTER[$name]:-0} != 1 ]] ||
    hint=$'\n''(BENCH_CLUSTER_KEY_PREFIX="{rl}:v1" runs on a Sluice that demands a hash tag in cluster mode)'
  "$SLUICE_BIN" --check-config -c "$d/sluice.toml" >"$d/check.log" 2>&1 \
    || die "Sluice refused its configuration: $(cat "$d/check.log")$hint"
  start_sluice "$name" "$d/sluice.toml"
  GW_PID[$name]=$PID_OUT GW_PORT[$name]=$port GW_ADMIN[$name]=$admin GW_KIND[$name]=sluice
  GW_LOG[$name]=$d/stderr.log
}

start_variant() {
  local name=$1 fn=variant_${1%%:*} tls=()  # (sluice+mix:ALGO -> variant_sluice_mix)
  fn=${fn%%@*}  # (sluice+mix@cluster -> variant_sluice_mix)
  fn=${fn%+module}  # (sluice+mix+module -> variant_sluice_mix: the engine is the variant's)
  fn=${fn//[-+]/_}
  declare -F "$fn" >/dev/null || die "unknown variant '$name' (no function $fn in run.sh)"
  "$fn" "$name"
  [[ ${GW_TLS[$name]:-0} == 1 ]] && tls=(--tls)
  local wait=(wait-http "${tls[@]}")
  [[ $H2_CLIENTS == 1 ]] && wait=(wait-h2)  # (every gateway of the mode must answer over h2c)
  "${HELPER[@]}" "${wait[@]}" --port "${GW_PORT[$name]}" --pid "${GW_PID[$name]}" \
    || die "$name did not answer 200 \"ok\" on GET /: $(tail -n 20 "${GW_LOG[$name]}" 2>/dev/null)"
  log "$(printf '%-14s pid %-7s %s://127.0.0.1:%s' "$name" "${GW_PID[$name]}" \
    "$([[ ${GW_TLS[$name]:-0} == 1 ]] && echo https || echo http)" "${GW_PORT[$name]}")$(
    [[ $H2_CLIENTS == 1 ]] && echo " (h2c)")"
  if [[ ${GW_TLS[$name]:-0} == 1 ]]; then  # what a TLS client negotiates (for the record)
    timeout 5 openssl s_client -connect "127.0.0.1:${GW_PORT[$name]}" -brief </dev/null \
      >"$WORK/$name/tls-negotiated.txt" 2>&1 || true
  fi
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
STAMP=$(date +%Y%m%d-%H%M%S)
[[ $MIX_MODE == 1 || $MODE == h2* || $MODE == grpc ]] && RUN_DIR=$RESULTS_DIR/$MODE-$STAMP  # and $MODE-$STAMP.{txt,json} beside it
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
! needs '*h2o*' || h2o_origin
if [[ $MODE == grpc ]]; then  # every Sluice proxies to the origin's gRPC server
  SLUICE_ENDPOINTS="\"127.0.0.1:$UPSTREAM_GRPC_PORT\"" SLUICE_PROTOCOL=h2c
  grpc_request_file
fi
for v in $VARIANTS; do start_variant "$v"; done
[[ $MIX_MODE != 1 ]] || mix_prepare
[[ $MODE != h2 ]] || h2_prepare
[[ $MODE != grpc ]] || grpc_prepare
[[ $MODE != rls ]] || rls_prepare

url_of() {  # $1 = variant
  if [[ ${GW_TLS[$1]:-0} == 1 ]]; then echo "https://127.0.0.1:${GW_PORT[$1]}/"
  else echo "http://127.0.0.1:${GW_PORT[$1]}/"; fi
}

# $1 = variant, $2 = duration, $3 = output file (text), $4 = connections (default
# $CONNECTIONS); more arguments go to wrk (e.g. -H "Connection: close"). WRK_ENV (an array of
# VAR=value) is put in wrk's environment.
WRK_ENV=()
run_wrk() {
  local v=$1 secs conns=${4:-$CONNECTIONS}
  if [[ -n ${GW_RLS_PORT[$v]:-} ]]; then  # a rate-limit-service variant: its calls instead
    run_rls_load "$@"
    return
  fi
  secs=$(seconds "$2")
  run_child timeout --signal=INT --kill-after=10 $((secs + 30)) \
    env "${WRK_ENV[@]}" "${TASKSET_CLIENT[@]}" wrk -t"$THREADS" -c"$conns" -d"$2" --latency \
    -s "${GW_SCRIPT[$v]:-$BENCH_DIR/wrk_report.lua}" "${@:5}" "$(url_of "$v")" >"$3" 2>&1 || true
}

# ROUND_ORDER: the variants after $1 (a round number) in the order of that round: reversed every
# other round, so that no gateway always runs first.
round_order() {
  local r=$1 i
  shift
  ROUND_ORDER=("$@")
  if ((r % 2 == 0)); then
    ROUND_ORDER=(); for ((i = $#; i >= 1; i--)); do ROUND_ORDER+=("${!i}"); done
  fi
}

# BENCH_MINUTE_GUARD=1: waits, when a run of $1 started now would span a minute boundary (or
# start less than 2 s after one), until 2 s past the next one. Windows are aligned to the
# epoch: at every minute the mix's one-minute keys expire together and Valkey's active expiry
# holds it for tens of milliseconds (failed-open decisions, CPU that is no decision's).
minute_guard() {
  [[ $MINUTE_GUARD == 1 ]] || return 0
  local secs s
  secs=$(seconds "$1")
  ((secs <= 55)) || return 0
  s=$(( $(date +%s) % 60 ))
  if ((s < 2 || s + secs + 1 > 60)); then
    local wait_s=$(( (62 - s) % 60 ))
    ((wait_s > 0)) || return 0
    log "waiting ${wait_s}s: past the minute boundary (BENCH_MINUTE_GUARD)"
    sleep "$wait_s"
  fi
}

# Measured keep-alive runs: $1 = file prefix (wrk: the throughput rounds, cap: capacity),
# $2 = label, $3 = connections, then the variants; ROUNDS rounds (round_order).
keepalive_rounds() {
  local prefix=$1 label=$2 conns=$3 r v
  for ((r = 1; r <= ROUNDS; r++)); do
    round_order "$r" "${@:4}"
    for v in "${ROUND_ORDER[@]}"; do
      check_alive "$v" "$label round $r" || continue
      sleep 1
      minute_guard "$DURATION"
      probe "$v" "$OUT/probe_${prefix}_${v}_${r}_before.json"
      run_wrk "$v" "$DURATION" "$RUN_DIR/${prefix}_${v}_$r.txt" "$conns"
      probe "$v" "$OUT/probe_${prefix}_${v}_${r}_after.json" after
      "${HELPER[@]}" wrk-parse --in "$RUN_DIR/${prefix}_${v}_$r.txt" \
        --out "$OUT/${prefix}_${v}_$r.json" --before "$OUT/probe_${prefix}_${v}_${r}_before.json" \
        --after "$OUT/probe_${prefix}_${v}_${r}_after.json" --label "$label $r/$ROUNDS $v" \
        || { log "wrk output for $v:"; cat "$RUN_DIR/${prefix}_${v}_$r.txt"; }
      grep -E "Non-2xx|Socket errors" "$RUN_DIR/${prefix}_${v}_$r.txt" | sed "s/^/    $v: /" || true
      check_alive "$v" "$label round $r" || true
    done
  done
}

# $1 = variant, $2 = output: CPU time of the gateway and the upstream, upstream counters; for
# a variant with limits also Valkey's INFO commandstats and CPU time and Sluice's decision
# counters; for nginx-tls the number of resumed TLS sessions so far. --mode mix-cluster: the
# same per Valkey node (summed over the cluster's), and with $3 = after (the probe after a
# run) the variant's keys on each node.
probe() {
  local extra=()
  if [[ ${GW_CLUSTER[$1]:-0} == 1 ]]; then
    extra+=(--valkey-nodes "$CLUSTER_NODES" --admin-port "${GW_ADMIN[$1]}")
  elif [[ ${GW_VALKEY[$1]:-0} == 1 ]]; then
    extra+=(--valkey-port "$VALKEY_PORT" --valkey-pid "$VALKEY_PID" --admin-port "${GW_ADMIN[$1]}")
    [[ $MODE != mix-cluster ]] || extra+=(--valkey-nodes "$VALKEY_PORT:$VALKEY_PID")
  fi
  if [[ ${3:-} == after && -n ${GW_KEY_PREFIX[$1]:-} && $MODE == mix-cluster ]]; then
    extra+=(--count-keys "${GW_KEY_PREFIX[$1]}")
  fi
  [[ -n ${GW_RESUMED_LOG[$1]:-} ]] && extra+=(--count-lines "${GW_RESUMED_LOG[$1]}")
  "${HELPER[@]}" probe --pid "${GW_PID[$1]}" --upstream-pid "${GW_ORIGIN_PID[$1]:-$UPSTREAM_PID}" \
    --status-port "${GW_ORIGIN_STATUS[$1]:-$UPSTREAM_STATUS_PORT}" "${extra[@]}" --out "$2" || true
}

# BENCH_HANDSHAKE_TOOL=s_time: $HANDSHAKE_CLIENTS processes of `openssl s_time -new` (a new
# session every time) for $2: connect, full handshake, close, no HTTP request (s_time -www
# sends HTTP/1.0 without Host, which the upstream refuses). Writes a WRKJSON line with the
# total (no latency figures) so that wrk-parse reads it like wrk's output.
run_s_time() {  # $1 = variant, $2 = duration, $3 = output file
  local v=$1 secs i pids=() t0 t1 total=0 n
  secs=$(seconds "$2")
  t0=$(date +%s%N)
  for ((i = 0; i < HANDSHAKE_CLIENTS; i++)); do
    timeout --kill-after=5 $((secs + 30)) "${TASKSET_CLIENT[@]}" openssl s_time \
      -connect "127.0.0.1:${GW_PORT[$v]}" -new -time "$secs" >"$3.$i" 2>&1 &
    pids+=($!); STARTED+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || true; forget_pid "$i"; done
  t1=$(date +%s%N)
  for ((i = 0; i < HANDSHAKE_CLIENTS; i++)); do
    n=$(grep -m1 -oE '^[0-9]+ connections in [0-9.]+s' "$3.$i" | cut -d' ' -f1 || true)
    total=$((total + ${n:-0}))
    cat "$3.$i" >>"$3"; rm -f "$3.$i"
  done
  printf 'WRKJSON {"requests":%d,"duration_us":%d,"bytes":0,"errors":{"connect":0,"read":0,"write":0,"status":0,"timeout":0},"latency_us":{"min":0,"max":0,"mean":0,"stdev":0,"p50":0,"p75":0,"p90":0,"p99":0,"p999":0}}\n' \
    "$total" $(((t1 - t0) / 1000)) >>"$3"
}

# 5. Memory of idle keep-alive connections, on gateways that have only been warmed up briefly,
#    so the difference measured is the cost of the connections and not of reused heap.
#    --mode h2: h2c connections (prior knowledge), each having made one request.
if [[ $MODE == all || $MODE == idle || $MODE == h2 ]]; then
  log "idle-connection memory test: $IDLE_CONNECTIONS keep-alive $([[ $MODE == h2 ]] && echo "h2c ")connections per gateway ($IDLE_VARIANTS)"
  for v in $IDLE_VARIANTS; do
    check_alive "$v" "startup" || continue
    if [[ $MODE == h2 ]]; then
      run_h2load "$v" 1s "$OUT/prewarm_$v.txt" "${H2_SHAPES%% *}"
    else
      run_wrk "$v" 1s "$OUT/prewarm_$v.txt"
    fi
    check_alive "$v" "pre-warm" || continue
    tls=(); [[ ${GW_TLS[$v]:-0} == 1 ]] && tls=(--tls)
    [[ $MODE == h2 ]] && tls=(--h2)
    # (the helper raises its own open-file limit to the hard limit)
    run_child "${HELPER[@]}" idle --name "$v" --port "${GW_PORT[$v]}" --pid "${GW_PID[$v]}" \
      --admin-port "${GW_ADMIN[$v]}" --count "$IDLE_CONNECTIONS" --out "$OUT/idle_$v.json" \
      --cycles "$IDLE_CYCLES" "${tls[@]}" || log "idle test of $v failed"
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

# --mode h2: h2load rounds, every shape (bench/h2.sh).
[[ $MODE != h2* && $MODE != grpc ]] || h2_rounds

# 4. Throughput and latency (--mode mix: the same rounds, with the mix on most variants).
if [[ $MODE == all || $MODE == throughput || $MIX_MODE == 1 || $MODE == h2-upstream ]]; then
  if [[ $(seconds "$WARMUP") != 0 ]]; then
    for v in $VARIANTS; do
      check_alive "$v" "warm-up" || continue
      log "warming up $v ($WARMUP)"
      run_wrk "$v" "$WARMUP" "$OUT/warmup_$v.txt"
    done
  fi
  read -r -a order <<<"$VARIANTS"
  keepalive_rounds wrk "round" "$CONNECTIONS" "${order[@]}"
fi
[[ $MODE != h2-upstream ]] || h2up_pool_memory

# 5. Capacity: plain Sluice and Sluice with limits again, with enough connections that each
#    one's worker is always busy. With 50 connections a closed loop gives 50 / latency requests
#    per second, and each decision adds a Valkey round trip to the latency while the worker
#    waits idle: that measures latency (reported above). Here the requests/s are what the
#    gateway can serve, so what rate limiting costs in requests/s is judged here.
CAP_VARIANTS=() CAP_ROUNDS=0
if [[ $MODE == all || $MODE == throughput ]] && ((CAPACITY_CONNECTIONS > 0)); then
  cap_limit=0
  for v in $VARIANTS; do
    [[ ${GW_KIND[$v]} == sluice && ${GW_TLS[$v]:-0} != 1 ]] || continue
    CAP_VARIANTS+=("$v")
    [[ ${GW_VALKEY[$v]:-0} == 1 ]] && cap_limit=1
  done
  ((cap_limit && ${#CAP_VARIANTS[@]} > 1)) || CAP_VARIANTS=()
fi
if ((${#CAP_VARIANTS[@]})); then
  CAP_ROUNDS=$ROUNDS
  log "capacity: ${CAP_VARIANTS[*]} with $CAPACITY_CONNECTIONS connections"
  if [[ $(seconds "$WARMUP") != 0 ]]; then
    for v in "${CAP_VARIANTS[@]}"; do
      check_alive "$v" "capacity warm-up" || continue
      run_wrk "$v" "$WARMUP" "$OUT/capwarmup_$v.txt" "$CAPACITY_CONNECTIONS"
    done
  fi
  keepalive_rounds cap "capacity" "$CAPACITY_CONNECTIONS" "${CAP_VARIANTS[@]}"
fi

# Round trips to Valkey per request: commandstats also counts the commands a Lua script runs,
# so a short separate run (not in the figures above) is watched with MONITOR, which tells the
# commands Sluice sends from those its script runs.
if [[ $MODE == all || $MODE == throughput ]]; then
  for v in $VARIANTS; do
    [[ ${GW_VALKEY[$v]:-0} == 1 ]] || continue
    check_alive "$v" "MONITOR sample" || continue
    secs=$(seconds "$MONITOR_DURATION")
    run_child "${HELPER[@]}" valkey-monitor --port "$VALKEY_PORT" --timeout $((secs + 60)) \
      --output "$RUN_DIR/monitor_wrk_$v.txt" --out "$OUT/monitor_$v.json" -- \
      timeout --signal=INT --kill-after=10 $((secs + 30)) "${TASKSET_CLIENT[@]}" wrk -t"$THREADS" \
      -c"$CONNECTIONS" -d"$MONITOR_DURATION" -s "$BENCH_DIR/wrk_report.lua" "$(url_of "$v")" \
      || log "MONITOR sample of $v failed"
    check_alive "$v" "MONITOR sample" || true
  done
fi

# 7. New TLS connections per second: one request per connection, every handshake a full one.
#    wrk 4.1 keeps the session of a closed connection (SSL_shutdown + SSL_clear) and offers it
#    on the next connect, so against a server that issues tickets (both do, by default) almost
#    every "new" connection would be a resumption. noresume.c, preloaded into wrk, drops the
#    session in SSL_clear. nginx-tls logs every resumed session (resumed.log): the report checks
#    that there were none. BENCH_HANDSHAKE_TOOL=s_time uses openssl s_time -new instead.
HS_VARIANTS=()
for v in $VARIANTS; do [[ ${GW_TLS[$v]:-0} == 1 ]] && HS_VARIANTS+=("$v"); done
HS_ROUNDS=0
if [[ $MODE == all || $MODE == handshake ]] && ((${#HS_VARIANTS[@]})); then
  HS_ROUNDS=$ROUNDS
  if [[ $HANDSHAKE_TOOL == wrk ]]; then
    if ! cc -O2 -shared -fPIC -Wl,-z,lazy -o "$WORK/noresume.so" "$BENCH_DIR/noresume.c" -ldl \
         >"$OUT/noresume.log" 2>&1; then
      log "warning: cannot build bench/noresume.c ($(head -n 3 "$OUT/noresume.log")); using openssl s_time"
      HANDSHAKE_TOOL=s_time
    fi
  fi
  log "new TLS connections: $HANDSHAKE_TOOL, $HANDSHAKE_CONNECTIONS connections, $HANDSHAKE_DURATION per run, one request per connection, no session reuse"
  for ((r = 1; r <= ROUNDS; r++)); do
    round_order "$r" "${HS_VARIANTS[@]}"
    for v in "${ROUND_ORDER[@]}"; do
      check_alive "$v" "handshake round $r" || continue
      sleep 1
      raw=$RUN_DIR/handshake_${v}_$r.txt
      probe "$v" "$OUT/hsprobe_${v}_${r}_before.json"
      if [[ $HANDSHAKE_TOOL == wrk ]]; then
        WRK_ENV=("LD_PRELOAD=$WORK/noresume.so")
        run_wrk "$v" "$HANDSHAKE_DURATION" "$raw" "$HANDSHAKE_CONNECTIONS" -H "Connection: close"
        WRK_ENV=()
      else
        run_s_time "$v" "$HANDSHAKE_DURATION" "$raw"
      fi
      probe "$v" "$OUT/hsprobe_${v}_${r}_after.json"
      "${HELPER[@]}" wrk-parse --handshake --in "$raw" --out "$OUT/hs_${v}_$r.json" \
        --before "$OUT/hsprobe_${v}_${r}_before.json" --after "$OUT/hsprobe_${v}_${r}_after.json" \
        --label "handshake $r/$ROUNDS $v" \
        || { log "output for $v:"; cat "$raw"; }
      grep -E "Non-2xx|Socket errors" "$raw" | sed "s/^/    $v: /" || true
      check_alive "$v" "handshake round $r" || true
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
for v in $VARIANTS upstream valkey cluster $(cd "$WORK" && ls -d cluster/node* 2>/dev/null); do
  for f in "$WORK/$v"/*.log "$WORK/$v"/*.conf "$WORK/$v"/*.toml "$WORK/$v"/*.txt; do
    if [[ -f $f ]]; then cp "$f" "$RUN_DIR/${v//\//_}_$(basename "$f")"; fi
  done
done
for v in $VARIANTS; do
  lines=0
  [[ -f ${GW_LOG[$v]} ]] && lines=$(grep -cv '^[[:space:]]*$' "${GW_LOG[$v]}" || true)
  "$PY" - "$OUT/extra_$v.json" <<EOF
import json, sys
def tls_negotiated(path):  # openssl s_client -brief: protocol, cipher suite, key exchange
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    keep = ("Protocol version", "Ciphersuite", "Peer signature type", "Server Temp Key")
    return {k: v.strip() for k, _, v in (l.partition(":") for l in lines) if k in keep} or None
exit_status = "${GW_EXIT[$v]:-}"
json.dump({
    "kind": "${GW_KIND[$v]}",
    "crashed": bool("${GW_CRASH[$v]:-}"),
    "crash_phase": "${GW_CRASH[$v]:-}" or None,
    "exit_status": int(exit_status) if exit_status.isdigit() else (exit_status or None),
    "stop_seconds": int("${GW_STOP_S[$v]:-0}" or 0) / 1000,
    "log_lines": int("${lines:-0}"),
    "log_file": "$RUN_DIR/${v}_$(basename "${GW_LOG[$v]}")",
    "tls": "${GW_TLS[$v]:-0}" == "1",
    "limit": "${GW_VALKEY[$v]:-0}" == "1",
    "tls_negotiated": tls_negotiated("$WORK/$v/tls-negotiated.txt"),
}, open(sys.argv[1], "w"))
EOF
done

cp "$OUT"/*.json "$RUN_DIR/" 2>/dev/null || true  # every JSON the report reads

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
    "capacity": {"connections": $CAPACITY_CONNECTIONS, "rounds": $CAP_ROUNDS,
                 "variants": "${CAP_VARIANTS[*]}".split()},
    "warmup": "$WARMUP", "rounds": $ROUNDS, "minute_guard": "$MINUTE_GUARD" == "1", "idle_connections": $IDLE_CONNECTIONS,
    "variants": "$VARIANTS".split(), "reference": "$REFERENCE",
    "pinned": "$PIN" == "1", "cpus": $(nproc),
    "load_average_start": "$LOAD_START", "load_average_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
    "sluice_bin": "$SLUICE_BIN",
    "git_commit": "${BENCH_GIT_COMMIT:-}" or out(["git", "-C", "$ROOT", "rev-parse", "--short", "HEAD"]),
    "nginx": (out(["sh", "-c", "nginx -v 2>&1"]) or "").replace("nginx version: ", ""),
    "wrk": (out(["sh", "-c", "wrk -v 2>&1 | head -n1"]) or "").split(" [")[0],
    "h2load": out(["sh", "-c", "h2load --version 2>&1 | head -n1"]) if "$MODE".startswith("h2") or "$MODE" == "grpc" else None,
    "h2_shapes": "$H2_SHAPES".split() if "$MODE".startswith("h2") or "$MODE" == "grpc" else None,
    "nofile": $NOFILE,
    "idle_variants": "$IDLE_VARIANTS".split(), "idle_cycles": $IDLE_CYCLES,
    "monitor_duration": "$MONITOR_DURATION",
    "handshake": {"tool": "$HANDSHAKE_TOOL", "duration": "$HANDSHAKE_DURATION",
                  "connections": $HANDSHAKE_CONNECTIONS, "rounds": $HS_ROUNDS,
                  "s_time_clients": $HANDSHAKE_CLIENTS if "$HANDSHAKE_TOOL" == "s_time" else None},
    "tls_key": {"ec": "ECDSA P-256", "rsa": "RSA 2048"}["$TLS_KEY"] if "$TLS_CERT" else None,
    "openssl": out(["openssl", "version"]),
    "valkey_server": out(["sh", "-c", "$VALKEY_BIN --version"]) if "$VALKEY_BIN" else None,
    "kernel": out(["uname", "-r"]),
    "cpu_model": out(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]),
}))
EOF
)

SUMMARY=$RESULTS_DIR/latest.json
if [[ $MODE == mix ]]; then
  SUMMARY=$RESULTS_DIR/mix-$STAMP.json
  mix_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/mix-$STAMP.txt"
  echo "Report: $RESULTS_DIR/mix-$STAMP.txt"
elif [[ $MODE == h2 ]]; then
  SUMMARY=$RESULTS_DIR/h2-$STAMP.json
  h2_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/h2-$STAMP.txt"
  echo "Report: $RESULTS_DIR/h2-$STAMP.txt"
elif [[ $MODE == grpc ]]; then
  SUMMARY=$RESULTS_DIR/grpc-$STAMP.json
  grpc_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/grpc-$STAMP.txt"
  echo "Report: $RESULTS_DIR/grpc-$STAMP.txt"
elif [[ $MODE == h2-upstream ]]; then
  SUMMARY=$RESULTS_DIR/h2-upstream-$STAMP.json
  h2up_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/h2-upstream-$STAMP.txt"
  echo "Report: $RESULTS_DIR/h2-upstream-$STAMP.txt"
elif [[ $MODE == rls ]]; then
  SUMMARY=$RESULTS_DIR/rls-$STAMP.json
  rls_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/rls-$STAMP.txt"
  echo "Report: $RESULTS_DIR/rls-$STAMP.txt"
elif [[ $MODE == mix-cluster ]]; then
  SUMMARY=$RESULTS_DIR/mix-cluster-$STAMP.json
  cluster_report "$meta" "$SUMMARY" | tee "$RESULTS_DIR/mix-cluster-$STAMP.txt"
  echo "Report: $RESULTS_DIR/mix-cluster-$STAMP.txt"
else
  "${HELPER[@]}" report --dir "$OUT" --variants "$VARIANTS" --reference "$REFERENCE" \
    --rounds "$([[ $MODE == all || $MODE == throughput ]] && echo "$ROUNDS" || echo 0)" \
    --handshake-rounds "$HS_ROUNDS" --capacity-rounds "$CAP_ROUNDS" --meta "$meta" \
    --rps-ratio-min "$RPS_RATIO_MIN" --p99-ratio-max "$P99_RATIO_MAX" --idle-kib-max "$IDLE_KIB_MAX" \
    --limit-rps-ratio-min "$LIMIT_RPS_RATIO_MIN" --handshake-ratio-min "$HANDSHAKE_RATIO_MIN" \
    --connections-hint "$(( CONNECTIONS > 64 ? CONNECTIONS : 64 ))" \
    --out "$SUMMARY"
fi
echo "Raw wrk output, logs and configs: $RUN_DIR"

if [[ $STRICT == 1 ]] && grep -q '"overall": "FAIL"' "$SUMMARY"; then
  exit 1
fi
exit 0
