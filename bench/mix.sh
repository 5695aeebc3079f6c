# shellcheck shell=bash disable=SC2034,SC2004
# (GW_* are run.sh's associative arrays, MIX_IDENTITY_TOML is read by its sluice_config.)
# bench/run.sh --mode mix: the production-like traffic mix, the headline rate-limit case (see
# "The traffic mix" in bench/README.md). Sourced by run.sh, which provides ensure_valkey,
# sluice_variant, PY, log and die.
#
# wrk runs bench/mix.lua against every variant but the one-key ones (MIX_ONE_KEY): each
# request comes from one of MIX_ADDRESSES client addresses (X-Forwarded-For through the
# trusted proxy 127.0.0.1) with one of MIX_KEYS API keys, the first MIX_TENANT_KEYS of which
# belong to MIX_TENANTS tenants (plan "pro") in Valkey.

MIX_ADDRESSES=${BENCH_MIX_ADDRESSES:-100000}
MIX_KEYS=${BENCH_MIX_KEYS:-5000}
MIX_TENANT_KEYS=${BENCH_MIX_TENANT_KEYS:-1000}
MIX_TENANTS=${BENCH_MIX_TENANTS:-100}
MIX_SEED=${BENCH_MIX_SEED:-1}
MIX_ONE_KEY=${BENCH_MIX_ONE_KEY:-sluice+limit}
MIX_VARIANTS="nginx sluice sluice+mix sluice+mix+module sluice+mix:fixed_window"
MIX_VARIANTS+=" sluice+mix:sliding_window"
MIX_VARIANTS+=" sluice+mix:token_bucket sluice+mix:sliding_log sluice+limit"
export MIX_ADDRESSES MIX_KEYS MIX_SEED  # read by mix.lua in wrk

# Targets of sluice+mix (information unless BENCH_STRICT=1).
MIX_RPS_RATIO_MIN=0.75     # requests/s, sluice+mix / nginx on the same requests
MIX_P99_RATIO_MAX=1.5      # p99, the same pair
MIX_VALKEY_CPU_US_MAX=12   # Valkey's CPU per request
MIX_OWN_CPU_US_MAX=5       # Sluice's CPU per request above plain Sluice's (same requests)
# sluice+mix+module: the same mix decided by the Valkey module (engine = "module").
MODULE_RPS_RATIO_MIN=0.75
MODULE_P99_RATIO_MAX=1.5
MODULE_VALKEY_CPU_US_MAX=4
MODULE_OWN_CPU_US_MAX=4

# Every Sluice of the mode believes X-Forwarded-For from wrk (plain Sluice included, so that
# it resolves the same client addresses); see sluice_config.
MIX_IDENTITY_TOML='[identity]
trusted_proxies = ["127.0.0.1/32"]
'

# The limits; each variant has its own key_prefix, so no two share (or mistype) a key.
# Per address about 0.3 requests/s and per API key about 6 at 30,000 requests/s: every
# request is allowed. sliding_log keeps a small log (20 per second).
# --mode h2 and --mode grpc (one client, bench/h2.sh): limits of 1,000,000,000 (per_key 100,000,000, raised
# 10x by the plan), so that one address and one key are always allowed.
mix_limit_toml() {  # $1 = limit name, $2 = algorithm
  local by=ip limit=1000 window=1m
  [[ $1 == per_key ]] && by=api_key limit=6000
  [[ $2 == sliding_log ]] && limit=20 window=1s
  if [[ $H2_CLIENTS == 1 ]]; then
    limit=1000000000
    [[ $1 == per_key ]] && limit=100000000
  fi
  printf '[[limit]]\nname = "%s"\nalgorithm = "%s"\nby = ["%s"]\nlimit = %s\nwindow = "%s"\n\n' \
    "$1" "$2" "$by" "$limit" "$window"
}

