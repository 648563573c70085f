#!/usr/bin/python3
"""Generates the numerical reference batteries for kiln's interpreter.

For each battery NAME (unary, binary, fused, reduce, softmax, norm, linalg, conv,
conv_transpose, pool, shape) this writes, next to this script:

  NAME.kiln                  one model: every test input is a `param` without an
                             initializer, each case is one statement `cK_y = op(...)`,
                             and `output` lists every case's result
  NAME.safetensors           the inputs (F32), keyed by param name
  NAME.expected.safetensors  the expected outputs (F32), keyed by output name

Expected values come from PyTorch (torch 1.13) in float64 on the same float32
inputs, rounded once to float32. Where the op's semantic source is ONNX and torch
has no direct equivalent (asymmetric pads, ceil-mode window dropping with such pads,
slice, pad with negative pads), they come from numpy code that follows the ONNX
specification; where such code overlaps with torch (symmetric pooling) the script
checks that both agree before writing anything. tests/unit/test_reference.c runs
every battery through the interpreter and compares with |a-b| <= 1e-4 + 1e-4*|b|.

Everything is deterministic (fixed seeds). Rerun after changing a battery:

    /usr/bin/python3 tests/ref/gen_reference.py [BATTERY...]

With no argument it rewrites every battery.
"""
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import philox  # noqa: E402
INF = float("inf")
NAN = float("nan")


# ---- files ----


# numpy dtype -> (kiln dtype, safetensors dtype, little-endian numpy spelling)
DTYPES = {np.dtype(np.float32): ("f32", "F32", "<f4"), np.dtype(np.int64): ("i64", "I64", "<i8"),
          np.dtype(np.int32): ("i32", "I32", "<i4"), np.dtype(np.bool_): ("bool", "BOOL", "|b1")}


def kept_dtype(arr):
    """arr as kiln holds it: integers and bools as they are, anything else float32."""
    arr = np.asarray(arr)
    return arr if arr.dtype in DTYPES else arr.astype(np.float32)


def write_safetensors(path, tensors):
    """Writes {name: array} as safetensors (F32, I64, I32 or BOOL, C order)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        _, st, le = DTYPES[arr.dtype]
        data = np.ascontiguousarray(arr, dtype=le).tobytes()
        header[name] = {"dtype": st, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def fmt(v):
    """An attribute value in kiln syntax."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(e) for e in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def T(a):
    """A float32 numpy array as a float64 torch tensor."""
    return torch.from_numpy(np.asarray(a, dtype=np.float32).astype(np.float64))


class Battery:
    """One model: params, one statement per case, and the expected outputs."""

    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.lines = [f"model {name}"]
        self.inputs, self.expected = {}, {}

    def rand(self, *shape, lo=-2.0, hi=2.0):
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def case(self, desc, op, args, expected, **attrs):
        """Adds `cK_y = op(args..., attrs...)`. args: (suffix, array or None for an
        absent optional input) pairs, float32 unless integer or bool; expected: a
        float64 tensor or array (rounded to float32), or an integer or bool one."""
        k = len(self.expected)
        self.lines.append(f"# {desc}")
        names = []
        for suffix, arr in args:
            if arr is None:
                names.append("_")
                continue
            arr = kept_dtype(arr)
            name = f"c{k}_{suffix}"
            self.lines.append(f"param {name} : {DTYPES[arr.dtype][0]}{list(arr.shape)}")
            self.inputs[name] = arr
            names.append(name)
        while names and names[-1] == "_":
            names.pop()
        names += [f"{key}={fmt(v)}" for key, v in attrs.items() if v is not None]
        y = f"c{k}_y"
        self.lines.append(f"{y} = {op}({', '.join(names)})")
        if isinstance(expected, torch.Tensor):
            expected = expected.numpy()
        expected = np.asarray(expected)
        if expected.dtype in DTYPES and expected.dtype != np.float32:
            self.expected[y] = expected
            return
        with np.errstate(over="ignore"):  # a value past float32's range is meant to become inf
            self.expected[y] = expected.astype(np.float64).astype(np.float32)

    def write(self):
        self.lines.append("output " + ", ".join(self.expected))
        with open(os.path.join(HERE, self.name + ".kiln"), "w") as f:
            f.write("\n".join(self.lines) + "\n")
        write_safetensors(os.path.join(HERE, self.name + ".safetensors"), self.inputs)
        write_safetensors(os.path.join(HERE, self.name + ".expected.safetensors"), self.expected)


# ---- elementwise ----


def gen_unary(b):
    # zero, signed zero, the breakpoints of relu/hardsigmoid/hardswish/clip, and a spread
    special = np.array([0.0, -0.0, -3.0, 3.0, -2.5, 2.5, -1.0, 1.0, 0.5, -0.5, 1e-3, -1e-3, 6.0, -6.0, 4.0, -4.0],
                       dtype=np.float32)
    spread = np.linspace(-5, 5, 24, dtype=np.float32)
    base = np.concatenate([special, spread]).reshape(5, 8)
    rand3 = b.rand(2, 3, 4, lo=-4, hi=4)
    extreme = np.array([INF, -INF, NAN, 30.0, -30.0, 100.0, -100.0, 0.0], dtype=np.float32)
    positive = b.rand(3, 5, lo=0.01, hi=10)
    mixed_log = np.array([0.0, -0.0, -1.0, 1.0, 2.718281828, 1e-30, INF, NAN], dtype=np.float32)

    ops = {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
        "log": torch.log, "sqrt": torch.sqrt, "neg": torch.neg, "abs": torch.abs, "erf": torch.erf,
    }
    for name, fn in ops.items():
        b.case(f"{name} around 0 and breakpoints", name, [("x", base)], fn(T(base)))
        b.case(f"{name} rank 3", name, [("x", rand3)], fn(T(rand3)))
        b.case(f"{name} of inf, nan and large values", name, [("x", extreme)], fn(T(extreme)))
    for name in ("log", "sqrt"):
        b.case(f"{name} of positive values", name, [("x", positive)], ops[name](T(positive)))
        b.case(f"{name} of 0, -0, negatives, tiny, inf, nan", name, [("x", mixed_log)], ops[name](T(mixed_log)))
    scalar = np.array(-0.75, dtype=np.float32)
    b.case("relu of a scalar", "relu", [("x", scalar)], torch.relu(T(scalar)))
    b.case("exp of a scalar", "exp", [("x", scalar)], torch.exp(T(scalar)))

    for alpha in (None, 0.2, 1.5, 0.0, -0.1):
        a = 0.01 if alpha is None else alpha
        b.case(f"leaky_relu alpha={alpha}", "leaky_relu", [("x", base)],
               torch.where(T(base) < 0, a * T(base), T(base)), alpha=alpha)
    b.case("leaky_relu of inf and nan", "leaky_relu", [("x", extreme)], F.leaky_relu(T(extreme), 0.01))

    clips = [(None, None), (-1.0, 1.0), (-0.5, None), (None, 2.5), (0.0, 6.0), (1.0, -1.0), (2.0, 2.0),
             (-INF, 0.5)]
    for lo, hi in clips:
        b.case(f"clip min={lo} max={hi}", "clip", [("x", base)],
               torch.clamp(T(base), -INF if lo is None else lo, INF if hi is None else hi), min=lo, max=hi)
    b.case("clip of inf and nan", "clip", [("x", extreme)], torch.clamp(T(extreme), -2.0, 2.0), min=-2.0, max=2.0)

    for approx in (None, "none", "tanh"):
        for x in (base, rand3):
            b.case(f"gelu approximate={approx}", "gelu", [("x", x)],
                   F.gelu(T(x), approximate=approx or "none"), approximate=approx)

    def hardsigmoid(x, alpha, beta):
        return torch.clamp(alpha * T(x) + beta, 0.0, 1.0)

    for alpha, beta in ((None, None), (1 / 6, 0.5), (0.5, None), (None, 0.25), (-0.3, 0.6), (2.0, -1.0)):
        b.case(f"hardsigmoid alpha={alpha} beta={beta}", "hardsigmoid", [("x", base)],
               hardsigmoid(base, 0.2 if alpha is None else alpha, 0.5 if beta is None else beta),
               alpha=alpha, beta=beta)
    b.case("hardsigmoid rank 3", "hardsigmoid", [("x", rand3)], hardsigmoid(rand3, 0.2, 0.5))
    b.case("hardsigmoid of inf and nan", "hardsigmoid", [("x", extreme[:3])], hardsigmoid(extreme[:3], 0.2, 0.5))
    for x in (base, rand3):
        b.case("hardswish", "hardswish", [("x", x)], F.hardswish(T(x)))

    # softplus reverts to x where beta x > threshold; past 88.7 exp overflows float32,
    # which a threshold of 1000 shows a naive formula would; a negative beta flips it
    wide = np.array([-100.0, -30.0, -20.0, -1e-3, 0.0, 1e-3, 10.0, 19.9, 20.0, 20.1, 30.0, 88.0, 89.0, 100.0,
                     INF, -INF, NAN], dtype=np.float32)
    for beta, threshold in ((None, None), (2.0, None), (0.5, 5.0), (None, 1000.0), (-1.5, None), (3.0, 0.0)):
        for x in (base, wide):
            b.case(f"softplus beta={beta} threshold={threshold}", "softplus", [("x", x)],
                   F.softplus(T(x), beta=1.0 if beta is None else beta,
                              threshold=20.0 if threshold is None else threshold),
                   beta=beta, threshold=threshold)
    b.case("softplus rank 3", "softplus", [("x", rand3)], F.softplus(T(rand3)))

    # floor, ceil, round (halves to even) and sign at integers, halves, zeros of both
    # signs, infinities and NaN; sign keeps a NaN (ONNX's np.sign), where torch.sign
    # gives 0
    halves = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, 0.0, 0.49999997, -0.50000006, 1e-3, -1e-3,
                       3.0, -3.0, 8388609.0, -8388607.5], dtype=np.float32)
    for name, fn in (("floor", torch.floor), ("ceil", torch.ceil), ("round", torch.round),
                     ("sign", lambda t: torch.where(torch.isnan(t), t, torch.sign(t)))):
        for x in (base, rand3, extreme, halves):
            b.case(f"{name} of {x.shape}", name, [("x", x)], fn(T(x)))
    # the trigonometric and hyperbolic functions: across and outside their domains
    # (NaN there), at their edges (atanh of 1 is inf), of infinities and NaN
    unit = np.array([-1.0, 1.0, -0.999, 0.999, 0.0, -0.0, 0.5, -0.5, 1.001, -1.001, 2.0, -2.0, 1e-4, -1e-4, INF, NAN],
                    dtype=np.float32)
    for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
        fn = getattr(torch, name)
        for x in (base, rand3, extreme, unit):
            b.case(f"{name} of {x.shape}", name, [("x", x)], fn(T(x)))


