#!/usr/bin/env bash
# The numerical test of every pass: for each model, the graph before and after
# each pass gives the same outputs on random inputs.
#
# usage: check_passes.sh [--pipeline-only] KILN MODEL...
#
# For each MODEL, random inputs are made (each input declared as a param with a
# uniform initializer and written by kiln run) and the unoptimized model is run in
# the interpreter for the reference outputs. Then, for the default pipeline and,
# unless --pipeline-only, for every pass of `kiln opt --list-passes` by itself
# (memplan, a stage of code generation, only with the pipeline):
#   - kiln opt --check: the interpreter after every pass against the unoptimized
#     model, on kiln's own random inputs;
#   - kiln run --check --target c on the random inputs: the same check, and the
#     generated C's outputs against the interpreter's, in kiln;
#   - those C outputs against the reference outputs, by tests/npy_compare.
# So a pass that lands later is covered without a change here. With
# --pipeline-only (for models that take the interpreter long), only the second,
# which checks every pass and the C target in one run. Models must use plain
# identifiers as the names of their inputs and outputs.
set -u
pipeline_only=0
if [ "${1:-}" = --pipeline-only ]; then
  pipeline_only=1
  shift
fi
if [ $# -lt 2 ]; then
  echo "usage: check_passes.sh [--pipeline-only] KILN MODEL..." >&2
  exit 2
fi
kiln=$1
shift
compare=${NPY_COMPARE:-$(dirname "$kiln")/tests/npy_compare}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

passes=$("$kiln" opt --list-passes | grep -vx memplan) || exit 1
passed=0 failed=0

# run_stage LABEL MODEL OPTION...: one stage's checks; prints a line either way.
run_stage() {
  local label=$1 model=$2
  shift 2
  local log=$tmp/log ok=1
  : > "$log"
  if [ $pipeline_only = 0 ] && ! "$kiln" opt --check "$@" "$model" > /dev/null 2>> "$log"; then
    ok=0
  elif ! "$kiln" run --check --target c "$@" "$model" "${in_args[@]}" "${stage_out_args[@]}" > /dev/null 2>> "$log"; then
    ok=0
  elif [ $pipeline_only = 0 ]; then
    for name in "${out_names[@]}"; do
      if ! "$compare" "$tmp/stage_$name.npy" "$tmp/ref_$name.npy" >> "$log" 2>&1; then
        echo "output '$name' of the C target differs from the interpreter's" >> "$log"
        ok=0
      fi
    done
  fi
  if [ $ok = 1 ]; then
    echo "ok: $model: $label"
    passed=$((passed + 1))
  else
    echo "FAILED: $model: $label" >&2
    sed 's/^/    /' "$log" >&2
    failed=$((failed + 1))
  fi
}

for model in "$@"; do
  rm -f "$tmp"/*.npy "$tmp"/*.kiln
  if ! "$kiln" opt -O0 "$model" > "$tmp/canonical.kiln"; then
    echo "FAILED: $model: cannot be read" >&2
    failed=$((failed + 1))
    continue
  fi
  # the inputs: `input NAME : TYPE` becomes `param NAME : TYPE = uniform(...)`
  in_args=() gen_out=() names=() seed=0
  while read -r _ name _ type; do
    seed=$((seed + 1))
    echo "param $name : $type = uniform(-1, 1, seed=$seed)" >> "$tmp/inputs.kiln"
    in_args+=(--input "$name=$tmp/in_$name.npy")
    gen_out+=(--output "$name=$tmp/in_$name.npy")
    names+=("$name")
  done < <(grep '^input ' "$tmp/canonical.kiln")
  if [ ${#names[@]} -gt 0 ]; then
    (IFS=,; echo "output ${names[*]}") >> "$tmp/inputs.kiln"
    "$kiln" run -O0 --target interp "$tmp/inputs.kiln" "${gen_out[@]}" || exit 1
  fi
  read -r -a out_names <<< "$(sed -n 's/^output //p' "$tmp/canonical.kiln" | tr -d ' ' | tr ',' ' ')"
  ref_args=() stage_out_args=()
  for name in "${out_names[@]}"; do
    ref_args+=(--output "$name=$tmp/ref_$name.npy")
    stage_out_args+=(--output "$name=$tmp/stage_$name.npy")
  done
  if [ $pipeline_only = 0 ] && ! "$kiln" run -O0 --target interp "$model" "${in_args[@]}" "${ref_args[@]}" > /dev/null; then
    echo "FAILED: $model: the interpreter cannot run it" >&2
    failed=$((failed + 1))
    continue
  fi
  run_stage "the default pipeline" "$model"
  if [ $pipeline_only = 0 ]; then
    for p in $passes; do
      run_stage "pass $p" "$model" "--passes=$p"
    done
  fi
done
echo "check_passes: $passed passed, $failed failed"
[ $failed = 0 ]
