# shellcheck shell=bash disable=SC2034
# (GW_* are run.sh's associative arrays.)
# bench/run.sh --mode mix-cluster: the production-like mix (bench/mix.sh) against one Valkey
# node (sluice+mix) and against a Valkey Cluster of CLUSTER_PRIMARIES primaries
# (sluice+mix@cluster), side by side (see "One Valkey node and a cluster" in bench/README.md).
# Sourced by run.sh after mix.sh; run.sh provides next_port, STARTED, HELPER, WORK, log, die,
# sluice_variant and mix_limit_toml.
#
# The cluster: CLUSTER_PRIMARIES servers (the server of ensure_valkey: BENCH_VALKEY_SERVER,
# valkey-server or redis-server) with --cluster-enabled yes on free loopback ports, no
# replicas, joined with `valkey-cli/redis-cli --cluster create ... --cluster-yes` (the slots
# split evenly), stopped by PID with everything else the run started.

CLUSTER_PRIMARIES=${BENCH_CLUSTER_PRIMARIES:-3}
if ! [[ $CLUSTER_PRIMARIES =~ ^[0-9]+$ ]] || ((CLUSTER_PRIMARIES < 3)); then
  echo "BENCH_CLUSTER_PRIMARIES: at least 3 (what --cluster create accepts)" >&2; exit 2
fi
# key_prefix of sluice+mix@cluster. Without a hash tag (the default, "rl:v1") every key is
# key_prefix:limit:{parts}, its own parts being its hash tag: clients spread over every slot.
# A Sluice that still demands a tag in cluster mode refuses it: "{rl}:v1" runs there (every
# key in the slot of "rl", on one primary).
CLUSTER_KEY_PREFIX=${BENCH_CLUSTER_KEY_PREFIX:-rl:v1}
CLUSTER_CLI=${BENCH_VALKEY_CLI:-}
# the default variants of the mode: each engine on one node and on the cluster
CLUSTER_VARIANTS="sluice+mix sluice+mix@cluster sluice+mix+module sluice+mix+module@cluster"

# Targets of sluice+mix@cluster against sluice+mix (information unless BENCH_STRICT=1).
CLUSTER_CPU_PER_DECISION_RATIO_MAX=1.25  # Valkey CPU per decision, cluster (sum) / one node
CLUSTER_SHARE_TARGET=$(awk -v n="$CLUSTER_PRIMARIES" 'BEGIN { printf "%.4f", 1 / n }')
                                         # each primary's share of the keys and of the CPU
CLUSTER_SHARE_TOLERANCE=0.08             # +- (absolute)

