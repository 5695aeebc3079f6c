#!/usr/bin/env bash
# Builds Sluice. Usage: scripts/build.sh [build-dir] [extra cmake args...]
#   scripts/build.sh                       -> build/ (RelWithDebInfo: -O2 -g1, the compiler cmake finds)
#   scripts/build.sh --sanitize            -> build-asan/: clang-14, AddressSanitizer + UBSan,
#       -O0 -g1 (line tables), with the unit tests and the libFuzzer targets (SLUICE_FUZZ): one
#       build serves the sanitizer test stage and scripts/fuzz.sh. (The tests take a gateway
#       whose path holds "asan" for the sanitizer build.) -O0: the sanitizers find the same
#       errors; it compiles in 60% of -O1's time (216 s against 368 s on two cores), and the
#       integration tests, which wait on sockets, take as long.
#   scripts/build.sh build-gcc-asan -DSLUICE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
#                                          -> the sanitizers with gcc, without the fuzz targets
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  shift
  # A build-asan/ of another compiler (gcc's, before this build served the fuzz targets too)
  # cannot be reconfigured in place: it is made anew.
  if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++-14' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  set -- build-asan -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DSLUICE_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -g1" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1" "$@"
fi
dir=${1:-build}
shift || true
cmake -S . -B "$dir" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
