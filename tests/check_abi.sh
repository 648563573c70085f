#!/usr/bin/env bash
# The compiled-model ABI from outside: `kiln compile` makes a .so and its header from
# the small CNN; the header compiles on its own; the .so exports exactly one symbol,
# kiln_model, and needs no kiln library; and abi_test (which knows only kiln/model.h
# and libdl) loads it, checks its description, runs it twice and compares the result
# with PyTorch's.
# usage: check_abi.sh KILN ABI_TEST EXAMPLES_DIR
set -eu
kiln=$1 abi_test=$2 dir=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" compile "$dir/small_cnn.kiln" -o "$tmp/m.so" --header "$tmp/m.h"
cc -std=c11 -Wall -Werror -fsyntax-only -x c "$tmp/m.h"
symbols=$(nm -D --defined-only "$tmp/m.so" | awk '{print $NF}')
if [ "$symbols" != kiln_model ]; then
  echo "check_abi: m.so must export exactly kiln_model; it exports:" $symbols >&2
  exit 1
fi
if ldd "$tmp/m.so" | grep -i kiln; then
  echo "check_abi: m.so depends on a kiln library (above)" >&2
  exit 1
fi
"$abi_test" "$tmp/m.so" "$dir/small_cnn_input.npy" "$dir/small_cnn_expected.npy"
