#!/usr/bin/env bash
# An ONNX model exported from PyTorch (tests/onnx/gen_models.py), checked three ways
# on a target: run directly from the .onnx, imported with `kiln import` and run from
# the .kiln text and its weights, and compiled from the .onnx into a shared object;
# each output is compared with PyTorch's.
# usage: check_models.sh KILN MODEL.onnx TARGET [OPTION...]
#   beside MODEL.onnx: MODEL_expected.npy, and MODEL_input.npy (the input x) or
#   MODEL_input_NAME.npy for each input NAME; the OPTIONs (--dim NAME=SIZE) go to
#   every command that reads the .onnx
set -eu
kiln=$1 model=$2 target=$3
shift 3
onnx_options=("$@")
compare=$(dirname "$kiln")/tests/npy_compare
base=${model%.onnx}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inputs=()
if [ -e "${base}_input.npy" ]; then
  inputs=(--input "x=${base}_input.npy")
else
  for f in "${base}"_input_*.npy; do
    name=${f#"${base}_input_"}
    inputs+=(--input "${name%.npy}=$f")
  done
fi
"$kiln" run "$model" ${onnx_options[@]+"${onnx_options[@]}"} --target "$target" "${inputs[@]}" --output "y=$tmp/y.npy"
"$compare" "$tmp/y.npy" "${base}_expected.npy"
"$kiln" import "$model" ${onnx_options[@]+"${onnx_options[@]}"} -o "$tmp/m.kiln" --weights-out "$tmp/m.safetensors"
"$kiln" run "$tmp/m.kiln" --weights "$tmp/m.safetensors" --target "$target" "${inputs[@]}" \
  --output "y=$tmp/y2.npy"
"$compare" "$tmp/y2.npy" "${base}_expected.npy"
if [ "$target" = c ]; then
  "$kiln" compile "$model" ${onnx_options[@]+"${onnx_options[@]}"} -o "$tmp/m.so"
  "$kiln" run "$tmp/m.so" "${inputs[@]}" --output "y=$tmp/y3.npy"
  "$compare" "$tmp/y3.npy" "${base}_expected.npy"
fi
