#!/usr/bin/python3
"""kiln against PyTorch, ONNX Runtime and OpenVINO on six image models, on the CPU.

    /usr/bin/python3 bench/bench.py [--kiln build/kiln] [--threads 2] [--models ...]
                                    [--batch 1,8,32] [--rounds 5] [--contend N]
                                    [--json FILE] [--quick]

For each model (small_cnn, resnet18, mobilenetv2, resnet50, efficientnet_b0,
mobilenet_v3_small), batch size and thread count, the time of one inference in
milliseconds (and, for a batch above 1, the images per second), for each engine:

  - kiln: the model's ONNX file through `kiln import`, `kiln compile` to a .so, and
    `kiln bench THE.so --input x=FILE` with KILN_NUM_THREADS=t;
  - PyTorch in its fastest inference mode: torch.jit.trace, torch.jit.freeze and
    torch.jit.optimize_for_inference, torch.set_num_threads(t), OPENBLAS_NUM_THREADS=1;
  - ONNX Runtime, when `import onnxruntime` works: the same ONNX file,
    intra_op_num_threads=t, sequential execution, all graph optimizations;
  - OpenVINO, when `import openvino` works: the same ONNX file on the CPU device with
    INFERENCE_NUM_THREADS=t, PERFORMANCE_HINT=LATENCY and INFERENCE_PRECISION_HINT=f32
    (on a CPU with bfloat16 OpenVINO would otherwise compute in bfloat16).

Every engine runs the same network with the same weights on the same input: the torch
network of bench/export_models.py (the example models with the values of kiln's
initializers, torchvision's models with seeded random weights), which is exported to
ONNX once per model and batch size into a temporary folder, with a random normal input
saved beside it. kiln, ONNX Runtime and OpenVINO read that one file.

A wrong output is an error, not a fast time. Before timing a model at a batch size,
the reference (ONNX Runtime's output, or PyTorch's where ONNX Runtime is missing) is
computed, and kiln's compiled model must match it (`kiln run THE.so`): the largest
difference, relative to the largest magnitude of the reference, below 1e-3. Every
timed PyTorch, ONNX Runtime and OpenVINO process checks its output the same way,
within 1e-2 (a wrong network is wrong by order one, and PyTorch's
optimize_for_inference alone differs by up to 7e-4 on MobileNetV3-Small), and at batch
1 the PyTorch process also checks the example models against examples/*_expected.npy
(computed in float64 from kiln's initializers) within 1e-3.

The timing runs in rounds (--rounds, default 5): in each round every engine runs once,
in turn, each in a fresh process that does its warm-up runs and then the timed runs,
and reports their median. The table gives, per engine, the median of the round
medians, their smallest and largest and the spread (largest - smallest) / median, and
kiln's time over the fastest peer's (the smallest median among PyTorch, ONNX Runtime
and OpenVINO). --contend N runs N busy loops beside every engine, as other work on the
machine would. --json FILE writes every round's figures.

Then, for the example models, the kernels and workspace of kiln's plan and the
compile times: `kiln compile M.kiln -o M.so` (wall time), and the JIT: `kiln run
M.kiln --target c` with an empty KILN_CACHE_DIR (cold: lowering plus the C compiler)
and again with the cache filled, each less the run's own time (the kiln median at the
default thread count); and for every model, the times of `kiln import` and `kiln
compile` of its ONNX file.

The default run (batch 1, 2 threads, 5 rounds) takes about four minutes on two cores,
mostly in starting processes; each further batch size or thread count adds as much
or more. Absolute times differ between machines; the ratios are what to compare.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, HERE)
import export_models  # noqa: E402  (the models, their torch networks, their ONNX exports)

MODELS = export_models.MODELS
WARMUP = 5
# The largest relative error allowed of kiln's output, and of the peers' (the peers' checks
# are there to catch a wrong network or wrong weights, which are wrong by order one;
# PyTorch's optimize_for_inference alone differs by up to 7e-4 on MobileNetV3-Small).
CHECK_TOLERANCE = 1e-3
PEER_TOLERANCE = 1e-2
PEERS = ("torch", "ort", "openvino")
ENGINE_TITLES = {"kiln": "kiln", "torch": "PyTorch", "ort": "ORT", "openvino": "OpenVINO"}
PEER_MODULES = {"torch": "torch", "ort": "onnxruntime", "openvino": "openvino"}


def summary(times_ms):
    return {"median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms)}


def relative_error(got, expected):
    """The largest difference relative to the largest magnitude of expected, or None when
    the shapes differ."""
    if got.shape != expected.shape:
        return None
    scale = max(float(abs(expected).max()), 1e-30)
    return float(abs(got.astype("float64") - expected).max()) / scale


# ---- The peers, each in a process of its own (bench/peers.py) ----


def run_peer(engine, name, batch, threads, iters, warmup, folder):
    """One fresh process of a peer; its summary (None when iters is 0)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.join(HERE, "peers.py"), engine, name, str(batch), str(threads), str(iters),
           str(warmup), folder]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s on %s at batch %d failed:\n%s" % (ENGINE_TITLES[engine], name, batch, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1]) if iters else None


