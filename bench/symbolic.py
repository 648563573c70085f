#!/usr/bin/python3
"""A model with a symbolic batch against the same model compiled for each batch size.

    python3 bench/symbolic.py [--kiln build/kiln] [--models small_cnn,resnet18,mobilenetv2,bert]
                              [--bound 32] [--batch 1,32] [--rounds 3] [--iters 10]
                              [--check interp,c,cuda]

For each model, an example (examples/NAME.kiln, whose input has batch 1) or `bert`
(the BERT-style encoder tests/onnx/models/tiny_bert_dynamic.onnx, exported with a
dynamic batch, its sequence fixed at 9), the model in two forms:

  symbolic   the model with `dim N <= BOUND` and N as every batch dim (for bert,
             imported with --dim 'batch<=BOUND'): one .so for every batch from 1 to
             BOUND (docs/abi.md, "A symbolic dim")
  static B   the model with its batch fixed at B, for each B of --batch

With --check, nothing is timed: on each target named (interp, c, and cuda, emulated
unless KILN_CUDA says otherwise), each form runs at each batch on the same random
inputs, and the script prints the largest difference between their outputs, relative
to the static model's largest output, and fails when one is over 1e-4.

Without it, the forms are compiled with `kiln compile` for the C target and timed,
interleaved in rounds (every model, batch and .so once per round, in turn), the
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
BERT = os.path.join(ROOT, "tests", "onnx", "models", "tiny_bert_dynamic")
BERT_SEQ = 9


def with_batch(text, batch, bound=None):
    """The example model's text with its batch dims (the 1 of every f32[1, ...]) set to
    batch, or to the symbolic dim N (declared after `model`) when bound is given."""
    dim = "N" if bound else str(batch)
    text = re.sub(r"f32\[1, ", "f32[%s, " % dim, text)
    if bound:
        text = re.sub(r"^(model .*)$", r"\1\ndim N <= %d" % bound, text, count=1, flags=re.M)
    return text


def model_source(model, tmp, batch=None, bound=None):
    """kiln's arguments for the model at batch (or symbolic to bound): an example's
    text, written into tmp, or bert's .onnx with its --dim options."""
    if model == "bert":
        size = "batch<=%d" % bound if bound else "batch=%d" % batch
        return [BERT + ".onnx", "--dim", size, "--dim", "seq=%d" % BERT_SEQ]
    with open(os.path.join(ROOT, "examples", model + ".kiln")) as f:
        text = with_batch(f.read(), batch, bound)
    path = os.path.join(tmp, "%s_%s.kiln" % (model, "sym" if bound else "b%d" % batch))
    with open(path, "w") as f:
        f.write(text)
    return [path]


def compile_model(kiln, source, path, target="c"):
    """Compiles the model into path; returns the seconds `kiln compile` took."""
    t = time.perf_counter()
    subprocess.run([kiln, "compile"] + source + ["-o", path, "--quiet", "--target", target], check=True)
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


def write_inputs(model, batch, tmp, rng):
    """Random inputs for the model at batch, as kiln run's --input options."""
    import numpy as np

    arrays = {}
    if model == "bert":
        ids = np.load(BERT + "_input_ids.npy")
        arrays["ids"] = rng.choice(ids.ravel(), size=(batch, BERT_SEQ)).astype(ids.dtype)
        mask = rng.integers(0, 2, size=(batch, BERT_SEQ))
        mask[:, 0] = 1
        arrays["mask"] = mask.astype(np.load(BERT + "_input_mask.npy").dtype)
        arrays["types"] = rng.integers(0, 2, size=(batch, BERT_SEQ)).astype(
            np.load(BERT + "_input_types.npy").dtype)
    else:
        with open(os.path.join(ROOT, "examples", model + ".kiln")) as f:
            name, dims = re.search(r"^input (\S+) : f32\[1, ([0-9, ]*)\]", f.read(), re.M).groups()
        arrays[name] = rng.standard_normal([batch] + [int(d) for d in dims.split(",")]).astype(np.float32)
    options = []
    for name, value in arrays.items():
        path = os.path.join(tmp, "in_%s.npy" % name)
        np.save(path, value)
        options += ["--input", "%s=%s" % (name, path)]
    return options


def check(a, models, batches, tmp):
    """Runs both forms at every batch on every target of --check; False when their
    outputs differ by more than the tolerance."""
    import numpy as np

    os.environ.setdefault("KILN_CUDA", "emulate")
    rng = np.random.default_rng(7)
    ok = True
    print("%-12s %6s %5s %12s" % ("model", "target", "batch", "difference"))
    for m in models:
        for target in a.check.split(","):
            if target == "interp":
                run_sym = model_source(m, tmp, bound=a.bound)
            else:
                so = os.path.join(tmp, "%s_sym_%s.so" % (m, target))
                compile_model(a.kiln, model_source(m, tmp, bound=a.bound), so, target)
                run_sym = [so]
            for b in batches:
                inputs = write_inputs(m, b, tmp, rng)
                if target == "interp":
                    run_static = model_source(m, tmp, batch=b)
                else:
                    so = os.path.join(tmp, "%s_b%d_%s.so" % (m, b, target))
                    compile_model(a.kiln, model_source(m, tmp, batch=b), so, target)
                    run_static = [so]
                outs = []
                for form, run in (("sym", run_sym), ("static", run_static)):
                    out = os.path.join(tmp, "out_%s.npy" % form)
                    cmd = [a.kiln, "run"] + run + inputs + ["--output", "y=" + out]
                    if target == "interp":
                        cmd += ["--target", "interp"]
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                    outs.append(np.load(out))
                got, want = outs
                diff = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
                bad = got.shape != want.shape or not diff <= 1e-4
                ok = ok and not bad
                print("%-12s %6s %5d %12.3g%s" % (m, target, b, diff, "  FAILED" if bad else ""), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--models", default="small_cnn,resnet18,mobilenetv2,bert")
    ap.add_argument("--bound", type=int, default=32)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--check", metavar="TARGETS", help="compare outputs on these targets instead of timing")
    a = ap.parse_args()
    models = a.models.split(",")
    batches = [int(b) for b in a.batch.split(",")]
    if any(b < 1 or b > a.bound for b in batches):
        sys.exit("--batch: every size must be from 1 to --bound (%d)" % a.bound)
    with tempfile.TemporaryDirectory() as tmp:
        if a.check:
            sys.exit(0 if check(a, models, batches, tmp) else 1)
        made = {}  # (model, "symbolic" or batch) -> (path, compile seconds)
        for m in models:
            path = os.path.join(tmp, "%s_sym.so" % m)
            made[m, "symbolic"] = path, compile_model(a.kiln, model_source(m, tmp, bound=a.bound), path)
            for b in batches:
                path = os.path.join(tmp, "%s_b%d.so" % (m, b))
                made[m, b] = path, compile_model(a.kiln, model_source(m, tmp, batch=b), path)
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
