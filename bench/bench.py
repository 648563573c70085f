#!/usr/bin/python3
"""kiln against PyTorch (and ONNX Runtime where installed) on the example models.

    /usr/bin/python3 bench/bench.py [--kiln build/kiln] [--threads 1,2] [--models ...] [--quick]

For each of small_cnn, resnet18 and mobilenetv2 and each thread count, the batch-1
latency of one inference, as medians over many runs, in milliseconds:

  - kiln: `kiln bench MODEL --input x=...` with KILN_NUM_THREADS=t (the C target,
    JIT-compiled through the compile cache);
  - PyTorch in its fastest inference mode: torch.jit.trace, torch.jit.freeze and
    torch.jit.optimize_for_inference, torch.set_num_threads(t), OPENBLAS_NUM_THREADS=1;
  - ONNX Runtime, when `import onnxruntime` works: the same network exported with
    torch.onnx, intra_op_num_threads=t, all graph optimizations.

Every engine runs the same network with the same weights (the values kiln's
initializers give, built by examples/gen_examples.py) on the same input file, each
engine and thread count in its own process, so that thread settings cannot leak from
one measurement into the next. The PyTorch process also checks its output against
examples/*_expected.npy, so a wrong weight shows up as an error, not as a fast time.

Then compile times for each model: `kiln compile M.kiln -o M.so` (wall time), and the
JIT: `kiln run M.kiln --target c` with an empty KILN_CACHE_DIR (cold: lowering plus
the C compiler) and again with the cache filled, each less the run's own time (the
kiln median at the default thread count).

The script takes about three minutes on two cores. Absolute times differ between
machines; the ratios are what to compare.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
import gen_examples  # noqa: E402  (the models, their weights, the torch networks)

# model -> (gen_examples builder, input file, timed runs for kiln and the peers)
MODELS = {
    "small_cnn": (gen_examples.small_cnn, "small_cnn_input.npy", 300),
    "resnet18": (gen_examples.resnet18, "input_224.npy", 20),
    "mobilenetv2": (gen_examples.mobilenetv2, "input_224.npy", 50),
}
WARMUP = 5


def summary(times_ms):
    return {"median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms)}


# ---- The peers, each in a process of its own (--worker) ----


def torch_network(name):
    """The torch network of gen_examples with kiln's param values, in float32, eval mode."""
    import numpy as np
    import torch

    model = MODELS[name][0]()
    net = gen_examples.torch_models()[name]().eval()
    state = net.state_dict()
    for key, (shape, init) in model.params.items():
        state[key].copy_(torch.from_numpy(gen_examples.init_values(shape, init).astype(np.float32)))
    return net


def time_calls(fn, iters):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return summary(times)


