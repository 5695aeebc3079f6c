# shellcheck shell=bash disable=SC2034
# (GW_* are run.sh's associative arrays.)
# bench/run.sh --mode h2: HTTP/2 to the gateway, h2c with prior knowledge (see "HTTP/2" in
# bench/README.md). Sourced by run.sh, which provides nginx_proxy, HELPER, run_child, probe,
# round_order, check_alive, seconds, log and die.
#
# h2load (nghttp2-client) against nginx-h2 (nginx `listen ... http2;` in clear: h2c only on
# that port) and against Sluice's plain listener (h2c with prior knowledge, beside HTTP/1.1),
# every gateway proxying to the same upstream over HTTP/1.1, in alternating rounds, for each
# load shape of H2_SHAPES ("cCmM": -cC -mM, one thread); then the memory of idle h2c
# connections (bench.py idle --h2), before the load, as the HTTP/1.1 idle test does.
#
# sluice+limit: one limit by ip (every stream one decision). sluice+mix: the mix's two limits
# (sliding_window by ip, token_bucket by API key with the tenant's plan "pro" from Valkey: every
# stream two limits and a tenant lookup), raised so that one client is always allowed: h2load
# sends the same header fields with every request (-H), so the mix's 100,000 addresses and
# 5,000 API keys cannot be made with it; every request of every variant carries one client
# address (X-Forwarded-For, through the trusted proxy 127.0.0.1) and one tenant's API key.

H2_VARIANTS="nginx-h2 sluice sluice+limit sluice+mix"
H2_CLIENT_ADDRESS=198.51.100.20
H2_API_KEY=mk00000   # a tenant's key of mix.py seed (KEY_FORMAT)
H2_SHAPES=${BENCH_H2_SHAPES:-c10m10 c50m1}
H2_IDLE_CONNECTIONS=${BENCH_H2_IDLE_CONNECTIONS:-2000}

# Targets (issue 26), Sluice (no limit) against nginx-h2 on every shape.
H2_RPS_RATIO_MIN=1.0
H2_P99_RATIO_MAX=1.2
H2_IDLE_KIB_MAX=32          # RSS growth per idle h2c connection

variant_nginx_h2() {  # nginx, HTTP/2 in clear (h2c, prior knowledge), same upstream
  nginx_proxy "$1" h2
}

# $1 = shape (c10m10), prints h2load's -c and -m
h2_shape_args() {
  [[ $1 =~ ^c([0-9]+)m([0-9]+)$ ]] || die "BENCH_H2_SHAPES: '$1' is not cNmM (e.g. c10m10)"
  echo "-c${BASH_REMATCH[1]} -m${BASH_REMATCH[2]}"
}

h2_concurrency() {  # the largest -c x -m of H2_SHAPES, at least $1
  local shape n=$1 a
  for shape in $H2_SHAPES; do
    read -r -a a <<<"$(h2_shape_args "$shape")"
    (( ${a[0]#-c} * ${a[1]#-m} > n )) && n=$(( ${a[0]#-c} * ${a[1]#-m} ))
  done
  echo "$n"
}

# $1 = variant, $2 = duration, $3 = output (text), $4 = shape; h2load's per-request log
# beside it ($3.log): h2load 1.52 prints no percentiles, bench.py h2load-json reads them there.
# H2LOAD_ARGS (more h2load arguments: a request body, fields) and H2LOAD_PATH (/ by default)
# are --mode grpc's (bench/grpc.sh).
H2LOAD_ARGS=() H2LOAD_PATH=/
run_h2load() {
  local v=$1 secs shape
  secs=$(seconds "$2")
  read -r -a shape <<<"$(h2_shape_args "$4")"
  run_child timeout --signal=INT --kill-after=10 $((secs + 30)) "${TASKSET_CLIENT[@]}" \
    h2load -t1 "${shape[@]}" -D "$secs" --log-file="$3.log" \
    -H "X-Forwarded-For: $H2_CLIENT_ADDRESS" -H "X-API-Key: $H2_API_KEY" "${H2LOAD_ARGS[@]}" \
    "http://127.0.0.1:${GW_PORT[$v]}$H2LOAD_PATH" >"$3" 2>&1 || true
}

# Each shape is warmed up on every gateway before its rounds: a shape of more connections than
# the one before needs more upstream connections, which each gateway's pool opens as it goes
# (the first measured round would pay for them).
h2_rounds() {
  local shape r v raw
  read -r -a order <<<"$VARIANTS"
  for shape in $H2_SHAPES; do
    if [[ $(seconds "$WARMUP") != 0 ]]; then
      for v in $VARIANTS; do
        check_alive "$v" "h2 warm-up" || continue
        log "warming up $v ($WARMUP, h2load $shape)"
        run_h2load "$v" "$WARMUP" "$OUT/h2warmup_$v.txt" "$shape"
        rm -f "$OUT/h2warmup_$v.txt.log"
      done
    fi
    for ((r = 1; r <= ROUNDS; r++)); do
      round_order "$r" "${order[@]}"
      log "h2 $shape round $r/$ROUNDS: ${ROUND_ORDER[*]}"
      for v in "${ROUND_ORDER[@]}"; do
        check_alive "$v" "h2 $shape round $r" || continue
        sleep 1
        raw=$RUN_DIR/h2_${shape}_${v}_$r.txt
        probe "$v" "$OUT/probe_h2_${shape}_${v}_${r}_before.json"
        run_h2load "$v" "$DURATION" "$raw" "$shape"
        probe "$v" "$OUT/probe_h2_${shape}_${v}_${r}_after.json" after
        if "${HELPER[@]}" h2load-json --in "$raw" --log "$raw.log"; then
          "${HELPER[@]}" wrk-parse --in "$raw" --out "$OUT/h2_${shape}_${v}_$r.json" \
            --before "$OUT/probe_h2_${shape}_${v}_${r}_before.json" \
            --after "$OUT/probe_h2_${shape}_${v}_${r}_after.json" --label "h2 $shape $r/$ROUNDS $v" \
            || { log "h2load output for $v:"; cat "$raw"; }
        else
          log "h2load output for $v:"; cat "$raw"
        fi
        rm -f "$raw.log"  # (one line per request: large; the figures are in the WRKJSON line)
        check_alive "$v" "h2 $shape round $r" || true
      done
    done
  done
}

# After the gateways started (sluice+mix): a tenant in Valkey for H2_API_KEY and a second key
# without one, and the check of mix.py that the plan and the client address apply.
h2_prepare() {
  [[ " $VARIANTS " == *" sluice+mix "* ]] || return 0
  "$PY" "$BENCH_DIR/mix.py" seed --port "$VALKEY_PORT" --keys 1 --tenants 1 \
    || die "could not put the tenant in Valkey"
  "$PY" "$BENCH_DIR/mix.py" check --port "${GW_PORT[sluice+mix]}" --valkey-port "$VALKEY_PORT" \
    --key-prefix "rl:sluice-mix" --tenant-keys 1 --keys 2 \
    || die "sluice+mix does not see the tenant's plan or the client address (see above)"
}

h2_report() {  # $1 = meta JSON, $2 = summary JSON to write
  "${HELPER[@]}" h2-report --dir "$OUT" --variants "$VARIANTS" --reference "$REFERENCE" \
    --shapes "$H2_SHAPES" --rounds "$ROUNDS" --meta "$1" \
    --rps-ratio-min "$H2_RPS_RATIO_MIN" --p99-ratio-max "$H2_P99_RATIO_MAX" \
    --idle-kib-max "$H2_IDLE_KIB_MAX" --out "$2"
}
