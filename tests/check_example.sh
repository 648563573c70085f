#!/usr/bin/env bash
# Runs an example model on its shipped input and compares the output with the one
# PyTorch computed for the same weights (examples/gen_examples.py --check).
# usage: check_example.sh KILN EXAMPLES_DIR NAME TARGET
set -eu
kiln=$1 dir=$2 name=$3 target=$4
compare=$(dirname "$kiln")/tests/npy_compare
input=$dir/input_224.npy
[ "$name" = small_cnn ] && input=$dir/small_cnn_input.npy
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" run "$dir/$name.kiln" --target "$target" --input "x=$input" --output "y=$tmp/y.npy"
"$compare" "$tmp/y.npy" "$dir/${name}_expected.npy"
