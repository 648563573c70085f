#!/usr/bin/python3
"""Writes the training example's data, initial weights and PyTorch loss curve.

    /usr/bin/python3 examples/gen_train.py

Run it from anywhere; it writes into the folder it lives in:

  train_x.npy                f32[256, 1, 16, 16]: 256 single-channel 16x16 images
  train_y.npy                f32[256, 4]: their classes, one-hot
  train_cnn_init.safetensors the small CNN's initial weights (torch's default init, seed 0)
  train_cnn_loss.npy         f32[300]: the loss of each of 300 training steps in PyTorch
  train_cnn_adam.kiln, train_cnn_adamw.kiln
                             the same step with Adam and with AdamW (written here from
                             ADAM_TEMPLATE: the forward pass, then per weight the update)
  train_cnn_adam_loss.npy, train_cnn_adamw_loss.npy
                             f32[100]: their losses over 100 steps of torch.optim.Adam
                             (lr 0.003) and torch.optim.AdamW (lr 0.003, weight decay 0.01)

  train_cnn_clip.kiln, train_cnn_clip_loss.npy
                             the step with the gradients clipped to global norm 0.5
                             (torch.nn.utils.clip_grad_norm_; most steps clip), then SGD
                             with momentum 0.9 and weight decay 5e-4, and its losses
                             over 100 steps
  train_cnn_bn.kiln, train_cnn_bn_init.safetensors, train_cnn_bn_loss.npy,
  train_cnn_bn_stats.npy     the network with a batch norm after each conv (the convs
                             without bias), in training mode, trained with SGD
                             (momentum 0.9, weight decay 5e-4) from torch's init (seed
                             0); its losses over 100 steps, and the batch norms' running
                             means and variances after them, bn1's then bn2's, concatenated

  train_cnn_dropout.kiln, train_cnn_dropout_loss.npy
                             the SGD step with dropout (p 0.1 after the first pool,
                             p 0.25 on the flattened features) drawn from kiln's
                             Philox4x32-10 stream, and its losses over 100 steps in
                             PyTorch with the same masks, built by tests/ref/philox.py
                             (torch's own dropout draws from another generator, so the
                             masks are made by construction, not by seed)

Adam's learning rate is 0.003, not 0.01: at 0.01 this network's Adam curve hangs on
the last bit, two float32 orderings of torch's own update (addcdiv or p - (m / d) lr)
parting by 6e-4 over 100 steps; at 0.003 they agree within 2e-7, as float32 and
float64 do, so the curves compare what was computed, not how it was rounded.

The data: each image is a bar of 5 to 9 pixels, horizontal (class 0), vertical (1),
diagonal top-left to bottom-right (2) or anti-diagonal (3), of brightness 1.5 to 2.5
at a random place, on Gaussian noise of standard deviation 0.3; the classes take
turns (sample i has class i % 4). The model (train_cnn.kiln is the same network):

  conv 3x3, 1 -> 8, pad 1, relu, max_pool 2     [32, 8, 8, 8]
  conv 3x3, 8 -> 16, pad 1, relu, max_pool 2    [32, 16, 4, 4]
  flatten, linear 256 -> 4                      [32, 4]

and the loss is the cross-entropy of its logits, averaged over the batch
(F.cross_entropy). Training: torch.optim.SGD with lr 0.05 and momentum 0.9, batch
32, 300 steps; step s takes samples (32 s + i) % 256, i = 0 .. 31 (the data in
order, no shuffling), so the curve is what kiln's train_cnn.kiln gives step by step
(examples/train_cnn.c runs it and compares). Everything is float32 and runs on one
thread, so the script writes the same files every time.

The bars are bright enough that the loss falls from the first steps (to about 0.03
by step 50): the training never sits on a plateau, where the rounding of float32
would be amplified. So the curve is reproducible: trained in float64, the same
network gives the same losses within 4e-6 (the script prints this), while with dimmer bars (brightness 0.7
to 1.3) it waits about 40 steps near log 4, then drops, and float32 and float64
part by 0.17 after step 100 (as kiln and PyTorch then do).
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from gen_reference import write_safetensors  # noqa: E402
import philox  # noqa: E402

N, SIZE, CLASSES = 256, 16, 4
BATCH, STEPS, LR, MOMENTUM = 32, 300, 0.05, 0.9


def make_data(seed=2024):
    """Images [N, 1, SIZE, SIZE] and one-hot labels [N, CLASSES], float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.3, size=(N, 1, SIZE, SIZE))
    y = np.zeros((N, CLASSES))
    for i in range(N):
        c = i % CLASSES
        length = int(rng.integers(5, 10))
        level = rng.uniform(1.5, 2.5)
        # (dr, dc): the bar's direction; it starts at (r0, c0) and stays in the image
        dr, dc = [(0, 1), (1, 0), (1, 1), (1, -1)][c]
        rows = (0, SIZE - 1 - dr * (length - 1))
        cols = (0, SIZE - 1 - dc * (length - 1)) if dc >= 0 else (length - 1, SIZE - 1)
        r0 = int(rng.integers(rows[0], rows[1] + 1))
        c0 = int(rng.integers(cols[0], cols[1] + 1))
        for k in range(length):
            x[i, 0, r0 + dr * k, c0 + dc * k] += level
        y[i, c] = 1
    return x.astype(np.float32), y.astype(np.float32)


class TrainCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (SIZE // 4) ** 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
        return self.fc(torch.flatten(x, 1))


class TrainBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * (SIZE // 4) ** 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2, 2)
        x = F.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2, 2)
        return self.fc(torch.flatten(x, 1))


def batch_indices(step):
    return (step * BATCH + np.arange(BATCH)) % N


def train(net, xt, labels, make_opt=None, steps=STEPS, clip=None):
    """The losses of `steps` steps (SGD with momentum unless make_opt makes another
    optimizer of the params; the gradients clipped to the global norm `clip` when
    given), each computed before its update, and which steps clipped."""
    opt = (make_opt or (lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM)))(net.parameters())
    losses, clipped = np.zeros(steps), np.zeros(steps, bool)
    for s in range(steps):
        idx = torch.from_numpy(batch_indices(s))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xt[idx]), labels[idx])
        loss.backward()
        if clip:
            clipped[s] = nn.utils.clip_grad_norm_(net.parameters(), clip) > clip
        opt.step()
        losses[s] = loss.item()
    return losses, clipped


ADAM_STEPS, ADAM_LR, ADAMW_DECAY = 100, 0.003, 0.01
WEIGHTS = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]
SHAPES = {"conv1.weight": [8, 1, 3, 3], "conv1.bias": [8], "conv2.weight": [16, 8, 3, 3], "conv2.bias": [16],
          "fc.weight": [4, 256], "fc.bias": [4]}

FORWARD = """const minus_batch : f32[] = -32
# the forward pass and the loss, as in train_cnn.kiln
conv1 = conv(x, conv1.weight, conv1.bias, pads=[1, 1, 1, 1])
relu1 = relu(conv1)
pool1 = max_pool(relu1, kernel=[2, 2], strides=[2, 2])
conv2 = conv(pool1, conv2.weight, conv2.bias, pads=[1, 1, 1, 1])
relu2 = relu(conv2)
pool2 = max_pool(relu2, kernel=[2, 2], strides=[2, 2])
flatten = flatten(pool2)
logits = linear(flatten, fc.weight, fc.bias)
lsm = log_softmax(logits, axis=1)
picked = mul(lsm, y)
total = sum(picked)
loss = div(total, minus_batch)
%s = grad(loss, %s)
""" % (", ".join("g." + w for w in WEIGHTS), ", ".join(WEIGHTS))

