#!/usr/bin/python3
"""kiln against PyTorch on one training step: forward, backward and the SGD update.

    /usr/bin/python3 bench/train.py [--kiln build/kiln] [--threads 2] [--models small_cnn,resnet18]
                                    [--quick] [--keep DIR]

The models are the examples' networks, trained on a batch with one-hot labels:

  - small_cnn (examples/small_cnn.kiln) at batch 32: 3x32x32 images, 10 classes;
  - resnet18 (examples/resnet18.kiln) at batch 8: 3x224x224 images, 1000 classes.

The kiln training step is the example's text rewritten: the input `x` gets the
batch, the result types after the op statements are dropped (they are optional and
shape inference gives the new ones), the final softmax (small_cnn) or the logits
themselves (resnet18) feed a cross-entropy loss against an input `labels`, one-hot
f32[B, C], averaged over the batch as F.cross_entropy does; `grad` gives the gradient
of every trained param, and plain SGD (`update p = sub(p, mul(g, lr))`, lr 0.001)
changes them. The model outputs the loss. The batch-norm running means and variances
are params in kiln but buffers in torch, which SGD does not train, so they are left
out of `grad` and `update` as well. The model is compiled once with `kiln compile`
(--memory-report gives the planned workspace and its lower bound) and timed with
`kiln bench` on the .so: every run is one step, and the instance keeps its updated
params, so the timed runs train the network as PyTorch's loop does.

PyTorch: an eager training step, `opt.zero_grad(set_to_none=True)`,
`F.cross_entropy(net(x), labels)`, `backward()`, `opt.step()` with
torch.optim.SGD(lr=0.001), torch.set_num_threads(t) and OPENBLAS_NUM_THREADS=1, the
network in eval() mode (see torch_network). The weights are the values of kiln's
initializers (examples/gen_examples.py), so both start from the same network.

Before timing, the compiled step runs twice on a fresh instance (through ctypes)
and its losses are compared with PyTorch's first two (the second one shows that the
first update was PyTorch's): a relative difference above 1e-3 is an error, so a
wrong training graph does not give a time. Then both engines run warm-up steps (5,
or 2 for ResNet-18) and the timed ones (100, or 10 for ResNet-18).

Each engine and thread count runs in a process of its own. Absolute times differ
between machines; compare the ratios, which come from one run.
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
sys.path.insert(0, HERE)
import bench  # noqa: E402  (kiln bench's output format, the memory report, the table's formats)
import gen_examples  # noqa: E402  (the models' params and initializers, the torch networks)

# model -> (gen_examples builder, batch, timed runs, warm-up runs)
MODELS = {
    "small_cnn": (gen_examples.small_cnn, 32, 100, 5),
    "resnet18": (gen_examples.resnet18, 8, 10, 2),
}
LR = 0.001
CHECK_STEPS = 2
CHECK_TOL = 1e-3
# params that torch keeps as buffers, not trained by SGD
BUFFER_SUFFIXES = (".running_mean", ".running_var")


# ---- The training step in kiln's language ----

TYPE_RE = re.compile(r"\s*:\s*f32\[[0-9, ]*\](\s*,\s*f32\[[0-9, ]*\])*\s*$")
DECL_RE = re.compile(r"^(input|param|const)\s+(\S+)\s*:\s*f32\[([0-9, ]*)\]")
OP_RE = re.compile(r"^(\S+)\s*=\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)")


def dims(text):
    return [int(d) for d in text.split(",") if d.strip()]


def training_step(text, batch):
    """The example's model text rewritten as one SGD training step at this batch; returns
    (text, number of classes, trained params)."""
    lines = text.splitlines()
    # first the statements: each value's line, the params, the output
    defs, params, out = {}, [], None
    for line in lines:
        s = line.strip()
        if s.startswith("output "):
            out = [v.strip() for v in s[len("output "):].split(",")]
            continue
        m = DECL_RE.match(s) or OP_RE.match(s)
        if m:
            name = m.group(2) if m.re is DECL_RE else m.group(1)
            defs[name] = s
            if m.re is DECL_RE and m.group(1) == "param" and not name.endswith(BUFFER_SUFFIXES):
                params.append(name)
    if not out or len(out) != 1:
        sys.exit("expected one output in the example")
    # the logits: the input of a final softmax, or the output itself
    result = logits = out[0]
    m = OP_RE.match(defs[result])
    if m and m.group(2) == "softmax":
        logits = m.group(3).split(",")[0].strip()
    else:
        result = None
    m = re.search(r":\s*f32\[1, ([0-9]+)\]$", defs[logits])
    if not m:
        sys.exit("cannot find the number of classes (a result type f32[1, C]) in: " + defs[logits])
    classes = int(m.group(1))
    taken = [n for n in defs if n.startswith(("grad.", "step.", "new.", "loss")) or n in ("labels", "lr")]
    if taken:
        sys.exit("the example already has values named %s; pick other names here" % ", ".join(taken[:3]))

    body = []
    for line in lines:
        s = line.strip()
        if not s or s.startswith("#"):
            body.append(line)
        elif s.startswith("model "):
            body.append(s + "_train")
            body.append("# Written by bench/train.py: the example below as one SGD training step at batch %d;" % batch)
            body.append("# the example's own comments follow.")
        elif s.startswith("output "):
            continue
        elif DECL_RE.match(s):
            m = DECL_RE.match(s)
            if m.group(1) == "input":
                shape = dims(m.group(3))
                if m.group(2) != "x" or shape[0] != 1:
                    sys.exit("expected the example's one input x at batch 1, got: " + s)
                body.append("input x : f32[%s]" % ", ".join(str(d) for d in [batch] + shape[1:]))
                body.append("input labels : f32[%d, %d]" % (batch, classes))
            else:
                body.append(line)
        elif OP_RE.match(s).group(1) != result:
            body.append(TYPE_RE.sub("", line))  # the result types change with the batch
    tail = [
        "# cross-entropy against the one-hot labels, averaged over the batch",
        "const loss.scale : f32[] = %d" % -batch,
        "const lr : f32[] = %g" % LR,
        "loss.lsm = log_softmax(%s, axis=1)" % logits,
        "loss.picked = mul(loss.lsm, labels)",
        "loss.total = sum(loss.picked)",
        "loss = div(loss.total, loss.scale)",
        "# the gradient of every trained param, and plain SGD",
        "%s = grad(loss, %s)" % (", ".join("grad." + p for p in params), ", ".join(params)),
    ]
    for p in params:
        tail += ["step.%s = mul(grad.%s, lr)" % (p, p), "new.%s = sub(%s, step.%s)" % (p, p, p)]
    tail += ["update %s = new.%s" % (p, p) for p in params]
    tail.append("output loss")
    return "\n".join(body + tail) + "\n", classes, params


def make_data(name, batch, classes, folder):
    """A fixed batch (normal(0, 1) images) and one-hot labels i % classes, as .npy files."""
    import numpy as np

    rng = np.random.default_rng(7)
    shape = gen_examples_shape(name)
    x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
    labels = np.zeros((batch, classes), np.float32)
    labels[np.arange(batch), np.arange(batch) % classes] = 1
    paths = os.path.join(folder, name + "_x.npy"), os.path.join(folder, name + "_labels.npy")
    np.save(paths[0], x)
    np.save(paths[1], labels)
    return paths


def gen_examples_shape(name):
    return MODELS[name][0]().shapes["x"]


# ---- PyTorch, in a process of its own (--worker) ----


def torch_network(name):
    """The torch network with kiln's param values, float32, in eval() mode, giving logits.

    eval(): kiln's batch_norm is the inference form, which normalizes with its mean and var
    inputs (the running_mean and running_var params); a torch BatchNorm in eval mode
    does the same, so both compute, and differentiate, the same function. In train mode
    torch would normalize with the batch's statistics instead."""
    import torch
    from torch import nn

    model = MODELS[name][0]()
    if name == "resnet18":
        try:
            import torchvision

            net = torchvision.models.resnet18()
        except ImportError:  # gen_examples' hand-written copy has the same modules
            net = gen_examples.torch_models()["resnet18"]()
    else:
        class SmallCNN(gen_examples.torch_models()["small_cnn"]):
            def forward(self, x):  # the logits: the example's softmax is the loss's now
                x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
                x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
                return self.fc(torch.flatten(x, 1))

        net = SmallCNN()
    net = net.eval()
    state = net.state_dict()
    keys = {k for k in state if not k.endswith("num_batches_tracked")}
    if keys != set(model.params):
        sys.exit("%s: torch's state_dict and kiln's params differ: only torch %s, only kiln %s"
                 % (name, sorted(keys - set(model.params))[:5], sorted(set(model.params) - keys)[:5]))
    for key, (shape, init) in model.params.items():
        if tuple(state[key].shape) != shape:
            sys.exit("%s: %s is %s in torch, %s in kiln" % (name, key, tuple(state[key].shape), shape))
        state[key].copy_(torch.from_numpy(gen_examples.init_values(shape, init)))
    return net


