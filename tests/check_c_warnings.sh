#!/usr/bin/env bash
# Generates a model's C (kiln compile --emit-source), with BLAS calls and without
# them (KILN_BLAS=off: GEMM loops), and compiles it with every warning as an error:
# generated code declares nothing it does not use and converts nothing silently.
# usage: check_c_warnings.sh KILN MODEL [WEIGHTS.safetensors]
set -eu
kiln=$1 model=$2
weights=()
[ $# -ge 3 ] && weights=(--weights "$3")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=${CC:-cc}
for blas in on off; do
  KILN_BLAS=$blas "$kiln" compile "$model" "${weights[@]}" --target c -o "$tmp/model.so" --emit-source "$tmp/model.c"
  "$cc" -std=gnu11 -fsyntax-only -Wall -Wextra -Werror -DKILN_WEIGHTS_FILE='"unused"' "$tmp/model.c"
  echo "$model (blas $blas): no warning"
done