def gen_binary(b):
    pairs = [
        ([3, 4], [3, 4]), ([], []), ([], [3, 4]), ([3, 4], []), ([2, 3, 4], [4]), ([4], [2, 3, 4]),
        ([2, 1, 4], [3, 1]), ([1], [5]), ([5], [1]), ([2, 3, 4, 5], [5]), ([5], [2, 3, 4, 5]),
        ([2, 1, 4, 1], [3, 1, 5]), ([1, 1], [3, 4]), ([3, 1], [1, 4]), ([2, 3, 1, 5], [1, 3, 4, 1]),
        ([1, 2, 1, 3, 1], [2, 4, 1, 1]), ([6], [6]), ([2, 1, 3], [2, 4, 3]),
    ]
    fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
           "min": torch.minimum}
    for name, fn in fns.items():
        for sa, sb in pairs:
            a = b.rand(*sa)
            c = b.rand(*sb)
            if name == "div":
                c = np.where(np.abs(c) < 0.1, np.float32(0.5), c).astype(np.float32)
            b.case(f"{name} {sa} {sb}", name, [("a", a), ("b", c)], fn(T(a), T(c)))
    a = np.array([1.0, -1.0, 0.0, 0.0, INF, -INF, NAN, 2.0], dtype=np.float32)
    c = np.array([0.0, 0.0, 0.0, -0.0, 2.0, INF, 1.0, NAN], dtype=np.float32)
    for name, fn in fns.items():
        b.case(f"{name} of zeros, infs and nans", name, [("a", a), ("b", c)], fn(T(a), T(c)))
    a = np.array([1.0, 3.0, -2.0, 5.0], dtype=np.float32)
    c = np.array([1.0, -3.0, -2.0, 5.0], dtype=np.float32)
    b.case("max with ties", "max", [("a", a), ("b", c)], torch.maximum(T(a), T(c)))
    b.case("min with ties", "min", [("a", a), ("b", c)], torch.minimum(T(a), T(c)))

    # pow: positive bases with real exponents, negative bases with integer exponents
    for sa, sb in pairs[:12]:
        a = b.rand(*sa, lo=0.1, hi=3.0)
        e = b.rand(*sb, lo=-2.0, hi=2.0)
        b.case(f"pow {sa} {sb}", "pow", [("a", a), ("b", e)], torch.pow(T(a), T(e)))
    a = b.rand(3, 4, lo=-3, hi=3)
    e = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    b.case("pow negative bases, integer exponents", "pow", [("a", a), ("b", e)], torch.pow(T(a), T(e)))
    e = np.array([-1.0, -2.0, 0.5, 1.5], dtype=np.float32)
    b.case("pow mixed bases, negative and fractional exponents", "pow", [("a", a), ("b", e)],
           torch.pow(T(a), T(e)))
    a = np.array([0.0, 0.0, 0.0, -0.0, 2.0, -2.0, 1.0, NAN, 4.0, INF], dtype=np.float32)
    e = np.array([0.0, -1.0, 2.0, -1.0, INF, 0.5, NAN, 0.0, -0.5, -1.0], dtype=np.float32)
    b.case("pow edge cases", "pow", [("a", a), ("b", e)], torch.pow(T(a), T(e)))


def gen_fused(b):
    """The fused ops, `elementwise` and `fused_conv`: each call rounds to float32, as its op does."""

    def r(t):
        return t.float().double()

    def case(desc, expr, inputs, fn):
        args = [(f"x{i}", x) for i, x in enumerate(inputs)]
        b.case(desc, "elementwise", args, fn(*[T(x) for x in inputs]), expr=f'"{expr}"')

    edge = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 3.0], dtype=np.float32)
    case("relu6 of a multiply-add, three broadcast shapes", "clip(add(mul($0, $1), $2), min=0, max=6)",
         [b.rand(2, 3, 4, lo=-4, hi=4), b.rand(4), b.rand(3, 1)],
         lambda a, w, c: torch.clamp(r(r(a * w) + c), 0.0, 6.0))
    case("residual add + relu", "relu(add($0, $1))", [b.rand(1, 4, 5, 5), b.rand(1, 4, 5, 5)],
         lambda a, c: torch.relu(r(a + c)))
    case("silu with an input read twice", "mul(sigmoid($0), $0)", [b.rand(3, 7, lo=-6, hi=6)],
         lambda a: r(torch.sigmoid(a)) * a)
    case("normalization with a literal", "div(sub($0, $1), sqrt(add($2, 0.001)))",
         [b.rand(2, 3, 4), b.rand(3, 1), b.rand(3, 1, lo=0.1, hi=2)],
         lambda x, m, v: r(x - m) / r(torch.sqrt(r(v + np.float32(0.001)))))
    case("gelu tanh of a scaled input", "gelu(mul($0, 0.5), approximate=tanh)", [b.rand(4, 6, lo=-5, hi=5)],
         lambda x: F.gelu(r(x * 0.5), approximate="tanh"))
    case("leaky_relu and min, broadcast from rank 1", "max(leaky_relu($0, alpha=0.1), min($1, 2))",
         [b.rand(5), b.rand(2, 5, lo=-3, hi=3)],
         lambda x, y: torch.maximum(r(torch.where(x < 0, 0.1 * x, x)), torch.minimum(y, T(2.0))))
    case("floor, ceil, round and sign of a broadcast",
         "add(add(floor($0), ceil($1)), mul(round(mul($0, 2)), sign($1)))",
         [b.rand(3, 4, lo=-3, hi=3), b.rand(4, lo=-3, hi=3)],
         lambda a, c: r(r(torch.floor(a) + torch.ceil(c)) + r(torch.round(r(a * 2)) * torch.sign(c))))
    case("sin, cos, tan and atan", "add(mul(sin($0), cos($1)), atan(tan(mul($0, 0.5))))",
         [b.rand(3, 4, lo=-3, hi=3), b.rand(3, 4, lo=-3, hi=3)],
         lambda a, c: r(r(r(torch.sin(a)) * r(torch.cos(c))) + r(torch.atan(r(torch.tan(r(a * 0.5)))))))
    case("asin, acos, sinh and cosh", "add(add(asin(tanh($0)), acos(tanh($1))), sub(sinh($0), cosh($1)))",
         [b.rand(3, 4, lo=-3, hi=3), b.rand(3, 4, lo=-3, hi=3)],
         lambda a, c: r(r(r(torch.asin(r(torch.tanh(a)))) + r(torch.acos(r(torch.tanh(c)))))
                        + r(r(torch.sinh(a)) - r(torch.cosh(c)))))
    case("asinh, acosh and atanh", "add(asinh($0), add(acosh(add(abs($1), 1.5)), atanh(mul(tanh($0), 0.9))))",
         [b.rand(3, 4, lo=-3, hi=3), b.rand(3, 4, lo=-3, hi=3)],
         lambda a, c: r(r(torch.asinh(a)) + r(r(torch.acosh(r(torch.abs(c) + 1.5)))
                                              + r(torch.atanh(r(r(torch.tanh(a)) * np.float32(0.9)))))))
    case("hardswish of a power, outer broadcast", "hardswish(pow(abs($0), $1))",
         [b.rand(4, 1, lo=-3, hi=3), b.rand(1, 3, lo=-1, hi=2)],
         lambda x, e: F.hardswish(r(torch.pow(torch.abs(x), e))))
    case("hardsigmoid of erf, tanh of log", "add(hardsigmoid(erf($0), alpha=0.3, beta=0.6), tanh(log($1)))",
         [b.rand(3, 4), b.rand(3, 4, lo=0.05, hi=5)],
         lambda x, y: r(torch.clamp(0.3 * r(torch.erf(x)) + 0.6, 0.0, 1.0)) + r(torch.tanh(r(torch.log(y)))))
    case("zeros, infinities and NaN", "sub(relu($0), exp(neg($1)))", [edge, edge[::-1].copy()],
         lambda x, y: r(torch.relu(x)) - r(torch.exp(-y)))
    case("max and min with NaN", "min(max($0, $1), 2)", [edge, np.roll(edge, 3)],
         lambda x, y: torch.minimum(r(torch.maximum(x, y)), T(2.0)))
    case("scalar and vector", "mul(exp($0), $1)", [np.array(0.25, dtype=np.float32), b.rand(6)],
         lambda x, y: r(torch.exp(x)) * y)
    case("an input the expression does not read still broadcasts", "exp($0)", [b.rand(3), b.rand(2, 3)],
         lambda x, y: torch.exp(x).expand(2, 3))
    case("rank 5 broadcast", "add(mul($0, $1), abs($2))",
         [b.rand(2, 1, 1, 3, 2), b.rand(4, 1, 2), b.rand(2, 1, 1, 1, lo=-1, hi=1)],
         lambda x, y, z: r(x * y) + r(torch.abs(z)))
    case("a number alone", "add($0, 0)", [b.rand(2, 2)], lambda x: x)

    def conv(desc, expr, extras, fn, n, c, size, o, k, groups=None, strides=None, pads=None, bias=True,
             layout=None):
        """fused_conv: the conv's result rounded to float32, then the epilogue; extras(shape)
        makes the epilogue's other inputs for the conv's result shape."""
        x, w, bb, y = make_conv(b, n, c, size, o, k, groups, strides, pads, None, bias, layout)
        es = extras(tuple(y.shape))
        args = [("x", x), ("w", w), ("b", bb)] + [(f"e{i + 1}", e) for i, e in enumerate(es)]
        b.case(f"fused_conv {desc}", "fused_conv", args, fn(r(y), *[T(e) for e in es]), strides=strides,
               pads=pads, groups=groups, layout=layout, expr=f'"{expr}"')

    none = lambda shape: []  # noqa: E731
    same = lambda shape: [b.rand(*shape)]  # noqa: E731
    scalar = lambda shape: [np.array(0.75, dtype=np.float32)]  # noqa: E731
    for L in (None, "nhwc"):
        conv("relu, 3x3 pad 1", "relu($0)", none, torch.relu, 2, 3, (6, 5), 4, (3, 3), pads=1, layout=L)
        conv("residual add + relu, stride 2", "relu(add($0, $1))", same, lambda y, e: torch.relu(r(y + e)),
             1, 4, (7, 7), 6, (3, 3), strides=2, pads=1, layout=L)
        conv("relu6 of a depthwise conv", "clip($0, min=0, max=6)", none, lambda y: torch.clamp(y, 0.0, 6.0),
             1, 4, (6, 6), 4, (3, 3), groups=4, pads=1, layout=L)
        conv("hardswish of a 1x1 conv (no column matrix)", "hardswish($0)", none, F.hardswish, 2, 5, (3, 4), 3,
             (1, 1), layout=L)
        conv("leaky_relu, 1-D, no bias", "leaky_relu($0, alpha=0.1)", none, lambda y: F.leaky_relu(y, 0.1),
             1, 2, (9,), 3, (3,), bias=False, layout=L)
        conv("sigmoid times a scalar, groups 2", "mul(sigmoid($0), $1)", scalar,
             lambda y, s: r(torch.sigmoid(y)) * s, 1, 4, (5, 5), 6, (3, 3), groups=2, layout=L)
        conv("silu, 3-D", "mul(sigmoid($0), $0)", none, lambda y: r(torch.sigmoid(y)) * y, 1, 2, (4, 4, 4), 2,
             (2, 2, 2), layout=L)
        conv("residual and scalar, depthwise multiplier 2", "relu(add(mul($0, $2), $1))",
             lambda shape: same(shape) + scalar(shape), lambda y, e, s: torch.relu(r(r(y * s) + e)), 1, 3, (7, 7),
             6, (3, 3), groups=3, strides=2, layout=L)

    def linear(desc, expr, x_shape, out, bias, extras, fn):
        """fused_linear: linear's result rounded to float32, then the epilogue."""
        x, w = b.rand(*x_shape), b.rand(out, x_shape[-1])
        bb = b.rand(out) if bias else None
        y = F.linear(T(x), T(w), None if bb is None else T(bb))
        es = extras(tuple(y.shape))
        args = [("x", x), ("w", w), ("b", bb)] + [(f"e{i + 1}", e) for i, e in enumerate(es)]
        b.case(f"fused_linear {desc}", "fused_linear", args, fn(r(y), *[T(e) for e in es]), expr=f'"{expr}"')

    linear("relu", "relu($0)", (3, 5), 4, True, none, torch.relu)
    linear("residual + tanh, batched, no bias", "tanh(add($0, $1))", (2, 3, 5), 6, False, same,
           lambda y, e: torch.tanh(r(y + e)))
    linear("hardsigmoid of a scaled result, one row", "hardsigmoid(mul($0, $1))", (1, 7), 9, True, scalar,
           lambda y, s: torch.clamp(0.2 * r(y * s) + 0.5, 0.0, 1.0))  # ONNX HardSigmoid, alpha 0.2
    case("softplus of a broadcast sum", "softplus(add($0, $1), beta=2, threshold=3)",
         [b.rand(3, 4, lo=-4, hi=4), b.rand(4, lo=-1, hi=1)],
         lambda x, y: F.softplus(r(x + y), beta=2.0, threshold=3.0))


