#!/usr/bin/env bash
# Runs the `# RUN:` lines of a text test, in the style of LLVM's lit:
#   %s        the test file          %kiln       the kiln binary
#   %S        the test file's folder
#   %t        a fresh temporary dir  %FileCheck  LLVM's FileCheck
#   %exit N   run the rest of the command and require exit status N
# Each RUN line runs under bash with pipefail; the test passes when all succeed.
# usage: run_text_test.sh TEST_FILE KILN FILECHECK
set -u
test_file=$1 kiln=$2 filecheck=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
grep -E '^# RUN:' "$test_file" | sed -E 's/^# RUN: ?//' > "$tmp/.runs"
if [ ! -s "$tmp/.runs" ]; then
  echo "$test_file: no RUN lines" >&2
  exit 1
fi
while IFS= read -r line; do
  cmd=${line//%FileCheck/$filecheck}
  cmd=${cmd//%kiln/$kiln}
  cmd=${cmd//%exit/expect_exit}
  cmd=${cmd//%S/$(dirname "$test_file")}
  cmd=${cmd//%s/$test_file}
  cmd=${cmd//%t/$tmp}
  echo "RUN: $cmd"
  if ! bash -c "set -o pipefail
expect_exit() { want=\$1; shift; \"\$@\"; got=\$?; if [ \$got -ne \$want ]; then echo \"expected exit status \$want, got \$got\" >&2; return 1; fi; }
$cmd" < /dev/null; then
    echo "FAILED: $line" >&2
    status=1
  fi
done < "$tmp/.runs"
exit $status
