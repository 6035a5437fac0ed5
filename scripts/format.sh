#!/usr/bin/env bash
# Formats every tracked C++ and CUDA file with clang-format and the repository's .clang-format
# (written for Debian's clang-format 14: apt-get install clang-format); with --check, changes
# nothing and fails, naming the files that are not formatted.
#   scripts/format.sh [--check]      (CLANG_FORMAT=... for another binary)
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${CLANG_FORMAT:-clang-format}"
command -v "$clang_format" > /dev/null || { echo "format: $clang_format not found (apt-get install clang-format)" >&2; exit 1; }
version=$("$clang_format" --version | grep -oE 'version [0-9]+' | cut -d' ' -f2)
[ "$version" = 14 ] || echo "format: $clang_format is version $version; .clang-format is tuned for 14 (others may format differently)" >&2
mapfile -t files < <(git ls-files -- '*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  unformatted=()
  for f in "${files[@]}"; do
    "$clang_format" --dry-run --Werror "$f" > /dev/null 2>&1 || unformatted+=("$f")
  done
  if [ ${#unformatted[@]} -gt 0 ]; then
    printf '%s\n' "${unformatted[@]}"
    echo "format: ${#unformatted[@]} of ${#files[@]} files are not formatted: run scripts/format.sh" >&2
    exit 1
  fi
  echo "format: all ${#files[@]} files are formatted"
elif [ $# -eq 0 ]; then
  "$clang_format" -i "${files[@]}"
else
  echo "usage: scripts/format.sh [--check]" >&2
  exit 2
fi