def worker(engine, name, threads, iters):
    """Times one engine on one model; prints one JSON line."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    x_np = np.load(os.path.join(EXAMPLES, MODELS[name][1]))
    x = torch.from_numpy(x_np)
    net = torch_network(name)
    result = {}
    with torch.no_grad():
        if engine == "torch":
            traced = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(net, x)))
            y = traced(x).numpy()
            expected = np.load(os.path.join(EXAMPLES, name + "_expected.npy"))
            # float32 against the float64 reference, relative to the output's scale
            err = float(np.abs(y - expected).max() / max(np.abs(expected).max(), 1e-30))
            if err > 1e-3:
                sys.exit("%s: PyTorch's output differs from %s_expected.npy by %.3g (relative); "
                         "the weights are not kiln's" % (name, name, err))
            result = time_calls(lambda: traced(x), iters)
        else:
            import onnxruntime as ort

            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, name + ".onnx")
                torch.onnx.export(net, x, path, input_names=["x"], output_names=["y"], opset_version=13)
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = threads
                opts.inter_op_num_threads = 1
                opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            result = time_calls(lambda: session.run(None, {"x": x_np}), iters)
    print(json.dumps(result))


def run_peer(engine, name, threads, iters):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, name, str(threads), str(iters)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s on %s failed:\n%s" % (engine, name, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


def have_onnxruntime():
    try:
        import onnxruntime  # noqa: F401
        return True
    except ImportError:
        return False


# ---- kiln ----


def run_kiln(args, env=None):
    """Runs kiln; returns (wall seconds, stdout), exiting with its message on failure."""
    start = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return wall, r.stdout


MEDIAN_RE = re.compile(r": median ([0-9.eE+-]+) ms, min ([0-9.eE+-]+) ms, max ([0-9.eE+-]+) ms")


def kiln_bench(kiln, name, threads, iters, cache):
    env = dict(os.environ, KILN_CACHE_DIR=cache)
    if threads:
        env["KILN_NUM_THREADS"] = str(threads)
    model = os.path.join(EXAMPLES, name + ".kiln")
    x = os.path.join(EXAMPLES, MODELS[name][1])
    _, out = run_kiln([kiln, "bench", model, "--input", "x=" + x, "--iters", str(iters),
                       "--warmup", str(WARMUP)], env)
    m = MEDIAN_RE.search(out)
    if not m:
        sys.exit("cannot read kiln bench's output: %r" % out)
    return {"median": float(m.group(1)), "min": float(m.group(2)), "max": float(m.group(3))}


def compile_times(kiln, name, run_ms):
    """(kiln compile seconds, cold JIT seconds, cached JIT seconds), the JIT times less run_ms."""
    model = os.path.join(EXAMPLES, name + ".kiln")
    x = os.path.join(EXAMPLES, MODELS[name][1])
    with tempfile.TemporaryDirectory() as tmp:
        compile_s, _ = run_kiln([kiln, "compile", model, "-o", os.path.join(tmp, name + ".so")])
        cache = os.path.join(tmp, "cache")
        env = dict(os.environ, KILN_CACHE_DIR=cache)
        run = [kiln, "run", model, "--target", "c", "--input", "x=" + x,
               "--output", "y=" + os.path.join(tmp, "y.npy")]
        cold_s, _ = run_kiln(run, env)
        cached_s, _ = run_kiln(run, env)
    return compile_s, cold_s - run_ms / 1e3, cached_s - run_ms / 1e3


PEAK_RE = re.compile(r"^peak: +([0-9]+) bytes", re.M)
BOUND_RE = re.compile(r"^lower bound: +([0-9]+) bytes", re.M)


def memory_report(kiln, name, *options):
    """(kernels, workspace peak bytes, lower bound bytes) from kiln compile --memory-report."""
    model = os.path.join(EXAMPLES, name + ".kiln")
    with tempfile.TemporaryDirectory() as tmp:
        _, out = run_kiln([kiln, "compile", model, "-o", os.path.join(tmp, "m.so"), "--memory-report", *options])
    kernels = out.split("\nkernels:\n", 1)[1].split("\nbuffers:\n", 1)[0].count("\n") + 1
    return kernels, int(PEAK_RE.search(out).group(1)), int(BOUND_RE.search(out).group(1))


def print_plans(kiln, models):
    """Kernels before and after fusion, and the workspace before and after planning."""
    print("\nkernels and workspace (kiln compile --memory-report; MiB)\n")
    print("%-12s %9s %9s %10s %10s %10s %10s" % ("model", "unfused", "fused", "unplanned", "planned", "bound",
                                              "peak/bound"), flush=True)
    for name in models:
        unfused, _, _ = memory_report(kiln, name, "--no-fuse_elementwise", "--no-fuse_epilogue")
        fused, peak, bound = memory_report(kiln, name)
        _, unplanned, _ = memory_report(kiln, name, "--no-memplan")
        mib = 1 << 20
        print("%-12s %9d %9d %10.2f %10.2f %10.2f %10.3f" % (name, unfused, fused, unplanned / mib, peak / mib,
                                                            bound / mib, peak / bound if bound else 1.0),
              flush=True)


# ---- Report ----


def fmt_ms(v):
    return "-" if v is None else ("%.3f" % v if v < 10 else "%.2f" % v)


def fmt_ratio(a, b):
    return "-" if a is None or b is None else "%.2f" % (a / b)


def checked_args(args, known_models):
    """The kiln binary, the models and the thread counts of the command line, or exit."""
    kiln = os.path.abspath(args.kiln)
    if not os.access(kiln, os.X_OK):
        sys.exit("no kiln binary at %s (build it, or pass --kiln)" % kiln)
    models = args.models.split(",")
    for name in models:
        if name not in known_models:
            sys.exit("unknown model '%s' (%s)" % (name, ", ".join(known_models)))
    return kiln, models, [int(t) for t in args.threads.split(",")]


def warn_if_loaded():
    load = os.getloadavg()[0]
    if load > 0.5:
        print("load average %.1f before starting: other processes share the cores, so the times "
              "are noisy" % load)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"), help="the kiln binary")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--models", default=",".join(MODELS), help="models, comma-separated")
    ap.add_argument("--quick", action="store_true", help="a fifth of the runs, for a smoke test")
    ap.add_argument("--no-compile-times", action="store_true", help="skip the compile-time section")
    ap.add_argument("--worker", nargs=4, metavar=("ENGINE", "MODEL", "THREADS", "ITERS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        engine, name, threads, iters = args.worker
        worker(engine, name, int(threads), int(iters))
        return

    kiln, models, threads = checked_args(args, MODELS)
    ort = have_onnxruntime()
    import torch

    print("kiln %s; PyTorch %s; ONNX Runtime %s; %d cores" % (
        kiln, torch.__version__, "yes" if ort else "not installed (pip install onnxruntime)",
        os.cpu_count()))
    warn_if_loaded()
    print("batch-1 latency, median ms over the runs shown; ratio < 1: kiln is faster\n")
    header = "%-12s %7s %6s %10s %10s %11s" % ("model", "threads", "runs", "kiln ms", "torch ms", "kiln/torch")
    if ort:
        header += " %10s %9s" % ("ORT ms", "kiln/ORT")
    print(header, flush=True)

    cache = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    default_run_ms = {}
    try:
        for name in models:
            iters = max(3, MODELS[name][2] // (5 if args.quick else 1))
            for t in threads:
                k = kiln_bench(kiln, name, t, iters, cache)
                p = run_peer("torch", name, t, iters)
                o = run_peer("ort", name, t, iters) if ort else None
                line = "%-12s %7d %6d %10s %10s %11s" % (name, t, iters, fmt_ms(k["median"]),
                                                        fmt_ms(p["median"]),
                                                        fmt_ratio(k["median"], p["median"]))
                if ort:
                    line += " %10s %9s" % (fmt_ms(o["median"]), fmt_ratio(k["median"], o["median"]))
                print(line, flush=True)
            if not args.no_compile_times:
                default_run_ms[name] = kiln_bench(kiln, name, None, max(3, iters // 4), cache)["median"]
        print_plans(kiln, models)
        if args.no_compile_times:
            return
        print("\ncompile times, seconds (JIT: one `kiln run --target c` less the run's own time)\n")
        print("%-12s %14s %14s %14s" % ("model", "kiln compile", "JIT, cold", "JIT, cached"), flush=True)
        for name in models:
            c, cold, cached = compile_times(kiln, name, default_run_ms[name])
            print("%-12s %14.2f %14.2f %14.3f" % (name, c, cold, cached), flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
