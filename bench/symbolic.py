#!/usr/bin/python3
"""A model with a symbolic batch against the same model compiled for each batch size.

    python3 bench/symbolic.py [--kiln build/kiln] [--models small_cnn,resnet18,mobilenetv2]
                              [--bound 32] [--batch 1,32] [--rounds 3] [--iters 10]

For each example model (examples/NAME.kiln, whose input has batch 1), three shared
objects made by `kiln compile`:

  symbolic   the model with `dim N <= BOUND` and N as every batch dim: one .so for
             every batch from 1 to BOUND (docs/abi.md, "A symbolic dim")
  static B   the model with its batch fixed at B, for each B of --batch

and, interleaved in rounds (every model, batch and .so once per round, in turn), the
median of `kiln bench --iters` runs of each: the symbolic .so with `--batch B`, the
static one as it is. The table gives per model and batch the median of the rounds'
medians, the spread of the rounds ((largest - smallest) / median) and the symbolic
model's time over the static one's; then each .so's size and compile time. Threads:
KILN_NUM_THREADS as the environment sets it (default: every core).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def with_batch(text, batch, bound=None):
    """The example model's text with its batch dims (the 1 of every f32[1, ...]) set to
    batch, or to the symbolic dim N (declared after `model`) when bound is given."""
    dim = "N" if bound else str(batch)
    text = re.sub(r"f32\[1, ", "f32[%s, " % dim, text)
    if bound:
        text = re.sub(r"^(model .*)$", r"\1\ndim N <= %d" % bound, text, count=1, flags=re.M)
    return text


def compile_model(kiln, text, path):
    """Compiles model text into path; returns the seconds `kiln compile` took."""
    src = path[:-3] + ".kiln"
    with open(src, "w") as f:
        f.write(text)
    t = time.perf_counter()
    subprocess.run([kiln, "compile", src, "-o", path, "--quiet"], check=True)
    return time.perf_counter() - t


def bench(kiln, so, iters, batch=None):
    """The median milliseconds `kiln bench` reports."""
    cmd = [kiln, "bench", so, "--iters", str(iters), "--warmup", "2"]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(re.search(r"median ([0-9.e+-]+) ms", out).group(1))


def spread(values):
    return (max(values) - min(values)) / statistics.median(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--models", default="small_cnn,resnet18,mobilenetv2")
    ap.add_argument("--bound", type=int, default=32)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    models = a.models.split(",")
    batches = [int(b) for b in a.batch.split(",")]
    if any(b < 1 or b > a.bound for b in batches):
        sys.exit("--batch: every size must be from 1 to --bound (%d)" % a.bound)
    with tempfile.TemporaryDirectory() as tmp:
        made = {}  # (model, "symbolic" or batch) -> (path, compile seconds)
        for m in models:
            with open(os.path.join(ROOT, "examples", m + ".kiln")) as f:
                text = f.read()
            path = os.path.join(tmp, "%s_sym.so" % m)
            made[m, "symbolic"] = path, compile_model(a.kiln, with_batch(text, 0, a.bound), path)
            for b in batches:
                path = os.path.join(tmp, "%s_b%d.so" % (m, b))
                made[m, b] = path, compile_model(a.kiln, with_batch(text, b), path)
        times = {}  # (model, batch, "symbolic" or "static") -> the rounds' medians
        for r in range(a.rounds):
            for m in models:
                for b in batches:
                    iters = max(2, a.iters // b)
                    for kind in ("symbolic", "static"):
                        so = made[m, "symbolic" if kind == "symbolic" else b][0]
                        ms = bench(a.kiln, so, iters, b if kind == "symbolic" else None)
                        times.setdefault((m, b, kind), []).append(ms)
            print("round %d of %d done" % (r + 1, a.rounds), file=sys.stderr)
        print("%-12s %5s %18s %18s %8s" % ("model", "batch", "static ms", "symbolic ms", "sym/st"))
        for m in models:
            for b in batches:
                st, sy = times[m, b, "static"], times[m, b, "symbolic"]
                print("%-12s %5d %10.3f (%4.1f%%) %10.3f (%4.1f%%) %8.3f" % (
                    m, b, statistics.median(st), 100 * spread(st), statistics.median(sy),
                    100 * spread(sy), statistics.median(sy) / statistics.median(st)))
        print("\n%-12s %-10s %10s %10s" % ("model", "compile", "MB", "seconds"))
        for (m, kind), (path, secs) in made.items():
            label = kind if kind == "symbolic" else "batch %d" % kind
            print("%-12s %-10s %10.1f %10.2f" % (m, label, os.path.getsize(path) / 1e6, secs))


if __name__ == "__main__":
    main()
