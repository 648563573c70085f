#!/usr/bin/env bash
# Hostile and wrong ONNX files (tests/onnx/gen_malformed.py): `kiln import` must exit
# with status 1, print the message tests/onnx/malformed/expected.txt gives, and leave
# no output file; `kiln run` of the same file must fail the same way. Then the files
# that must work: external data beside the model, and a shape input bound with --bind.
# usage: check_malformed.sh KILN MALFORMED_DIR
set -u
kiln=$1 dir=$2
compare=$(dirname "$kiln")/tests/npy_compare
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
while IFS=$'\t' read -r file text; do
  case "$file" in '#'*|'') continue ;; esac
  status=0
  "$kiln" import "$dir/$file" -o "$tmp/out.kiln" --weights-out "$tmp/out.safetensors" > "$tmp/log" 2>&1 || status=$?
  if [ "$status" -ne 1 ]; then echo "FAILED: $file: exit status $status, expected 1"; cat "$tmp/log"; fail=1; fi
  if ! grep -qF -- "$text" "$tmp/log"; then echo "FAILED: $file: no '$text' in:"; cat "$tmp/log"; fail=1; fi
  if [ -e "$tmp/out.kiln" ] || [ -e "$tmp/out.safetensors" ] || [ -n "$(ls -A "$tmp" | grep -v '^log$')" ]; then
    echo "FAILED: $file: an output file was left"; ls -la "$tmp"; fail=1
  fi
  status=0
  "$kiln" run "$dir/$file" --target interp > "$tmp/log" 2>&1 || status=$?
  if [ "$status" -ne 1 ] || ! grep -qF -- "$text" "$tmp/log"; then
    echo "FAILED: kiln run $file: status $status"; cat "$tmp/log"; fail=1
  fi
done < "$dir/expected.txt"
# external data next to the model
"$kiln" run "$dir/external_ok.onnx" --target interp --input "x=$dir/external_ok_input.npy" --output "y=$tmp/y.npy" &&
  "$compare" "$tmp/y.npy" "$dir/external_ok_expected.npy" || { echo "FAILED: external_ok.onnx"; fail=1; }
# a shape input bound to a constant
"$kiln" import "$dir/unbound_shape.onnx" --bind "shape=$dir/unbound_shape_bind.npy" -o "$tmp/bound.kiln" &&
  grep -q 'reshape(x, shape=\[3, 2\])' "$tmp/bound.kiln" || { echo "FAILED: --bind"; cat "$tmp/bound.kiln"; fail=1; }
# a constant Slice with a step of INT64_MAX (its length once overflowed)
"$kiln" import "$dir/hostile_slice_step_ok.onnx" -o "$tmp/slice.kiln" &&
  grep -q 'reshape(x, shape=\[2\])' "$tmp/slice.kiln" || { echo "FAILED: hostile_slice_step_ok.onnx"; cat "$tmp/slice.kiln"; fail=1; }
[ "$fail" -eq 0 ] && echo "all malformed files rejected as expected"
exit $fail
