#!/usr/bin/python3
"""Writes kiln's example models and their inputs, and checks them against PyTorch.

    /usr/bin/python3 examples/gen_examples.py                 # the .kiln files and inputs
    /usr/bin/python3 examples/gen_examples.py --check         # also *_expected.npy, from torch
    /usr/bin/python3 examples/gen_examples.py --check --kiln build/kiln
                                                              # also run kiln's interpreter on them

Run it from anywhere; it writes into the folder it lives in. The models:

  autograd.kiln     the language spec's autograd exercise, with its gradients; input
                    autograd_x.npy
  small_cnn.kiln    two conv + relu + max_pool stages, flatten, linear 10, softmax;
                    input small_cnn_input.npy
  resnet18.kiln     torchvision's ResNet-18, batch 1
  mobilenetv2.kiln  torchvision's MobileNetV2 (width 1.0), batch 1, dropout left out
                    (inference); both ImageNet models read input_224.npy

Params are named as the PyTorch state_dict keys and carry initializers written in the
language, so no weights file is needed: conv weights He-normal (std sqrt(2 / fan_in)),
batch-norm weight uniform(0.5, 1), bias and running_mean uniform(-0.1, 0.1), running_var
uniform(0.5, 1.5), the classifier normal with std sqrt(1 / in_features) and bias zeros
(the small CNN's conv and fc biases uniform(-0.1, 0.1)); every seeded initializer of a
model has its own seed. The batch-norm statistics are not the activations' real ones,
so they exercise every input of batch_norm while the He scaling keeps activations of
order one (--check prints the output's magnitude).

The generated models (all but autograd.kiln, the spec's text) are, comments aside, in
kiln's canonical form: `kiln opt -O0 M.kiln` prints them back unchanged, less the `#`
lines.

--check builds the same networks in torch, written by hand as torchvision writes them
(torchvision itself is not needed), fills their state_dict with the values kiln's
initializers give (the generator of ir/init.c, reimplemented below), runs them in float64
on the float32 weights and input, and saves the result as float32: the reference that
`kiln run` must match within |a - b| <= 1e-4 + 1e-4 |b|.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- The initializers of ir/init.c ----
#
# SplitMix64: the state starts at the seed and advances by GAMMA before each draw, so the
# k-th draw (k = 1, 2, ...) mixes seed + k * GAMMA (mod 2^64); that makes it vectorizable.

GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(seed, count):
    z = np.uint64(seed) + np.arange(1, count + 1, dtype=np.uint64) * GAMMA
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def init_values(shape, init):
    """The float32 values kiln gives a param with this initializer, in C order."""
    n = int(np.prod(shape, dtype=np.int64))
    kind = init[0]
    if kind == "zeros":
        v = np.zeros(n)
    elif kind == "ones":
        v = np.ones(n)
    elif kind == "fill":
        v = np.full(n, init[1])
    elif kind == "uniform":
        _, lo, hi, seed = init
        u = (splitmix64(seed, n) >> np.uint64(40)).astype(np.float64) / 2.0**24
        v = lo + (hi - lo) * u
    elif kind == "normal":
        _, mean, std, seed = init
        z = splitmix64(seed, 2 * n)
        u1 = ((z[0::2] >> np.uint64(11)).astype(np.float64) + 1) / 2.0**53
        u2 = (z[1::2] >> np.uint64(11)).astype(np.float64) / 2.0**53
        v = mean + std * np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)
    else:
        raise ValueError(kind)
    return v.astype(np.float32).reshape(shape)


# ---- Writing the language ----


def fmt_float(v):
    """A double as kiln's printer writes it: the shortest %g that reads back the same."""
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    for prec in range(1, 18):
        s = "%.*g" % (prec, v)
        if float(s) == v:
            break
    mant, e, exp = s.partition("e")
    if not e:
        return s
    sign = "-" if exp[0] == "-" else ""
    return mant + "e" + sign + exp.lstrip("+-").lstrip("0")


def fmt_type(shape):
    return "f32[" + ", ".join(str(d) for d in shape) + "]"


def fmt_init(init):
    if len(init) == 1:
        return init[0]
    return "%s(%s, %s, seed=%d)" % (init[0], fmt_float(init[1]), fmt_float(init[2]), init[3])


def fmt_attr(value):
    """An int or a list of ints (the only attribute values these models need)."""
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


