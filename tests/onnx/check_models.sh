#!/usr/bin/env bash
# An ONNX model exported from PyTorch (tests/onnx/gen_models.py), checked three ways
# on a target: run directly from the .onnx, imported with `kiln import` and run from
# the .kiln text and its weights, and compiled from the .onnx into a shared object;
# each output is compared with PyTorch's.
# usage: check_models.sh KILN MODEL.onnx TARGET   (MODEL_input.npy, MODEL_expected.npy beside it)
set -eu
kiln=$1 model=$2 target=$3
compare=$(dirname "$kiln")/tests/npy_compare
base=${model%.onnx}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" run "$model" --target "$target" --input "x=${base}_input.npy" --output "y=$tmp/y.npy"
"$compare" "$tmp/y.npy" "${base}_expected.npy"
"$kiln" import "$model" -o "$tmp/m.kiln" --weights-out "$tmp/m.safetensors"
"$kiln" run "$tmp/m.kiln" --weights "$tmp/m.safetensors" --target "$target" --input "x=${base}_input.npy" \
  --output "y=$tmp/y2.npy"
"$compare" "$tmp/y2.npy" "${base}_expected.npy"
if [ "$target" = c ]; then
  "$kiln" compile "$model" -o "$tmp/m.so"
  "$kiln" run "$tmp/m.so" --input "x=${base}_input.npy" --output "y=$tmp/y3.npy"
  "$compare" "$tmp/y3.npy" "${base}_expected.npy"
fi
