#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test. The C++ sources must first be as
# clang-format-14 writes them (scripts/format.sh --check). Then:
#   1. the normal build (build/): doctest unit tests, then the integration tests (real
#      redis-server, real upstreams, the real binary on loopback ports), in parallel
#      (scripts/integration.sh: pytest-xdist; the tests marked `alone` after, one at a time);
#   2. the sanitizer build (build-asan/: clang-14, ASan + UBSan, leak checks on): the unit tests
#      and the integration tests but the suites marked `once` (tests/integration/pytest.ini:
#      their work is inside Valkey, or they move 100 MiB), the same way;
#   3. the libFuzzer targets of that same build, for a bounded time (scripts/fuzz.sh).
# At the end (also after a failure) a table says how long each stage took.
#   scripts/test.sh --quick              -> the inner loop before a commit: clang-format, the
#                                           normal build, its unit and integration tests
#   SLUICE_SKIP_ASAN=1 scripts/test.sh   -> without the sanitizer build's tests
#   SLUICE_SKIP_FUZZ=1 scripts/test.sh   -> without fuzzing
#   SLUICE_TEST_JOBS=N                   -> integration tests in N processes (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

stage "install packages (scripts/deps.sh)" scripts/deps.sh
stage "clang-format (scripts/format.sh --check)" scripts/format.sh --check

stage "build (build/)" scripts/build.sh build
stage "unit tests (build/)" build/sluice_unit_tests
stage "integration tests (build/)" scripts/integration.sh build/sluice
[ $quick = 0 ] || exit 0

if [ "${SLUICE_SKIP_ASAN:-0}" != "1" ] || [ "${SLUICE_SKIP_FUZZ:-0}" != "1" ]; then
  stage "build (build-asan/: ASan + UBSan, fuzz targets)" scripts/build.sh --sanitize
fi
if [ "${SLUICE_SKIP_ASAN:-0}" != "1" ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  stage "unit tests (build-asan/)" build-asan/sluice_unit_tests
  stage "integration tests (build-asan/), not once" scripts/integration.sh build-asan/sluice -m "not once"
fi
if [ "${SLUICE_SKIP_FUZZ:-0}" != "1" ]; then
  stage "fuzzing (scripts/fuzz.sh)" scripts/fuzz.sh
fi
echo "== all tests passed"
