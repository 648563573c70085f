#!/usr/bin/python3
"""kiln against PyTorch, ONNX Runtime and OpenVINO on two transformers, on the CPU.

    /work/venv/bin/python bench/transformers.py [--kiln build/kiln] [--threads 2] [--rounds 3]
                                                [--models bert,gpt2_step] [--folder DIR]

(a venv made with --system-site-packages and `pip install onnxruntime openvino`, as for
bench/bench.py; a peer that is not installed is left out.) The models, with random
weights from a fixed seed, made and exported into --folder (default: a temporary one):

  bert       tests/onnx/gen_models.py's BERT-style encoder at hidden 256, 4 layers, 4
             heads, vocabulary 30522, sequence 128, batch 1: int64 token ids, token
             types and an attention mask (the last 16 positions padding) in
  gpt2_step  examples/gen_gpt2.py's decoder step at hidden 256, 4 heads, 4 layers,
             context 256, vocabulary 1000: one token at a position in, the logits out.
             kiln runs gpt2_step.kiln, whose key/value cache lives in the instance; the
             peers run the same step exported to ONNX with the cache as inputs and
             outputs (past in, present out, as generation with them is written), and
             PyTorch the module that was exported. A step costs the same at every
             position, so each call repeats position 100.

Each engine runs in a process of its own (this script with --worker), once per round,
the rounds interleaved, so that each measures the machine as the others found it.
Every engine's output is first checked against PyTorch's (relative error below 1e-4).
PyTorch runs its fastest mode (torch.jit.trace, freeze, optimize_for_inference) with
OPENBLAS_NUM_THREADS=1; kiln is timed by `kiln bench` on the model compiled through its
cache. The table gives the median of the round medians, the spread of the rounds
((max - min) / median) and kiln's time over each engine's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENGINES = ("kiln", "torch", "ort", "openvino")
ITERS = {"bert": 40, "gpt2_step": 300}
TOLERANCE = 1e-4
GPT_SIZE = {"DIM": 256, "HEADS": 4, "LAYERS": 4, "CONTEXT": 256, "VOCAB": 1000}
GPT_POS = 100


def gpt2_module():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import gen_gpt2
    for key, value in GPT_SIZE.items():
        setattr(gen_gpt2, key, value)
    return gen_gpt2


def build_bert():
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
    import gen_models
    torch.manual_seed(0)
    net = gen_models.Bert(30522, 256, 4, 4, 128).eval()
    ids = torch.randint(0, 30522, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    mask[0, 112:] = 0
    inputs = {"ids": ids, "types": (torch.arange(128) >= 64).long().unsqueeze(0), "mask": mask}
    return net, inputs, ["y"]


def build_gpt2_step():
    import torch
    from torch import nn
    import torch.nn.functional as F
    g = gpt2_module()
    torch.manual_seed(0)
    gpt = g.Gpt().eval()
    dh = g.DIM // g.HEADS

    class Step(nn.Module):
        """gpt2_step.kiln as a module: the cache [LAYERS, HEADS, CONTEXT, HEAD_DIM] in and
        out, written at pos by a where over the positions."""

        def __init__(self):
            super().__init__()
            self.gpt = gpt
            self.register_buffer("positions", torch.arange(g.CONTEXT))

        def forward(self, token, pos, k_cache, v_cache):
            x = self.gpt.wte(token) + self.gpt.wpe(pos)
            slot = (self.positions == pos).reshape(1, g.CONTEXT, 1)
            visible = self.positions <= pos
            keys_out, values_out = [], []
            for i, b in enumerate(self.gpt.blocks):
                q, k, v = (t.reshape(g.HEADS, 1, dh) for t in b.attn(b.ln1(x)).split(g.DIM, dim=-1))
                keys = torch.where(slot, k, k_cache[i])
                values = torch.where(slot, v, v_cache[i])
                scores = torch.where(visible, (q @ keys.transpose(1, 2)) * (1 / dh ** 0.5), torch.tensor(-1e30))
                x = x + b.proj((F.softmax(scores, dim=2) @ values).reshape(1, g.DIM))
                x = x + b.fc2(F.gelu(b.fc1(b.ln2(x)), approximate="tanh"))
                keys_out.append(keys)
                values_out.append(values)
            return self.gpt.head(self.gpt.lnf(x)), torch.stack(keys_out), torch.stack(values_out)

    cache = torch.zeros(g.LAYERS, g.HEADS, g.CONTEXT, dh)
    inputs = {"token": torch.tensor([7]), "pos": torch.tensor([GPT_POS]), "k_cache": cache, "v_cache": cache}
    return Step().eval(), inputs, ["logits", "k_present", "v_present"]


BUILDERS = {"bert": build_bert, "gpt2_step": build_gpt2_step}


def export(name, folder):
    """The model's ONNX file, its inputs as .npy, PyTorch's output, and for gpt2_step
    kiln's own step (.kiln and weights)."""
    import torch
    net, inputs, outputs = BUILDERS[name]()
    with torch.no_grad():
        torch.onnx.export(net, tuple(inputs.values()), os.path.join(folder, name + ".onnx"),
                          input_names=list(inputs), output_names=outputs, opset_version=13)
        for key, value in inputs.items():
            np.save(os.path.join(folder, f"{name}_{key}.npy"), value.numpy())
    if name == "gpt2_step":
        g = gpt2_module()
        w = g.weights(net.gpt)
        with open(os.path.join(folder, "gpt2_step.kiln"), "w") as f:
            f.write(g.kiln_text(w))
        g.write_safetensors(os.path.join(folder, "gpt2_step.safetensors"), w)


