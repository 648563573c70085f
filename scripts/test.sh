#!/bin/sh
# Sets up, builds and runs every test: the suite with warnings as errors, the same
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer, and a short run
# of each fuzz target. Build trees: build/ and build-asan/, build-fuzz/.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)

cmake -S . -B build -DKILN_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

cmake -S . -B build-asan -DKILN_WERROR=ON -DKILN_SANITIZE=ON \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j "$jobs" --output-on-failure

cmake -S . -B build-fuzz -DKILN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_parser fuzz_npy fuzz_safetensors
for f in parser npy safetensors; do
  mkdir -p build-fuzz/corpus-$f
  build-fuzz/tests/fuzz_$f -max_total_time=20 -max_len=4096 build-fuzz/corpus-$f tests/fuzz/corpus/$f
done
echo "fuzzing: no crash found"