def torch_worker(name, threads, iters, x_path, labels_path):
    """Times PyTorch's training step; prints one JSON line with the times and its first losses."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    x = torch.from_numpy(np.load(x_path))
    labels = torch.from_numpy(np.load(labels_path).argmax(1))
    net = torch_network(name)
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), labels)
        loss.backward()
        opt.step()
        return loss

    losses = [float(step().item()) for _ in range(CHECK_STEPS)]
    for _ in range(MODELS[name][3]):
        step()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    result = bench.summary(times)
    result["losses"] = losses
    print(json.dumps(result))


def run_torch(name, threads, iters, x_path, labels_path):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "torch", name, str(threads), str(iters),
           x_path, labels_path]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("torch on %s failed:\n%s" % (name, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- kiln ----


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class ModelDef(ctypes.Structure):  # runtime/kiln/model.h
    _fields_ = [("abi_version", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("n_inputs", ctypes.c_int32), ("n_outputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(TensorInfo)), ("outputs", ctypes.POINTER(TensorInfo)),
                ("create", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                            ctypes.c_size_t)),
                ("run", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_void_p))),
                ("destroy", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


def kiln_check_worker(so_path, x_path, labels_path):
    """Runs the compiled step CHECK_STEPS times on a fresh instance; prints the losses as JSON."""
    import numpy as np

    lib = ctypes.CDLL(os.path.abspath(so_path))
    lib.kiln_model.restype = ctypes.POINTER(ModelDef)
    m = lib.kiln_model().contents
    names = [m.inputs[i].name.decode() for i in range(m.n_inputs)]
    if m.abi_version != 1 or names != ["x", "labels"] or m.n_outputs != 1 or m.outputs[0].rank != 0:
        sys.exit("%s: not the training step expected (ABI %d, inputs %s, %d outputs)"
                 % (so_path, m.abi_version, names, m.n_outputs))
    x = np.ascontiguousarray(np.load(x_path), np.float32)
    labels = np.ascontiguousarray(np.load(labels_path), np.float32)
    for i, a in enumerate((x, labels)):
        shape = tuple(m.inputs[i].shape[k] for k in range(m.inputs[i].rank))
        if shape != a.shape:
            sys.exit("%s: input %s is %s, the data %s" % (so_path, names[i], shape, a.shape))
    inst = ctypes.c_void_p()
    err = ctypes.create_string_buffer(512)
    if m.create(ctypes.byref(inst), err, len(err)) != 0:
        sys.exit("%s: create failed: %s" % (so_path, err.value.decode(errors="replace")))
    loss = np.zeros((), np.float32)
    ins = (ctypes.c_void_p * 2)(x.ctypes.data, labels.ctypes.data)
    outs = (ctypes.c_void_p * 1)(loss.ctypes.data)
    losses = []
    try:
        for _ in range(CHECK_STEPS):
            if m.run(inst, ins, outs) != 0:
                sys.exit("%s: run failed" % so_path)
            losses.append(float(loss))
    finally:
        m.destroy(inst)
    print(json.dumps({"losses": losses}))


def kiln_check(so_path, threads, x_path, labels_path):
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "kiln-check", so_path, x_path, labels_path]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("checking %s failed:\n%s" % (so_path, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])["losses"]


def kiln_compile(kiln, model_path, so_path):
    """Compiles with --memory-report; (seconds, kernels, peak bytes, lower bound bytes)."""
    seconds, out = bench.run_kiln([kiln, "compile", model_path, "-o", so_path, "--memory-report"])
    try:
        kernels = out.split("\nkernels:\n", 1)[1].split("\nbuffers:\n", 1)[0].count("\n") + 1
        peak, bound = int(bench.PEAK_RE.search(out).group(1)), int(bench.BOUND_RE.search(out).group(1))
    except (IndexError, AttributeError):
        sys.exit("cannot read kiln compile --memory-report's output:\n" + out[:2000])
    return seconds, kernels, peak, bound


def kiln_bench(kiln, so_path, threads, iters, warmup, x_path, labels_path):
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    _, out = bench.run_kiln([kiln, "bench", so_path, "--input", "x=" + x_path, "--input", "labels=" + labels_path,
                             "--iters", str(iters), "--warmup", str(warmup)], env)
    m = bench.MEDIAN_RE.search(out)
    if not m:
        sys.exit("cannot read kiln bench's output: %r" % out)
    return {"median": float(m.group(1)), "min": float(m.group(2)), "max": float(m.group(3))}


def param_bytes(name, params):
    model = MODELS[name][0]()
    total = 0
    for p in params:
        n = 1
        for d in model.params[p][0]:
            n *= d
        total += 4 * n
    return total


# ---- Report ----


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"), help="the kiln binary")
    ap.add_argument("--threads", default="2", help="thread counts, comma-separated (default 2)")
    ap.add_argument("--models", default=",".join(MODELS), help="models, comma-separated")
    ap.add_argument("--quick", action="store_true", help="a fifth of the runs, for a smoke test")
    ap.add_argument("--keep", metavar="DIR", help="write the training models, .so files and data here")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker[0] == "torch":
            name, threads, iters, x_path, labels_path = args.worker[1:]
            torch_worker(name, int(threads), int(iters), x_path, labels_path)
        else:
            kiln_check_worker(*args.worker[1:])
        return

    kiln, models, threads = bench.checked_args(args, MODELS)
    import torch

    print("kiln %s; PyTorch %s; %d cores" % (kiln, torch.__version__, os.cpu_count()))
    bench.warn_if_loaded()
    print("one training step (forward, backward, SGD update), median ms over the runs shown; "
          "ratio < 1: kiln is faster\n")
    print("%-12s %6s %7s %6s %10s %10s %11s" % ("model", "batch", "threads", "runs", "kiln ms", "torch ms",
                                               "kiln/torch"), flush=True)

    folder = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="kiln-train-")
    os.makedirs(folder, exist_ok=True)
    plans, checks = {}, {}
    try:
        for name in models:
            _, batch, runs, warmup = MODELS[name]
            iters = max(3, runs // (5 if args.quick else 1))
            with open(os.path.join(EXAMPLES, name + ".kiln")) as f:
                text, classes, params = training_step(f.read(), batch)
            model_path = os.path.join(folder, name + "_train.kiln")
            so_path = os.path.join(folder, name + "_train.so")
            with open(model_path, "w") as f:
                f.write(text)
            x_path, labels_path = make_data(name, batch, classes, folder)
            plans[name] = kiln_compile(kiln, model_path, so_path) + (param_bytes(name, params), len(params))
            for t in threads:
                kiln_losses = kiln_check(so_path, t, x_path, labels_path)
                k = kiln_bench(kiln, so_path, t, iters, warmup, x_path, labels_path)
                p = run_torch(name, t, iters, x_path, labels_path)
                worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(kiln_losses, p["losses"]))
                checks[(name, t)] = (kiln_losses, p["losses"], worst)
                if worst > CHECK_TOL:
                    sys.exit("%s: the losses of the first %d steps differ: kiln %s, torch %s (relative %.3g)"
                             % (name, CHECK_STEPS, kiln_losses, p["losses"], worst))
                print("%-12s %6d %7d %6d %10s %10s %11s" % (name, batch, t, iters, bench.fmt_ms(k["median"]),
                                                           bench.fmt_ms(p["median"]),
                                                           bench.fmt_ratio(k["median"], p["median"])), flush=True)

        print("\nlosses of the first %d steps (fresh weights), kiln and PyTorch\n" % CHECK_STEPS)
        for (name, t), (kl, tl, worst) in checks.items():
            print("%-12s threads %d: kiln %s, torch %s; largest relative difference %.2g"
                  % (name, t, ", ".join("%.6f" % v for v in kl), ", ".join("%.6f" % v for v in tl), worst))

        mib = 1 << 20
        print("\nthe training step's workspace (kiln compile --memory-report; MiB), and the trained params\n")
        print("%-12s %8s %10s %10s %11s %8s %12s %10s" % ("model", "kernels", "peak", "bound", "peak/bound",
                                                          "params", "params MiB", "compile s"))
        for name in models:
            seconds, kernels, peak, bound, pbytes, nparams = plans[name]
            print("%-12s %8d %10.2f %10.2f %11.3f %8d %12.2f %10.2f"
                  % (name, kernels, peak / mib, bound / mib, peak / bound if bound else 1.0, nparams, pbytes / mib,
                     seconds))
        if args.keep:
            print("\nthe training models, .so files and data are in", folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
