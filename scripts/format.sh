#!/usr/bin/env bash
# clang-format (Debian's clang-format-14, the repository's .clang-format) over every C++ file
# of src/, tests/ and bench/.
#   scripts/format.sh          rewrites the files in place
#   scripts/format.sh --check  changes nothing; lists the files that differ and fails if any
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'bench/*.c')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    if ! clang-format-14 --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "clang-format-14 would change these files (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "clang-format: ${#files[@]} files clean"
else
  clang-format-14 --style=file -i "${files[@]}"
fi