# ---- reductions, softmax, normalizations ----


def gen_reduce(b):
    def ref(name, x, axes, keep):
        dims = tuple(range(x.dim())) if axes is None else tuple(axes)
        if name == "sum":
            return torch.sum(x, dim=dims, keepdim=keep)
        if name == "mean":
            return torch.mean(x, dim=dims, keepdim=keep)
        return torch.amax(x, dim=dims, keepdim=keep)

    shapes_axes = [
        ([3, 4], None), ([3, 4], [0]), ([3, 4], [1]), ([3, 4], [-1]), ([2, 3, 4], [0, 2]),
        ([2, 3, 4], [-1, -3]), ([2, 3, 4], [1]), ([2, 3, 4, 5], [1, 2]), ([2, 3, 4, 5], [0, 3]),
        ([2, 3, 4, 5], [-2]), ([2, 3, 4, 5], None), ([2, 3, 4, 5], [0, 1, 2, 3]), ([7], None), ([7], [0]),
        ([1, 5, 1], [0, 2]), ([2, 3, 4], [2, 0, 1]),
    ]
    for name in ("sum", "mean", "reduce_max"):
        for shape, axes in shapes_axes:
            for keep in (None, True, False):
                x = b.rand(*shape)
                b.case(f"{name} {shape} axes={axes} keepdims={keep}", name, [("x", x)],
                       ref(name, T(x), axes, bool(keep)), axes=axes, keepdims=keep)
    x = np.array([[1.0, NAN, 3.0], [INF, 2.0, -INF]], dtype=np.float32)
    for name in ("sum", "mean", "reduce_max"):
        b.case(f"{name} with inf and nan", name, [("x", x)], ref(name, T(x), [1], False), axes=[1])
    x = np.full((2, 3), -5.0, dtype=np.float32)
    b.case("reduce_max of negatives", "reduce_max", [("x", x)], ref("reduce_max", T(x), None, False))


def gen_softmax(b):
    cases = [([5], None), ([3, 4], None), ([3, 4], 0), ([3, 4], -2), ([2, 3, 4], 1), ([2, 3, 4], -1),
             ([2, 3, 4], 0), ([2, 3, 4, 5], 2), ([2, 3, 4, 5], -3), ([1, 6], 1), ([4, 1], 1)]
    for name, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        for shape, axis in cases:
            x = b.rand(*shape, lo=-4, hi=4)
            b.case(f"{name} {shape} axis={axis}", name, [("x", x)], fn(T(x), -1 if axis is None else axis),
                   axis=axis)
        x = b.rand(3, 5, lo=-1, hi=1) + np.array([[1000], [-1000], [80]], dtype=np.float32)
        b.case(f"{name} of large values", name, [("x", x)], fn(T(x), -1))
        x = np.array([[1000.0, 0.0, -1000.0, 999.0], [-INF, 0.0, 1.0, -INF]], dtype=np.float32)
        b.case(f"{name} of extreme values", name, [("x", x)], fn(T(x), 1), axis=1)
        b.case(f"{name} with all-equal values", name, [("x", np.full((2, 4), 3.0, np.float32))],
               fn(T(np.full((2, 4), 3.0, np.float32)), -1))


def gen_norm(b):
    for shape in ([4, 3], [2, 3, 5], [2, 3, 4, 4], [1, 2, 3, 2, 3]):
        for layout in (None, "nhwc"):
            c = shape[-1] if layout == "nhwc" else shape[1]
            for eps in (None, 1e-3):
                x = b.rand(*shape)
                scale, bias, mean = b.rand(c), b.rand(c), b.rand(c, lo=-1, hi=1)
                var = b.rand(c, lo=0.1, hi=2.0)
                xt = T(x)
                if layout == "nhwc":
                    xt = xt.movedim(-1, 1)
                y = F.batch_norm(xt, T(mean), T(var), T(scale), T(bias), False, 0.0, 1e-5 if eps is None else eps)
                if layout == "nhwc":
                    y = y.movedim(1, -1)
                b.case(f"batch_norm {shape} layout={layout} epsilon={eps}", "batch_norm",
                       [("x", x), ("scale", scale), ("bias", bias), ("mean", mean), ("var", var)], y,
                       epsilon=eps, layout=layout)

    def layer_norm(x, axis, scale, bias, eps):
        xt = T(x)
        axis = axis % x.ndim
        dims = tuple(range(axis, x.ndim))
        mean = xt.mean(dim=dims, keepdim=True)
        var = ((xt - mean) ** 2).mean(dim=dims, keepdim=True)
        y = (xt - mean) / torch.sqrt(var + eps)
        if scale is not None:
            y = y * T(scale)
        if bias is not None:
            y = y + T(bias)
        return y

    cases = [([3, 5], None), ([2, 3, 4], None), ([2, 3, 4], 1), ([2, 3, 4], -2), ([2, 3, 4], 0),
             ([2, 3, 4, 5], 2), ([2, 3, 4, 5], -1), ([6], 0)]
    for shape, given in cases:
        axis = -1 if given is None else given
        norm = shape[axis % len(shape):]
        for with_scale, with_bias in ((True, True), (False, False), (True, False), (False, True)):
            x = b.rand(*shape, lo=-3, hi=3)
            scale = b.rand(*norm) if with_scale else None
            bias = b.rand(*norm) if with_bias else None
            # check the torch formula against torch's own layer_norm where it applies
            if with_scale and with_bias:
                want = F.layer_norm(T(x), norm, T(scale), T(bias), 1e-5)
                assert torch.allclose(want, layer_norm(x, axis, scale, bias, 1e-5))
            b.case(f"layer_norm {shape} axis={given} scale={with_scale} bias={with_bias}", "layer_norm",
                   [("x", x), ("scale", scale), ("bias", bias)], layer_norm(x, axis, scale, bias, 1e-5),
                   axis=given)
    x = b.rand(2, 3, 4)
    scale, bias = b.rand(4), b.rand(1)
    b.case("layer_norm axis=1, scale and bias broadcast to [3, 4]", "layer_norm",
           [("x", x), ("scale", scale), ("bias", bias)], layer_norm(x, 1, scale, bias, 1e-5), axis=1)
    x = b.rand(2, 6) * 0.01
    b.case("layer_norm epsilon=0.1 on small values", "layer_norm", [("x", x)], layer_norm(x, -1, None, None, 0.1),
           epsilon=0.1)
    x = np.full((2, 5), 7.0, np.float32)
    b.case("layer_norm of constant rows", "layer_norm", [("x", x)], layer_norm(x, -1, None, None, 1e-5))


# ---- linear algebra ----


