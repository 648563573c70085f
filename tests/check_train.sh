#!/usr/bin/env bash
# The training example end to end: every pass of the training step checked in the
# interpreter (the new params' values too), then the step compiled to a shared
# object and run 300 times by examples/train_cnn.c, whose losses must follow the
# curve PyTorch gives from the same weights (examples/gen_train.py); the same for
# the Adam, AdamW and clipped SGD steps over 100 steps, the SGD step with dropout
# (its masks from kiln's Philox stream, torch's made from the same numbers) within
# 1e-6, its first 10 steps also on the CUDA target's kernels (emulated), and the
# network with batch norms in training mode, whose running statistics after 100
# steps, read out of the instance, must match torch's too. Bad data files and params
# the model does not have are errors naming them, with exit status 1.
# usage: check_train.sh KILN TRAIN_CNN EXAMPLES_DIR
set -eu
kiln=$1 driver=$2 dir=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" opt "$dir/train_cnn.kiln" --weights "$dir/train_cnn_init.safetensors" --check > /dev/null
"$kiln" compile "$dir/train_cnn.kiln" --weights "$dir/train_cnn_init.safetensors" -o "$tmp/train_cnn.so"
"$driver" "$tmp/train_cnn.so" "$dir/train_x.npy" "$dir/train_y.npy" 300 --expect "$dir/train_cnn_loss.npy" |
  tail -n 2
# Adam, AdamW, and SGD with weight decay after clipping the gradients' global norm:
# 100 steps, each loss within 1e-5 of torch's
for opt in adam adamw clip; do
  "$kiln" opt "$dir/train_cnn_$opt.kiln" --weights "$dir/train_cnn_init.safetensors" --check > /dev/null
  "$kiln" compile "$dir/train_cnn_$opt.kiln" --weights "$dir/train_cnn_init.safetensors" -o "$tmp/$opt.so"
  "$driver" "$tmp/$opt.so" "$dir/train_x.npy" "$dir/train_y.npy" 100 --expect "$dir/train_cnn_${opt}_loss.npy" \
    --tol 1e-5 | tail -n 1
done
# batch norm in training mode: the losses within 1e-5, the running statistics within
# 1e-4 * max(1, |torch's|) (they sum 100 steps' batch statistics, each as far from
# torch's as the weights have drifted; 3.1e-5 measured)
stats=bn1.running_mean,bn1.running_var,bn2.running_mean,bn2.running_var
"$kiln" opt "$dir/train_cnn_bn.kiln" --weights "$dir/train_cnn_bn_init.safetensors" --check > /dev/null
"$kiln" compile "$dir/train_cnn_bn.kiln" --weights "$dir/train_cnn_bn_init.safetensors" -o "$tmp/bn.so"
"$driver" "$tmp/bn.so" "$dir/train_x.npy" "$dir/train_y.npy" 100 --expect "$dir/train_cnn_bn_loss.npy" \
  --tol 1e-5 | tail -n 1
"$driver" "$tmp/bn.so" "$dir/train_x.npy" "$dir/train_y.npy" 100 --expect-params "$stats=$dir/train_cnn_bn_stats.npy" |
  tail -n 1
"$kiln" compile "$dir/train_cnn_dropout.kiln" --weights "$dir/train_cnn_init.safetensors" -o "$tmp/dropout.so"
"$driver" "$tmp/dropout.so" "$dir/train_x.npy" "$dir/train_y.npy" 100 --expect "$dir/train_cnn_dropout_loss.npy" \
  --tol 1e-6 | tail -n 1
# the dropout step's first 10 steps on the CUDA target, its kernels emulated on the
# CPU: the training step where two kernels compile to the same code
KILN_CUDA=emulate "$kiln" compile "$dir/train_cnn_dropout.kiln" --weights "$dir/train_cnn_init.safetensors" \
  --target cuda -o "$tmp/dropout_cuda.so"
"$driver" "$tmp/dropout_cuda.so" "$dir/train_x.npy" "$dir/train_y.npy" 10 \
  --expect "$dir/train_cnn_dropout_loss.npy" --tol 1e-6 | tail -n 1
head -c 1000 "$dir/train_x.npy" > "$tmp/short.npy"
expect_error() {
  status=0
  "$@" > "$tmp/out" 2>&1 || status=$?
  [ "$status" -eq 1 ] || { echo "exit status $status, expected 1: $*" >&2; exit 1; }
}
expect_error "$driver" "$tmp/train_cnn.so" "$tmp/short.npy" "$dir/train_y.npy" 3
grep -q "short.npy: truncated" "$tmp/out"
expect_error "$driver" "$tmp/train_cnn.so" "$dir/train_y.npy" "$dir/train_x.npy" 3
grep -q "train_y.npy: shape \[256, 4\], but the model's input 'x' is \[32, 1, 16, 16\]" "$tmp/out"
expect_error "$driver" "$tmp/bn.so" "$dir/train_x.npy" "$dir/train_y.npy" 1 --expect-params "bn1.nope=$dir/train_cnn_bn_stats.npy"
grep -q "no param 'bn1.nope' that the model updates" "$tmp/out"
