#!/usr/bin/python3
"""How long kiln takes to make a model ready to run, beside ONNX Runtime and OpenVINO.

    /work/venv/bin/python bench/compile.py [--kiln build/kiln] [--models ...]
                                           [--rounds 3] [--threads 2] [--json FILE]

For each model (small_cnn, resnet18, mobilenetv2, resnet50, densenet121, vgg11: the
ONNX exports of bench/export_models.py, made once into a temporary folder), the
seconds from an ONNX file to a model ready to run:

  jit cold     kiln_jit_file(model.onnx) with an empty KILN_CACHE_DIR: import,
               passes, lowering, and Clang in process on the model's own code
  jit warm     the same call with the cache that the cold one filled
  read         reading the ONNX file's bytes (already in the page cache): the part of
               a warm JIT that is the weights, not kiln
  compile      `kiln compile model.onnx -o M.so`, wall time (the system C compiler)
  ORT          onnxruntime.InferenceSession(model.onnx), all graph optimizations
  OpenVINO     Core().compile_model(model.onnx, "CPU"), reading included

Each measurement runs in a fresh process that times only the call (not Python's or
the library's loading), and the measurements are interleaved in rounds (--rounds):
in each round every model and engine once, in turn. The table gives the median of
the rounds and the spread (largest - smallest) / median. --json FILE writes every
round's figures. ONNX Runtime and OpenVINO come from a venv made with
--system-site-packages (pip install onnxruntime openvino); a missing one is left out.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_models  # noqa: E402  (the models and their ONNX exports)

MODELS = ["small_cnn", "resnet18", "mobilenetv2", "resnet50", "densenet121", "vgg11"]
ENGINES = ["jit cold", "jit warm", "read", "compile", "ORT", "OpenVINO"]

# Each snippet prints the seconds of its one call.
KILN_JIT = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.kiln_jit_file.restype = ctypes.c_void_p
lib.kiln_jit_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
lib.kiln_free.argtypes = [ctypes.c_void_p]
err = ctypes.create_string_buffer(4096)
t = time.perf_counter()
m = lib.kiln_jit_file(sys.argv[2].encode(), None, err)
t = time.perf_counter() - t
if not m:
    sys.exit("kiln_jit_file: " + err.value.decode(errors="replace"))
lib.kiln_free(m)
print(t)
"""

READ = """
import sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    f.read()
print(time.perf_counter() - t)
"""

ORT = """
import sys, time
import onnxruntime as ort
o = ort.SessionOptions()
o.intra_op_num_threads = int(sys.argv[2])
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
t = time.perf_counter()
ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
print(time.perf_counter() - t)
"""

OPENVINO = """
import sys, time
import openvino as ov
core = ov.Core()
config = {"INFERENCE_NUM_THREADS": int(sys.argv[2]), "PERFORMANCE_HINT": "LATENCY",
          "INFERENCE_PRECISION_HINT": "f32"}
t = time.perf_counter()
core.compile_model(sys.argv[1], "CPU", config)
print(time.perf_counter() - t)
"""


def importable(module):
    return subprocess.run([sys.executable, "-c", "import " + module], capture_output=True).returncode == 0


def timed(argv, env=None):
    """Runs argv; returns the seconds it prints, or None (with why on stderr)."""
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write("%s failed:\n%s" % (" ".join(argv[:3]), p.stderr[-2000:]))
        return None
    return float(p.stdout.split()[-1])


def wall(argv, env=None):
    """Runs argv; returns its wall time in seconds, or None."""
    t = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    t = time.perf_counter() - t
    if p.returncode != 0:
        sys.stderr.write("%s failed:\n%s" % (" ".join(argv[:3]), p.stderr[-2000:]))
        return None
    return t


def measure(engine, kiln, libkiln, onnx, threads, scratch):
    """One measurement of an engine on a model's ONNX file."""
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    cache = os.path.join(scratch, "cache")
    if engine == "jit cold":
        shutil.rmtree(cache, ignore_errors=True)
        return timed([sys.executable, "-c", KILN_JIT, libkiln, onnx], dict(env, KILN_CACHE_DIR=cache))
    if engine == "jit warm":
        return timed([sys.executable, "-c", KILN_JIT, libkiln, onnx], dict(env, KILN_CACHE_DIR=cache))
    if engine == "read":
        return timed([sys.executable, "-c", READ, onnx])
    if engine == "compile":
        return wall([kiln, "compile", onnx, "-o", os.path.join(scratch, "m.so"), "--quiet"], env)
    if engine == "ORT":
        return timed([sys.executable, "-c", ORT, onnx, str(threads)])
    return timed([sys.executable, "-c", OPENVINO, onnx, str(threads)])


def fmt(values):
    if not values:
        return "%16s" % "-"
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med if med > 0 else 0
    return "%8.3f (%4.0f%%)" % (med, 100 * spread)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(HERE), "build", "kiln"))
    ap.add_argument("--models", default=",".join(MODELS), help="models, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write every round's figures to this file")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    libkiln = os.path.join(os.path.dirname(kiln), "libkiln.so")
    if not os.access(kiln, os.X_OK) or not os.path.exists(libkiln):
        sys.exit("no kiln at %s (and libkiln.so beside it): build it first, or give --kiln" % kiln)
    models = args.models.split(",")
    for name in models:
        if name not in export_models.MODELS:
            sys.exit("unknown model '%s' (%s)" % (name, ", ".join(export_models.MODELS)))
    engines = [e for e in ENGINES if (e != "ORT" or importable("onnxruntime")) and
               (e != "OpenVINO" or importable("openvino"))]
    folder = tempfile.mkdtemp(prefix="kiln-compile-bench-")
    try:
        onnx = {}
        for name in models:
            onnx[name], _ = export_models.export(name, 1, folder)
        rounds = {name: {e: [] for e in engines} for name in models}
        for r in range(args.rounds):
            for name in models:
                for e in engines:
                    scratch = os.path.join(folder, name)
                    os.makedirs(scratch, exist_ok=True)
                    v = measure(e, kiln, libkiln, onnx[name], args.threads, scratch)
                    if v is not None:
                        rounds[name][e].append(v)
            print("round %d of %d done" % (r + 1, args.rounds), file=sys.stderr)
        print("seconds to a model ready to run, median of %d rounds (spread), %d threads" %
              (args.rounds, args.threads))
        print("%-14s" % "model" + "".join("%16s" % e for e in engines))
        for name in models:
            print("%-14s" % name + "".join(fmt(rounds[name][e]) for e in engines))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"threads": args.threads, "rounds": rounds}, f, indent=1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
