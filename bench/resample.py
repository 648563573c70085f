#!/usr/bin/python3
"""kiln's resize and interpolate kernels against a copy of their output, PyTorch and
ONNX Runtime (where installed).

    /usr/bin/python3 bench/resample.py [--kiln build/kiln] [--threads 1,2] [--iters 50]

For each case, the median time of one call in milliseconds:

  - kiln: `kiln bench` on a one-op model (the C target), KILN_NUM_THREADS=t;
  - copy: `kiln bench` on a model that copies a tensor of the output's shape once,
    the memory-speed floor the resampling is measured against ("x copy");
  - torch: F.interpolate on the same float32 input, torch.set_num_threads(t),
    OPENBLAS_NUM_THREADS=1;
  - ort: the ONNX Resize node with the same attributes, intra_op_num_threads=t, when
    `import onnxruntime` works (run this script with a venv's python that has it).

Each engine and thread count runs in its own process. Absolute times differ between
machines; the ratios are what to compare.
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

# name -> (input shape, kiln statement (x -> y), F.interpolate kwargs or None, ONNX Resize attributes and
# scales or None)
CASES = {
    "bilinear 2x up 1x64x112x112": (
        [1, 64, 112, 112], "interpolate(x, scale_factor=2.0, mode=bilinear)",
        dict(scale_factor=2.0, mode="bilinear"),
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 2, 2])),
    "nearest 2x up 1x64x112x112": (
        [1, 64, 112, 112], "interpolate(x, scale_factor=2.0)", dict(scale_factor=2.0, mode="nearest"),
        (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1, 1, 2, 2])),
    "bicubic 2x up 1x64x112x112": (
        [1, 64, 112, 112], "interpolate(x, scale_factor=2.0, mode=bicubic)", dict(scale_factor=2.0, mode="bicubic"),
        (dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 2, 2])),
    "bilinear 0.5x down 1x64x224x224": (
        [1, 64, 224, 224], "interpolate(x, scale_factor=0.5, mode=bilinear)",
        dict(scale_factor=0.5, mode="bilinear"),
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 0.5, 0.5])),
    "area 224->56 1x64x224x224": (
        [1, 64, 224, 224], "interpolate(x, size=56, mode=area)", dict(size=56, mode="area"), None),
    "resize linear half_pixel 1.5x 1x32x100x100": (
        [1, 32, 100, 100], "resize(x, scales=[1.0, 1.0, 1.5, 1.5], mode=linear)", None,
        (dict(mode="linear"), [1, 1, 1.5, 1.5])),
}


def kiln_median(kiln, model, threads, iters):
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    out = subprocess.run([kiln, "bench", model, "--iters", str(iters)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(re.search(r"median ([0-9.]+) ms", out).group(1))


def time_calls(fn, iters):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def worker(engine, case, threads, iters):
    import numpy as np
    shape, _, torch_kwargs, onnx_resize = CASES[case]
    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
    if engine == "torch":
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(threads)
        t = torch.from_numpy(x)
        with torch.no_grad():
            return time_calls(lambda: F.interpolate(t, **torch_kwargs), iters)
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    attrs, scales = onnx_resize
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], scales)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return time_calls(lambda: sess.run(None, {"x": x}), iters)


def run_peer(engine, case, threads, iters):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--worker", engine, case, str(threads), str(iters)], env=env,
                         capture_output=True, text=True)
    return float(out.stdout.strip()) if out.returncode == 0 else None


def have_onnxruntime():
    return subprocess.run([sys.executable, "-c", "import onnxruntime, onnx"], capture_output=True).returncode == 0


def kiln_output_shape(kiln, model):
    """y's shape, from kiln's shape inference (`kiln opt` prints each result's type)."""
    text = subprocess.run([kiln, "opt", model], check=True, capture_output=True, text=True).stdout
    return [int(d) for d in re.search(r"^y = .* : f32\[([0-9, ]+)\]$", text, re.M).group(1).split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"), help="the kiln binary")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--iters", type=int, default=50, help="timed runs per measurement")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        engine, case, threads, iters = args.worker
        print(worker(engine, case, int(threads), int(iters)))
        return
    threads = [int(t) for t in args.threads.split(",")]
    ort = have_onnxruntime()
    print(f"{'case':44} {'thr':>3} {'kiln ms':>8} {'copy ms':>8} {'x copy':>7} {'torch ms':>9} {'x torch':>8}"
          f"{'   ort ms  x ort' if ort else ''}")
    with tempfile.TemporaryDirectory() as tmp:
        for case, (shape, stmt, torch_kwargs, onnx_resize) in CASES.items():
            model = os.path.join(tmp, "m.kiln")
            with open(model, "w") as f:
                f.write(f"model resample\ninput x : f32{shape}\ny = {stmt}\noutput y\n")
            y = kiln_output_shape(args.kiln, model)
            copy = os.path.join(tmp, "copy.kiln")
            with open(copy, "w") as f:
                f.write(f"model copy\ninput x : f32{y}\ny = identity(x)\noutput y\n")
            for t in threads:
                k = kiln_median(args.kiln, model, t, args.iters)
                c = kiln_median(args.kiln, copy, t, args.iters)
                line = f"{case:44} {t:>3} {k:8.3f} {c:8.3f} {k / c:7.2f}"
                p = run_peer("torch", case, t, args.iters) if torch_kwargs else None
                line += f" {p:9.3f} {k / p:8.2f}" if p else f" {'-':>9} {'-':>8}"
                if ort:
                    o = run_peer("ort", case, t, args.iters) if onnx_resize else None
                    line += f" {o:8.3f} {k / o:6.2f}" if o else f" {'-':>8} {'-':>6}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
