#!/usr/bin/env bash
# Runs integration tests against one build of the gateway: every selected test but those marked
# `alone` in parallel (pytest-xdist, SLUICE_TEST_JOBS processes, default 4: the tests wait on
# sockets and timers far more than they compute, and each starts its own servers on free ports),
# then the `alone` ones (latency, RSS and descriptor bounds under load) one at a time.
#   scripts/integration.sh BIN [-m EXPR] [pytest arguments and paths; default tests/integration]
# BIN is the gateway under test (SLUICE_BIN); a path with "asan" in it is taken for the sanitizer
# build, whose bounds are scaled (tests/integration/harness/gateway.py).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BIN [-m EXPR] [pytest args...]" >&2; exit 2; }
bin=$(realpath -s "$1")
shift
marks=""
if [ "${1:-}" = "-m" ]; then
  marks=$2
  shift 2
fi
args=("$@")
has_path=0
for a in "${args[@]}"; do
  [[ "$a" == tests/* ]] && has_path=1
done
[ $has_path = 1 ] || args+=(tests/integration)

marked() { # $1: "alone" or "not alone", combined with the caller's expression
  if [ -n "$marks" ]; then echo "$1 and ($marks)"; else echo "$1"; fi
}
pytest_run() { # exit code 5 is "no test selected": not a failure here
  local rc=0
  SLUICE_BIN="$bin" /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@" || rc=$?
  [ $rc = 0 ] || [ $rc = 5 ] || exit $rc
}
pytest_run -n "${SLUICE_TEST_JOBS:-4}" -m "$(marked "not alone")" "${args[@]}"
pytest_run -m "$(marked alone)" "${args[@]}"