ADAM_TEMPLATE = """model train_cnn_{kind}
# train_cnn.kiln's step with {title} in place of SGD, as torch.optim.{title}
# computes it (lr {lr}, betas (0.9, 0.999), eps 1e-8{decay_note}). At the t-th
# step (t = 1 first), per weight w with its gradient g:
#
#{decay_line}   m = 0.9 m + 0.1 g            (the first moment, a param)
#   v = 0.999 v + 0.001 g * g    (the second moment, a param)
#   w = w - lr / (1 - 0.9^t) * m / (sqrt(v) / sqrt(1 - 0.999^t) + eps)
#
# Written by examples/gen_train.py, which also writes the losses PyTorch gives over
# {steps} steps from the same weights and data (train_cnn_{kind}_loss.npy):
#
#   kiln compile examples/train_cnn_{kind}.kiln --weights examples/train_cnn_init.safetensors -o {kind}.so
#   ./train_cnn {kind}.so examples/train_x.npy examples/train_y.npy {steps} --expect examples/train_cnn_{kind}_loss.npy
input x : f32[32, 1, 16, 16]
input y : f32[32, 4]
{params}# The bias corrections 1 - beta^t, params updated as (1 - beta) + beta (1 - beta^(t-1))
# from 0. Not 1 - pow(beta, t): 0.999 is 0.99900001 in f32, and 1 - 0.99900001^t is
# 1.3e-5 off the 1 - 0.999^t torch computes in double, enough to move the losses by
# 4e-4 over 100 steps.
param correction1 : f32[] = zeros
param correction2 : f32[] = zeros
const lr : f32[] = {lr}
const beta1 : f32[] = 0.9
const beta2 : f32[] = 0.999
const one_minus_beta1 : f32[] = 0.1
const one_minus_beta2 : f32[] = 0.001
const eps : f32[] = 1e-8
{decay_const}{forward}# this step's bias corrections and step size, shared by every weight
old_correction1 = mul(correction1, beta1)
old_correction2 = mul(correction2, beta2)
new_correction1 = add(old_correction1, one_minus_beta1)
new_correction2 = add(old_correction2, one_minus_beta2)
step_size = div(lr, new_correction1)
root2 = sqrt(new_correction2)
{updates}update correction1 = new_correction1
update correction2 = new_correction2
output loss
"""


def adam_text(kind):
    """train_cnn_{kind}.kiln's text: kind 'adam' or 'adamw'."""
    decoupled = kind == "adamw"
    params, updates = "", ""
    for w in WEIGHTS:
        shape = ", ".join(map(str, SHAPES[w]))
        params += "param %s : f32[%s]\n" % (w, shape)
        params += "param %s.m : f32[%s] = zeros\nparam %s.v : f32[%s] = zeros\n" % (w, shape, w, shape)
    for w in WEIGHTS:
        base = "decayed.%s" % w if decoupled else w
        if decoupled:
            updates += "decayed.%s = mul(%s, keep)\n" % (w, w)
        updates += ("old_m.{w} = mul({w}.m, beta1)\nnew_g.{w} = mul(g.{w}, one_minus_beta1)\n"
                    "m.{w} = add(old_m.{w}, new_g.{w})\n"
                    "old_v.{w} = mul({w}.v, beta2)\nsquare.{w} = mul(g.{w}, g.{w})\n"
                    "new_square.{w} = mul(square.{w}, one_minus_beta2)\nv.{w} = add(old_v.{w}, new_square.{w})\n"
                    "root.{w} = sqrt(v.{w})\nscaled.{w} = div(root.{w}, root2)\ndenom.{w} = add(scaled.{w}, eps)\n"
                    "ratio.{w} = div(m.{w}, denom.{w})\nstep.{w} = mul(ratio.{w}, step_size)\n"
                    "new.{w} = sub({base}, step.{w})\n"
                    "update {w}.m = m.{w}\nupdate {w}.v = v.{w}\nupdate {w} = new.{w}\n").format(w=w, base=base)
    return ADAM_TEMPLATE.format(
        kind=kind, title="AdamW" if decoupled else "Adam", lr=ADAM_LR, steps=ADAM_STEPS, params=params,
        decay_note=", weight decay %g" % ADAMW_DECAY if decoupled else "",
        decay_line="   w = (1 - lr * %g) w          (the decoupled weight decay)\n#" % ADAMW_DECAY if decoupled else "",
        decay_const="const keep : f32[] = %r\n" % (1 - ADAM_LR * ADAMW_DECAY) if decoupled else "",
        forward=FORWARD, updates=updates)


