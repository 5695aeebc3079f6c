# Sourced by scripts/test.sh and .ci/run: `stage NAME COMMAND...` runs COMMAND (under the
# caller's set -e), says "== NAME", and records how long it took in $SLUICE_STAGE_TIMES (a
# file that the outermost script creates and the scripts it calls fill too). The outermost
# script prints the table when it exits, also after a failure (that stage is marked failed), so
# that a slow or broken run shows where its time went.
_stages_owner=0
if [ -z "${SLUICE_STAGE_TIMES:-}" ]; then
  SLUICE_STAGE_TIMES=$(mktemp)
  export SLUICE_STAGE_TIMES
  _stages_owner=1
fi
_stages_start=$SECONDS
_stage_name=""

_stages_exit() {
  local rc=$?
  if [ -n "$_stage_name" ]; then
    printf '%s\t%s\n' "$_stage_name (failed)" $((SECONDS - _stage_t0)) >>"$SLUICE_STAGE_TIMES"
  fi
  if [ $_stages_owner = 1 ]; then
    {
      echo
      echo "== stage times (seconds)"
      awk -F'\t' '{ printf "%-52s %6d\n", $1, $2 }' "$SLUICE_STAGE_TIMES"
      printf '%-52s %6d\n' "total" $((SECONDS - _stages_start))
    } >&2
    rm -f "$SLUICE_STAGE_TIMES"
  fi
  exit $rc
}
trap _stages_exit EXIT

stage() {
  _stage_name=$1
  shift
  _stage_t0=$SECONDS
  echo "== $_stage_name"
  "$@"
  printf '%s\t%s\n' "$_stage_name" $((SECONDS - _stage_t0)) >>"$SLUICE_STAGE_TIMES"
  _stage_name=""
}
