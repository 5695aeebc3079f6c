#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (ASan + UBSan) and runs each for a bounded time
# over its corpus (tests/fuzz/corpus/<target>, copied: the repository is not changed). A crash
# is copied to tests/fuzz/regressions/<target>/, where the unit tests replay it from then on,
# and the script fails.
#   SLUICE_FUZZ_SECONDS=60 scripts/fuzz.sh            (seconds per target, default 45)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SLUICE_FUZZ_SECONDS:-45}

CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_request fuzz_config fuzz_response

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for target in request config response; do
  mkdir -p "$work/$target" "$work/artifacts-$target"
  cp tests/fuzz/corpus/"$target"/* "$work/$target"/
  echo "== fuzz_$target for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 build-fuzz/fuzz_"$target" -max_total_time="$seconds" \
       -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$work/artifacts-$target/" "$work/$target" 2>"$work/$target.log"; then
    status=1
    tail -40 "$work/$target.log"
    mkdir -p tests/fuzz/regressions/"$target"
    cp "$work/artifacts-$target"/* tests/fuzz/regressions/"$target"/ 2>/dev/null || true
    echo "fuzz_$target found a crash: input saved in tests/fuzz/regressions/$target/"
  else
    grep -E '^stat::number_of_executed_units|^Done' "$work/$target.log" || true
  fi
done
exit $status
