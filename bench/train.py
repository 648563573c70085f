#!/usr/bin/python3
"""kiln against PyTorch on one training step: forward, backward and the SGD update.

    /usr/bin/python3 bench/train.py [--kiln build/kiln] [--threads 2] [--models small_cnn,resnet18]
                                    [--check-steps 20] [--rounds 3] [--quick] [--keep DIR]

The models are the examples' networks, trained on a batch with one-hot labels:

  - small_cnn (examples/small_cnn.kiln) at batch 32: 3x32x32 images, 10 classes;
  - resnet18 (examples/resnet18.kiln) at batch 8: 3x224x224 images, 1000 classes.

The kiln training step is the example's text rewritten: the input `x` gets the
batch, the result types after the op statements are dropped (they are optional and
shape inference gives the new ones), the final softmax (small_cnn) or the logits
themselves (resnet18) feed a cross-entropy loss against an input `labels`, one-hot
f32[B, C], averaged over the batch as F.cross_entropy does; `grad` gives the gradient
of every trained param, and SGD with momentum 0.9 and weight decay 5e-4 as
torch.optim.SGD computes it (v = 0.9 v + g + 5e-4 w, w = w - lr v, lr 0.001; each v a
param) changes them. The model outputs the loss. Every batch norm is in training
mode, as torch's in train(): it normalizes with the batch's mean and biased variance
over (N, H, W), computed with `mean` and differentiated through (docs/language.md,
"Training steps"), and its running mean and variance, which torch keeps as buffers
and SGD does not train, are params that `update`s move by momentum 0.1 towards the
batch's mean and unbiased variance. The model is compiled once with `kiln compile`
(--memory-report gives the planned workspace and its lower bound) and timed with
`kiln bench` on the .so: every run is one step, and the instance keeps its updated
params, so the timed runs train the network as PyTorch's loop does.

PyTorch: an eager training step, `opt.zero_grad(set_to_none=True)`,
`F.cross_entropy(net(x), labels)`, `backward()`, `opt.step()` with
torch.optim.SGD(lr=0.001, momentum=0.9, weight_decay=5e-4), torch.set_num_threads(t)
and OPENBLAS_NUM_THREADS=1, the network in train() mode. The weights are the values
of kiln's initializers (examples/gen_examples.py), so both start from the same
network.

Before timing, the compiled step runs --check-steps times (20) on a fresh instance
(through ctypes), as PyTorch does from the same weights in float32 and in float64;
then the losses, and every param (weights, momentum buffers and running statistics,
read out of the instance through the ABI's read_param, docs/abi.md), of kiln and of
PyTorch in float32 are measured against float64's: kiln further from it than
CHECK_FACTOR times PyTorch (see there) is an error, so a wrong training graph does
not give a time. Then both engines run warm-up steps (5, or 2 for
ResNet-18) and the timed ones (100, or 10 for ResNet-18).

Each engine and thread count runs in a process of its own, the engines in turns
for --rounds rounds (3), so that a busy spell of the machine slows both: the table
gives the median of the rounds' medians and their spread. Absolute times differ
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
LR, MOMENTUM, WEIGHT_DECAY = 0.001, 0.9, 5e-4
BN_MOMENTUM = 0.1
# Both engines compute in float32 and are measured against PyTorch in float64 from the
# same weights: kiln fails the check when its error of a kind (losses, weights,
# momentum buffers, running statistics) exceeds CHECK_FACTOR times torch's float32
# error plus CHECK_FLOOR. Not a fixed tolerance: with batch norms in training mode at
# batch 8, a random ResNet-18's float32 gradients are ill-conditioned (both engines'
# momentum buffers are 9% off float64's after one step, in layer4.0.conv1), and a
# value within rounding of a relu's kink (layer4.1.add holds one at 1.4e-5) takes its
# gradient one way or the other depending on how its conv was summed, so over 20
# steps float32 runs part by more than any tolerance that would still catch a wrong
# gradient in the small CNN.
CHECK_FACTOR, CHECK_FLOOR = 4, 1e-5
# params that torch keeps as buffers, not trained by SGD
BUFFER_SUFFIXES = (".running_mean", ".running_var")
BN_RE = re.compile(r"^(\S+)\s*=\s*batch_norm\(([^)]*)\)\s*:\s*f32\[1, ([0-9]+), ([0-9]+), ([0-9]+)\]\s*$")


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
    taken = [n for n in defs if n.startswith(("grad.", "step.", "new.", "loss", "v.", "bn_stat."))
             or n.endswith(".momentum") or n in ("labels", "lr", "momentum", "weight_decay")]
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
        elif BN_RE.match(s):
            if not any(b.startswith("const bn_stat.") for b in body):
                body += ["const bn_stat.keep : f32[] = %r" % (1 - BN_MOMENTUM),
                         "const bn_stat.momentum : f32[] = %r" % BN_MOMENTUM]
            body += batch_norm_train(BN_RE.match(s), batch)
        elif OP_RE.match(s).group(1) != result:
            body.append(TYPE_RE.sub("", line))  # the result types change with the batch
    tail = [
        "# cross-entropy against the one-hot labels, averaged over the batch",
        "const loss.scale : f32[] = %d" % -batch,
        "const lr : f32[] = %g" % LR,
        "const momentum : f32[] = %g" % MOMENTUM,
        "const weight_decay : f32[] = %g" % WEIGHT_DECAY,
        "loss.lsm = log_softmax(%s, axis=1)" % logits,
        "loss.picked = mul(loss.lsm, labels)",
        "loss.total = sum(loss.picked)",
        "loss = div(loss.total, loss.scale)",
        "# the gradient of every trained param, and SGD with momentum and weight decay",
        "%s = grad(loss, %s)" % (", ".join("grad." + p for p in params), ", ".join(params)),
    ]
    for p in params:
        shape = DECL_RE.match(defs[p]).group(3)
        tail += ["param %s.momentum : f32[%s] = zeros" % (p, shape),
                 "decay.%s = mul(%s, weight_decay)" % (p, p), "d.%s = add(grad.%s, decay.%s)" % (p, p, p),
                 "mv.%s = mul(%s.momentum, momentum)" % (p, p), "v.%s = add(mv.%s, d.%s)" % (p, p, p),
                 "step.%s = mul(v.%s, lr)" % (p, p), "new.%s = sub(%s, step.%s)" % (p, p, p),
                 "update %s.momentum = v.%s" % (p, p), "update %s = new.%s" % (p, p)]
    tail.append("output loss")
    return "\n".join(body + tail) + "\n", classes, params


def batch_norm_train(m, batch):
    """The lines of a batch norm in training mode in place of the inference one that m
    matched (result, args, C, H, W)."""
    r, args, c, h, w = m.group(1), [a.strip() for a in m.group(2).split(",")], *map(int, m.group(3, 4, 5))
    x, scale, bias, running_mean, running_var = args[:5]
    attrs = "".join(", " + a for a in args[5:])
    n = batch * h * w
    return [
        "# %s in training mode: the batch's statistics, and the running ones updated" % r,
        "const %s.var_momentum : f32[] = %r" % (r, BN_MOMENTUM * n / (n - 1)),
        "%s.mean_k = mean(%s, axes=[0, 2, 3], keepdims=true)" % (r, x),
        "%s.centered = sub(%s, %s.mean_k)" % (r, x, r),
        "%s.square = mul(%s.centered, %s.centered)" % (r, r, r),
        "%s.var_k = mean(%s.square, axes=[0, 2, 3], keepdims=true)" % (r, r),
        "%s.mean = reshape(%s.mean_k, shape=[%d])" % (r, r, c),
        "%s.var = reshape(%s.var_k, shape=[%d])" % (r, r, c),
        "%s = batch_norm(%s, %s, %s, %s.mean, %s.var%s)" % (r, x, scale, bias, r, r, attrs),
        "%s.old_mean = mul(%s, bn_stat.keep)" % (r, running_mean),
        "%s.new_mean = mul(%s.mean, bn_stat.momentum)" % (r, r),
        "%s.next_mean = add(%s.old_mean, %s.new_mean)" % (r, r, r),
        "%s.old_var = mul(%s, bn_stat.keep)" % (r, running_var),
        "%s.new_var = mul(%s.var, %s.var_momentum)" % (r, r, r),
        "%s.next_var = add(%s.old_var, %s.new_var)" % (r, r, r),
        "update %s = %s.next_mean" % (running_mean, r),
        "update %s = %s.next_var" % (running_var, r),
    ]


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
    """The torch network with kiln's param values, float32, in train() mode, giving logits."""
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
    net = net.train()
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


