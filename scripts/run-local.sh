#!/usr/bin/env bash
# Installs, builds and runs Sluice locally: a redis-server (Valkey-compatible) on
# 127.0.0.1:6380 with the Sluice module loaded (build/sluice-valkey.so), two demo upstreams on :9000 and :9001, and Sluice on :8080 (admin :9901)
# with conf/sluice.toml. Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

redis-server --bind 127.0.0.1 --port 6380 --save '' --appendonly no --dir "$work" \
  --loadmodule "$PWD/build/sluice-valkey.so" --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
for port in 9000 9001; do
  /usr/bin/python3 tests/integration/upstream.py --port "$port" --strip-prefix /api \
    >"$work/upstream-$port.log" 2>&1 &
  pids+=($!)
done
sleep 0.5
echo "Sluice on http://127.0.0.1:8080 (admin http://127.0.0.1:9901/metrics); Ctrl-C stops."
echo "Try: curl -i http://127.0.0.1:8080/api/echo -H 'X-API-Key: key_abc'"
build/sluice -c conf/sluice.toml &
pids+=($!)
wait "${pids[-1]}"
