#!/usr/bin/env bash
# A recurrent model trains: the imported model (tests/onnx/gen_models.py) gets the loss
# sum(y * y), its gradients with respect to the layers' weights, and plain SGD on them
# as `update` statements; kiln runs it step after step, and the loss before each step
# must be PyTorch's for the same SGD (MODEL_train_loss.npy, TRAIN_STEPS of them at
# TRAIN_LR). The export's other params (the zero initial states) are constants of the
# model and stay. The model keeps the curve in a param of its own, shifted a step at a
# time, so the last run's output is the whole curve.
# usage: check_train.sh KILN MODEL.onnx TARGET
set -eu
kiln=$1 model=$2 target=$3
compare=$(dirname "$kiln")/tests/npy_compare
base=${model%.onnx}
steps=5 lr=0.02 # gen_models.py's TRAIN_STEPS and TRAIN_LR
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" import "$model" -o "$tmp/m.kiln" --weights-out "$tmp/m.safetensors"
grep -qx 'output y' "$tmp/m.kiln"
mapfile -t weights < <(sed -n 's/^param \("onnx::[A-Z]*_[0-9]*"\) : .*/\1/p' "$tmp/m.kiln")
[ "${#weights[@]}" -gt 0 ] || { echo "$model: no weights of the layers to train" >&2; exit 1; }
{
  sed '/^output y$/d' "$tmp/m.kiln"
  echo "param curve : f32[$steps] = zeros"
  echo "const lr : f32[] = $lr"
  echo "squares = mul(y, y)"
  echo "loss = sum(squares)"
  grads=()
  for i in "${!weights[@]}"; do grads+=("g$i"); done
  echo "$(IFS=,; echo "${grads[*]}") = grad(loss, $(IFS=,; echo "${weights[*]}"))"
  for i in "${!weights[@]}"; do
    echo "step$i = mul(g$i, lr)"
    echo "new$i = sub(${weights[i]}, step$i)"
  done
  echo "older = slice(curve, starts=[1], ends=[$steps])"
  echo "latest = reshape(loss, shape=[1])"
  echo "losses = concat(older, latest, axis=0)"
  for i in "${!weights[@]}"; do echo "update ${weights[i]} = new$i"; done
  echo "update curve = losses"
  echo "output losses"
} > "$tmp/train.kiln"
"$kiln" run "$tmp/train.kiln" --weights "$tmp/m.safetensors" --target "$target" --input "x=${base}_input.npy" \
  --steps "$steps" --output "losses=$tmp/losses.npy"
"$compare" "$tmp/losses.npy" "${base}_train_loss.npy"