CLIP_STEPS, CLIP_MAX_NORM, CLIP_DECAY = 100, 0.5, 5e-4

CLIP_TEMPLATE = """model train_cnn_clip
# train_cnn.kiln's step with the gradients clipped by their global norm, as
# torch.nn.utils.clip_grad_norm_(params, {max_norm}) does, then SGD with momentum 0.9,
# weight decay {decay} and lr {lr} as torch.optim.SGD computes it. Per weight w, with
# its gradient g and n the 2-norm of all the gradients together:
#
#   g = g * min(1, {max_norm} / (n + 1e-6))
#   v = 0.9 v + (g + {decay} w)       (v, the momentum, a param)
#   w = w - lr v
#
# Written by examples/gen_train.py, which also writes the losses PyTorch gives over
# {steps} steps from the same weights and data (train_cnn_clip_loss.npy).
input x : f32[32, 1, 16, 16]
input y : f32[32, 4]
{params}const lr : f32[] = {lr}
const momentum : f32[] = 0.9
const weight_decay : f32[] = {decay}
const max_norm : f32[] = {max_norm}
const tiny : f32[] = 1e-6
const one : f32[] = 1
{forward}# the gradients' global norm, and the factor that brings it down to max_norm
{norm}norm = sqrt(squares)
norm_tiny = add(norm, tiny)
ratio = div(max_norm, norm_tiny)
clip = min(ratio, one)
{updates}output loss
"""


def sgd_step(w, grad):
    """The statements of SGD with momentum and weight decay for weight w with gradient
    `grad`, as torch.optim.SGD computes it (consts lr, momentum, weight_decay; the
    buffer w.momentum a param)."""
    return ("decay.{w} = mul({w}, weight_decay)\nd.{w} = add({g}, decay.{w})\n"
            "mv.{w} = mul({w}.momentum, momentum)\nv.{w} = add(mv.{w}, d.{w})\n"
            "step.{w} = mul(v.{w}, lr)\nnew.{w} = sub({w}, step.{w})\n"
            "update {w}.momentum = v.{w}\nupdate {w} = new.{w}\n").format(w=w, g=grad)


def clip_text():
    """train_cnn_clip.kiln's text."""
    params, norm, updates = "", "", ""
    for k, w in enumerate(WEIGHTS):
        shape = ", ".join(map(str, SHAPES[w]))
        params += "param %s : f32[%s]\nparam %s.momentum : f32[%s] = zeros\n" % (w, shape, w, shape)
        norm += "square.{w} = mul(g.{w}, g.{w})\nsum.{w} = sum(square.{w})\n".format(w=w)
        if k:
            total = "squares" if k == len(WEIGHTS) - 1 else "squares%d" % k
            before = "sum." + WEIGHTS[0] if k == 1 else "squares%d" % (k - 1)
            norm += "%s = add(%s, sum.%s)\n" % (total, before, w)
        updates += "clipped.%s = mul(g.%s, clip)\n" % (w, w) + sgd_step(w, "clipped." + w)
    return CLIP_TEMPLATE.format(max_norm=CLIP_MAX_NORM, decay=CLIP_DECAY, lr=LR, steps=CLIP_STEPS, params=params,
                                forward=FORWARD, norm=norm, updates=updates)


BN_STEPS, BN_DECAY = 100, 5e-4
BN_WEIGHTS = ["conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight", "bn2.bias", "fc.weight",
              "fc.bias"]
BN_SHAPES = {"conv1.weight": [8, 1, 3, 3], "bn1.weight": [8], "bn1.bias": [8], "conv2.weight": [16, 8, 3, 3],
             "bn2.weight": [16], "bn2.bias": [16], "fc.weight": [4, 256], "fc.bias": [4]}
BN_STATS = ["bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"]

