#!/usr/bin/env bash
# The generation example end to end: the decoder step (examples/gpt2_step.kiln) through
# every pass on the interpreter, compiled to a shared object, and run token by token by
# examples/generate.c, whose 32 greedy tokens must be PyTorch's (gpt2_tokens.txt, from
# examples/gen_gpt2.py); a position past the cache is a failed run, exit status 1.
# (cuda_kernels.gpt2_step checks the step's CUDA kernels.)
# usage: check_generate.sh KILN GENERATE EXAMPLES_DIR
set -eu
kiln=$1 driver=$2 dir=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=$dir/gpt2_step.kiln weights=$dir/gpt2_step.safetensors
"$kiln" opt "$model" --weights "$weights" --check > /dev/null
"$kiln" compile "$model" --weights "$weights" -o "$tmp/gpt2.so"
read -r -a prompt < "$dir/gpt2_tokens.txt"
"$driver" "$tmp/gpt2.so" 32 "${prompt[@]}" --expect "$dir/gpt2_tokens.txt" | tail -n 2
status=0
"$driver" "$tmp/gpt2.so" 100 "${prompt[@]}" > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 1 ] || { echo "past the cache: exit status $status, expected 1" >&2; exit 1; }
grep -q "run failed at position 64" "$tmp/out"
