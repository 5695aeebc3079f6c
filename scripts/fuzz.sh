#!/usr/bin/env bash
# Runs each libFuzzer target (clang-14, ASan + UBSan) for a bounded time
# over its corpus (tests/fuzz/corpus/<target>, copied: the repository is not changed). A crash
# is copied to tests/fuzz/regressions/<target>/, where the unit tests replay it from then on,
# and the script fails.
#   SLUICE_FUZZ_SECONDS=60 scripts/fuzz.sh            (seconds, default 60; the targets run in parallel)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SLUICE_FUZZ_SECONDS:-60}

# The fuzz targets come from the sanitizer build (scripts/build.sh --sanitize: clang-14, ASan +
# UBSan, libFuzzer's coverage), the same build the sanitizer test stage runs; up to date, this
# only checks it.
scripts/build.sh --sanitize >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
targets=(request config response chunked admin http2 rls h2upstream)
pids=()
for target in "${targets[@]}"; do
  mkdir -p "$work/$target" "$work/artifacts-$target"
  cp tests/fuzz/corpus/"$target"/* "$work/$target"/
  echo "== fuzz_$target for ${seconds}s"
  # They run side by side: CI time stays about one fuzzing period.
  ASAN_OPTIONS=detect_leaks=1 build-asan/fuzz_"$target" -max_total_time="$seconds" \
    -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts-$target/" "$work/$target" >"$work/$target.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  if wait "${pids[$i]}"; then
    echo "fuzz_$target: $(grep -E '^stat::number_of_executed_units' "$work/$target.log" || true)"
  else
    status=1
    tail -40 "$work/$target.log"
    mkdir -p tests/fuzz/regressions/"$target"
    cp "$work/artifacts-$target"/* tests/fuzz/regressions/"$target"/ 2>/dev/null || true
    echo "fuzz_$target found a crash: input saved in tests/fuzz/regressions/$target/"
  fi
done
exit $status