def importable(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def peer_version(engine):
    """The peer's version, as its release number (OpenVINO's full version adds its build)."""
    if engine == "openvino":
        import openvino

        return openvino.get_version().split("-")[0]
    return __import__(PEER_MODULES[engine]).__version__


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


def kiln_bench_model(kiln, model, input_path, threads, iters, warmup, env=None):
    """`kiln bench` of a .so (or, through the compile cache of env, a .kiln) on one input."""
    env = dict(env or os.environ)
    if threads:
        env["KILN_NUM_THREADS"] = str(threads)
    _, out = run_kiln([kiln, "bench", model, "--input", "x=" + input_path, "--iters", str(iters),
                       "--warmup", str(warmup)], env)
    m = MEDIAN_RE.search(out)
    if not m:
        sys.exit("cannot read kiln bench's output: %r" % out)
    return {"median": float(m.group(1)), "min": float(m.group(2)), "max": float(m.group(3))}


def kiln_bench(kiln, name, threads, iters, cache):
    """An example model's .kiln, JIT-compiled through the cache, on its example input."""
    return kiln_bench_model(kiln, os.path.join(EXAMPLES, name + ".kiln"),
                            os.path.join(EXAMPLES, export_models.EXAMPLE_INPUTS[name]), threads, iters,
                            WARMUP, dict(os.environ, KILN_CACHE_DIR=cache))


def kiln_build(kiln, folder, name, batch):
    """`kiln import` of the model's ONNX file and `kiln compile` of the result to a .so;
    (the .so, import seconds, compile seconds)."""
    onnx_path, _ = export_models.file_paths(folder, name, batch)
    stem = os.path.join(folder, "%s_b%d" % (name, batch))
    import_s, _ = run_kiln([kiln, "import", onnx_path, "-o", stem + ".kiln", "--weights-out",
                            stem + ".safetensors"])
    compile_s, _ = run_kiln([kiln, "compile", stem + ".kiln", "--weights", stem + ".safetensors", "-o",
                             stem + ".so"])
    return stem + ".so", import_s, compile_s


def kiln_output(kiln, so_path, folder, name, batch, threads):
    """Runs the compiled model once on the model's input; saves its output in folder."""
    _, input_path = export_models.file_paths(folder, name, batch)
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    run_kiln([kiln, "run", so_path, "--input", "x=" + input_path, "--output",
              "y=" + export_models.output_path(folder, name, batch, "kiln")], env)


def compile_times(kiln, name, run_ms):
    """(kiln compile seconds, cold JIT seconds, cached JIT seconds), the JIT times less run_ms."""
    model = os.path.join(EXAMPLES, name + ".kiln")
    x = os.path.join(EXAMPLES, export_models.EXAMPLE_INPUTS[name])
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
    plans = {}
    for name in models:
        unfused, _, _ = memory_report(kiln, name, "--no-fuse_elementwise", "--no-fuse_epilogue")
        fused, peak, bound = memory_report(kiln, name)
        _, unplanned, _ = memory_report(kiln, name, "--no-memplan")
        mib = 1 << 20
        print("%-12s %9d %9d %10.2f %10.2f %10.2f %10.3f" % (name, unfused, fused, unplanned / mib, peak / mib,
                                                            bound / mib, peak / bound if bound else 1.0),
              flush=True)
        plans[name] = {"kernels_unfused": unfused, "kernels": fused, "unplanned_bytes": unplanned,
                       "planned_bytes": peak, "bound_bytes": bound}
    return plans


# ---- Contention ----

# A busy loop in the shell that ends by itself once the process that started it ($1) is
# gone, so that not even a harness killed with SIGKILL leaves it spinning.
BUSY_LOOP = 'while kill -0 "$1" 2>/dev/null; do i=0; while [ "$i" -lt 100000 ]; do i=$((i + 1)); done; done'


class BusyLoops:
    """N processes that keep a core each busy, for as long as the with block runs."""

    def __init__(self, count):
        self.count = count
        self.processes = []

    def __enter__(self):
        for _ in range(self.count):
            self.processes.append(subprocess.Popen(["sh", "-c", BUSY_LOOP, "busy-loop", str(os.getpid())]))
        return self

    def __exit__(self, *exc):
        for p in self.processes:
            p.kill()
        for p in self.processes:
            p.wait()
        self.processes = []
        return False


def exit_on_sigterm():
    """SIGTERM ends the harness as Ctrl-C does, through the finally blocks that stop the
    busy loops and remove the temporary files."""
    def handler(signum, frame):
        sys.exit("bench.py: terminated")

    signal.signal(signal.SIGTERM, handler)


# ---- Measuring one model at one batch size ----


def check_output(engine, folder, name, batch, reference, tolerance):
    """Exits unless the engine's saved output matches the reference's within tolerance
    (relative); returns the relative error."""
    import numpy as np

    got = np.load(export_models.output_path(folder, name, batch, engine))
    expected = np.load(export_models.output_path(folder, name, batch, reference))
    err = relative_error(got, expected)
    if err is None:
        sys.exit("%s on %s at batch %d: output of shape %s, %s's is %s" % (
            ENGINE_TITLES[engine], name, batch, got.shape, ENGINE_TITLES[reference], expected.shape))
    if err >= tolerance:
        sys.exit("%s on %s at batch %d: output differs from %s's by %.3g (relative; the most allowed "
                 "is %g)" % (ENGINE_TITLES[engine], name, batch, ENGINE_TITLES[reference], err, tolerance))
    return err


def runs(name, batch, quick):
    """(timed runs, warm-up runs) per process: the model's runs at batch 1, divided by
    the batch, and by 5 with --quick; at least 3."""
    iters = max(3, MODELS[name].iters // batch // (5 if quick else 1))
    return iters, min(WARMUP, iters)


def aggregate(rounds):
    """The median of the round medians, the smallest and largest, and the spread."""
    medians = [r["median"] for r in rounds]
    median = statistics.median(medians)
    return {"median": median, "min": min(medians), "max": max(medians),
            "spread": (max(medians) - min(medians)) / median if median else 0.0}


def fastest_peer(stats):
    """The peer with the smallest median, or None when only kiln ran."""
    peers = [e for e in PEERS if e in stats]
    return min(peers, key=lambda e: stats[e]["median"]) if peers else None


def build_and_check(kiln, folder, name, batch, net, reference, threads):
    """Exports the model at the batch size, builds it with kiln and checks kiln's output
    against the reference engine's; (the .so, the build's times and kiln's error)."""
    export_models.export(name, batch, folder, net)
    so_path, import_s, compile_s = kiln_build(kiln, folder, name, batch)
    run_peer(reference, name, batch, threads, 0, 0, folder)
    kiln_output(kiln, so_path, folder, name, batch, threads)
    error = check_output("kiln", folder, name, batch, reference, CHECK_TOLERANCE)
    return so_path, {"model": name, "batch": batch, "import_s": import_s, "compile_s": compile_s,
                     "kiln_error": error}


def measure(kiln, so_path, folder, name, batch, threads, engines, rounds, quick, reference):
    """Every engine in each round, in turn. The result: per engine its round summaries and
    their aggregate, and the largest relative error of its outputs against the reference."""
    iters, warmup = runs(name, batch, quick)
    _, input_path = export_models.file_paths(folder, name, batch)
    timings = {engine: [] for engine in engines}
    errors = {engine: 0.0 for engine in engines if engine != "kiln"}
    for _ in range(rounds):
        for engine in engines:
            if engine == "kiln":
                timings[engine].append(kiln_bench_model(kiln, so_path, input_path, threads, iters, warmup))
                continue
            timings[engine].append(run_peer(engine, name, batch, threads, iters, warmup, folder))
            error = check_output(engine, folder, name, batch, reference, PEER_TOLERANCE)
            errors[engine] = max(errors[engine], error)
    stats = {engine: aggregate(timings[engine]) for engine in engines}
    return {"model": name, "batch": batch, "threads": threads, "iters": iters, "warmup": warmup,
            "engines": stats, "rounds": timings, "errors": errors, "fastest_peer": fastest_peer(stats)}


# ---- Report ----


def fmt_ms(v):
    return "-" if v is None else ("%.3f" % v if v < 10 else "%.2f" % v)


def fmt_spread(fraction):
    return ("%.1f%%" if fraction < 1 else "%.0f%%") % (100 * fraction)


def fmt_ratio(a, b):
    return "-" if a is None or b is None else "%.2f" % (a / b)


RESULT_HEADER = "%-18s %5s %7s %5s  %-8s %10s %10s %10s %7s %10s %10s" % (
    "model", "batch", "threads", "runs", "engine", "median ms", "min ms", "max ms", "spread", "images/s",
    "kiln/this")


def print_result(result):
    """One line per engine (the medians over the rounds), then kiln over the fastest peer."""
    stats, batch = result["engines"], result["batch"]
    first = "%-18s %5d %7d %5d" % (result["model"], batch, result["threads"], result["iters"])
    for engine, s in stats.items():
        throughput = "%.1f" % (batch * 1e3 / s["median"]) if batch > 1 else "-"
        ratio = fmt_ratio(stats["kiln"]["median"], s["median"]) if engine != "kiln" else ""
        line = "%-38s  %-8s %10s %10s %10s %7s %10s %10s" % (
            first, ENGINE_TITLES[engine], fmt_ms(s["median"]), fmt_ms(s["min"]), fmt_ms(s["max"]),
            fmt_spread(s["spread"]), throughput, ratio)
        print(line.rstrip())
        first = ""
    peer = result["fastest_peer"]
    if peer:
        print("%-38s  kiln / fastest peer (%s): %s" % ("", ENGINE_TITLES[peer], fmt_ratio(
            stats["kiln"]["median"], stats[peer]["median"])), flush=True)


def print_ratios(results):
    print("\nkiln / fastest peer, medians over the rounds (below 1: kiln is faster)\n")
    print("%-18s %5s %7s %10s %-9s %10s %7s" % ("model", "batch", "threads", "kiln ms", "fastest", "its ms",
                                               "ratio"))
    for r in results:
        peer = r["fastest_peer"]
        kiln_ms = r["engines"]["kiln"]["median"]
        peer_ms = r["engines"][peer]["median"] if peer else None
        print("%-18s %5d %7d %10s %-9s %10s %7s" % (r["model"], r["batch"], r["threads"], fmt_ms(kiln_ms),
                                                   ENGINE_TITLES[peer] if peer else "-", fmt_ms(peer_ms),
                                                   fmt_ratio(kiln_ms, peer_ms)), flush=True)


def positive_ints(text, what):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        sys.exit("bad %s '%s': positive integers, comma-separated" % (what, text))
    return values


def checked_args(args, known_models):
    """The kiln binary, the models and the thread counts of the command line, or exit."""
    kiln = os.path.abspath(args.kiln)
    if not os.access(kiln, os.X_OK):
        sys.exit("no kiln binary at %s (build it, or pass --kiln)" % kiln)
    models = args.models.split(",")
    for name in models:
        if name not in known_models:
            sys.exit("unknown model '%s' (%s)" % (name, ", ".join(known_models)))
    return kiln, models, positive_ints(args.threads, "thread counts")


def warn_if_loaded():
    load = os.getloadavg()[0]
    if load > 0.5:
        print("load average %.1f before starting: other processes share the cores, so the times "
              "are noisy" % load)


def write_json(path, report):
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"), help="the kiln binary")
    ap.add_argument("--threads", default="2", help="thread counts, comma-separated")
    ap.add_argument("--models", default=",".join(export_models.TIMED), help="models, comma-separated")
    ap.add_argument("--batch", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each runs every engine once")
    ap.add_argument("--contend", type=int, default=0, metavar="N",
                    help="run N busy loops beside every engine")
    ap.add_argument("--json", metavar="FILE", help="write every round's figures to FILE")
    ap.add_argument("--quick", action="store_true", help="a fifth of the runs, for a smoke test")
    ap.add_argument("--no-compile-times", action="store_true", help="skip the compile-time section")
    args = ap.parse_args()
    kiln, models, threads = checked_args(args, MODELS)
    batches = positive_ints(args.batch, "batch sizes")
    if args.rounds < 1 or args.contend < 0:
        sys.exit("--rounds must be at least 1 and --contend at least 0")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        sys.exit("--json %s: no such folder" % args.json)
    if any(name not in export_models.EXAMPLE_INPUTS for name in models) and not importable("torchvision"):
        sys.exit("resnet50, efficientnet_b0 and mobilenet_v3_small need torchvision (Debian's "
                 "python3-torchvision); or choose others with --models")
    engines = ["kiln"] + [e for e in PEERS if importable(PEER_MODULES[e])]
    if "torch" not in engines:
        sys.exit("PyTorch is needed to build the networks (Debian's python3-torch, seen by /usr/bin/python3)")
    reference = "ort" if "ort" in engines else "torch"
    exit_on_sigterm()

    versions = {e: peer_version(e) for e in engines if e != "kiln"}
    print("kiln %s; %s; %d cores" % (kiln, "; ".join(
        "%s %s" % (ENGINE_TITLES[e], versions.get(e, "not installed (pip install %s)" % PEER_MODULES[e]))
        for e in PEERS), os.cpu_count()))
    warn_if_loaded()
    if args.contend:
        print("contention: %d busy-loop process%s run beside every engine" % (
            args.contend, "" if args.contend == 1 else "es"))
    print("%d round%s, each a fresh process per engine (warm-up, then the runs shown); medians over the "
          "rounds,\nthe spread (largest - smallest) / median of the round medians; outputs checked against "
          "%s's\n" % (args.rounds, "" if args.rounds == 1 else "s", ENGINE_TITLES[reference]))
    print(RESULT_HEADER, flush=True)

    folder = tempfile.mkdtemp(prefix="kiln-bench-")
    cache = os.path.join(folder, "cache")
    report = {"kiln": kiln, "versions": versions, "cores": os.cpu_count(), "rounds": args.rounds,
              "contend": args.contend, "quick": args.quick, "reference": reference,
              "tolerance": CHECK_TOLERANCE, "peer_tolerance": PEER_TOLERANCE,
              "load_average": os.getloadavg()[0], "builds": [], "results": []}
    try:
        with BusyLoops(args.contend):
            for name in models:
                net = export_models.torch_network(name)
                for batch in batches:
                    so_path, build = build_and_check(kiln, folder, name, batch, net, reference, threads[0])
                    report["builds"].append(build)
                    for t in threads:
                        result = measure(kiln, so_path, folder, name, batch, t, engines, args.rounds, args.quick,
                                         reference)
                        result["errors"]["kiln"] = build["kiln_error"]
                        report["results"].append(result)
                        print_result(result)
        print_ratios(report["results"])
        write_json(args.json, report)
        examples = [name for name in models if name in export_models.EXAMPLE_INPUTS]
        if examples:
            report["plans"] = print_plans(kiln, examples)
        if not args.no_compile_times:
            print_compile_times(kiln, examples, report, cache, args.quick)
        write_json(args.json, report)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def print_compile_times(kiln, examples, report, cache, quick):
    """The example models' compile and JIT times, then those of kiln import and compile
    of every ONNX file the benchmark made."""
    print("\ncompile times, seconds (JIT: one `kiln run --target c` less the run's own time)\n")
    print("%-18s %14s %14s %14s" % ("model", "kiln compile", "JIT, cold", "JIT, cached"), flush=True)
    report["compile_times"] = {}
    for name in examples:
        iters = max(3, runs(name, 1, quick)[0] // 4)
        run_ms = kiln_bench(kiln, name, None, iters, cache)["median"]
        c, cold, cached = compile_times(kiln, name, run_ms)
        report["compile_times"][name] = {"compile_s": c, "jit_cold_s": cold, "jit_cached_s": cached}
        print("%-18s %14.2f %14.2f %14.3f" % (name + ".kiln", c, cold, cached), flush=True)
    print("\nthe ONNX files: kiln import, and kiln compile of the result, seconds\n")
    print("%-18s %5s %14s %14s" % ("model", "batch", "kiln import", "kiln compile"))
    for build in report["builds"]:
        print("%-18s %5d %14.2f %14.2f" % (build["model"], build["batch"], build["import_s"], build["compile_s"]),
              flush=True)

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("bench.py: interrupted")
