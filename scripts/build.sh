#!/usr/bin/env bash
# Builds Sluice. Usage: scripts/build.sh [build-dir] [extra cmake args...]
#   scripts/build.sh                       -> build/ (RelWithDebInfo)
#   scripts/build.sh build-asan -DSLUICE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