class Model:
    """Collects a model's statements in canonical form, and its params' initializers."""

    def __init__(self, name):
        self.lines = ["model " + name]
        self.params = {}  # name -> (shape, init)
        self.shapes = {}  # value name -> shape
        self.next_seed = 1

    def comment(self, text):
        self.lines.append("# " + text)

    def input(self, name, shape):
        self.shapes[name] = tuple(shape)
        self.lines.append("input %s : %s" % (name, fmt_type(shape)))
        return name

    def param(self, name, shape, kind, a=None, b=None):
        if kind in ("uniform", "normal"):
            init = (kind, float(a), float(b), self.next_seed)
            self.next_seed += 1
        else:
            init = (kind,)
        self.params[name] = (tuple(shape), init)
        self.shapes[name] = tuple(shape)
        self.lines.append("param %s : %s = %s" % (name, fmt_type(shape), fmt_init(init)))
        return name

    def op(self, name, op, inputs, shape, **attrs):
        """`name = op(inputs, attrs) : shape`; attrs in the op table's order, defaults left out."""
        args = list(inputs) + ["%s=%s" % (k, fmt_attr(v)) for k, v in attrs.items()]
        self.shapes[name] = tuple(shape)
        self.lines.append("%s = %s(%s) : %s" % (name, op, ", ".join(args), fmt_type(shape)))
        return name

    def output(self, *names):
        self.lines.append("output " + ", ".join(names))

    def text(self):
        return "\n".join(self.lines) + "\n"

    # -- layers, as torch.nn modules map onto kiln ops --

    def conv(self, name, x, out_ch, k, stride=1, pad=0, groups=1, bias=False, out=None):
        n, c, h, w = self.shapes[x]
        fan_in = c // groups * k * k
        wname = self.param(name + ".weight", (out_ch, c // groups, k, k), "normal", 0,
                           math.sqrt(2 / fan_in))
        inputs = [x, wname]
        if bias:
            inputs.append(self.param(name + ".bias", (out_ch,), "uniform", -0.1, 0.1))
        attrs = {}
        if stride != 1:
            attrs["strides"] = [stride, stride]
        if pad:
            attrs["pads"] = [pad] * 4
        if groups != 1:
            attrs["groups"] = groups
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        return self.op(out or name, "conv", inputs, (n, out_ch, ho, wo), **attrs)

    def batch_norm(self, name, x):
        c = self.shapes[x][1]
        inputs = [x,
                  self.param(name + ".weight", (c,), "uniform", 0.5, 1),
                  self.param(name + ".bias", (c,), "uniform", -0.1, 0.1),
                  self.param(name + ".running_mean", (c,), "uniform", -0.1, 0.1),
                  self.param(name + ".running_var", (c,), "uniform", 0.5, 1.5)]
        return self.op(name, "batch_norm", inputs, self.shapes[x])

    def max_pool(self, name, x, k, stride, pad=0):
        n, c, h, w = self.shapes[x]
        attrs = {"kernel": [k, k], "strides": [stride, stride]}
        if pad:
            attrs["pads"] = [pad] * 4
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        return self.op(name, "max_pool", [x], (n, c, ho, wo), **attrs)

    def linear(self, name, x, wname, bname, out_features, bias_init):
        n, f = self.shapes[x]
        inputs = [x, self.param(wname, (out_features, f), "normal", 0, math.sqrt(1 / f)),
                  self.param(bname, (out_features,), *bias_init)]
        return self.op(name, "linear", inputs, (n, out_features))

    def same(self, name, op, x, **attrs):
        return self.op(name, op, [x], self.shapes[x], **attrs)

    def head(self, x):
        """global average pool and flatten: [N, C, H, W] -> [N, C]."""
        n, c = self.shapes[x][:2]
        p = self.op("avgpool", "global_avg_pool", [x], (n, c, 1, 1))
        return self.op("flatten", "flatten", [p], (n, c))


# ---- The models ----

AUTOGRAD = """\
# The autograd exercise of the language spec, as a static graph. With x all ones
# (autograd_x.npy) it returns loss = 40 and the gradients g1 = 28, g2 = 8, g3 = 10.
model autograd_example
input  x  : f32[2, 2]
param  w1 : f32[] = fill(2.0)
param  w2 : f32[] = fill(3.0)
param  w3 : f32[] = fill(4.0)
l1 = mul(x, w1)
l2 = add(l1, w2)
l3 = mul(l1, w3)
l4 = mul(l2, l3)
loss = mean(l4)
g1, g2, g3 = grad(loss, w1, w2, w3)
output loss, g1, g2, g3
"""


def small_cnn():
    m = Model("small_cnn")
    m.comment("A small CNN on one 32x32 RGB image: two conv3x3 + relu + max_pool stages,")
    m.comment("flatten, a linear layer to 10 classes and softmax. Input: small_cnn_input.npy.")
    x = m.input("x", (1, 3, 32, 32))
    x = m.conv("conv1", x, 16, 3, pad=1, bias=True)
    x = m.same("relu1", "relu", x)
    x = m.max_pool("pool1", x, 2, 2)
    x = m.conv("conv2", x, 32, 3, pad=1, bias=True)
    x = m.same("relu2", "relu", x)
    x = m.max_pool("pool2", x, 2, 2)
    n, c, h, w = m.shapes[x]
    x = m.op("flatten", "flatten", [x], (n, c * h * w))
    x = m.linear("logits", x, "fc.weight", "fc.bias", 10, ("uniform", -0.1, 0.1))
    m.same("y", "softmax", x)
    m.output("y")
    return m


def resnet18():
    m = Model("resnet18")
    m.comment("torchvision's ResNet-18, batch 1. Params are named as its state_dict keys; each")
    m.comment("value is named after the module whose output it is. Input: input_224.npy.")
    x = m.input("x", (1, 3, 224, 224))
    x = m.conv("conv1", x, 64, 7, stride=2, pad=3)
    x = m.batch_norm("bn1", x)
    x = m.same("relu", "relu", x)
    x = m.max_pool("maxpool", x, 3, 2, pad=1)
    inp = 64
    for layer, (out_ch, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], 1):
        for block in range(2):
            b = "layer%d.%d" % (layer, block)
            s = stride if block == 0 else 1
            m.comment("%s: BasicBlock %d -> %d, stride %d" % (b, inp, out_ch, s))
            y = m.conv(b + ".conv1", x, out_ch, 3, stride=s, pad=1)
            y = m.batch_norm(b + ".bn1", y)
            y = m.same(b + ".relu", "relu", y)
            y = m.conv(b + ".conv2", y, out_ch, 3, pad=1)
            y = m.batch_norm(b + ".bn2", y)
            if s != 1 or inp != out_ch:
                x = m.conv(b + ".downsample.0", x, out_ch, 1, stride=s)
                x = m.batch_norm(b + ".downsample.1", x)
            y = m.op(b + ".add", "add", [y, x], m.shapes[y])
            x = m.same(b, "relu", y)
            inp = out_ch
    x = m.head(x)
    m.linear("y", x, "fc.weight", "fc.bias", 1000, ("zeros",))
    m.output("y")
    return m


