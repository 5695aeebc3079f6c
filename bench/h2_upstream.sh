# shellcheck shell=bash disable=SC2034
# (GW_* are run.sh's associative arrays.)
# bench/run.sh --mode h2-upstream: the plain proxy with an HTTP/2 upstream (h2c, prior
# knowledge) against the same with an HTTP/1.1 upstream (see "Upstream protocols" in
# bench/README.md). Sourced by run.sh, which provides sluice_variant, nginx_main, start_nginx,
# run_wrk, probe, HELPER, next_port, stop_pid, forget_pid, log and die.
#
# The origin is one nginx for both: its HTTP/1.1 port (UPSTREAM_PORT) and an h2c port
# (UPSTREAM_H2_PORT, `listen ... http2;` in clear), both answering GET / with 200 "ok".
# sluice: [[upstream]] protocol "http1" to UPSTREAM_PORT; sluice-h2c: protocol "h2c" to
# UPSTREAM_H2_PORT. Both one worker, no limit. The rounds: wrk keep-alive (HTTP/1.1 clients,
# run.sh's throughput rounds) and h2load shapes (HTTP/2 clients, h2.sh's h2_rounds), every
# variant in alternating order.
#
# Then the memory of idle pooled upstream connections (h2up_pool_memory): for each protocol a
# fresh Sluice whose upstream has H2UP_POOL_ENDPOINTS endpoints (ports of one more nginx, the
# "pool" origin), one wrk connection sending requests round-robin until every endpoint has
# its pooled connection; memory after minus memory before, per connection the origin accepted.

H2UP_VARIANTS="sluice sluice-h2c sluice-h2o sluice-h2c-h2o"
H2UP_SHAPES=${BENCH_H2UP_SHAPES:-c10m10}
H2UP_POOL_ENDPOINTS=${BENCH_H2UP_POOL_ENDPOINTS:-500}
# sluice-h2c-spread (not in the default variants; --variants "sluice sluice-h2c sluice-h2c-spread"):
# [[upstream]] max_concurrent_streams, streams per upstream connection
H2UP_SPREAD_STREAMS=${BENCH_H2UP_SPREAD_STREAMS:-25}
H2UP_POOL_DURATION=${BENCH_H2UP_POOL_DURATION:-3s}

# Targets (issue 44), sluice-h2c against sluice on every load.
H2UP_RPS_RATIO_MIN=0.9
H2UP_CPU_RATIO_MAX=1.15

# The upstream of a Sluice variant: sluice_config writes these (run.sh sets the defaults).
variant_sluice_h2c() {  # Sluice, one worker, no limit, h2c to the origin's HTTP/2 port
  SLUICE_ENDPOINTS="\"127.0.0.1:$UPSTREAM_H2_PORT\"" SLUICE_PROTOCOL=h2c sluice_variant "$1" "" </dev/null
}

variant_sluice_h2c_spread() {  # the same, at most H2UP_SPREAD_STREAMS streams per connection
  SLUICE_ENDPOINTS="\"127.0.0.1:$UPSTREAM_H2_PORT\"" SLUICE_PROTOCOL=h2c \
    SLUICE_UPSTREAM_STREAMS=$H2UP_SPREAD_STREAMS sluice_variant "$1" "" </dev/null
}

# The same pair with h2o as the origin (h2o_origin below): an origin that gathers the frames
# of many streams into one write, where nginx writes each stream's frames on their own.
variant_sluice_h2o() {  # Sluice, one worker, no limit, HTTP/1.1 to h2o
  SLUICE_ENDPOINTS="\"127.0.0.1:$H2O_PORT\"" sluice_variant "$1" "" </dev/null
  GW_ORIGIN_PID[$1]=$H2O_PID GW_ORIGIN_STATUS[$1]=0
}

variant_sluice_h2c_h2o() {  # Sluice, one worker, no limit, h2c to h2o
  SLUICE_ENDPOINTS="\"127.0.0.1:$H2O_PORT\"" SLUICE_PROTOCOL=h2c sluice_variant "$1" "" </dev/null
  GW_ORIGIN_PID[$1]=$H2O_PID GW_ORIGIN_STATUS[$1]=0
}

