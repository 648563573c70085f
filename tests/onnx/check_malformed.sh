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
# hostile_onnx_external_symlink: external data is read only from regular files under the
# model's directory, reached without a symbolic link. git keeps no empty directory and
# a link's target depends on the checkout, so the links are made here.
refuse() { # LABEL MODEL TEXT
  status=0
  "$kiln" import "$2" -o "$tmp/out.kiln" --weights-out "$tmp/out.safetensors" > "$tmp/log" 2>&1 || status=$?
  if [ "$status" -ne 1 ] || ! grep -qF -- "$3" "$tmp/log" || [ -e "$tmp/out.kiln" ]; then
    echo "FAILED: $1: status $status, expected 1 and '$3' in:"; cat "$tmp/log"; fail=1
  fi
}
ext=$tmp/ext && mkdir -p "$ext/data" "$tmp/outside"
cp "$dir/external_ok.onnx" "$dir/external_subdir.onnx" "$ext/"
cp "$dir/external_ok.bin" "$ext/data/" && cp "$dir/external_ok.bin" "$tmp/outside/"
"$kiln" run "$ext/external_subdir.onnx" --target interp --input "x=$dir/external_ok_input.npy" --output "y=$tmp/y.npy" &&
  "$compare" "$tmp/y.npy" "$dir/external_ok_expected.npy" || { echo "FAILED: external data in a subdirectory"; fail=1; }
rm -f "$tmp/y.npy"
ln -s "$tmp/outside/external_ok.bin" "$ext/external_ok.bin"
refuse "a link to a file outside" "$ext/external_ok.onnx" "'external_ok.bin' is refused: a component of it is a symbolic link"
ln -s /etc/passwd "$ext/passwd" && rm "$ext/external_ok.bin" && ln -s passwd "$ext/external_ok.bin"
refuse "a link to /etc/passwd" "$ext/external_ok.onnx" "'external_ok.bin' is refused: a component of it is a symbolic link"
rm -r "$ext/data" && ln -s "$tmp/outside" "$ext/data"
refuse "a linked directory" "$ext/external_subdir.onnx" "'data/external_ok.bin' is refused: a component of it is a symbolic link"
rm "$ext/data" && mkdir "$ext/data" && mkfifo "$ext/data/external_ok.bin"
refuse "a FIFO" "$ext/external_subdir.onnx" "'data/external_ok.bin' is refused: it is not a regular file"
rm -r "$ext" "$tmp/outside"
# a shape input bound to a constant
"$kiln" import "$dir/unbound_shape.onnx" --bind "shape=$dir/unbound_shape_bind.npy" -o "$tmp/bound.kiln" &&
  grep -q 'reshape(x, shape=\[3, 2\])' "$tmp/bound.kiln" || { echo "FAILED: --bind"; cat "$tmp/bound.kiln"; fail=1; }
# a symbolic dim fixed with --dim, in the input and the output that declare it; a
# --dim no input has is an error
"$kiln" import "$dir/symbolic_dim.onnx" --dim N=5 -o "$tmp/dim.kiln" &&
  grep -q 'input x : f32\[5, 3\]' "$tmp/dim.kiln" && grep -q 'y = relu(x) : f32\[5, 3\]' "$tmp/dim.kiln" ||
  { echo "FAILED: --dim"; cat "$tmp/dim.kiln"; fail=1; }
rm -f "$tmp/dim.kiln"
status=0
"$kiln" run "$dir/symbolic_dim.onnx" --dim M=5 --target interp > "$tmp/log" 2>&1 || status=$?
if [ "$status" -ne 1 ] || ! grep -qF "no graph input has a symbolic dim 'M' to fix at 5" "$tmp/log"; then
  echo "FAILED: --dim of no input's dim: status $status"; cat "$tmp/log"; fail=1
fi
# a model compiled with --dim is not the model without it: the model cache, keyed by
# the file, must not answer the second run
printf 'param c : f32[2, 3] = uniform(-1, 1, seed=1)\noutput c\n' > "$tmp/mk.kiln"
"$kiln" run "$tmp/mk.kiln" --target interp --output "c=$tmp/x23.npy" &&
  "$kiln" run "$dir/symbolic_dim.onnx" --dim N=2 --input "x=$tmp/x23.npy" --output "y=$tmp/y23.npy" ||
  { echo "FAILED: a run with --dim N=2"; fail=1; }
status=0
"$kiln" run "$dir/symbolic_dim.onnx" --input "x=$tmp/x23.npy" > "$tmp/log" 2>&1 || status=$?
if [ "$status" -ne 1 ] || ! grep -qF "dim 0 is the symbolic 'N'" "$tmp/log"; then
  echo "FAILED: a run without --dim after one with it: status $status"; cat "$tmp/log"; fail=1
fi
rm -f "$tmp/mk.kiln" "$tmp/x23.npy" "$tmp/y23.npy"
# a constant Slice with a step of INT64_MAX (its length once overflowed)
"$kiln" import "$dir/hostile_slice_step_ok.onnx" -o "$tmp/slice.kiln" &&
  grep -q 'reshape(x, shape=\[2\])' "$tmp/slice.kiln" || { echo "FAILED: hostile_slice_step_ok.onnx"; cat "$tmp/slice.kiln"; fail=1; }
[ "$fail" -eq 0 ] && echo "all malformed files rejected as expected"
exit $fail
