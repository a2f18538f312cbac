#!/bin/bash
# Every tracked C++ and CUDA file is as clang-format (.clang-format) lays it out, and the check
# fails on one that is not: a copy of a file with a line joined is refused.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v clang-format >/dev/null || { echo "format_test: clang-format is not installed" >&2; exit 1; }
cd "$src"
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
(( ${#files[@]} > 0 )) || { echo "format_test: no tracked C++ files under $src" >&2; exit 1; }
clang-format --dry-run -Werror "${files[@]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp .clang-format "$tmp/"
printf 'int f(int a,int b){return a+b;}\n' > "$tmp/bad.cpp"
if clang-format --dry-run -Werror "$tmp/bad.cpp" 2>/dev/null; then
  echo "format_test: a file clang-format would change passed the check" >&2
  exit 1
fi
echo "format: ${#files[@]} files as clang-format lays them out; a file that is not is refused"
