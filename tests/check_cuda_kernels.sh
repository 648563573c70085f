#!/usr/bin/env bash
# Generates a model's CUDA kernels (kiln compile --target cuda --emit-source) and
# compiles them with NVRTC, failing on any error or warning (tools/nvrtc_check.c);
# exit 77, CTest's skip, where NVRTC is not installed.
# usage: check_cuda_kernels.sh KILN NVRTC_CHECK MODEL [WEIGHTS.safetensors]
set -eu
kiln=$1 check=$2 model=$3
weights=()
[ $# -ge 4 ] && weights=(--weights "$4")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" compile "$model" "${weights[@]}" --target cuda -o "$tmp/model.so" --emit-source "$tmp/model.cu"
exec "$check" "$tmp/model.cu"
