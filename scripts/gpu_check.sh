#!/bin/sh
# On a machine with an NVIDIA GPU, CUDA and no package registry: builds kiln without
# LLVM and OpenBLAS, then runs every op battery and every example on --target cuda
# against the reference interpreter (kiln run --check), once more under
# compute-sanitizer where it is installed, and times the examples (kiln bench, and
# the first load with an empty and with a warm kernel cache), then prints each kernel's
# time at batch 1 (kiln bench --profile).
# On a machine without Debian's packages, CMAKE_PREFIX_PATH may name a folder with
# what kiln builds against: cJSON and protobuf-c (lib/, include/cjson/,
# include/protobuf-c/), protoc-c (bin/; its libraries in lib/, on LD_LIBRARY_PATH)
# and ONNX's include/onnx/onnx.proto. Ends with "gpu_check: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=build-gpu
cmake -S . -B $build -DKILN_CLANG_JIT=OFF -DKILN_OPENBLAS=OFF -DKILN_TESTS=OFF >/dev/null &&
  cmake --build $build -j "$(nproc)" >/dev/null || exit 1
kiln=$build/kiln
export KILN_CACHE_DIR="$PWD/$build/kiln-cache"
passed=0
failed=0
check() { # NAME COMMAND...
  name=$1
  shift
  if out=$("$@" 2>&1); then
    passed=$((passed + 1))
    echo "ok      $name: $(echo "$out" | grep -m1 '^check: target')"
  else
    failed=$((failed + 1))
    echo "FAILED  $name"
    echo "$out" | tail -20
  fi
}
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
for m in tests/ref/*.kiln; do
  n=$(basename "$m" .kiln)
  for level in -O2 -O1; do
    check "$n $level" $kiln run "$m" --weights "tests/ref/$n.safetensors" --target cuda $level --check
  done
  [ -n "$sanitizer" ] &&
    check "$n (compute-sanitizer)" "$sanitizer" --error-exitcode 1 $kiln run "$m" \
      --weights "tests/ref/$n.safetensors" --target cuda --check
done
check small_cnn $kiln run examples/small_cnn.kiln --target cuda --input x=examples/small_cnn_input.npy --check
for n in resnet18 mobilenetv2; do
  check $n $kiln run examples/$n.kiln --target cuda --input x=examples/input_224.npy --check
done
for n in resnet18 mobilenetv2; do
  for batch in 1 32; do
    # every value's leading dimension is the batch; no parameter's is 1
    sed "/^param/!s/f32\[1, /f32[$batch, /g" examples/$n.kiln > $build/${n}_b$batch.kiln
    $kiln compile $build/${n}_b$batch.kiln --target cuda -o $build/${n}_b$batch.so || continue
    rm -rf "$KILN_CACHE_DIR"
    t0=$(date +%s.%N)
    $kiln bench $build/${n}_b$batch.so --iters 1 --warmup 0 >/dev/null
    t1=$(date +%s.%N)
    $kiln bench $build/${n}_b$batch.so --iters 1 --warmup 0 >/dev/null
    t2=$(date +%s.%N)
    awk -v what="$n batch $batch" -v t0="$t0" -v t1="$t1" -v t2="$t2" 'BEGIN {
      printf "%s: first load and run %.3f s with an empty kernel cache, %.3f s warm\n", what, t1 - t0, t2 - t1 }'
    $kiln bench $build/${n}_b$batch.so --iters 50
  done
done
for n in resnet18 mobilenetv2; do
  $kiln bench examples/$n.kiln --target cuda --profile --iters 20
done
echo "gpu_check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
