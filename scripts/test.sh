#!/bin/sh
# Sets up, builds and runs every test: the suite with warnings as errors, the same
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer (then the
# allocation-failure sweep by itself, its count printed), the host-side unit tests
# under ThreadSanitizer, and a short run of each fuzz target. Build trees: build/,
# build-asan/, build-tsan/ and build-fuzz/. Ends with one line "tests: N passed,
# N failed" over all of it.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
passed=0
failed=0

# Runs CTest in build tree $1 (extra environment after it; the tests whose names
# match $ctest_select, all when it is empty, less those matching $ctest_exclude),
# adding to the tally.
ctest_select=
ctest_exclude=
run_suite() {
  dir=$1
  shift
  status=0
  env "$@" ctest --test-dir "$dir" -j "$jobs" ${ctest_select:+-R "$ctest_select"} ${ctest_exclude:+-E "$ctest_exclude"} --output-on-failure > "$dir/ctest.log" 2>&1 ||
    status=$?
  grep -E "^[0-9]+% tests passed" "$dir/ctest.log" || true
  [ "$status" -eq 0 ] || sed -n '/The following tests FAILED/,$p;/Output from these tests/q' "$dir/ctest.log" | head -40
  [ "$status" -eq 0 ] || grep -B2 -A30 "\*\*\*Failed\|\*\*\*Exception\|\*\*\*Timeout" "$dir/ctest.log" | head -200
  total=$(sed -nE 's/.*tests failed out of ([0-9]+).*/\1/p' "$dir/ctest.log")
  bad=$(sed -nE 's/.* ([0-9]+) tests failed out of.*/\1/p' "$dir/ctest.log")
  [ -n "$total" ] || { total=1; bad=1; }
  passed=$((passed + total - bad))
  failed=$((failed + bad))
}

cmake -S . -B build -DKILN_WERROR=ON >/dev/null
cmake --build build -j "$jobs" >/dev/null
ctest_exclude='^unit\.test_alloc_failure$' # the ASan tree's sweep below, with leaks counted
run_suite build

cmake -S . -B build-asan -DKILN_WERROR=ON -DKILN_SANITIZE=ON \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build build-asan -j "$jobs" >/dev/null
run_suite build-asan ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
ctest_exclude=

# Every allocation failing in turn, leaks counted (ASan): its own step, for its count.
if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/tests/test_alloc_failure \
     > build-asan/alloc_failure.log 2>&1; then
  grep "^alloc failure:" build-asan/alloc_failure.log
  passed=$((passed + 1))
else
  tail -60 build-asan/alloc_failure.log
  failed=$((failed + 1))
fi

# The host side under ThreadSanitizer: the unit tests that compile no batteries,
# test_threads among them (libkiln from eight threads at once). About a minute on
# 2 cores, build included. Generated models and LLVM are not instrumented: TSan
# sees kiln's own code, which is what is checked here (tests/tsan.supp sets aside
# what LLVM's lazily made statics look like from outside). So the models run on one
# thread each (KILN_NUM_THREADS=1): TSan cannot see the atomics by which a model's
# thread pool hands work to its workers, and would report their writes; the pool
# itself is checked instrumented, by test_pool.
tsan_tests="test_pool test_parser test_files test_passes test_check test_dot test_plan test_libkiln test_threads"
cmake -S . -B build-tsan -DKILN_WERROR=ON -DKILN_SANITIZE=thread \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
# shellcheck disable=SC2086
cmake --build build-tsan -j "$jobs" --target $tsan_tests >/dev/null
ctest_select="^unit\.($(echo "$tsan_tests" | tr ' ' '|'))\$"
run_suite build-tsan "TSAN_OPTIONS=halt_on_error=1 suppressions=$PWD/tests/tsan.supp" KILN_NUM_THREADS=1
ctest_select=

cmake -S . -B build-fuzz -DKILN_FUZZ=ON -DKILN_CLANG_JIT=OFF -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_parser fuzz_npy fuzz_safetensors fuzz_onnx fuzz_elf fuzz_names fuzz_shapes >/dev/null
for f in parser npy safetensors onnx elf names shapes; do
  mkdir -p build-fuzz/corpus-$f
  if build-fuzz/tests/fuzz_$f -max_total_time=20 -max_len=4096 build-fuzz/corpus-$f tests/fuzz/corpus/$f \
       > build-fuzz/fuzz_$f.log 2>&1; then
    echo "fuzz_$f: $(grep -Eo 'Done [0-9]+ runs' build-fuzz/fuzz_$f.log), no crash"
    passed=$((passed + 1))
  else
    tail -40 build-fuzz/fuzz_$f.log
    failed=$((failed + 1))
  fi
done

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
