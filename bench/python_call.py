"""What a call from Python adds to a run of a compiled model.

    build/python-venv/bin/python bench/python_call.py [--kiln build/kiln] [--model examples/small_cnn.kiln]
                                                     [--rounds 5] [--iters 3000]

The model is compiled once into a .so. In each round, `kiln bench` times --iters runs
through the C ABI (kiln_run in a C loop; its median), then this process times
--iters calls of kiln.load's Model on the same input (each call timed alone; their
median): NumPy array in, a new NumPy array out. The rounds interleave the two. The
table gives the median of the rounds and their spread, (largest - smallest) /
median, and the difference: what Python adds per call. Run it with the Python of a
venv the package is installed in (tests/python/run.sh makes build/python-venv).
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np

import kiln

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
parser.add_argument("--kiln", default=os.path.join(root, "build", "kiln"))
parser.add_argument("--model", default=os.path.join(root, "examples", "small_cnn.kiln"))
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--iters", type=int, default=3000)
args = parser.parse_args()

with tempfile.TemporaryDirectory() as tmp:
    so = os.path.join(tmp, "model.so")
    subprocess.run([args.kiln, "compile", args.model, "-o", so, "--quiet"], check=True)
    model = kiln.load(so)
    inputs = [np.random.default_rng(0).standard_normal(t.shape).astype(t.dtype) for t in model.inputs]
    for _ in range(200):
        model(*inputs)
    c_abi, python = [], []
    for _ in range(args.rounds):
        out = subprocess.run([args.kiln, "bench", so, "--iters", str(args.iters)], check=True, capture_output=True,
                             text=True).stdout
        c_abi.append(float(re.search(r"median ([0-9.]+) ms", out).group(1)) * 1e3)
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            model(*inputs)
            times.append(time.perf_counter() - t0)
        python.append(statistics.median(times) * 1e6)


def row(name, values):
    m = statistics.median(values)
    print(f"{name:<22} {m:9.1f} us   spread {100 * (max(values) - min(values)) / m:5.1f}%")


print(f"{os.path.basename(args.model)}: per-call median over {args.rounds} rounds of {args.iters} calls")
row("C ABI (kiln bench)", c_abi)
row("Python (Model call)", python)
print(f"{'Python adds':<22} {statistics.median(python) - statistics.median(c_abi):9.1f} us")
