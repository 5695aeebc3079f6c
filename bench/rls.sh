# shellcheck shell=bash disable=SC2034,SC2004
# (GW_* are run.sh's associative arrays.)
# bench/run.sh --mode rls: Sluice as Envoy's rate limit service (see "Rate limit service" in
# bench/README.md). Sourced by run.sh after mix.sh: the mode is a traffic-mix mode (MIX_MODE),
# whose gateways (sluice, sluice+mix) get the mix from wrk (bench/mix.lua), and whose
# rate-limit-service variants (sluice+rls, sluice+rls+module) get the same mix as unary
# ShouldRateLimit calls from bench/rls_load.c: each call has the mix's two descriptors,
# remote_address (one of MIX_ADDRESSES) and api_key (one of MIX_KEYS), drawn uniformly from
# the same seed, which [[rls.descriptor]] maps to the mix's limits per_ip and per_key: the
# same decisions on the same keys as sluice+mix's requests.
#
# The load: RLS_CONNECTIONS h2c connections with RLS_STREAMS calls in flight each (a closed
# loop, like wrk's CONNECTIONS connections with one request each; Envoy multiplexes its calls
# on few connections), the calls cycling through RLS_CALLS distinct requests.

RLS_VARIANTS="sluice sluice+mix sluice+rls sluice+mix+module sluice+rls+module"
RLS_CONNECTIONS=${BENCH_RLS_CONNECTIONS:-5}
RLS_STREAMS=${BENCH_RLS_STREAMS:-10}
RLS_CALLS=${BENCH_RLS_CALLS:-200000}
declare -A GW_RLS_PORT  # the [rls] listener of a rate-limit-service variant

# Targets (issue 45), each rate-limit-service variant against the gateway variant of its
# engine on the same mix: Valkey's CPU per call over its CPU per request, and Sluice's CPU per
# call over its CPU per proxied request.
RLS_VALKEY_CPU_RATIO_MAX=1.1
RLS_OWN_CPU_RATIO_MAX=0.6

variant_sluice_rls() {  # sluice+rls[+module]: sluice+mix's configuration and the service's
  next_port; GW_RLS_PORT[$1]=$PORT_OUT
  variant_sluice_mix "$1"
}

# The [rls] tables of a rate-limit-service variant $1 (printed into its configuration by
# variant_sluice_mix, in a subshell: the port is taken before).
rls_toml() {
  cat <<EOF

[rls]
listen = "127.0.0.1:${GW_RLS_PORT[$1]}"

[[rls.descriptor]]
domain = "mix"
entries = ["remote_address"]
limit = "per_ip"

[[rls.descriptor]]
domain = "mix"
entries = ["api_key"]
limit = "per_key"
EOF
}

# The load client (cc and libnghttp2-dev), the calls' requests, and one second of calls on
# every rate-limit-service variant: each must answer them all, OK.
rls_prepare() {
  RLS_LOAD=$WORK/rls_load
  cc -O2 -o "$RLS_LOAD" "$BENCH_DIR/rls_load.c" -lnghttp2 \
    || die "could not build bench/rls_load.c (cc, libnghttp2-dev)"
  RLS_BODIES=$WORK/rls-requests.bin
  "$PY" "$BENCH_DIR/rls.py" requests --out "$RLS_BODIES" --calls "$RLS_CALLS" \
    --addresses "$MIX_ADDRESSES" --keys "$MIX_KEYS" --seed "$MIX_SEED" \
    || die "could not write the calls' requests"
  local v out
  for v in $VARIANTS; do
    [[ -n ${GW_RLS_PORT[$v]:-} ]] || continue
    out=$WORK/$v/rls-check.txt
    "$RLS_LOAD" "${GW_RLS_PORT[$v]}" 1 1 1 "$RLS_BODIES" >"$out" 2>&1 || true
    grep -qE '^[1-9][0-9]* calls answered, [1-9][0-9]* OK, 0 OVER_LIMIT, 0 failed' "$out" \
      || die "$v does not answer ShouldRateLimit calls OK: $(cat "$out")"
    log "$(printf '%-14s rate limit service on 127.0.0.1:%s (h2c): %s' "$v" "${GW_RLS_PORT[$v]}" \
      "$(head -n 1 "$out")")"
  done
}

# $1 = variant, $2 = duration, $3 = output file: run_wrk's part for a rate-limit-service
# variant.
run_rls_load() {
  local secs
  secs=$(seconds "$2")
  run_child timeout --signal=INT --kill-after=10 $((secs + 30)) \
    "${TASKSET_CLIENT[@]}" "$RLS_LOAD" "${GW_RLS_PORT[$1]}" "$RLS_CONNECTIONS" "$RLS_STREAMS" \
    "$secs" "$RLS_BODIES" >"$3" 2>&1 || true
}

rls_report() {  # $1 = meta JSON, $2 = summary JSON to write
  "$PY" "$BENCH_DIR/rls.py" report --dir "$OUT" --run-dir "$RUN_DIR" --variants "$VARIANTS" \
    --rounds "$ROUNDS" --meta "$1" --addresses "$MIX_ADDRESSES" --keys "$MIX_KEYS" \
    --seed "$MIX_SEED" --calls "$RLS_CALLS" --rls-connections "$RLS_CONNECTIONS" \
    --rls-streams "$RLS_STREAMS" --valkey-cpu-ratio-max "$RLS_VALKEY_CPU_RATIO_MAX" \
    --own-cpu-ratio-max "$RLS_OWN_CPU_RATIO_MAX" --out "$2"
}