# torchvision's inverted residual settings: expansion t, channels c, repeats n, stride s.
MOBILENET_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                      (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenetv2():
    m = Model("mobilenetv2")
    m.comment("torchvision's MobileNetV2 (width 1.0), batch 1, dropout left out (inference).")
    m.comment("relu6 is clip(min=0, max=6). Params are named as its state_dict keys; each value")
    m.comment("is named after the module whose output it is. Input: input_224.npy.")

    def conv_bn(name, x, out_ch, k, stride=1, groups=1, act=True):
        x = m.conv(name + ".0", x, out_ch, k, stride=stride, pad=(k - 1) // 2, groups=groups)
        x = m.batch_norm(name + ".1", x)
        return m.same(name + ".2", "clip", x, min=0, max=6) if act else x

    x = m.input("x", (1, 3, 224, 224))
    x = conv_bn("features.0", x, 32, 3, stride=2)
    inp, i = 32, 1
    for t, c, n, s in MOBILENET_SETTINGS:
        for r in range(n):
            f = "features.%d" % i
            stride = s if r == 0 else 1
            hidden = inp * t
            m.comment("%s: inverted residual %d -> %d, expansion %d, stride %d" % (f, inp, c, t, stride))
            y, k = x, 0
            if t != 1:
                y = conv_bn("%s.conv.%d" % (f, k), y, hidden, 1)
                k += 1
            y = conv_bn("%s.conv.%d" % (f, k), y, hidden, 3, stride=stride, groups=hidden)
            y = m.conv("%s.conv.%d" % (f, k + 1), y, c, 1)
            y = m.batch_norm("%s.conv.%d" % (f, k + 2), y)
            x = m.op(f, "add", [x, y], m.shapes[y]) if stride == 1 and inp == c else y
            inp, i = c, i + 1
    x = conv_bn("features.%d" % i, x, 1280, 1)
    x = m.head(x)
    m.linear("y", x, "classifier.1.weight", "classifier.1.bias", 1000, ("zeros",))
    m.output("y")
    return m


# ---- Inputs ----

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def smooth_image(size):
    """A smooth synthetic RGB image in [0, 1], normalized as torchvision's ImageNet models
    expect: (pixel - mean) / std per channel. Shape [1, 3, size, size], float32."""
    yy, xx = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    r = 0.5 + 0.4 * np.sin(2 * np.pi * (1.5 * xx + 0.25)) * np.cos(2 * np.pi * yy)
    g = 0.1 + 0.4 * (xx + yy)
    b = 0.5 + 0.4 * np.cos(4 * np.pi * np.hypot(xx - 0.5, yy - 0.6))
    img = np.stack([r, g, b])
    img = (img - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None]
    return img[None].astype(np.float32)


# ---- The torch networks, written by hand as torchvision writes them ----


def torch_models():
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, inp, out, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out)
            self.downsample = None
            if stride != 1 or inp != out:
                self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                                nn.BatchNorm2d(out))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (self.downsample(x) if self.downsample is not None else x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inp = 64
            for i, (out, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], 1):
                setattr(self, "layer%d" % i, nn.Sequential(BasicBlock(inp, out, stride),
                                                           BasicBlock(out, out, 1)))
                inp = out
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    def conv_bn_relu6(inp, out, k, stride=1, groups=1):
        return nn.Sequential(nn.Conv2d(inp, out, k, stride, (k - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6())

    class InvertedResidual(nn.Module):
        def __init__(self, inp, out, stride, t):
            super().__init__()
            hidden = inp * t
            self.use_res_connect = stride == 1 and inp == out
            layers = [conv_bn_relu6(inp, hidden, 1)] if t != 1 else []
            layers += [conv_bn_relu6(hidden, hidden, 3, stride, hidden),
                       nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            features = [conv_bn_relu6(3, 32, 3, 2)]
            inp = 32
            for t, c, n, s in MOBILENET_SETTINGS:
                for r in range(n):
                    features.append(InvertedResidual(inp, c, s if r == 0 else 1, t))
                    inp = c
            features.append(conv_bn_relu6(inp, 1280, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(torch.flatten(x, 1))

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, 1, 1)
            self.conv2 = nn.Conv2d(16, 32, 3, 1, 1)
            self.fc = nn.Linear(32 * 8 * 8, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
            x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
            return torch.softmax(self.fc(torch.flatten(x, 1)), -1)

    return {"small_cnn": SmallCNN, "resnet18": ResNet18, "mobilenetv2": MobileNetV2}


def torch_reference(net_class, model, x):
    """Runs the torch network with kiln's param values; the state_dict must hold exactly
    the params of the kiln model, with the same shapes."""
    import torch

    net = net_class().double().eval()
    state = net.state_dict()
    keys = {k for k in state if not k.endswith("num_batches_tracked")}
    if keys != set(model.params):
        sys.exit("state_dict keys and kiln params differ: only torch %s, only kiln %s"
                 % (sorted(keys - set(model.params))[:5], sorted(set(model.params) - keys)[:5]))
    for k in keys:
        shape, init = model.params[k]
        if tuple(state[k].shape) != shape:
            sys.exit("%s: torch shape %s, kiln shape %s" % (k, tuple(state[k].shape), shape))
        state[k].copy_(torch.from_numpy(init_values(shape, init).astype(np.float64)))
    with torch.no_grad():
        return net(torch.from_numpy(x.astype(np.float64))).numpy().astype(np.float32)


def run_kiln(kiln, model_path, input_path):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "y.npy")
        cmd = [kiln, "run", model_path, "--target", "interp", "--input", "x=" + input_path,
               "--output", "y=" + out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return None, r.stderr.strip()
        return np.load(out), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write *_expected.npy from torch")
    ap.add_argument("--kiln", help="a kiln binary: also run its interpreter and compare")
    args = ap.parse_args()

    def path(name):
        return os.path.join(HERE, name)

    with open(path("autograd.kiln"), "w") as f:
        f.write(AUTOGRAD)
    np.save(path("autograd_x.npy"), np.ones((2, 2), np.float32))
    np.save(path("small_cnn_input.npy"), smooth_image(32))
    np.save(path("input_224.npy"), smooth_image(224))
    models = {"small_cnn": (small_cnn(), "small_cnn_input.npy"),
              "resnet18": (resnet18(), "input_224.npy"),
              "mobilenetv2": (mobilenetv2(), "input_224.npy")}
    for name, (model, _) in models.items():
        with open(path(name + ".kiln"), "w") as f:
            f.write(model.text())
    print("wrote the models and inputs in", HERE)
    if not args.check:
        return

    classes = torch_models()
    failed = False
    for name, (model, inp) in models.items():
        x = np.load(path(inp))
        y = torch_reference(classes[name], model, x)
        np.save(path(name + "_expected.npy"), y)
        print("%-12s output %s: mean |y| %.3g, max |y| %.3g, std %.3g"
              % (name, list(y.shape), np.abs(y).mean(), np.abs(y).max(), y.std()))
        if args.kiln:
            got, err = run_kiln(args.kiln, path(name + ".kiln"), path(inp))
            if got is None:
                print("  kiln failed:", err)
                failed = True
                continue
            bad = np.abs(got - y) > 1e-4 + 1e-4 * np.abs(y)
            print("  kiln interp: max |diff| %.3g, %d of %d outside tolerance"
                  % (np.abs(got - y).max(), bad.sum(), y.size))
            failed |= bool(bad.any())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