def torch_worker(name, threads, iters, check_steps, x_path, labels_path, state_path, dtype):
    """Times PyTorch's training step in float32 (iters runs); prints one JSON line with
    the times and its first check_steps losses, and saves its params and momentum
    buffers after them to state_path (.npz, by kiln's names). In float64, only the
    check steps: the reference that both float32 engines are measured against."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    precision = torch.float64 if dtype == "float64" else torch.float32
    x = torch.from_numpy(np.load(x_path)).to(precision)
    labels = torch.from_numpy(np.load(labels_path).argmax(1))
    net = torch_network(name).to(precision)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), labels)
        loss.backward()
        opt.step()
        return loss

    losses = [float(step().item()) for _ in range(check_steps)]
    if check_steps:  # a timing round after the first checks nothing
        state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()
                 if not k.endswith("num_batches_tracked")}
        for k, p in net.named_parameters():
            state[k + ".momentum"] = opt.state[p]["momentum_buffer"].numpy().copy()
        np.savez(state_path, **state)
    if precision == torch.float64:
        print(json.dumps({"losses": losses}))
        return
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


def run_torch(name, threads, iters, check_steps, x_path, labels_path, state_path, dtype="float32"):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "torch", name, str(threads), str(iters),
           str(check_steps), x_path, labels_path, state_path, dtype]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("torch on %s failed:\n%s" % (name, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- kiln ----


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class ModelDef(ctypes.Structure):  # runtime/kiln/model.h
    _fields_ = [("abi_version", ctypes.c_uint32), ("extensions", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("n_inputs", ctypes.c_int32), ("n_outputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(TensorInfo)), ("outputs", ctypes.POINTER(TensorInfo)),
                ("create", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                            ctypes.c_size_t)),
                ("run", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_void_p))),
                ("destroy", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
                ("n_params", ctypes.c_int32), ("params", ctypes.POINTER(TensorInfo)),
                ("read_param", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)),
                ("write_param", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p))]
KILN_EXT_PARAMS = 1


def kiln_check_worker(so_path, check_steps, x_path, labels_path, state_path):
    """Runs the compiled step check_steps times on a fresh instance; prints the losses as
    JSON and saves the params it updated to state_path (.npz)."""
    import numpy as np

    lib = ctypes.CDLL(os.path.abspath(so_path))
    lib.kiln_model.restype = ctypes.POINTER(ModelDef)
    m = lib.kiln_model().contents
    names = [m.inputs[i].name.decode() for i in range(m.n_inputs)]
    if (m.abi_version != 1 or not m.extensions & KILN_EXT_PARAMS or names != ["x", "labels"] or m.n_outputs != 1
            or m.outputs[0].rank != 0):
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
    losses, state = [], {}
    try:
        for _ in range(int(check_steps)):
            if m.run(inst, ins, outs) != 0:
                sys.exit("%s: run failed" % so_path)
            losses.append(float(loss))
        for i in range(m.n_params):
            info = m.params[i]
            value = np.zeros([info.shape[k] for k in range(info.rank)], np.float32)
            if info.dtype != 1 or m.read_param(inst, i, value.ctypes.data) != 0:
                sys.exit("%s: cannot read the param %s" % (so_path, info.name.decode()))
            state[info.name.decode()] = value
    finally:
        m.destroy(inst)
    np.savez(state_path, **state)
    print(json.dumps({"losses": losses}))


def kiln_check(so_path, threads, check_steps, x_path, labels_path, state_path):
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "kiln-check", so_path, str(check_steps), x_path,
           labels_path, state_path]
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


def errors(losses, state_path, ref_losses, ref_path):
    """How far a float32 run is from the float64 one, by kind: the losses, and the
    params after the check steps (weights, momentum buffers, running statistics); each
    the largest difference relative to the largest magnitude of that param in the
    float64 run. {kind: (error, where)}."""
    import numpy as np

    got, ref = np.load(state_path), np.load(ref_path)
    if set(got.files) != set(ref.files):
        sys.exit("kiln's params and torch's state differ: only kiln %s, only torch %s"
                 % (sorted(set(got.files) - set(ref.files))[:5], sorted(set(ref.files) - set(got.files))[:5]))
    worst = {"losses": (max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)), "")}
    for name in got.files:
        kind = ("momentum" if name.endswith(".momentum") else
                "running statistics" if name.endswith(BUFFER_SUFFIXES) else "weights")
        diff = float(np.max(np.abs(got[name] - ref[name])) / max(np.max(np.abs(ref[name])), 1e-30))
        if kind not in worst or diff > worst[kind][0]:
            worst[kind] = (diff, name)
    return worst


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
    ap.add_argument("--check-steps", type=int, default=20,
                    help="steps from the same weights whose losses and params must match torch's (default 20)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, each timing kiln then torch (default 3)")
    ap.add_argument("--quick", action="store_true", help="a fifth of the runs, for a smoke test")
    ap.add_argument("--keep", metavar="DIR", help="write the training models, .so files and data here")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker[0] == "torch":
            name, threads, iters, check_steps, x_path, labels_path, state_path, dtype = args.worker[1:]
            torch_worker(name, int(threads), int(iters), int(check_steps), x_path, labels_path, state_path, dtype)
        else:
            kiln_check_worker(*args.worker[1:])
        return

    kiln, models, threads = bench.checked_args(args, MODELS)
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    import torch

    print("kiln %s; PyTorch %s; %d cores" % (kiln, torch.__version__, os.cpu_count()))
    bench.warn_if_loaded()
    print("one training step (forward, backward, SGD update): the median of the rounds' median ms, and "
          "the spread (largest - smallest) / median of the rounds' medians; ratio < 1: kiln is faster\n")
    print("%-12s %6s %7s %6s %10s %7s %10s %7s %11s" % ("model", "batch", "threads", "runs", "kiln ms", "spread",
                                                       "torch ms", "spread", "kiln/torch"), flush=True)

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
                states = [os.path.join(folder, "%s_%s_%d.npz" % (name, who, t)) for who in ("kiln", "torch", "f64")]
                kiln_losses = kiln_check(so_path, t, args.check_steps, x_path, labels_path, states[0])
                # the engines in turns, round after round, so that a busy spell of the
                # machine slows both; the first torch round also gives its checked steps
                kiln_rounds, torch_rounds = [], []
                for r in range(args.rounds):
                    kiln_rounds.append(kiln_bench(kiln, so_path, t, iters, warmup, x_path, labels_path))
                    torch_rounds.append(run_torch(name, t, iters, args.check_steps if r == 0 else 0, x_path,
                                                  labels_path, states[1]))
                k, p = bench.aggregate(kiln_rounds), bench.aggregate(torch_rounds)
                p["losses"] = torch_rounds[0]["losses"]
                ref = run_torch(name, t, 0, args.check_steps, x_path, labels_path, states[2], "float64")["losses"]
                kiln_err = errors(kiln_losses, states[0], ref, states[2])
                torch_err = errors(p["losses"], states[1], ref, states[2])
                checks[(name, t)] = (kiln_losses, p["losses"], kiln_err, torch_err)
                bad = [kind for kind, (e, _) in kiln_err.items() if e > CHECK_FACTOR * torch_err[kind][0] + CHECK_FLOOR]
                if bad:
                    sys.exit("%s: after %d steps kiln is further from float64 than %g x torch's float32 + %g in %s: "
                             "kiln %s, torch %s" % (name, args.check_steps, CHECK_FACTOR, CHECK_FLOOR,
                                                    ", ".join(bad), kiln_err, torch_err))
                print("%-12s %6d %7d %6s %10s %7s %10s %7s %11s"
                      % (name, batch, t, "%dx%d" % (args.rounds, iters), bench.fmt_ms(k["median"]),
                         bench.fmt_spread(k["spread"]), bench.fmt_ms(p["median"]), bench.fmt_spread(p["spread"]),
                         bench.fmt_ratio(k["median"], p["median"])), flush=True)

        print("\n%d steps from the same weights in float32, kiln and PyTorch: the first and last losses, and "
              "each engine's largest error against PyTorch in float64 (relative to the largest magnitude)\n"
              % args.check_steps)
        for (name, t), (kl, tl, kiln_err, torch_err) in checks.items():
            print("%-12s threads %d: loss kiln %.6f .. %.6f, torch %.6f .. %.6f"
                  % (name, t, kl[0], kl[-1], tl[0], tl[-1]))
            for kind in kiln_err:
                print("    %-20s kiln %.2g (%s), torch %.2g (%s)"
                      % (kind, kiln_err[kind][0], kiln_err[kind][1], torch_err[kind][0], torch_err[kind][1]))

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