# h2o (Debian's, one thread) on one port for both protocols (HTTP/1.1, and h2c by prior
# knowledge), answering GET / with 200 "ok" (a static file). Started when a variant needs it.
H2O_PID=0 H2O_PORT=0
h2o_origin() {
  local d=$WORK/h2o
  mkdir -p "$d/www"
  printf ok >"$d/www/index.html"
  next_port; H2O_PORT=$PORT_OUT
  { [[ $EUID -ne 0 ]] || echo "user: root"  # (as root, h2o would switch to nobody)
    cat <<EOF
num-threads: 1
error-log: $d/error.log
listen:
  host: 127.0.0.1
  port: $H2O_PORT
hosts:
  default:
    paths:
      /:
        file.dir: $d/www
EOF
  } >"$d/h2o.conf"
  "${TASKSET_CLIENT[@]}" h2o -c "$d/h2o.conf" >"$d/stdout.log" 2>&1 &
  H2O_PID=$!
  STARTED+=("$H2O_PID")
  "${HELPER[@]}" wait-http --port "$H2O_PORT" --pid "$H2O_PID" \
    || die "the h2o origin did not start: $(cat "$d/error.log" "$d/stdout.log" 2>/dev/null)"
  log "origin h2o $(h2o --version | head -n 1 | cut -d' ' -f3)  pid $H2O_PID  127.0.0.1:$H2O_PORT"
}

# The origin's h2c server, inside run.sh's upstream nginx (start_upstream).
h2up_origin_server() {
  next_port; UPSTREAM_H2_PORT=$PORT_OUT
  cat <<EOF
    server {  # HTTP/2 in clear, prior knowledge (h2c)
        listen 127.0.0.1:$UPSTREAM_H2_PORT http2 backlog=4096;
        location / { return 200 "ok"; }
    }
EOF
}

