#!/usr/bin/env bash
# Every C and C++ file of the tree is as clang-format-14 writes it (.clang-format):
# lists the files that are not and fails. Exit 77 (CTest's skip) without git or
# clang-format-14, as in a source tarball.
set -eu
cd "$(dirname "$0")/.."
command -v clang-format-14 >/dev/null && git rev-parse --git-dir >/dev/null 2>&1 || exit 77
bad=$(git ls-files '*.c' '*.h' '*.cpp' | while read -r f; do
  if [ -f "$f" ] && ! clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1; then echo "$f"; fi
done)
if [ -n "$bad" ]; then
  echo "not formatted (clang-format-14 -i FILE):"
  echo "$bad"
  exit 1
fi
echo "every C file is clang-format clean"