CLUSTER_PORTS=() CLUSTER_PIDS=() CLUSTER_NODES=""  # CLUSTER_NODES: "port:pid,port:pid,..."
ensure_valkey_cluster() {
  [[ -z $CLUSTER_NODES ]] || return 0
  local i d c port pid addrs=() bin
  bin=${BENCH_VALKEY_SERVER:-$(command -v valkey-server || command -v redis-server)} \
    || die "valkey-server or redis-server is needed for the cluster"
  VALKEY_BIN=${VALKEY_BIN:-$bin}  # (for the record of the run)
  if [[ -z $CLUSTER_CLI ]]; then  # the client beside the server, else one on the PATH
    local dir; dir=$(dirname "$bin")
    for c in "$dir/valkey-cli" "$dir/redis-cli"; do [[ -x $c ]] && { CLUSTER_CLI=$c; break; }; done
    [[ -n $CLUSTER_CLI ]] || CLUSTER_CLI=$(command -v valkey-cli || command -v redis-cli) \
      || die "valkey-cli or redis-cli is needed to create the cluster (BENCH_VALKEY_CLI)"
  fi
  # The cluster bus of a node listens on its port + 10000: ports whose bus port is free too.
  local ports
  mapfile -t ports < <("$PY" "$BENCH_DIR/cluster.py" ports "$CLUSTER_PRIMARIES" --avoid "${FREE[@]}")
  ((${#ports[@]} == CLUSTER_PRIMARIES)) || die "no free ports for the cluster"
  for ((i = 1; i <= CLUSTER_PRIMARIES; i++)); do
    d=$WORK/cluster/node$i
    mkdir -p "$d"
    port=${ports[$((i - 1))]}
    "${TASKSET_CLIENT[@]}" "$bin" --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --cluster-enabled yes --cluster-config-file "$d/nodes.conf" --cluster-node-timeout 5000 \
      "${VALKEY_MODULE_ARGS[@]}" --dir "$d" --logfile "$d/valkey.log" --daemonize no >"$d/stdout.log" 2>&1 &
    pid=$!
    STARTED+=("$pid")
    CLUSTER_PORTS+=("$port") CLUSTER_PIDS+=("$pid")
    addrs+=("127.0.0.1:$port")
  done
  for ((i = 0; i < CLUSTER_PRIMARIES; i++)); do
    "${HELPER[@]}" wait-valkey --port "${CLUSTER_PORTS[$i]}" --pid "${CLUSTER_PIDS[$i]}" \
      || die "$bin (cluster node $((i + 1))) did not start: $(tail -n 5 "$WORK/cluster/node$((i + 1))/valkey.log" 2>/dev/null)"
  done
  "$CLUSTER_CLI" --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    >"$WORK/cluster/create.log" 2>&1 \
    || die "$CLUSTER_CLI --cluster create failed: $(tail -n 5 "$WORK/cluster/create.log")"
  CLUSTER_NODES=$(for ((i = 0; i < CLUSTER_PRIMARIES; i++)); do
    printf '%s:%s\n' "${CLUSTER_PORTS[$i]}" "${CLUSTER_PIDS[$i]}"; done | paste -sd,)
  "$PY" "$BENCH_DIR/cluster.py" wait --nodes "$CLUSTER_NODES" \
    || die "the cluster did not reach cluster_state:ok (see $WORK/cluster/create.log)"
  log "valkey cluster ($(basename "$bin"), $CLUSTER_PRIMARIES primaries, no replicas, created with $(basename "$CLUSTER_CLI")): ${addrs[*]}  pids ${CLUSTER_PIDS[*]}"
}

# [valkey] of sluice+mix@cluster (and sluice+mix:ALGO@cluster): nodes = the cluster,
# key_prefix = $1 (CLUSTER_KEY_PREFIX, and -ALGO for one algorithm alone). Called by
# variant_sluice_mix, after ensure_valkey_cluster (this may run in a subshell).
cluster_variant_valkey_toml() {
  local seeds
  seeds=$(printf '"127.0.0.1:%s", ' "${CLUSTER_PORTS[@]}")
  printf '[valkey]\nnodes = [%s]\nkey_prefix = "%s"\n' "${seeds%, }" "$1"
}

# After the gateways started: the tenants in the cluster (each hash on the primary of its
# slot), and the check of sluice+mix@cluster (the plan applies, the per_ip key of the
# X-Forwarded-For address is on the primary of its slot).
cluster_prepare() {
  [[ -n $CLUSTER_NODES ]] || return 0
  "$PY" "$BENCH_DIR/cluster.py" seed --nodes "$CLUSTER_NODES" --keys "$MIX_TENANT_KEYS" \
    --tenants "$MIX_TENANTS" --out "$OUT/cluster_seed.json" \
    || die "could not put the tenants in the cluster"
  if [[ " $VARIANTS " == *" sluice+mix@cluster "* ]]; then
    "$PY" "$BENCH_DIR/cluster.py" check --port "${GW_PORT[sluice+mix@cluster]}" \
      --nodes "$CLUSTER_NODES" --key-prefix "$CLUSTER_KEY_PREFIX" \
      --tenant-keys "$MIX_TENANT_KEYS" --keys "$MIX_KEYS" \
      || die "sluice+mix@cluster does not see the mix as expected (see above)"
  fi
}

cluster_report() {  # $1 = meta JSON, $2 = summary JSON to write
  "$PY" "$BENCH_DIR/cluster.py" report --dir "$OUT" --variants "$VARIANTS" --rounds "$ROUNDS" \
    --meta "$1" --addresses "$MIX_ADDRESSES" --keys "$MIX_KEYS" \
    --tenant-keys "$MIX_TENANT_KEYS" --tenants "$MIX_TENANTS" --seed "$MIX_SEED" \
    --key-prefix "$CLUSTER_KEY_PREFIX" --primaries "$CLUSTER_PRIMARIES" \
    --cpu-per-decision-ratio-max "$CLUSTER_CPU_PER_DECISION_RATIO_MAX" \
    --share-target "$CLUSTER_SHARE_TARGET" --share-tolerance "$CLUSTER_SHARE_TOLERANCE" \
    --out "$2"
}