def gen_linalg(b):
    pairs = [([4], [4]), ([3], [3, 5]), ([3], [2, 3, 5]), ([4, 3], [3]), ([2, 4, 3], [3]), ([4, 3], [3, 5]),
             ([2, 4, 3], [3, 5]), ([4, 3], [2, 3, 5]), ([2, 1, 4, 3], [3, 3, 5]), ([1, 4, 3], [2, 3, 5]),
             ([2, 3, 4, 3], [2, 3, 3, 2]), ([1, 1], [1, 1]), ([5, 1], [1, 6]), ([1], [1, 1]),
             ([3, 1, 2, 4], [1, 5, 4, 2])]
    for sa, sb in pairs:
        a, c = b.rand(*sa), b.rand(*sb)
        b.case(f"matmul {sa} {sb}", "matmul", [("a", a), ("b", c)], torch.matmul(T(a), T(c)))

    m, k, n = 3, 4, 5
    c_shapes = [None, [], [1], [n], [1, n], [m, 1], [m, n], [1, 1]]
    for ta in (None, True):
        for tb in (None, True):
            for alpha, beta in ((None, None), (0.5, None), (None, -2.0), (1.5, 0.25), (0.0, 1.0), (1.0, 0.0)):
                for cs in c_shapes:
                    # keep the battery moderate: every c shape with default scalars, every scalar pair with
                    # a full c and with c absent
                    if not (alpha is None and beta is None) and cs not in (None, [m, n], [n]):
                        continue
                    a = b.rand(k, m) if ta else b.rand(m, k)
                    bb = b.rand(n, k) if tb else b.rand(k, n)
                    c = None if cs is None else b.rand(*cs)
                    at = T(a).t() if ta else T(a)
                    bt = T(bb).t() if tb else T(bb)
                    al = 1.0 if alpha is None else alpha
                    be = 1.0 if beta is None else beta
                    y = al * (at @ bt)
                    if c is not None:
                        y = y + be * T(c)
                    b.case(f"gemm trans_a={ta} trans_b={tb} alpha={alpha} beta={beta} c={cs}", "gemm",
                           [("a", a), ("b", bb), ("c", c)], y, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb)

    a, bb, c = b.rand(m, k), b.rand(k, n), b.rand(m, n)
    b.case("gemm with every attribute at its default, written out", "gemm", [("a", a), ("b", bb), ("c", c)],
           T(a) @ T(bb) + T(c), alpha=1.0, beta=1.0, trans_a=False, trans_b=False)

    for xs in ([4], [3, 4], [2, 3, 4], [2, 2, 3, 4], [1, 4]):
        for bias in (True, False):
            x, w = b.rand(*xs), b.rand(5, 4)
            bb = b.rand(5) if bias else None
            b.case(f"linear x={xs} bias={bias}", "linear", [("x", x), ("w", w), ("b", bb)],
                   F.linear(T(x), T(w), None if bb is None else T(bb)))
    x, w, bb = b.rand(3, 1), b.rand(2, 1), b.rand(2)
    b.case("linear with one input feature", "linear", [("x", x), ("w", w), ("b", bb)], F.linear(T(x), T(w), T(bb)))


# ---- convolution ----


def spatial(v, count, fill):
    """A list attribute as given (None: the default, one integer: every entry)."""
    if v is None:
        return [fill] * count
    if isinstance(v, int):
        return [v] * count
    return list(v)


def to_nchw(t, nd):
    return t.permute(0, nd + 1, *range(1, nd + 1))


def to_nhwc(t, nd):
    return t.permute(0, *range(2, nd + 2), 1)


def torch_pads(pads, nd):
    """ONNX [b1.., e1..] as F.pad's [b_last, e_last, ..., b_first, e_first]."""
    out = []
    for i in reversed(range(nd)):
        out += [pads[i], pads[i + nd]]
    return out


CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def make_conv(b, n, c, size, o, k, groups=None, strides=None, pads=None, dilations=None, bias=True,
              layout=None):
    """A conv's random inputs x, w, b (or None) and PyTorch's result."""
    nd = len(size)
    g = groups or 1
    s, p, d = spatial(strides, nd, 1), spatial(pads, 2 * nd, 0), spatial(dilations, nd, 1)
    nhwc = layout == "nhwc"
    x = b.rand(n, *size, c) if nhwc else b.rand(n, c, *size)
    w = b.rand(o, *k, c // g) if nhwc else b.rand(o, c // g, *k)
    bb = b.rand(o) if bias else None
    xt, wt = (to_nchw(T(x), nd), to_nchw(T(w), nd)) if nhwc else (T(x), T(w))
    bt = None if bb is None else T(bb)
    if p[:nd] == p[nd:]:
        y = CONV[nd](xt, wt, bt, stride=s, padding=p[:nd], dilation=d, groups=g)
    else:
        y = CONV[nd](F.pad(xt, torch_pads(p, nd)), wt, bt, stride=s, dilation=d, groups=g)
    if nhwc:
        y = to_nhwc(y, nd)
    return x, w, bb, y


def conv_case(b, desc, n, c, size, o, k, groups=None, strides=None, pads=None, dilations=None, bias=True,
              layout=None):
    x, w, bb, y = make_conv(b, n, c, size, o, k, groups, strides, pads, dilations, bias, layout)
    b.case(f"conv {desc}", "conv", [("x", x), ("w", w), ("b", bb)], y, strides=strides, pads=pads,
           dilations=dilations, groups=groups, layout=layout)


def gen_conv(b):
    for layout in (None, "nhwc"):
        L = layout
        # 1-D
        conv_case(b, "1-D plain", 1, 2, (7,), 3, (3,), layout=L)
        conv_case(b, "1-D stride 2 pad 1 no bias", 2, 3, (8,), 2, (3,), strides=[2], pads=[1, 1], bias=False, layout=L)
        conv_case(b, "1-D dilation 2, asymmetric pads", 1, 2, (9,), 4, (3,), dilations=[2], pads=[0, 2], layout=L)
        conv_case(b, "1-D groups 2", 1, 4, (6,), 6, (2,), groups=2, pads=[2, 1], layout=L)
        conv_case(b, "1-D depthwise stride 3", 1, 3, (9,), 3, (3,), groups=3, strides=[3], layout=L)
        # 2-D
        conv_case(b, "2-D 3x3", 1, 2, (5, 5), 3, (3, 3), layout=L)
        conv_case(b, "2-D 3x3 pad 1", 2, 3, (6, 5), 4, (3, 3), pads=[1, 1, 1, 1], layout=L)
        conv_case(b, "2-D 3x3 stride 2 pad 1 (shorthand)", 1, 2, (7, 7), 3, (3, 3), strides=2, pads=1, layout=L)
        conv_case(b, "2-D asymmetric pads", 1, 2, (5, 6), 3, (3, 3), pads=[1, 0, 1, 2], layout=L)
        conv_case(b, "2-D asymmetric pads, stride 2", 1, 3, (7, 6), 2, (3, 2), strides=[2, 2], pads=[0, 1, 2, 0],
                  bias=False, layout=L)
        conv_case(b, "2-D dilations 2x1", 1, 2, (7, 6), 3, (3, 3), dilations=[2, 1], layout=L)
        conv_case(b, "2-D dilation 2 pad 2", 1, 2, (6, 6), 2, (3, 3), dilations=[2, 2], pads=[2, 2, 2, 2], layout=L)
        conv_case(b, "2-D groups 2", 1, 4, (5, 5), 6, (3, 3), groups=2, pads=[1, 1, 1, 1], layout=L)
        conv_case(b, "2-D groups 3, no bias", 2, 6, (4, 5), 3, (2, 2), groups=3, bias=False, layout=L)
        conv_case(b, "2-D depthwise", 1, 4, (6, 6), 4, (3, 3), groups=4, pads=[1, 1, 1, 1], layout=L)
        conv_case(b, "2-D depthwise multiplier 2, stride 2", 1, 3, (7, 7), 6, (3, 3), groups=3, strides=[2, 2],
                  layout=L)
        conv_case(b, "2-D 1x1", 2, 5, (3, 4), 3, (1, 1), layout=L)
        conv_case(b, "2-D 1x1 stride 2", 1, 3, (5, 5), 2, (1, 1), strides=[2, 2], bias=False, layout=L)
        conv_case(b, "2-D kernel as large as the image", 1, 2, (4, 3), 3, (4, 3), layout=L)
        conv_case(b, "2-D strides 2x3, non-square kernel", 1, 2, (8, 9), 3, (2, 4), strides=[2, 3], layout=L)
        conv_case(b, "2-D stride larger than kernel", 1, 2, (9, 9), 2, (2, 2), strides=[3, 4], layout=L)
        conv_case(b, "2-D everything", 2, 4, (9, 8), 6, (3, 2), groups=2, strides=[2, 1], pads=[2, 0, 1, 1],
                  dilations=[1, 2], layout=L)
        conv_case(b, "2-D pads larger than the kernel", 1, 1, (3, 3), 2, (2, 2), pads=[2, 3, 3, 2], layout=L)
        # 3-D
        conv_case(b, "3-D plain", 1, 2, (4, 4, 4), 2, (2, 2, 2), layout=L)
        conv_case(b, "3-D stride 2 pad 1", 1, 2, (5, 5, 5), 3, (3, 3, 3), strides=[2, 2, 2], pads=1, layout=L)
        conv_case(b, "3-D asymmetric pads, dilation", 1, 1, (5, 4, 5), 2, (2, 2, 3), pads=[1, 0, 0, 0, 1, 2],
                  dilations=[2, 1, 1], layout=L)
        conv_case(b, "3-D groups 2", 1, 4, (3, 4, 3), 2, (2, 3, 2), groups=2, bias=False, layout=L)


def conv_transpose_case(b, desc, n, c, size, o, k, groups=None, strides=None, pads=None, output_padding=None,
                        dilations=None, bias=True, layout=None):
    nd = len(size)
    g = groups or 1
    s, p, d = spatial(strides, nd, 1), spatial(pads, 2 * nd, 0), spatial(dilations, nd, 1)
    op = [0] * nd if output_padding is None else list(output_padding)
    nhwc = layout == "nhwc"
    x = b.rand(n, *size, c) if nhwc else b.rand(n, c, *size)
    w = b.rand(c, *k, o // g) if nhwc else b.rand(c, o // g, *k)
    bb = b.rand(o) if bias else None
    xt, wt = (to_nchw(T(x), nd), to_nchw(T(w), nd)) if nhwc else (T(x), T(w))
    # the ONNX definition: the full transposed convolution, output_padding zeros
    # appended at the end, then pads cropped from each side, then the bias
    full = CONVT[nd](xt, wt, None, stride=s, padding=0, output_padding=0, groups=g, dilation=d)
    full = F.pad(full, torch_pads([0] * nd + op, nd))
    index = [slice(None), slice(None)] + [slice(p[i], full.shape[2 + i] - p[i + nd]) for i in range(nd)]
    y = full[tuple(index)]
    if bb is not None:
        y = y + T(bb).reshape(-1, *[1] * nd)
    if p[:nd] == p[nd:] and all(op[i] < max(s[i], d[i]) for i in range(nd)):
        own = CONVT[nd](xt, wt, None if bb is None else T(bb), stride=s, padding=p[:nd], output_padding=op,
                        groups=g, dilation=d)
        assert torch.allclose(own, y), desc
    if nhwc:
        y = to_nhwc(y, nd)
    b.case(f"conv_transpose {desc}", "conv_transpose", [("x", x), ("w", w), ("b", bb)], y, strides=strides,
           pads=pads, output_padding=output_padding, dilations=dilations, groups=groups, layout=layout)


def gen_conv_transpose(b):
    for layout in (None, "nhwc"):
        L = layout
        conv_transpose_case(b, "1-D plain", 1, 2, (5,), 3, (3,), layout=L)
        conv_transpose_case(b, "1-D stride 2 pad 1 output_padding 1", 2, 3, (4,), 2, (3,), strides=[2], pads=[1, 1],
                            output_padding=[1], layout=L)
        conv_transpose_case(b, "1-D dilation 2 asymmetric pads", 1, 2, (5,), 2, (3,), dilations=[2], pads=[2, 0],
                            bias=False, layout=L)
        conv_transpose_case(b, "1-D groups 2 stride 3", 1, 4, (4,), 6, (2,), groups=2, strides=[3], layout=L)
        conv_transpose_case(b, "2-D plain", 1, 2, (3, 4), 3, (3, 3), layout=L)
        conv_transpose_case(b, "2-D stride 2", 1, 3, (4, 4), 2, (3, 3), strides=[2, 2], layout=L)
        conv_transpose_case(b, "2-D stride 2 pad 1 output_padding 1", 2, 2, (3, 4), 3, (3, 3), strides=[2, 2],
                            pads=[1, 1, 1, 1], output_padding=[1, 1], layout=L)
        conv_transpose_case(b, "2-D stride 2 kernel 2 (upsampling)", 1, 4, (4, 3), 2, (2, 2), strides=2,
                            bias=False, layout=L)
        conv_transpose_case(b, "2-D asymmetric pads", 1, 2, (4, 4), 3, (3, 3), strides=[2, 1], pads=[0, 1, 2, 0],
                            layout=L)
        conv_transpose_case(b, "2-D strides 3x2 output_padding 2x1", 1, 2, (3, 3), 2, (2, 3), strides=[3, 2],
                            output_padding=[2, 1], pads=[1, 0, 0, 1], layout=L)
        conv_transpose_case(b, "2-D dilations", 1, 2, (4, 3), 2, (3, 2), dilations=[2, 3], pads=[1, 1, 1, 1],
                            layout=L)
        conv_transpose_case(b, "2-D groups 2", 1, 4, (3, 3), 4, (3, 3), groups=2, strides=[2, 2], layout=L)
        conv_transpose_case(b, "2-D depthwise", 1, 3, (4, 4), 3, (3, 3), groups=3, pads=[1, 1, 1, 1], layout=L)
        conv_transpose_case(b, "2-D everything", 2, 4, (3, 4), 6, (3, 2), groups=2, strides=[2, 3],
                            pads=[1, 0, 2, 1], output_padding=[1, 2], dilations=[1, 2], layout=L)
        conv_transpose_case(b, "2-D output_padding past the stride, within the dilation", 1, 2, (3, 3), 2, (2, 2),
                            dilations=[3, 2], output_padding=[2, 1], layout=L)
        conv_transpose_case(b, "3-D plain", 1, 2, (3, 3, 3), 2, (2, 2, 2), layout=L)
        conv_transpose_case(b, "3-D stride 2 pads output_padding", 1, 2, (2, 3, 2), 3, (3, 3, 2),
                            strides=[2, 2, 2], pads=[1, 0, 1, 1, 1, 0], output_padding=[1, 0, 1], layout=L)
        conv_transpose_case(b, "3-D groups 2 dilation", 1, 2, (2, 3, 3), 4, (2, 2, 2), groups=2,
                            dilations=[1, 2, 1], bias=False, layout=L)


# ---- pooling ----


def pool_len(n, k, s, pb, pe, d, ceil):
    """Output length: ONNX's formula, with a ceil-mode window that would start inside
    the right padding dropped, as PyTorch does."""
    span = n + pb + pe - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + pb:
        out -= 1
    return out


def pool_general(kind, x, k, s, p, d, ceil, include_pad):
    """Pooling by the definition, for any pads: pad, pool without padding, keep the
    windows the spec keeps. x is a float64 nchw tensor."""
    nd = x.dim() - 2
    size = list(x.shape[2:])
    out = [pool_len(size[i], k[i], s[i], p[i], p[i + nd], d[i], ceil) for i in range(nd)]
    # room for ceil-mode windows that run past the padded input
    extra = [max(0, (out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - (size[i] + p[i] + p[i + nd])) for i in range(nd)]
    ends = [p[i + nd] + extra[i] for i in range(nd)]
    crop = (slice(None), slice(None)) + tuple(slice(0, o) for o in out)
    if kind == "max":
        xp = F.pad(x, torch_pads(p[:nd] + ends, nd), value=-INF)
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
        return pool(xp, k, stride=s, dilation=d)[crop]
    c = x.shape[1]
    ones = torch.ones(c, 1, *k, dtype=torch.float64)

    def window_sum(t):
        return CONV[nd](t, ones, stride=s, groups=c)[crop]

    sums = window_sum(F.pad(x, torch_pads(p[:nd] + ends, nd)))
    if include_pad:
        region = F.pad(torch.ones_like(x), torch_pads(p[:nd] + p[nd:], nd), value=1.0)
        count = window_sum(F.pad(region, torch_pads([0] * nd + extra, nd)))
    else:
        count = window_sum(F.pad(torch.ones_like(x), torch_pads(p[:nd] + ends, nd)))
    return sums / count


def pool_case(b, desc, kind, n, c, size, kernel, strides=None, pads=None, dilations=None, ceil_mode=None,
              count_include_pad=None, layout=None, x=None):
    nd = len(size)
    k, s = spatial(kernel, nd, 1), spatial(strides, nd, 1)
    p, d = spatial(pads, 2 * nd, 0), spatial(dilations, nd, 1)
    nhwc = layout == "nhwc"
    if x is None:
        x = b.rand(n, *size, c) if nhwc else b.rand(n, c, *size)
    xt = to_nchw(T(x), nd) if nhwc else T(x)
    ceil, incl = bool(ceil_mode), bool(count_include_pad)
    y = pool_general(kind, xt, k, s, p, d, ceil, incl)
    # torch's own padding, where torch accepts the pads (and avg_pool3d the input size)
    if p[:nd] == p[nd:] and all(p[i] <= k[i] // 2 for i in range(nd)):
        if kind == "max":
            own = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd](xt, k, stride=s, padding=p[:nd], dilation=d,
                                                                          ceil_mode=ceil)
        elif nd < 3 or all(size[i] >= k[i] for i in range(nd)):
            own = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd](xt, k, stride=s, padding=p[:nd],
                                                                          ceil_mode=ceil, count_include_pad=incl)
        else:
            own = y
        assert own.shape == y.shape and torch.allclose(own, y, equal_nan=True), desc
        y = own
    if nhwc:
        y = to_nhwc(y, nd)
    attrs = dict(kernel=kernel, strides=strides, pads=pads)
    if kind == "max":
        attrs.update(dilations=dilations, ceil_mode=ceil_mode)
    else:
        attrs.update(ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    b.case(f"{kind}_pool {desc}", f"{kind}_pool", [("x", x)], y, **attrs, layout=layout)


def gen_pool(b):
    for layout in (None, "nhwc"):
        L = layout
        for kind in ("max", "avg"):
            P = kind
            pool_case(b, "1-D k3", P, 1, 2, (7,), [3], layout=L)
            pool_case(b, "1-D k2 s2 pad 1", P, 2, 2, (7,), [2], strides=[2], pads=[1, 1], layout=L)
            pool_case(b, "1-D k3 s2 ceil keeps a partial window", P, 1, 2, (6,), [3], strides=[2], ceil_mode=True,
                      layout=L)
            pool_case(b, "2-D k2 s2", P, 1, 3, (6, 6), [2, 2], strides=[2, 2], layout=L)
            pool_case(b, "2-D k3 s1 pad 1 (shorthand)", P, 1, 2, (5, 5), 3, pads=1, layout=L)
            pool_case(b, "2-D k3 s2 pad 1", P, 2, 2, (7, 6), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], layout=L)
            pool_case(b, "2-D k2x3 s1x2", P, 1, 2, (5, 7), [2, 3], strides=[1, 2], layout=L)
            pool_case(b, "2-D ceil mode, last window partial", P, 1, 2, (5, 5), [2, 2], strides=[2, 2],
                      ceil_mode=True, layout=L)
            pool_case(b, "2-D ceil mode, same as floor", P, 1, 2, (6, 6), [2, 2], strides=[2, 2], ceil_mode=True,
                      layout=L)
            pool_case(b, "2-D ceil mode drops a window starting in the padding", P, 1, 2, (5, 8), [3, 3],
                      strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=True, layout=L)
            pool_case(b, "2-D ceil mode with pads, partial windows kept", P, 1, 2, (6, 7), [3, 2], strides=[2, 2],
                      pads=[1, 1, 1, 1], ceil_mode=True, layout=L)
            pool_case(b, "2-D asymmetric pads", P, 1, 2, (5, 6), [3, 3], strides=[2, 2], pads=[0, 1, 2, 1],
                      layout=L)
            pool_case(b, "2-D asymmetric pads, ceil mode", P, 1, 2, (6, 5), [3, 2], strides=[2, 2],
                      pads=[1, 0, 0, 1], ceil_mode=True, layout=L)
            pool_case(b, "2-D asymmetric pads, ceil mode dropping", P, 1, 1, (7, 4), [3, 2], strides=[3, 2],
                      pads=[2, 0, 0, 1], ceil_mode=True, layout=L)
            pool_case(b, "3-D k2 s2", P, 1, 2, (4, 4, 4), [2, 2, 2], strides=[2, 2, 2], layout=L)
            pool_case(b, "3-D k3 pad 1 ceil", P, 1, 1, (5, 4, 5), [3, 3, 3], strides=[2, 2, 2], pads=1,
                      ceil_mode=True, layout=L)
            pool_case(b, "3-D asymmetric pads", P, 1, 2, (3, 4, 3), [2, 2, 2], pads=[1, 0, 1, 0, 1, 0], layout=L)
        for incl in (True, False):
            pool_case(b, f"1-D pad 1 count_include_pad={incl}", "avg", 1, 2, (6,), [3], strides=[2], pads=[1, 1],
                      count_include_pad=incl, layout=L)
            pool_case(b, f"2-D pad 1 count_include_pad={incl}", "avg", 2, 2, (5, 5), [3, 3], pads=[1, 1, 1, 1],
                      count_include_pad=incl, layout=L)
            pool_case(b, f"2-D pad 1 ceil count_include_pad={incl}: windows past the padding", "avg", 1, 2, (6, 6),
                      [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True, count_include_pad=incl, layout=L)
            pool_case(b, f"2-D ceil no pads count_include_pad={incl}", "avg", 1, 2, (5, 7), [2, 3],
                      strides=[2, 2], ceil_mode=True, count_include_pad=incl, layout=L)
            pool_case(b, f"2-D asymmetric pads count_include_pad={incl}", "avg", 1, 2, (5, 6), [3, 3],
                      strides=[2, 2], pads=[0, 1, 2, 1], count_include_pad=incl, layout=L)
            pool_case(b, f"2-D asymmetric pads ceil count_include_pad={incl}", "avg", 1, 2, (6, 5), [3, 2],
                      strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=True, count_include_pad=incl, layout=L)
            pool_case(b, f"3-D pad 1 count_include_pad={incl}", "avg", 1, 2, (4, 3, 4), [2, 3, 2],
                      strides=[2, 1, 2], pads=1, ceil_mode=True, count_include_pad=incl, layout=L)
        pool_case(b, "1-D dilation 2", "max", 1, 2, (8,), [3], dilations=[2], layout=L)
        pool_case(b, "2-D dilations 2x1 stride 2", "max", 1, 2, (7, 6), [2, 3], strides=[2, 1], dilations=[2, 1],
                  layout=L)
        pool_case(b, "2-D dilation 2 pad 1 ceil", "max", 1, 2, (7, 7), [3, 3], strides=[2, 2], pads=1,
                  dilations=[2, 2], ceil_mode=True, layout=L)
        pool_case(b, "2-D dilation 2, asymmetric pads", "max", 1, 2, (6, 6), [2, 2], pads=[1, 0, 0, 1],
                  dilations=[2, 2], layout=L)
        pool_case(b, "3-D dilation", "max", 1, 1, (5, 4, 5), [2, 2, 2], dilations=[2, 1, 2], layout=L)
        neg = b.rand(1, 5, 5, 2, lo=-9, hi=-1) if L else b.rand(1, 2, 5, 5, lo=-9, hi=-1)
        pool_case(b, "2-D negative values with pads (padding is not 0)", "max", 1, 2, (5, 5), [3, 3],
                  strides=[2, 2], pads=[1, 1, 1, 1], layout=L, x=neg)
        neg = b.rand(1, 5, 5, 2, lo=-9, hi=-1) if L else b.rand(1, 2, 5, 5, lo=-9, hi=-1)
        pool_case(b, "2-D negative values, asymmetric pads", "max", 1, 2, (5, 5), [2, 2], pads=[1, 0, 0, 1],
                  layout=L, x=neg)
        pool_case(b, "2-D dilation 2, pads 2 (wider than torch allows)", "max", 1, 2, (6, 7), [3, 3],
                  strides=[2, 1], pads=2, dilations=[2, 2], layout=L)
        special = b.rand(1, 4, 4, 2) if L else b.rand(1, 2, 4, 4)
        special.flat[[0, 9, 18, 27]] = [NAN, INF, -INF, NAN]
        for kind in ("max", "avg"):
            pool_case(b, "2-D with nan and inf", kind, 1, 2, (4, 4), [2, 2], pads=[1, 1, 1, 1], layout=L,
                      x=special)

        for size in ((6,), (3, 5), (2, 3, 4)):
            nd = len(size)
            x = b.rand(2, *size, 3) if L else b.rand(2, 3, *size)
            xt = to_nchw(T(x), nd) if L else T(x)
            y = xt.mean(dim=tuple(range(2, nd + 2)), keepdim=True)
            b.case(f"global_avg_pool {size}", "global_avg_pool", [("x", x)], to_nhwc(y, nd) if L else y, layout=L)

        adaptive = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
        for size, out in (((6,), [3]), ((7,), [3]), ((5,), [5]), ((3,), [5]), ((6, 6), [2, 3]), ((7, 5), [3, 2]),
                          ((5, 7), [1, 1]), ((4, 4), [6, 3]), ((5, 4, 6), [2, 3, 4]), ((3, 5, 4), [2, 2, 3])):
            nd = len(size)
            x = b.rand(1, *size, 2) if L else b.rand(1, 2, *size)
            xt = to_nchw(T(x), nd) if L else T(x)
            y = adaptive[nd](xt, out)
            b.case(f"adaptive_avg_pool {size} -> {out}", "adaptive_avg_pool", [("x", x)],
                   to_nhwc(y, nd) if L else y, output_size=out, layout=L)


# ---- shape ops ----


def onnx_slice(x, starts, ends, axes, steps):
    r = x.ndim
    axes = list(range(len(starts))) if axes is None else [a + r if a < 0 else a for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        dim = x.shape[ax]
        st = st + dim if st < 0 else st
        en = en + dim if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
        else:
            st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
        x = np.take(x, np.arange(st, en, sp, dtype=np.int64), axis=ax)
    return x


def onnx_pad(x, pads, mode, value):
    """ONNX Pad: negative pads crop. Cropping first and padding first must agree, so
    that the case does not depend on which of the two an implementation does."""
    r = x.ndim
    width = [(max(0, pads[i]), max(0, pads[i + r])) for i in range(r)]

    def crop(a):
        return a[tuple(slice(max(0, -pads[i]), a.shape[i] - max(0, -pads[i + r])) for i in range(r))]

    def padded(a):
        if mode == "constant":
            return np.pad(a, width, mode="constant", constant_values=value)
        return np.pad(a, width, mode=mode)

    y = padded(crop(x))
    other = crop(padded(x))
    assert np.array_equal(y, other), pads
    return y


def gen_shape(b):
    x = b.rand(2, 3, 4)
    for shape in ([6, 4], [-1], [4, -1], [2, -1, 2], [1, 24, 1], [3, 2, 2, 2], [-1, 1]):
        b.case(f"reshape to {shape}", "reshape", [("x", x)], torch.reshape(T(x), shape), shape=shape)
    s = b.rand()
    b.case("reshape a scalar to [1, 1]", "reshape", [("x", s)], T(s).reshape(1, 1), shape=[1, 1])
    v = b.rand(1)
    b.case("reshape [1] to a scalar", "reshape", [("x", v)], T(v).reshape([]), shape=[])

    x = b.rand(2, 3, 4, 2)
    for axis in (None, 0, 1, 2, 3, 4, -1, -3):
        a = 1 if axis is None else axis if axis >= 0 else axis + 4
        lead = int(np.prod(x.shape[:a]))
        b.case(f"flatten axis={axis}", "flatten", [("x", x)], x.reshape(lead, -1), axis=axis)

    for shape, perm in (([2, 3], None), ([2, 3, 4], None), ([2, 3, 4], [0, 2, 1]), ([2, 3, 4], [2, 0, 1]),
                        ([2, 3, 4, 5], [0, 3, 1, 2]), ([2, 3, 4, 5], [0, 2, 3, 1]), ([2, 1, 3, 1, 2], [4, 2, 0, 3, 1]),
                        ([5], None), ([3, 4], [0, 1])):
        x = b.rand(*shape)
        y = np.transpose(x, perm)
        b.case(f"transpose {shape} perm={perm}", "transpose", [("x", x)], y, perm=perm)

    for shapes, axis in ((([2, 3], [4, 3]), 0), (([2, 3], [2, 1], [2, 4]), 1), (([2, 3], [2, 2]), -1),
                         (([1, 2, 3], [2, 2, 3], [3, 2, 3], [1, 2, 3]), 0), (([2, 2, 3], [2, 1, 3]), -2),
                         (([2, 3, 1], [2, 3, 2], [2, 3, 1]), -1), (([4], [3]), 0), (([2, 3], [2, 3]), -2)):
        xs = [b.rand(*s) for s in shapes]
        b.case(f"concat {len(xs)} inputs axis={axis}", "concat", [(f"x{i}", x) for i, x in enumerate(xs)],
               np.concatenate(xs, axis=axis), axis=axis)

    x = b.rand(5, 6, 4)
    slices = [
        ([1, 0, 0], [4, 6, 4], None, None), ([0], [3], [1], None), ([-3], [-1], [0], None),
        ([1, -2], [1000, 1000], [0, 2], None), ([-1000], [2], [1], None), ([0, 1], [5, 6], [0, 1], [2, 2]),
        ([4], [0], [0], [-1]), ([-1], [-1000], [0], [-1]), ([10], [-10], [1], [-2]),
        ([3, 2], [0, -5], [-1, 0], [-1, -2]),
        ([0], [6], [-2], [3]), ([2], [2147483647], [2], None), ([1, 1, 1], [2, 2, 2], None, None),
        ([5], [0], [1], [-1]), ([-2], [1000], [-3], [1]),
    ]
    for starts, ends, axes, steps in slices:
        b.case(f"slice starts={starts} ends={ends} axes={axes} steps={steps}", "slice", [("x", x)],
               onnx_slice(x, starts, ends, axes, steps), starts=starts, ends=ends, axes=axes, steps=steps)

    x = b.rand(3, 4)
    x3 = b.rand(2, 3, 4)
    pads = [
        (x, [1, 2, 0, 1], None, None), (x, [0, 0, 2, 2], "constant", 1.5), (x, [2, 1, 1, 3], "reflect", None),
        (x, [1, 2, 2, 1], "edge", None), (x, [-1, 0, 0, -2], None, None), (x, [-1, 2, 1, -1], "constant", -3.0),
        (x, [-1, 2, 1, -1], "edge", None), (x, [1, -1, -1, 2], "reflect", None),
        (x3, [0, 1, 1, 1, 0, 2], "reflect", None), (x3, [1, 0, 2, 0, 2, 1], "edge", None),
        (x3, [1, 1, 1, 1, 1, 1], None, 0.25), (x, [0, 0, 0, 0], "reflect", None),
        (x3, [0, -1, 0, 0, -1, -3], None, None),
    ]
    for arr, p, mode, value in pads:
        b.case(f"pad {list(arr.shape)} pads={p} mode={mode} value={value}", "pad", [("x", arr)],
               onnx_pad(arr, p, mode or "constant", 0.0 if value is None else value), pads=p, mode=mode, value=value)

    x = b.rand(1, 3, 1, 4, 1)
    for axes in (None, [0], [2, 4], [-1], [0, -3, 4]):
        y = np.squeeze(x, axis=None if axes is None else tuple(axes))
        b.case(f"squeeze axes={axes}", "squeeze", [("x", x)], y, axes=axes)
    x = b.rand(3, 4)
    for axes in ([0], [2], [-1], [0, 3], [-1, -4], [1, -2], [0, 1, 2]):
        out_rank = x.ndim + len(axes)
        shape = list(x.shape)
        for a in sorted(a % out_rank for a in axes):
            shape.insert(a, 1)
        b.case(f"unsqueeze axes={axes}", "unsqueeze", [("x", x)], x.reshape(shape), axes=axes)
    s = b.rand()
    b.case("unsqueeze a scalar", "unsqueeze", [("x", s)], s.reshape(1), axes=[0])
    for arr in (b.rand(2, 3), b.rand(), b.rand(1, 2, 3, 2)):
        b.case(f"identity {list(arr.shape)}", "identity", [("x", arr)], arr)


# ---- every dtype: comparisons, logic, where, cast, gather ----


def gen_logic(b):
    I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    f = b.rand(2, 3, 4)
    ties = np.where(b.rng.uniform(size=(2, 3, 4)) < 0.3, f, b.rand(2, 3, 4)).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, np.nan, 2.0], dtype=np.float32)
    other = np.array([np.nan, np.inf, np.inf, -0.0, 0.0, np.nan, 1.0, 2.0], dtype=np.float32)
    ints = b.rng.integers(-3, 4, size=(3, 4)).astype(np.int64)
    ints2 = b.rng.integers(-3, 4, size=(4,)).astype(np.int64)
    extremes = np.array([I64_MIN, I64_MAX, -1, 0, I64_MAX, I64_MIN + 1], dtype=np.int64)
    extremes2 = np.array([I64_MAX, I64_MAX - 1, 0, -1, I64_MAX, I64_MIN], dtype=np.int64)
    bools = b.rng.uniform(size=(3, 4)) < 0.5
    bools2 = b.rng.uniform(size=(1, 4)) < 0.5
    compare = {"equal": torch.eq, "less": torch.lt, "less_equal": torch.le, "greater": torch.gt,
               "greater_equal": torch.ge}
    for op, fn in compare.items():
        b.case(f"{op} f32 with ties", op, [("a", f), ("b", ties)], fn(T(f), T(ties)))
        b.case(f"{op} f32 broadcast", op, [("a", f), ("b", ties[0, :, :1])], fn(T(f), T(ties[0, :, :1])))
        b.case(f"{op} f32 NaN, inf and signed zeros", op, [("a", specials), ("b", other)],
               fn(T(specials), T(other)))
        b.case(f"{op} i64 broadcast", op, [("a", ints), ("b", ints2)],
               fn(torch.from_numpy(ints), torch.from_numpy(ints2)))
        b.case(f"{op} i64 extremes", op, [("a", extremes), ("b", extremes2)],
               fn(torch.from_numpy(extremes), torch.from_numpy(extremes2)))
        b.case(f"{op} i32", op, [("a", ints.astype(np.int32)), ("b", ints2.astype(np.int32))],
               fn(torch.from_numpy(ints.astype(np.int32)), torch.from_numpy(ints2.astype(np.int32))))
        b.case(f"{op} bool", op, [("a", bools), ("b", bools2)],
               fn(torch.from_numpy(bools), torch.from_numpy(bools2)))
    b.case("not", "not", [("x", bools)], torch.logical_not(torch.from_numpy(bools)))
    b.case("and broadcast", "and", [("a", bools), ("b", bools2)],
           torch.logical_and(torch.from_numpy(bools), torch.from_numpy(bools2)))
    b.case("or broadcast", "or", [("a", bools2), ("b", bools)],
           torch.logical_or(torch.from_numpy(bools2), torch.from_numpy(bools)))
    b.case("where f32", "where", [("c", bools), ("a", f[0]), ("b", ties[0])],
           torch.where(torch.from_numpy(bools), T(f[0]), T(ties[0])))
    b.case("where broadcast over all three", "where", [("c", bools2), ("a", f[:, :, :1]), ("b", ties[0, 0])],
           torch.where(torch.from_numpy(bools2), T(f[:, :, :1]), T(ties[0, 0])))
    b.case("where i64", "where", [("c", bools), ("a", ints), ("b", ints2)],
           torch.where(torch.from_numpy(bools), torch.from_numpy(ints), torch.from_numpy(ints2)))
    b.case("where bool", "where", [("c", bools), ("a", bools2), ("b", bools)],
           torch.where(torch.from_numpy(bools), torch.from_numpy(bools2), torch.from_numpy(bools)))
    b.case("where a scalar condition", "where", [("c", np.array(True)), ("a", f[0]), ("b", np.float32(-1))],
           torch.where(torch.tensor(True), T(f[0]), T(np.float32(-1))))
    # casts PyTorch defines: floats in range truncate toward zero
    fr = (b.rand(3, 5) * 1e3).astype(np.float32)
    for to, dt in (("i64", torch.int64), ("i32", torch.int32), ("bool", torch.bool), ("f32", torch.float32)):
        b.case(f"cast f32 to {to}", "cast", [("x", fr)], torch.from_numpy(fr).to(dt), to=to)
    b.case("cast f32 to bool: NaN, inf, signed zeros", "cast", [("x", specials)],
           torch.from_numpy(specials).to(torch.bool), to="bool")
    for to, dt in (("f32", torch.float32), ("i32", torch.int32), ("bool", torch.bool), ("i64", torch.int64)):
        b.case(f"cast i64 extremes to {to}", "cast", [("x", extremes)], torch.from_numpy(extremes).to(dt), to=to)
    b.case("cast i32 to i64", "cast", [("x", ints.astype(np.int32))],
           torch.from_numpy(ints.astype(np.int32)).to(torch.int64), to="i64")
    for to, dt in (("f32", torch.float32), ("i64", torch.int64), ("i32", torch.int32)):
        b.case(f"cast bool to {to}", "cast", [("x", bools)], torch.from_numpy(bools).to(dt), to=to)
    # where PyTorch's result is the CPU's, kiln saturates (docs/language.md): the rule itself
    wild = np.array([np.nan, np.inf, -np.inf, 3e19, -3e19, 3e9, -3e9, 2.5, -2.5], dtype=np.float32)
    for to, info in (("i64", np.iinfo(np.int64)), ("i32", np.iinfo(np.int32))):
        want = [0 if np.isnan(v) else info.max if v >= 2.0 ** (info.bits - 1) else
                info.min if v < -2.0 ** (info.bits - 1) else int(v) for v in wild.astype(np.float64)]
        b.case(f"cast f32 to {to} saturates, NaN to 0", "cast", [("x", wild)],
               np.array(want, dtype=info.dtype), to=to)
    # gather is numpy's take (ONNX Gather), negative indices counting from the end
    x = b.rand(4, 5, 3)
    for axis in (0, 1, 2, -1):
        dim = x.shape[axis]
        idx = b.rng.integers(-dim, dim, size=(2, 3)).astype(np.int64)
        b.case(f"gather axis {axis}, 2-D i64 indices", "gather", [("x", x), ("i", idx)],
               np.take(x, idx, axis=axis), axis=axis)
    idx = np.array([3, -4, 0, 3], dtype=np.int32)
    b.case("gather i32 indices, repeated", "gather", [("x", x), ("i", idx)], np.take(x, idx, axis=0), axis=0)
    b.case("gather a scalar index", "gather", [("x", x), ("i", np.array(-1, dtype=np.int64))],
           np.take(x, np.int64(-1), axis=1), axis=1)
    table = b.rng.integers(I64_MIN, I64_MAX, size=(6, 2), dtype=np.int64)
    ids = np.array([[5, 0, 2], [1, -1, -4]], dtype=np.int64)
    b.case("gather an i64 table (an embedding of ids)", "gather", [("x", table), ("i", ids)],
           np.take(table, ids, axis=0), axis=0)
    # gather_elements is torch.gather (ONNX GatherElements): the indices' shape, no dim
    # but axis larger than x's; negative indices count from the end (torch takes none)
    for axis, shape in ((0, (6, 5, 3)), (1, (4, 2, 3)), (2, (3, 5, 7)), (-1, (4, 1, 2)), (-3, (1, 1, 1))):
        dim = x.shape[axis]
        idx = b.rng.integers(-dim, dim, size=shape).astype(np.int64)
        b.case(f"gather_elements axis {axis}, indices {list(shape)}", "gather_elements", [("x", x), ("i", idx)],
               torch.gather(T(x), axis, torch.from_numpy(idx % dim)), axis=axis)
    idx = np.array([[3, -4, 0], [0, -1, 2]], dtype=np.int32)
    b.case("gather_elements i32 indices, repeated", "gather_elements", [("x", x[:, :, 0]), ("i", idx)],
           torch.gather(T(x[:, :, 0]), 0, torch.from_numpy(idx.astype(np.int64) % 4)), axis=0)
    b.case("gather_elements an i64 table", "gather_elements", [("x", table), ("i", ids[:, :2])],
           torch.gather(torch.from_numpy(table), 0, torch.from_numpy(ids[:, :2] % 6)), axis=0)
    b.case("gather_elements bools", "gather_elements", [("x", bools), ("i", ids % 3)],
           torch.gather(torch.from_numpy(bools), 1, torch.from_numpy(ids % 3)), axis=1)
    # the ops that move data take every dtype
    b.case("reshape i64", "reshape", [("x", ints)], ints.reshape(2, 6), shape=[2, -1])
    b.case("transpose bool", "transpose", [("x", bools)], bools.T, perm=[1, 0])
    b.case("concat i32", "concat", [("a", ints.astype(np.int32)), ("b", ints[:1].astype(np.int32))],
           np.concatenate([ints, ints[:1]]).astype(np.int32), axis=0)
    b.case("slice i64 backward", "slice", [("x", extremes)], extremes[::-2], starts=[-1], ends=[-9223372036854775807],
           steps=[-2])
    b.case("expand bool", "expand", [("x", bools2)], np.broadcast_to(bools2, (2, 3, 4)), shape=[2, 3, 4])
    b.case("unsqueeze i64", "unsqueeze", [("x", ints2)], ints2.reshape(1, 4), axes=[0])
    b.case("flatten bool", "flatten", [("x", bools.reshape(3, 2, 2))], bools.reshape(3, 4), axis=1)
    # argmax (torch.argmax: the first of ties, NaN the largest) and cumsum (ONNX CumSum)
    ties = np.array([[1, 3, 3, -1], [np.nan, 2, np.nan, 5], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    for axis, keep in ((0, False), (1, True), (-1, False)):
        b.case(f"argmax axis={axis} keepdims={keep}", "argmax", [("x", ties)],
               torch.argmax(T(ties), dim=axis, keepdim=keep), axis=axis, keepdims=keep)
    b.case("argmax 3-D", "argmax", [("x", x)], torch.argmax(T(x), dim=1), axis=1)
    for axis, exclusive, reverse in ((0, False, False), (1, True, False), (-1, False, True), (2, True, True)):
        def onnx_cumsum(v, axis=axis, exclusive=exclusive, reverse=reverse):
            v = np.flip(v, axis) if reverse else v
            s = np.cumsum(v, axis=axis, dtype=v.dtype)
            if exclusive:
                s = s - v
            return np.flip(s, axis) if reverse else s
        b.case(f"cumsum f32 axis={axis} exclusive={exclusive} reverse={reverse}", "cumsum", [("x", x)],
               onnx_cumsum(x.astype(np.float64)), axis=axis, exclusive=exclusive, reverse=reverse)
        b.case(f"cumsum i64 axis={axis % 2} exclusive={exclusive} reverse={reverse}", "cumsum", [("x", ints)],
               onnx_cumsum(ints, axis % 2), axis=axis % 2, exclusive=exclusive, reverse=reverse)
    b.case("cumsum i32 (position ids from a mask)", "cumsum", [("x", bools.astype(np.int32))],
           np.cumsum(bools.astype(np.int32), axis=1, dtype=np.int32), axis=1)
    b.case("gather bools", "gather", [("x", bools), ("i", ids[1])], np.take(bools, ids[1] % 4, axis=-1), axis=-1)
    # argmax with select_last (ONNX's select_last_index): ONNX's reference flips the axis
    for axis, keep in ((0, False), (1, True)):
        first = torch.argmax(T(np.flip(ties, axis).copy()), dim=axis, keepdim=keep)
        b.case(f"argmax select_last axis={axis} keepdims={keep}", "argmax", [("x", ties)],
               ties.shape[axis] - 1 - first, axis=axis, keepdims=keep, select_last=True)

    # integer arithmetic wraps around (two's complement); a division truncates toward
    # zero, by zero gives 0 and INT_MIN / -1 wraps to INT_MIN (numpy wraps the others)
    def int_div(a, c, dtype):
        """Truncating division as kiln defines it, wrapped to dtype."""
        bits = np.iinfo(dtype).bits
        out = []
        for x, y in zip(a.tolist(), c.tolist()):
            q = 0 if y == 0 else abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            out.append((q + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1))
        return np.array(out, dtype=dtype)

    with np.errstate(over="ignore"):
        for op, fn in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply)):
            b.case(f"{op} i64 extremes wrap", op, [("a", extremes), ("b", extremes2)], fn(extremes, extremes2))
            b.case(f"{op} i64 broadcast", op, [("a", ints), ("b", ints2)], fn(ints, ints2))
            b.case(f"{op} i32 extremes wrap", op, [("a", extremes.astype(np.int32)), ("b", extremes2.astype(np.int32))],
                   fn(extremes.astype(np.int32), extremes2.astype(np.int32)))
        b.case("neg i64 extremes", "neg", [("x", extremes)], -extremes)
        b.case("abs i64 extremes", "abs", [("x", extremes)], np.abs(extremes))
    for op, fn in (("max", np.maximum), ("min", np.minimum)):
        b.case(f"{op} i64 broadcast", op, [("a", ints), ("b", ints2)], fn(ints, ints2))
    den = np.array([2, 2, -2, -2, 3, -1, 0, 0], dtype=np.int64)
    for dtype in (np.int64, np.int32):
        low = np.iinfo(dtype).min
        num = np.array([7, -7, 7, -7, 0, low, low, 5], dtype=dtype)
        b.case(f"div {np.dtype(dtype).name}: truncation, by -1, by zero", "div",
               [("a", num), ("b", den.astype(dtype))], int_div(num, den.astype(dtype), dtype))

    # the random ops on Philox4x32-10 (tests/ref/philox.py): keys with every half of
    # the seed and offset set, counts not a multiple of 4
    keys = {"zero": (0, 0), "wide": (0x299F31D0A4093822, 0x0370734413198A2E), "negative": (-1, 2**40 + 5),
            "step": (42, 3)}

    def key(k):
        return np.array(keys[k], dtype=np.int64)

    for k, shape in (("zero", [2, 4]), ("wide", [3, 5, 7]), ("negative", [37]), ("step", [1])):
        b.case(f"uniform, key {k} {shape}", "uniform", [("key", key(k))], philox.uniform(*keys[k], shape),
               shape=shape)

    def dropped(x, k, p):
        x = np.asarray(x, dtype=np.float32)
        scale = np.where(philox.keep_mask(*keys[k], x.shape, p), philox.dropout_scale(p), np.float32(0))
        return x * scale.astype(np.float32)  # float32 product: x * s or a signed 0 (NaN for inf, NaN)

    xd = b.rand(4, 33)
    for k, p in (("step", 0.5), ("wide", 0.1), ("negative", 0.0), ("zero", 0.9999999)):
        b.case(f"dropout p={p}, key {k}", "dropout", [("x", xd), ("key", key(k))], dropped(xd, k, p), p=p)
    b.case("dropout, the default p (0.5)", "dropout", [("x", xd[0]), ("key", key("wide"))], dropped(xd[0], "wide", 0.5))
    wild_x = np.tile(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 1e-45, 3e38], dtype=np.float32), 4)
    with np.errstate(invalid="ignore", over="ignore"):
        b.case("dropout of NaN, inf, signed zeros, a denormal, near the largest", "dropout",
               [("x", wild_x), ("key", key("step"))], dropped(wild_x, "step", 0.3), p=0.3)


