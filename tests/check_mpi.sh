#!/usr/bin/env bash
# Data-parallel training over MPI: examples/train_cnn.c built with libkiln_mpi runs
# examples/train_cnn_dp.kiln as a job of two processes, each on half of every batch
# of 32; with the gradients and the loss averaged over them, the losses must follow
# PyTorch's curve for the whole batch (train_cnn_loss.npy) over 300 steps, as
# train_cnn.kiln does in one process; its first 30 steps also on the CUDA target.
# Then the failures, each run bounded by `timeout`: a process that stops taking part
# (it was asked for fewer steps) makes the other fail within its --timeout, saying
# which process waited and why; a process killed while training ends the job,
# mpirun naming it, instead of leaving the other waiting. A malformed --timeout is
# an error before MPI starts.
# usage: check_mpi.sh KILN TRAIN_CNN_MPI MPIEXEC EXAMPLES_DIR
set -eu
kiln=$1 driver=$2 mpiexec=$3 dir=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# OpenMPI refuses to run as root (a container's CI) unless told, and two processes
# may be more than the machine's cores; each model runs on one thread of its own
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export KILN_NUM_THREADS=1
"$kiln" compile "$dir/train_cnn_dp.kiln" --weights "$dir/train_cnn_init.safetensors" -o "$tmp/dp.so"
run=("$driver" "$tmp/dp.so" "$dir/train_x.npy" "$dir/train_y.npy")
timeout 300 "$mpiexec" -np 2 "${run[@]}" 300 --expect "$dir/train_cnn_loss.npy" --tol 1e-5 | tail -n 2
# the first 30 steps again on the CUDA target (emulated), whose runtime does each
# allreduce on the host between its launches
KILN_CUDA=emulate "$kiln" compile "$dir/train_cnn_dp.kiln" --weights "$dir/train_cnn_init.safetensors" \
  --target cuda -o "$tmp/dp_cuda.so"
timeout 300 "$mpiexec" -np 2 "$driver" "$tmp/dp_cuda.so" "$dir/train_x.npy" "$dir/train_y.npy" 30 \
  --expect "$dir/train_cnn_loss.npy" --tol 1e-5 | tail -n 1

# Runs the job "$@", which must fail (not time out), its output in $tmp/out.
expect_failure() {
  status=0
  timeout 60 "$mpiexec" "$@" > "$tmp/out" 2>&1 || status=$?
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
    cat "$tmp/out" >&2
    echo "check_mpi: the job ended with status $status; it should have failed by itself" >&2
    exit 1
  fi
}
expect_failure -np 1 "${run[@]}" 1000 --timeout 2 : -np 1 "${run[@]}" 3
grep "train_cnn (process 0): error: " "$tmp/out"
grep -q "run failed at step 3: allreduce '.*' (.*train_cnn_dp.kiln:[0-9]*:[0-9]*): the communicator failed: process 0 of 2 had no answer from the others within 2 s" "$tmp/out"
expect_failure -np 1 "${run[@]}" 1000000 : -np 1 timeout -s KILL 1 "${run[@]}" 1000000
grep "process rank 1 .* exited on signal 9" "$tmp/out"
# a malformed --timeout is refused before MPI starts, exit status 2
status=0
"${run[@]}" 3 --timeout -1 > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 2 ] || { cat "$tmp/out" >&2; echo "check_mpi: --timeout -1 exited $status, not 2" >&2; exit 1; }
grep -q "train_cnn: error: --timeout needs a number >= 0, got '-1'" "$tmp/out"
