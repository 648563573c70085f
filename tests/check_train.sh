#!/usr/bin/env bash
# The training example end to end: every pass of the training step checked in the
# interpreter (the new params' values too), then the step compiled to a shared
# object and run 300 times by examples/train_cnn.c, whose losses must follow the
# curve PyTorch gives from the same weights (examples/gen_train.py).
# usage: check_train.sh KILN TRAIN_CNN EXAMPLES_DIR
set -eu
kiln=$1 driver=$2 dir=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" opt "$dir/train_cnn.kiln" --weights "$dir/train_cnn_init.safetensors" --check > /dev/null
"$kiln" compile "$dir/train_cnn.kiln" --weights "$dir/train_cnn_init.safetensors" -o "$tmp/train_cnn.so"
"$driver" "$tmp/train_cnn.so" "$dir/train_x.npy" "$dir/train_y.npy" 300 --expect "$dir/train_cnn_loss.npy" |
  tail -n 2