BN_TEMPLATE = """model train_cnn_bn
# A training step of the small CNN with a batch norm after each conv, in training
# mode as torch's nn.BatchNorm2d computes it in train(): each normalizes with its
# batch's statistics over (N, H, W), the mean and the biased variance, and the
# gradients flow through them (batch_norm is differentiable in its mean and var);
# the running mean and variance move by momentum 0.1 towards the batch's mean and
# unbiased variance (n / (n - 1) times the biased one, n the values per channel),
# and num_batches_tracked counts the steps, all as `update`s. Then SGD with momentum
# 0.9, weight decay {decay} and lr {lr} (torch.optim.SGD), every weight decayed:
#
#   v = 0.9 v + (g + {decay} w)       (v, the momentum, a param)
#   w = w - lr v
#
# Written by examples/gen_train.py, which also writes the losses PyTorch gives over
# {steps} steps from the same weights and data (train_cnn_bn_loss.npy) and the running
# statistics after them (train_cnn_bn_stats.npy):
#
#   kiln compile examples/train_cnn_bn.kiln --weights examples/train_cnn_bn_init.safetensors -o bn.so
#   ./train_cnn bn.so examples/train_x.npy examples/train_y.npy {steps} --expect examples/train_cnn_bn_loss.npy \\
#       --expect-params {stats}=examples/train_cnn_bn_stats.npy
input x : f32[32, 1, 16, 16]
input y : f32[32, 4]
{params}const lr : f32[] = {lr}
const momentum : f32[] = 0.9
const weight_decay : f32[] = {decay}
const stat_keep : f32[] = 0.9
const stat_momentum : f32[] = 0.1
const one : i64[] = 1
const minus_batch : f32[] = -32
conv1 = conv(x, conv1.weight, pads=[1, 1, 1, 1])
{bn1}relu1 = relu(bn1)
pool1 = max_pool(relu1, kernel=[2, 2], strides=[2, 2])
conv2 = conv(pool1, conv2.weight, pads=[1, 1, 1, 1])
{bn2}relu2 = relu(bn2)
pool2 = max_pool(relu2, kernel=[2, 2], strides=[2, 2])
flatten = flatten(pool2)
logits = linear(flatten, fc.weight, fc.bias)
lsm = log_softmax(logits, axis=1)
picked = mul(lsm, y)
total = sum(picked)
loss = div(total, minus_batch)
{grads} = grad(loss, {weights})
{updates}output loss
"""

BN_LAYER = """# {b}: the batch's mean and biased variance per channel, normalizing {x}
{b}.mean_k = mean({x}, axes=[0, 2, 3], keepdims=true)
{b}.centered = sub({x}, {b}.mean_k)
{b}.square = mul({b}.centered, {b}.centered)
{b}.var_k = mean({b}.square, axes=[0, 2, 3], keepdims=true)
{b}.mean = reshape({b}.mean_k, shape=[{c}])
{b}.var = reshape({b}.var_k, shape=[{c}])
{b} = batch_norm({x}, {b}.weight, {b}.bias, {b}.mean, {b}.var, epsilon=1e-5)
# its running statistics: r = 0.9 r + 0.1 s, with the variance unbiased
{b}.old_mean = mul({b}.running_mean, stat_keep)
{b}.new_mean = mul({b}.mean, stat_momentum)
{b}.next_mean = add({b}.old_mean, {b}.new_mean)
{b}.old_var = mul({b}.running_var, stat_keep)
{b}.new_var = mul({b}.var, {b}.var_momentum)
{b}.next_var = add({b}.old_var, {b}.new_var)
{b}.next_count = add({b}.num_batches_tracked, one)
update {b}.running_mean = {b}.next_mean
update {b}.running_var = {b}.next_var
update {b}.num_batches_tracked = {b}.next_count
"""


