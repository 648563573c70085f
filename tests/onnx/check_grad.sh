#!/usr/bin/env bash
# The gradient through an imported ONNX model (tests/onnx/gen_models.py): the model is
# imported, a loss sum(y * y) and its gradient with respect to the input x are added
# to the .kiln text, and the gradient is compared with PyTorch's (MODEL_grad_x.npy).
# usage: check_grad.sh KILN MODEL.onnx TARGET
set -eu
kiln=$1 model=$2 target=$3
compare=$(dirname "$kiln")/tests/npy_compare
base=${model%.onnx}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" import "$model" -o "$tmp/m.kiln" --weights-out "$tmp/m.safetensors"
grep -qx 'output y' "$tmp/m.kiln"
sed 's/^output y$/squares = mul(y, y)\nloss = sum(squares)\ngx = grad(loss, x)\noutput gx/' "$tmp/m.kiln" > "$tmp/grad.kiln"
"$kiln" run "$tmp/grad.kiln" --weights "$tmp/m.safetensors" --target "$target" --input "x=${base}_input.npy" \
  --output "gx=$tmp/gx.npy"
"$compare" "$tmp/gx.npy" "${base}_grad_x.npy"
