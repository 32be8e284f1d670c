#!/usr/bin/env bash
# Checks that the C++ sources follow .clang-format (Debian's clang-format-14); with --fix, rewrites
# them. Lists the files that differ and exits 1 when any does. Files named after the option (or
# alone) limit the check or the rewrite to them: `check_format.sh --fix src/a.cpp src/a.h`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format-14 >/dev/null || { echo "check_format: clang-format-14 is missing (scripts/setup.sh --tests installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.inc' 'tools/*.cpp' 'tools/*.h' 'tests/*.cpp' 'tests/*.h' \
                                 'include/*.h' 'fuzz/*.cpp')
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
if [ $# -gt 0 ]; then
  for f in "$@"; do
    [ -f "$f" ] || { echo "check_format: no such file: $f" >&2; exit 1; }
    case "$f" in
      *.cpp | *.h | *.inc) ;;
      *) echo "check_format: $f is not C++ (.cpp, .h, .inc): clang-format would rewrite it as C++" >&2; exit 1 ;;
    esac
  done
  files=("$@")
fi
if [ "$fix" = 1 ]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! clang-format-14 "$f" | cmp -s "$f" -; then
    echo "check_format: $f differs from .clang-format (scripts/check_format.sh --fix)" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "check_format: ${#files[@]} files follow .clang-format"
exit "$bad"