def bn_text():
    """train_cnn_bn.kiln's text."""
    params, updates = "", ""
    for w in BN_WEIGHTS:
        shape = ", ".join(map(str, BN_SHAPES[w]))
        params += "param %s : f32[%s]\nparam %s.momentum : f32[%s] = zeros\n" % (w, shape, w, shape)
        updates += sgd_step(w, "g." + w)
    layers = {}
    for b, x, c, hw in (("bn1", "conv1", 8, SIZE * SIZE), ("bn2", "conv2", 16, (SIZE // 2) ** 2)):
        n = 32 * hw
        params += ("param {b}.running_mean : f32[{c}]\nparam {b}.running_var : f32[{c}]\n"
                   "param {b}.num_batches_tracked : i64[]\n").format(b=b, c=c)
        # 0.1 n / (n - 1), rounded once (torch multiplies the variance by momentum and
        # divides by n - 1 in double before it rounds to float)
        params += "const %s.var_momentum : f32[] = %r\n" % (b, float(np.float32(0.1 * n / (n - 1))))
        layers[b] = BN_LAYER.format(b=b, x=x, c=c)
    return BN_TEMPLATE.format(decay=BN_DECAY, lr=LR, steps=BN_STEPS, stats=",".join(BN_STATS), params=params,
                              bn1=layers["bn1"], bn2=layers["bn2"],
                              grads=", ".join("g." + w for w in BN_WEIGHTS), weights=", ".join(BN_WEIGHTS),
                              updates=updates)


def bn_example(x, y):
    """train_cnn_bn's files; returns the largest relative difference of float64's losses."""
    torch.manual_seed(0)
    net = TrainBN()
    init = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    write_safetensors(os.path.join(HERE, "train_cnn_bn_init.safetensors"), init)
    with open(os.path.join(HERE, "train_cnn_bn.kiln"), "w") as f:
        f.write(bn_text())
    xt, labels = torch.from_numpy(x), torch.from_numpy(y.argmax(1))
    curves, stats = [], []
    for dtype in (torch.float32, torch.float64):
        fresh = TrainBN().to(dtype)
        fresh.load_state_dict({k: torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v)
                               for k, v in init.items()})
        fresh.train()
        decayed = lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM, weight_decay=BN_DECAY)  # noqa: E731
        curves.append(train(fresh, xt.to(dtype), labels, decayed, BN_STEPS)[0])
        state = fresh.state_dict()
        stats.append(np.concatenate([state[k].double().numpy() for k in BN_STATS]))
    np.save(os.path.join(HERE, "train_cnn_bn_loss.npy"), curves[0].astype(np.float32))
    np.save(os.path.join(HERE, "train_cnn_bn_stats.npy"), stats[0].astype(np.float32))
    apart = np.abs(curves[0] - curves[1]) / np.maximum(1, np.abs(curves[0]))
    stats_apart = np.abs(stats[0] - stats[1]) / np.maximum(1, np.abs(stats[0]))
    print("bn: loss step 0 %.6f, step %d %.6f; float64 differs by at most %.3g in the losses, %.3g in the "
          "running statistics" % (curves[0][0], BN_STEPS - 1, curves[0][-1], apart.max(), stats_apart.max()))


DROPOUT_STEPS, DROPOUT_SEED, DROPOUT_P1, DROPOUT_P2 = 100, 7, 0.1, 0.25

DROPOUT_TEMPLATE = """model train_cnn_dropout
# train_cnn.kiln's step (SGD, lr {lr}, momentum {momentum}) with dropout: p {p1} after
# the first pool and p {p2} on the flattened features, the masks drawn from kiln's
# Philox4x32-10 stream at the key rng = (seed, offset), a param. The first dropout
# takes the key rng, the second rng + (0, 1), and each step adds (0, 2) to rng, so
# every step draws new masks and no two dropouts share one. fill({seed}) starts rng
# at (seed {seed}, offset {seed}); a weights file may give it any (seed, offset).
# The gradients go through the same masks (dropout of dy at the same key).
#
# Written by examples/gen_train.py, which also writes the losses PyTorch gives over
# {steps} steps from the same weights, data and masks (train_cnn_dropout_loss.npy).
input x : f32[32, 1, 16, 16]
input y : f32[32, 4]
{params}param rng : i64[2] = fill({seed})
const second : i64[2] = [0, 1]
const advance : i64[2] = [0, 2]
const lr : f32[] = {lr}
const momentum : f32[] = {momentum}
key2 = add(rng, second)
{forward}{updates}rng_next = add(rng, advance)
update rng = rng_next
output loss
"""


def dropout_text():
    """train_cnn_dropout.kiln's text."""
    params, updates = "", ""
    for w in WEIGHTS:
        shape = ", ".join(map(str, SHAPES[w]))
        params += "param %s : f32[%s]\nparam %s.momentum : f32[%s] = zeros\n" % (w, shape, w, shape)
        updates += ("mv.{w} = mul({w}.momentum, momentum)\nv.{w} = add(mv.{w}, g.{w})\n"
                    "step.{w} = mul(v.{w}, lr)\nnew.{w} = sub({w}, step.{w})\n"
                    "update {w}.momentum = v.{w}\nupdate {w} = new.{w}\n").format(w=w)
    forward = FORWARD.replace(
        "conv2 = conv(pool1,", "drop1 = dropout(pool1, rng, p=%s)\nconv2 = conv(drop1," % DROPOUT_P1).replace(
        "logits = linear(flatten,", "drop2 = dropout(flatten, key2, p=%s)\nlogits = linear(drop2," % DROPOUT_P2)
    return DROPOUT_TEMPLATE.format(lr=LR, momentum=MOMENTUM, p1=DROPOUT_P1, p2=DROPOUT_P2, seed=DROPOUT_SEED,
                                   steps=DROPOUT_STEPS, params=params, forward=forward, updates=updates)


class DropoutCNN(TrainCNN):
    """TrainCNN with dropout whose masks, x / (1 - p) where kept and x * 0
    elsewhere, are kiln's for key (seed, offset) and (seed, offset + 1)."""

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = x * self.scaled_mask(self.offset, x.shape, DROPOUT_P1, x.dtype)
        x = torch.flatten(F.max_pool2d(torch.relu(self.conv2(x)), 2, 2), 1)
        return self.fc(x * self.scaled_mask(self.offset + 1, x.shape, DROPOUT_P2, x.dtype))

    @staticmethod
    def scaled_mask(offset, shape, p, dtype):
        keep = philox.keep_mask(DROPOUT_SEED, offset, tuple(shape), p)
        return torch.from_numpy(np.where(keep, philox.dropout_scale(p), np.float32(0))).to(dtype)


def train_dropout(init, xt, labels, dtype):
    """The losses of DROPOUT_STEPS SGD steps of DropoutCNN, step s at offset
    seed + 2 s, and the weights after them."""
    net = DropoutCNN().to(dtype)
    net.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in init.items()})
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = np.zeros(DROPOUT_STEPS)
    for s in range(DROPOUT_STEPS):
        net.offset = DROPOUT_SEED + 2 * s
        idx = torch.from_numpy(batch_indices(s))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xt[idx].to(dtype)), labels[idx])
        loss.backward()
        opt.step()
        losses[s] = loss.item()
    return losses, net