def gen_attention(b):
    """attention against softmax(q k^T scale + mask) v in float64 (torch 1.13 has no
    scaled_dot_product_attention; this is its definition): shapes below and above the
    C kernel's blocks of rows and 64 keys, masks of both kinds broadcast, causal
    masks with L < S and L = S, rows masked everywhere (NaN, as softmax over nothing),
    NaN in q, a last block of rows shorter than the others."""

    def ref(q, k, v, mask=None, is_causal=False, scale=None):
        q, k, v = T(q), T(k), T(v)
        s = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        if mask is not None and mask.dtype == np.bool_:
            s = s.masked_fill(~torch.from_numpy(mask), -math.inf)
        elif mask is not None:
            s = s + T(mask)
        if is_causal:
            rows, cols = s.shape[-2:]
            s = s.masked_fill(~torch.ones(rows, cols, dtype=torch.bool).tril(), -math.inf)
        return torch.softmax(s, dim=-1) @ v

    def case(desc, q, k, v, mask=None, **attrs):
        args = [("q", q), ("k", k), ("v", v)] + ([("mask", mask)] if mask is not None else [])
        b.case(desc, "attention", args, ref(q, k, v, mask, **attrs), **attrs)

    case("rank 4, one block of rows, two of keys (the last partial)", b.rand(2, 3, 16, 8), b.rand(2, 3, 70, 8),
         b.rand(2, 3, 70, 6))
    additive = np.where(b.rng.uniform(size=(2, 1, 1, 70)) < 0.3, -1e4, 0).astype(np.float32)
    case("f32 mask broadcast over heads and rows (BERT's padding)", b.rand(2, 3, 20, 8), b.rand(2, 3, 70, 8),
         b.rand(2, 3, 70, 6), additive)
    keep = b.rng.uniform(size=(20, 70)) < 0.7
    keep[3] = False
    case("bool mask broadcast over the batch, one row masked everywhere", b.rand(2, 20, 8), b.rand(2, 70, 8),
         b.rand(2, 70, 5), keep)
    case("causal, L = S = 33", b.rand(1, 2, 33, 16), b.rand(1, 2, 33, 16), b.rand(1, 2, 33, 16), is_causal=True)
    case("causal, L < S, an explicit scale", b.rand(3, 5, 4), b.rand(3, 9, 4), b.rand(3, 9, 7), is_causal=True,
         scale=0.25)
    case("rank 2, S = 130 (three blocks)", b.rand(7, 16), b.rand(130, 16), b.rand(130, 3))
    wide = b.rand(4, 32, 128, lo=-3, hi=3)
    wide[1, 5] = -np.inf
    wide[2, 7, ::2] = -np.inf
    case("f32 mask of the scores' shape with -inf, a row of it everywhere; S = 128", b.rand(4, 32, 16),
         b.rand(4, 128, 16), b.rand(4, 128, 16), wide)
    q = b.rand(2, 16, 8)
    q[1, 4, 2] = np.nan
    case("NaN in q: its row NaN", q, b.rand(2, 24, 8), b.rand(2, 24, 8))
    case("rank 5, scale 1", b.rand(2, 1, 2, 8, 4), b.rand(2, 1, 2, 3, 4), b.rand(2, 1, 2, 3, 2), scale=1.0)
    case("L = 100: blocks of rows with a shorter last; S = 64 in lanes; causal", b.rand(2, 100, 8),
         b.rand(2, 64, 8), b.rand(2, 64, 5), is_causal=True)
    case("L = 150, S = 32: a shorter last block of rows, keys in two groups of lanes", b.rand(1, 150, 16),
         b.rand(1, 32, 16), b.rand(1, 32, 16))
    keep = b.rng.uniform(size=(40, 64)) < 0.6
    keep[0] = False
    case("bool mask in register tiles, a row masked everywhere: L = 40, S = 64, Ev = 32", b.rand(2, 40, 8),
         b.rand(2, 64, 8), b.rand(2, 64, 32), keep)
    case("causal in register tiles, L = S = 128", b.rand(1, 128, 8), b.rand(1, 128, 8), b.rand(1, 128, 16),
         is_causal=True)


BATTERIES = {
    "unary": gen_unary, "binary": gen_binary, "reduce": gen_reduce, "softmax": gen_softmax, "norm": gen_norm,
    "linalg": gen_linalg, "conv": gen_conv, "conv_transpose": gen_conv_transpose, "pool": gen_pool,
    "shape": gen_shape, "fused": gen_fused, "logic": gen_logic, "attention": gen_attention,
}


def main(argv):
    names = argv[1:] or list(BATTERIES)
    for name in names:
        b = Battery(name, zlib.crc32(name.encode()))
        BATTERIES[name](b)
        b.write()
        print(f"{name}: {len(b.expected)} cases")


if __name__ == "__main__":
    main(sys.argv)
