#!/bin/sh
# The Python package's tests: installs python/ (as `pip install ./python` does, with
# libkiln and kiln taken from the build tree BUILD) into a venv made in BUILD over
# Debian's Python (its numpy, pytest and onnx), then runs test_kiln.py with pytest.
# usage: run.sh BUILD
set -eu
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$build/python-venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
KILN_BUILD_DIR=$build "$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall \
  --disable-pip-version-check "$root/python"
cd "$build"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/test_kiln.py"