def dropout_main(x, y, init):
    xt, labels = torch.from_numpy(x), torch.from_numpy(y.argmax(1))
    with open(os.path.join(HERE, "train_cnn_dropout.kiln"), "w") as f:
        f.write(dropout_text())
    curves = [train_dropout(init, xt, labels, dtype)[0] for dtype in (torch.float32, torch.float64)]
    np.save(os.path.join(HERE, "train_cnn_dropout_loss.npy"), curves[0].astype(np.float32))
    apart = np.abs(curves[0] - curves[1]) / np.maximum(1, np.abs(curves[0]))
    print("dropout: loss step 0 %.6f, step %d %.6f; float64 differs by at most %.3g * max(1, |loss|) (step %d)"
          % (curves[0][0], DROPOUT_STEPS - 1, curves[0][-1], apart.max(), apart.argmax()))


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    x, y = make_data()
    np.save(os.path.join(HERE, "train_x.npy"), x)
    np.save(os.path.join(HERE, "train_y.npy"), y)

    torch.manual_seed(0)
    net = TrainCNN()
    init = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    write_safetensors(os.path.join(HERE, "train_cnn_init.safetensors"), init)

    xt, labels = torch.from_numpy(x), torch.from_numpy(y.argmax(1))
    net64 = TrainCNN().double()
    net64.load_state_dict({k: torch.from_numpy(v).double() for k, v in init.items()})
    losses = train(net, xt, labels)[0].astype(np.float32)
    np.save(os.path.join(HERE, "train_cnn_loss.npy"), losses)
    # the same training in float64: how far float32's rounding moves the curve
    drift = np.abs(losses - train(net64, xt.double(), labels)[0]) / np.maximum(1, np.abs(losses))

    with torch.no_grad():
        acc = (net(xt).argmax(1) == labels).float().mean().item()
    optimizers = {"adam": lambda p: torch.optim.Adam(p, lr=ADAM_LR),
                  "adamw": lambda p: torch.optim.AdamW(p, lr=ADAM_LR, weight_decay=ADAMW_DECAY)}
    for kind, make_opt in optimizers.items():
        with open(os.path.join(HERE, "train_cnn_%s.kiln" % kind), "w") as f:
            f.write(adam_text(kind))
        curves = []
        for dtype in (torch.float32, torch.float64):
            fresh = TrainCNN().to(dtype)
            fresh.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in init.items()})
            curves.append(train(fresh, xt.to(dtype), labels, make_opt, ADAM_STEPS)[0])
        np.save(os.path.join(HERE, "train_cnn_%s_loss.npy" % kind), curves[0].astype(np.float32))
        apart = np.abs(curves[0] - curves[1]) / np.maximum(1, np.abs(curves[0]))
        print("%s: loss step 0 %.6f, step %d %.6f; float64 differs by at most %.3g * max(1, |loss|) (step %d)"
              % (kind, curves[0][0], ADAM_STEPS - 1, curves[0][-1], apart.max(), apart.argmax()))
    with open(os.path.join(HERE, "train_cnn_clip.kiln"), "w") as f:
        f.write(clip_text())
    curves = []
    for dtype in (torch.float32, torch.float64):
        fresh = TrainCNN().to(dtype)
        fresh.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in init.items()})
        decayed = lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM, weight_decay=CLIP_DECAY)  # noqa: E731
        losses_d, clipped = train(fresh, xt.to(dtype), labels, decayed, CLIP_STEPS, CLIP_MAX_NORM)
        curves.append(losses_d)
        if dtype == torch.float32:
            n_clipped = int(clipped.sum())
    np.save(os.path.join(HERE, "train_cnn_clip_loss.npy"), curves[0].astype(np.float32))
    apart = np.abs(curves[0] - curves[1]) / np.maximum(1, np.abs(curves[0]))
    print("clip: loss step 0 %.6f, step %d %.6f; %d of %d steps clipped; float64 differs by at most %.3g"
          % (curves[0][0], CLIP_STEPS - 1, curves[0][-1], n_clipped, CLIP_STEPS, apart.max()))
    bn_example(x, y)
    dropout_main(x, y, init)
    print("wrote train_x.npy %s, train_y.npy %s, train_cnn_init.safetensors (%s), train_cnn_loss.npy in %s"
          % (list(x.shape), list(y.shape), ", ".join(init), HERE))
    print("loss: step 0 %.6f, step %d %.6f (mean of the last 8 steps %.6f); accuracy after training %.1f%%"
          % (losses[0], STEPS - 1, losses[-1], losses[-8:].mean(), 100 * acc))
    print("trained in float64 instead, the losses differ by at most %.3g * max(1, |loss|) (step %d)"
          % (drift.max(), drift.argmax()))


if __name__ == "__main__":
    if sys.argv[1:] == ["dropout"]:  # only the dropout step, from the same data and weights
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(0)
        dropout_main(*make_data(), {k: v.detach().numpy().copy() for k, v in TrainCNN().state_dict().items()})
    else:
        main()
