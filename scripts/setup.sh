#!/bin/sh
# Installs the Debian packages kiln needs to build and test, when any is missing.
# `setup.sh --bench` also installs what the benchmarks in bench/ need (PyTorch and
# torchvision, whose models bench/bench.py times; they are large, and no test needs
# them, so the build and CI leave them out). Non-interactive; uses sudo when not run
# as root.
set -eu
packages="build-essential cmake pkg-config python3-venv python3-pip python3-setuptools python3-wheel python3-numpy python3-pytest python3-onnx clang-14 clang-format-14 libclang-rt-14-dev llvm-14-tools libcjson-dev libcmocka-dev libopenblas-dev llvm-14-dev libclang-cpp14-dev libclang-14-dev protobuf-c-compiler libprotobuf-c-dev libonnx-dev libonnx-testdata openmpi-bin libopenmpi-dev"
bench_packages="python3-torch python3-torchvision"
case "${1-}" in
  "") ;;
  --bench) packages="$packages $bench_packages" ;;
  *) echo "usage: setup.sh [--bench]" >&2; exit 2 ;;
esac
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "setup: installing$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q $missing
