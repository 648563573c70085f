#!/usr/bin/env bash
# The printer's contract: print(parse(print(model))) is byte-identical to
# print(model), at -O0 and after the default pipeline.
# usage: roundtrip.sh KILN MODEL
set -eu
kiln=$1 model=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for level in -O0 -O2; do
  "$kiln" opt "$level" "$model" > "$tmp/a.kiln"
  "$kiln" opt "$level" "$tmp/a.kiln" > "$tmp/b.kiln"
  if ! cmp -s "$tmp/a.kiln" "$tmp/b.kiln"; then
    echo "$model: printing at $level is not a fixed point:" >&2
    diff "$tmp/a.kiln" "$tmp/b.kiln" >&2 || true
    exit 1
  fi
done
