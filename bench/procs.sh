# Process bookkeeping shared by bench/run.sh and bench/soak.sh (sourced, not run). The script
# that sources it defines log() and die(), sets RESULTS_DIR and ROOT, and keeps every PID it
# starts in STARTED, so that its EXIT trap stops exactly those and nothing else.

STARTED=()                 # every PID this script started, in order

descendants() {  # PIDs of the children of $1, recursively
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}

alive() {  # running and not a zombie
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $st && $st != Z* ]]
}

# Stops one started process (and its children): $2 = signal, waits up to $3 seconds, then KILL.
stop_pid() {
  local pid=$1 sig=${2:-TERM} wait_s=${3:-5} kids i
  kids=$(descendants "$pid")
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_s * 10; i++)); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  for k in $kids; do alive "$k" && kill -KILL "$k" 2>/dev/null; done
  wait "$pid" 2>/dev/null || true
}

forget_pid() {  # a PID that exited and was reaped: never signal it again (PIDs get reused)
  local p keep=()
  for p in "${STARTED[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}

# Runs "$@" as a registered child and waits for it. Waiting with `wait` (rather than running
# in the foreground) lets a signal to this script run the traps at once.
run_child() {
  "$@" &
  local p=$! rc=0
  STARTED+=("$p")
  wait "$p" || rc=$?
  forget_pid "$p"
  return "$rc"
}

stop_started() {  # every process still running, in the order they were started
  local pid
  for pid in "${STARTED[@]}"; do alive "$pid" && stop_pid "$pid" TERM 5; done
}

# SLUICE_BIN if set, else a Release build in build-release/ (log in $RESULTS_DIR/build.log),
# with the codec tool that bench/sizing.py and bench/script_cost.py call (sluice_codec).
build_sluice() {
  if [[ -n ${SLUICE_BIN:-} ]]; then
    [[ -x $SLUICE_BIN ]] || die "SLUICE_BIN=$SLUICE_BIN is not executable"
  else
    mkdir -p "$RESULTS_DIR"
    local build_log=$RESULTS_DIR/build.log warnings
    log "building Sluice (Release) in build-release (log: $build_log)"
    if ! { cmake -S "$ROOT" -B "$ROOT/build-release" -DCMAKE_BUILD_TYPE=Release &&
           cmake --build "$ROOT/build-release" --target sluice sluice_codec sluice_valkey -j2; } \
        >"$build_log" 2>&1; then
      tail -n 30 "$build_log" >&2
      die "build failed (if another engineer is editing src/, retry in a minute)"
    fi
    warnings=$(grep -c 'warning:' "$build_log" || true)
    [[ $warnings == 0 ]] || log "the build printed $warnings compiler warning(s), see $build_log"
    SLUICE_BIN=$ROOT/build-release/sluice
  fi
  SLUICE_BIN=$(realpath "$SLUICE_BIN")
  # The Valkey module beside it (BENCH_VALKEY_MODULE overrides): every Valkey the benchmark
  # starts loads it, and each variant says which engine it decides with.
  VALKEY_MODULE=${BENCH_VALKEY_MODULE:-$(dirname "$SLUICE_BIN")/sluice-valkey.so}
  VALKEY_MODULE_ARGS=()
  [[ -f $VALKEY_MODULE ]] && VALKEY_MODULE_ARGS=(--loadmodule "$VALKEY_MODULE")
  return 0
}