# sluice+mix: per_ip (sliding_window by ip) and per_key (token_bucket by api_key, raised 10x
# by the plan "pro" of the tenants in Valkey). sluice+mix:ALGO: per_ip alone with ALGO.
# NAME@cluster (--mode mix-cluster, bench/cluster.sh): the same against the Valkey Cluster.
# NAME+module (sluice+mix+module, sluice+mix+module@cluster): decided by the Valkey module
# (engine = "module", the servers load it: VALKEY_MODULE); the others by the Lua functions
# (engine = "lua", on the same servers).
variant_sluice_mix() {
  local name=$1 base=${1%@cluster} algo route='limits = ["per_ip"]' cluster=0 engine=lua
  if [[ $base == *+module ]]; then
    engine=module base=${base%+module}
    [[ -f $VALKEY_MODULE ]] || die "variant $name: no Valkey module at $VALKEY_MODULE"
  fi
  algo=${base#*:}
  [[ $base == *:* ]] || algo=""
  [[ $name == *@cluster ]] && cluster=1
  [[ $name == *@* && $cluster == 0 ]] && die "variant $name: only @cluster is known"
  case "$algo" in ""|fixed_window|sliding_window|token_bucket|sliding_log) ;;
    *) die "variant $name: unknown algorithm '$algo'" ;; esac
  [[ -z $algo ]] && route='limits = ["per_ip", "per_key"]'
  if ((cluster)); then
    ensure_valkey_cluster
    # (sluice+mix:ALGO@cluster: a prefix of its own, beside sluice+mix@cluster's)
    GW_CLUSTER[$name]=1 GW_KEY_PREFIX[$name]=$CLUSTER_KEY_PREFIX${algo:+-$algo}
  else
    ensure_valkey
    GW_KEY_PREFIX[$name]=rl:${name//[^A-Za-z0-9_]/-}
  fi
  sluice_variant "$name" "$route" < <(
    if ((cluster)); then
      cluster_variant_valkey_toml "${GW_KEY_PREFIX[$name]}"
    else
      printf '[valkey]\naddress = "127.0.0.1:%s"\nkey_prefix = "%s"\n' \
        "$VALKEY_PORT" "${GW_KEY_PREFIX[$name]}"
    fi
    printf 'engine = "%s"\n\n' "$engine"
    if [[ -z $algo ]]; then
      mix_limit_toml per_ip sliding_window
      mix_limit_toml per_key token_bucket
      local pro=60000
      [[ $H2_CLIENTS == 1 ]] && pro=1000000000
      printf '[[plan]]\nname = "pro"\nlimits = { per_key = %s }\n' "$pro"
    else
      mix_limit_toml per_ip "$algo"
    fi
    # sluice+rls (bench/rls.sh): the rate limit service's listener too.
    [[ -z ${GW_RLS_PORT[$name]:-} ]] || rls_toml "$name")
  GW_VALKEY[$name]=1
}

# After the gateways started: the tenants in Valkey, the wrk script of each variant, and a
# check that sluice+mix reads the client address and the tenant's plan.
mix_prepare() {
  local v
  ensure_valkey
  "$PY" "$BENCH_DIR/mix.py" seed --port "$VALKEY_PORT" --keys "$MIX_TENANT_KEYS" \
    --tenants "$MIX_TENANTS" || die "could not put the tenants in Valkey"
  for v in $VARIANTS; do
    [[ " $MIX_ONE_KEY " == *" $v "* ]] || GW_SCRIPT[$v]=$BENCH_DIR/mix.lua
  done
  [[ $MODE != mix-cluster ]] || cluster_prepare
  if [[ " $VARIANTS " == *" sluice+mix "* ]]; then
    "$PY" "$BENCH_DIR/mix.py" check --port "${GW_PORT[sluice+mix]}" --valkey-port "$VALKEY_PORT" \
      --key-prefix "rl:sluice-mix" --tenant-keys "$MIX_TENANT_KEYS" --keys "$MIX_KEYS" \
      || die "sluice+mix does not see the mix as expected (see above)"
  fi
}

mix_report() {  # $1 = meta JSON, $2 = summary JSON to write
  "$PY" "$BENCH_DIR/mix.py" report --dir "$OUT" --variants "$VARIANTS" --rounds "$ROUNDS" \
    --meta "$1" --one-key "$MIX_ONE_KEY" --addresses "$MIX_ADDRESSES" --keys "$MIX_KEYS" \
    --tenant-keys "$MIX_TENANT_KEYS" --tenants "$MIX_TENANTS" --seed "$MIX_SEED" \
    --rps-ratio-min "$MIX_RPS_RATIO_MIN" --p99-ratio-max "$MIX_P99_RATIO_MAX" \
    --valkey-cpu-us-max "$MIX_VALKEY_CPU_US_MAX" --own-cpu-us-max "$MIX_OWN_CPU_US_MAX" \
    --module-targets "$MODULE_RPS_RATIO_MIN,$MODULE_P99_RATIO_MAX,$MODULE_VALKEY_CPU_US_MAX,$MODULE_OWN_CPU_US_MAX" \
    --out "$2"
}
