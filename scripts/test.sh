#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: doctest unit tests, then the
# integration tests (real redis-server, real upstreams, the real binary on loopback ports),
# first on the normal build, then on the AddressSanitizer + UBSan build (leak checks on; without
# the suites marked once: tests/integration/pytest.ini), and
# last the libFuzzer targets for a bounded time (scripts/fuzz.sh). Before building, the C++
# sources must be as clang-format-14 writes them (scripts/format.sh --check).
#   SLUICE_SKIP_ASAN=1 scripts/test.sh   -> without the sanitizer build
#   SLUICE_SKIP_FUZZ=1 scripts/test.sh   -> without fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
echo "== clang-format (scripts/format.sh --check)"
scripts/format.sh --check

run_suite() {
  local dir=$1
  shift
  echo "== unit tests ($dir)"
  "$dir/sluice_unit_tests"
  echo "== integration tests ($dir)"
  SLUICE_BIN="$PWD/$dir/sluice" /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@" tests/integration
}

scripts/build.sh build
run_suite build

if [ "${SLUICE_SKIP_ASAN:-0}" != "1" ]; then
  scripts/build.sh build-asan -DSLUICE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # (not the suites marked once, whose work is inside Valkey, nor the long expiry storm:
  # tests/integration/pytest.ini)
  run_suite build-asan -m "not once"
fi
if [ "${SLUICE_SKIP_FUZZ:-0}" != "1" ]; then
  scripts/fuzz.sh
fi
echo "== all tests passed"