# The "pool" origin: H2UP_POOL_ENDPOINTS ports of each protocol in one nginx, and its status.
POOL_PID=0 POOL_STATUS_PORT=0 POOL_H1_ENDPOINTS="" POOL_H2_ENDPOINTS=""
h2up_start_pool_origin() {
  local d=$WORK/pool i h1="" h2="" ports
  mkdir -p "$d"
  # (not one of run.sh's ports still to be taken: the pool Sluices listen on those)
  mapfile -t ports < <("${HELPER[@]}" free-ports $((2 * H2UP_POOL_ENDPOINTS + 1)) --avoid "${FREE[@]}")
  ((${#ports[@]} == 2 * H2UP_POOL_ENDPOINTS + 1)) || die "not enough free ports for the pool origin"
  POOL_STATUS_PORT=${ports[0]}
  for ((i = 1; i <= H2UP_POOL_ENDPOINTS; i++)); do
    h1+="        listen 127.0.0.1:${ports[i]};"$'\n'
    h2+="        listen 127.0.0.1:${ports[i + H2UP_POOL_ENDPOINTS]} http2;"$'\n'
    POOL_H1_ENDPOINTS+="${POOL_H1_ENDPOINTS:+, }\"127.0.0.1:${ports[i]}\""
    POOL_H2_ENDPOINTS+="${POOL_H2_ENDPOINTS:+, }\"127.0.0.1:${ports[i + H2UP_POOL_ENDPOINTS]}\""
  done
  { nginx_main "$d"
    cat <<EOF
    server {
$h1        location / { return 200 "ok"; }
    }
    server {
$h2        location / { return 200 "ok"; }
    }
    server {
        listen 127.0.0.1:$POOL_STATUS_PORT;
        location / { stub_status; }
    }
}
EOF
  } >"$d/nginx.conf"
  TASKSET_NGINX=("${TASKSET_CLIENT[@]}")
  start_nginx pool "$d/nginx.conf"
  POOL_PID=$PID_OUT
  "${HELPER[@]}" wait-http --port "$POOL_STATUS_PORT" --pid "$POOL_PID" --any-body \
    || die "the pool origin did not start: $(cat "$d/error.log" 2>/dev/null)"
  log "pool origin nginx pid $POOL_PID: $H2UP_POOL_ENDPOINTS HTTP/1.1 and $H2UP_POOL_ENDPOINTS h2c ports"
}

# $1 = protocol (http1 | h2c): a fresh Sluice, its pool filled, its memory before and after.
h2up_pool_one() {
  local proto=$1 name=pool-$1 endpoints=$POOL_H1_ENDPOINTS
  [[ $proto == h2c ]] && endpoints=$POOL_H2_ENDPOINTS
  SLUICE_ENDPOINTS=$endpoints SLUICE_PROTOCOL=$proto sluice_variant "$name" "" </dev/null
  "${HELPER[@]}" wait-http --port "${GW_PORT[$name]}" --pid "${GW_PID[$name]}" \
    || die "$name did not answer: $(tail -n 20 "${GW_LOG[$name]}" 2>/dev/null)"
  sleep 1
  "${HELPER[@]}" mem --pid "${GW_PID[$name]}" >"$OUT/poolmem_${proto}_before.json"
  "${HELPER[@]}" probe --pid "${GW_PID[$name]}" --upstream-pid "$POOL_PID" \
    --status-port "$POOL_STATUS_PORT" --out "$OUT/poolprobe_${proto}_before.json"
  run_wrk "$name" "$H2UP_POOL_DURATION" "$RUN_DIR/pool_wrk_$proto.txt" 1
  "${HELPER[@]}" wrk-parse --in "$RUN_DIR/pool_wrk_$proto.txt" --out "$OUT/poolwrk_$proto.json" \
    --label "pool $proto" >/dev/null || true
  sleep 2  # (idle: the client connection closed, the pooled ones stay)
  "${HELPER[@]}" mem --pid "${GW_PID[$name]}" >"$OUT/poolmem_${proto}_after.json"
  "${HELPER[@]}" probe --pid "${GW_PID[$name]}" --upstream-pid "$POOL_PID" \
    --status-port "$POOL_STATUS_PORT" --out "$OUT/poolprobe_${proto}_after.json"
  "${HELPER[@]}" h2up-pool --protocol "$proto" --endpoints "$H2UP_POOL_ENDPOINTS" \
    --mem-before "$OUT/poolmem_${proto}_before.json" --mem-after "$OUT/poolmem_${proto}_after.json" \
    --probe-before "$OUT/poolprobe_${proto}_before.json" \
    --probe-after "$OUT/poolprobe_${proto}_after.json" --wrk "$OUT/poolwrk_$proto.json" \
    --out "$OUT/pool_$proto.json" || log "pool measure of $proto failed"
  cp "${GW_LOG[$name]}" "$RUN_DIR/${name}_stderr.log" 2>/dev/null || true
  stop_pid "${GW_PID[$name]}" TERM 15
  forget_pid "${GW_PID[$name]}"
}

h2up_pool_memory() {
  ((H2UP_POOL_ENDPOINTS > 0)) || return 0
  h2up_start_pool_origin
  log "idle pooled upstream connections: $H2UP_POOL_ENDPOINTS endpoints, HTTP/1.1 then h2c"
  h2up_pool_one http1
  h2up_pool_one h2c
  stop_pid "$POOL_PID" QUIT 15
  forget_pid "$POOL_PID"
}

h2up_report() {  # $1 = meta JSON, $2 = summary JSON to write
  local pool=()
  ((H2UP_POOL_ENDPOINTS > 0)) || pool=(--pool-protocols=)
  # (H2_SHAPES: h2.sh's, set to H2UP_SHAPES by run.sh in this mode)
  # shellcheck disable=SC2153
  "${HELPER[@]}" h2up-report --dir "$OUT" --variants "$VARIANTS" --reference "$REFERENCE" \
    --shapes "$H2_SHAPES" --rounds "$ROUNDS" --meta "$1" \
    --rps-ratio-min "$H2UP_RPS_RATIO_MIN" --cpu-ratio-max "$H2UP_CPU_RATIO_MAX" "${pool[@]}" --out "$2"
}
