#!/usr/bin/python3
"""One benchmark run of a peer engine on one model, in a process of its own.

    /usr/bin/python3 bench/peers.py ENGINE MODEL BATCH THREADS ITERS WARMUP FOLDER

bench/bench.py starts this once per engine and round, so that each measurement starts
from a fresh process and no thread setting leaks from one into the next. ENGINE is
`torch`, `ort` or `openvino`; FOLDER holds the model's ONNX file and input, as
bench/export_models.py writes them (MODEL_bBATCH.onnx, MODEL_bBATCH_x.npy).

  - torch: the torch network of export_models (the network the ONNX file was
    exported from) in PyTorch's fastest inference mode: torch.jit.trace,
    torch.jit.freeze and torch.jit.optimize_for_inference, torch.set_num_threads.
    bench.py sets OPENBLAS_NUM_THREADS=1, without which OpenBLAS's workers and
    PyTorch's fight over the cores. At batch 1 an example model's output on its
    example input must also be examples/NAME_expected.npy (float64, from kiln's
    initializers), so a wrong weight is an error, not a fast time.
  - ort: ONNX Runtime on the ONNX file, intra_op_num_threads=THREADS, one inter-op
    thread, sequential execution, all graph optimizations, the CPU provider.
  - openvino: OpenVINO's CPU device on the ONNX file, INFERENCE_NUM_THREADS=THREADS,
    PERFORMANCE_HINT=LATENCY and INFERENCE_PRECISION_HINT=f32: on a CPU with bfloat16
    OpenVINO would otherwise compute in bfloat16, and the output check (and the
    comparison) assume float32 throughout.

The run saves the engine's output as FOLDER/MODEL_bBATCH_ENGINE_y.npy for bench.py
to check; then, unless ITERS is 0, it makes WARMUP untimed calls and ITERS timed ones
and prints the median, smallest and largest time in ms as one JSON line.
"""

import json
import os
import sys
import time

import bench
import export_models


def time_calls(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return bench.summary(times)


def check_expected(name, traced):
    """At batch 1, an example model's PyTorch output on its example input must be
    examples/NAME_expected.npy; otherwise the weights are not kiln's."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.load(os.path.join(bench.EXAMPLES, export_models.EXAMPLE_INPUTS[name])))
    expected = np.load(os.path.join(bench.EXAMPLES, name + "_expected.npy"))
    err = bench.relative_error(traced(x).numpy(), expected)
    if err is None or err >= bench.CHECK_TOLERANCE:
        sys.exit("%s: PyTorch's output differs from %s_expected.npy (relative error %s); the weights "
                 "are not kiln's" % (name, name, err))


def torch_runner(name, x_np, threads):
    import torch

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    x = torch.from_numpy(x_np)
    net = export_models.torch_network(name)
    traced = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(net, x)))
    if x_np.shape[0] == 1 and name in export_models.EXAMPLE_INPUTS:
        check_expected(name, traced)
    return lambda: traced(x).numpy()


def ort_runner(onnx_path, x_np, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x_np})[0]


def openvino_runner(onnx_path, x_np, threads):
    import openvino

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "f32"}
    compiled = openvino.Core().compile_model(onnx_path, "CPU", config)
    request = compiled.create_infer_request()

    def run():
        request.infer({0: x_np})
        return request.get_output_tensor(0).data

    return run


RUNNERS = {"torch": lambda name, onnx_path, x, threads: torch_runner(name, x, threads),
           "ort": lambda name, onnx_path, x, threads: ort_runner(onnx_path, x, threads),
           "openvino": lambda name, onnx_path, x, threads: openvino_runner(onnx_path, x, threads)}


def main():
    import numpy as np

    if len(sys.argv) != 8:
        sys.exit("usage: peers.py ENGINE MODEL BATCH THREADS ITERS WARMUP FOLDER")
    engine, name, batch, threads, iters, warmup, folder = sys.argv[1:]
    if engine not in RUNNERS:
        sys.exit("unknown engine '%s' (%s)" % (engine, ", ".join(RUNNERS)))
    if name not in export_models.MODELS:
        sys.exit("unknown model '%s' (%s)" % (name, ", ".join(export_models.MODELS)))
    try:
        batch, threads, iters, warmup = int(batch), int(threads), int(iters), int(warmup)
    except ValueError:
        sys.exit("BATCH, THREADS, ITERS and WARMUP must be integers")
    onnx_path, input_path = export_models.file_paths(folder, name, batch)
    x = np.load(input_path)
    run = RUNNERS[engine](name, onnx_path, x, threads)
    np.save(export_models.output_path(folder, name, batch, engine), np.array(run(), dtype=np.float32))
    if iters:
        print(json.dumps(time_calls(run, iters, warmup)))


if __name__ == "__main__":
    main()