def torch_runner(name, feeds, threads):
    import torch
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    net, _, _ = BUILDERS[name]()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    traced = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(net, args)))
    return lambda: traced(*args)[0].numpy() if name == "gpt2_step" else traced(*args).numpy()


def ort_runner(path, feeds, threads):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)[0]


def openvino_runner(path, feeds, threads):
    import openvino
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    request = openvino.Core().compile_model(path, "CPU", config).create_infer_request()

    def run():
        request.infer(feeds)
        return request.get_output_tensor(0).data

    return run


def worker(engine, name, folder, threads, iters):
    """One engine's process: saves its output, then prints its times as JSON."""
    feeds = {k: np.load(os.path.join(folder, f"{name}_{k}.npy")) for k in input_names(name)}
    path = os.path.join(folder, name + ".onnx")
    run = {"torch": lambda: torch_runner(name, feeds, threads), "ort": lambda: ort_runner(path, feeds, threads),
           "openvino": lambda: openvino_runner(path, feeds, threads)}[engine]()
    np.save(os.path.join(folder, f"{name}_{engine}_y.npy"), np.asarray(run(), dtype=np.float32))
    for _ in range(5):
        run()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"median": statistics.median(times), "min": min(times), "max": max(times)}))


def input_names(name):
    return ["ids", "types", "mask"] if name == "bert" else ["token", "pos", "k_cache", "v_cache"]


def kiln_model(name, folder):
    """What kiln runs: the ONNX file, or for gpt2_step its own step and weights; and the
    inputs it takes, as --input options."""
    if name == "bert":
        model = [os.path.join(folder, "bert.onnx")]
    else:
        model = [os.path.join(folder, "gpt2_step.kiln"), "--weights", os.path.join(folder, "gpt2_step.safetensors")]
    names = input_names(name)[:3] if name == "bert" else ["token", "pos"]
    inputs = sum((["--input", f"{k}={os.path.join(folder, f'{name}_{k}.npy')}"] for k in names), [])
    return model + inputs


def kiln_output(kiln, name, folder, threads):
    out = os.path.join(folder, f"{name}_kiln_y.npy")
    key = "y" if name == "bert" else "logits"
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    subprocess.run([kiln, "run"] + kiln_model(name, folder) + ["--output", f"{key}={out}"], check=True, env=env)


def kiln_time(kiln, name, folder, threads, iters):
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    text = subprocess.run([kiln, "bench"] + kiln_model(name, folder) + ["--iters", str(iters)], check=True,
                          env=env, capture_output=True, text=True).stdout
    # MODEL: median X ms, min Y ms, max Z ms over N runs (T threads)
    fields = text.split(": ", 1)[1].replace(",", "").split()
    return {"median": float(fields[1]), "min": float(fields[4]), "max": float(fields[7])}


def peer_time(engine, name, folder, threads, iters):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    text = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", engine, "--models", name,
                           "--folder", folder, "--threads", str(threads), "--iters", str(iters)],
                          check=True, env=env, capture_output=True, text=True).stdout
    return json.loads(text.strip().splitlines()[-1])


def available(engine):
    module = {"kiln": None, "torch": "torch", "ort": "onnxruntime", "openvino": "openvino"}[engine]
    if module is None:
        return True
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def check(name, folder, engines):
    want = np.load(os.path.join(folder, f"{name}_torch_y.npy")).astype(np.float64)
    for engine in engines:
        got = np.load(os.path.join(folder, f"{name}_{engine}_y.npy")).reshape(want.shape)
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        if not err < TOLERANCE:
            sys.exit(f"{name}: {engine}'s output differs from PyTorch's (relative error {err:.3g})")
        print(f"{name}: {engine} matches PyTorch (relative error {err:.2g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="bert,gpt2_step")
    ap.add_argument("--folder")
    ap.add_argument("--worker", choices=["torch", "ort", "openvino"], help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.models, args.folder, args.threads, args.iters)
    models = args.models.split(",")
    for name in models:
        if name not in BUILDERS:
            sys.exit(f"unknown model '{name}' ({', '.join(BUILDERS)})")
    folder = args.folder or tempfile.mkdtemp(prefix="kiln-transformers-")
    os.makedirs(folder, exist_ok=True)
    engines = [e for e in ENGINES if available(e)]
    if "torch" not in engines:
        sys.exit("PyTorch is needed for the reference outputs")
    rows = []
    for name in models:
        export(name, folder)
        kiln_output(args.kiln, name, folder, args.threads)
        rounds = {e: [] for e in engines}
        for r in range(args.rounds):
            for engine in engines:
                if engine == "kiln":
                    rounds[engine].append(kiln_time(args.kiln, name, folder, args.threads, ITERS[name]))
                else:
                    rounds[engine].append(peer_time(engine, name, folder, args.threads, ITERS[name]))
        check(name, folder, [e for e in engines if e != "torch"])
        stats = {}
        for engine, results in rounds.items():
            medians = [x["median"] for x in results]
            m = statistics.median(medians)
            stats[engine] = (m, (max(medians) - min(medians)) / m)
        for engine in engines:
            m, spread = stats[engine]
            rows.append((name, engine, m, spread, stats["kiln"][0] / m))
    print(f"\n{args.threads} threads, {args.rounds} rounds")
    print("%-10s %-9s %10s %8s %10s" % ("model", "engine", "median ms", "spread", "kiln/this"))
    for name, engine, m, spread, ratio in rows:
        print("%-10s %-9s %10.3f %7.1f%% %10.2f" % (name, engine, m, 100 * spread, ratio))


if __name__ == "__main__":
    main()
