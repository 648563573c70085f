#!/usr/bin/python3
"""Generates the gradient battery `grad` for kiln's autodiff (see gen_reference.py for
the battery format).

Each case applies one op to params, weights its result with a random tensor r (so
the incoming gradient is not all ones) and sums it to the scalar loss, then asks
`grad(loss, inputs...)`:

    cK_f = op(cK_x, ..., attrs)        cK_l = sum(mul(cK_f, cK_r))
    cK_gx, ... = grad(cK_l, cK_x, ...)

The expected gradients are PyTorch's autograd in float64 on the same float32
inputs. Where the op is smooth at every input, the script also checks them against
central finite differences in float64 and stops if they disagree; at the kinks
(relu at 0, clip at its bounds, ties of max and min, hardswish at -3 and 3, ties and
NaN in reduce_max) PyTorch's conventions are the reference. The torch side of pad
is F.pad where it takes the pads, and elsewhere a gather (index_select) that the
script checks against F.pad where both apply; that of slice, which may step
backwards, index_select; that of a fused op, the ops it stands for.
tests/unit/test_reference.c (the interpreter) and test_target_c.c (the C target) run
the battery like any other.

    /usr/bin/python3 tests/ref/gen_grad.py
"""
import os
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_reference import Battery, T, fmt  # noqa: E402


def finite_difference(fn, xs, k, eps=1e-6):
    """d sum(fn(xs) * r) / d xs[k] by central differences (fn already includes r)."""
    x = xs[k].detach().clone()
    g = torch.zeros_like(x)
    flat, gflat = x.view(-1), g.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + eps
        hi = fn(*[x if j == k else xs[j] for j in range(len(xs))]).item()
        flat[i] = old - eps
        lo = fn(*[x if j == k else xs[j] for j in range(len(xs))]).item()
        flat[i] = old
        gflat[i] = (hi - lo) / (2 * eps)
    return g


class GradBattery(Battery):
    def loss(self, k, op, names, shape, attrs):
        """The lines `cK_f = op(names, attrs)`, `cK_l = sum(mul(cK_f, cK_r))` with a
        random weight cK_r of the given shape, which it returns."""
        r = self.rand(*shape)
        self.inputs[f"c{k}_r"] = r
        self.lines.append(f"param c{k}_r : f32{list(r.shape)}")
        attr_text = "".join(f", {key}={fmt(v)}" for key, v in attrs.items() if v is not None)
        self.lines.append(f"c{k}_f = {op}({', '.join(names)}{attr_text})")
        self.lines.append(f"c{k}_p = mul(c{k}_f, c{k}_r)")
        self.lines.append(f"c{k}_l = sum(c{k}_p)")
        return r

    def grad_case(self, desc, op, args, fn, smooth=True, fixed=(), **attrs):
        """args: (suffix, float32 array) pairs, all differentiated, or (suffix, None)
        for an absent optional input (`_`, not passed to fn); fixed: (suffix, int64
        array) inputs after them that are not (fn closes over them); fn: the op in
        torch."""
        k = self.n_cases = getattr(self, "n_cases", 0) + 1
        self.lines.append(f"# {desc}")
        names = []
        for suffix, arr in args:
            if arr is None:
                names.append("_")
                continue
            name = f"c{k}_{suffix}"
            self.lines.append(f"param {name} : f32{list(arr.shape)}")
            self.inputs[name] = np.asarray(arr, dtype=np.float32)
            names.append(name)
        for suffix, arr in fixed:
            name = f"c{k}_{suffix}"
            self.lines.append(f"param {name} : i64{list(arr.shape)}")
            self.inputs[name] = np.asarray(arr, dtype=np.int64)
            names.append(name)
        args = [(suffix, arr) for suffix, arr in args if arr is not None]
        xs = [T(arr).requires_grad_(True) for _, arr in args]
        y = fn(*xs)
        r = self.loss(k, op, names, y.shape, attrs)
        grads = [f"c{k}_g{suffix}" for suffix, _ in args]
        wrt = [n for n in names[:len(names) - len(fixed)] if n != "_"]
        self.lines.append(f"{', '.join(grads)} = grad(c{k}_l, {', '.join(wrt)})")

        def loss(*v):
            return (fn(*v) * T(r)).sum()

        got = torch.autograd.grad(loss(*xs), xs, allow_unused=True)
        for j, (name, g) in enumerate(zip(grads, got)):
            g = torch.zeros_like(xs[j]) if g is None else g
            if smooth:
                fd = finite_difference(loss, [x.detach() for x in xs], j)
                if not torch.allclose(g, fd, rtol=1e-5, atol=1e-5):
                    sys.exit(f"{desc}: autograd and finite differences disagree for {name}:\n{g}\n{fd}")
            self.expected[name] = g.detach().numpy().astype(np.float32)


def away_from(b, shape, kinks, lo=-4.0, hi=4.0, margin=0.05):
    """Random values at least `margin` from every kink (for finite differences)."""
    x = b.rand(*shape, lo=lo, hi=hi)
    for kink in kinks:
        x = np.where(np.abs(x - kink) < margin, x + 2 * margin, x)
    return x.astype(np.float32)


def gen(b):
    # unary ops, smooth points
    unary = {
        "relu": (torch.relu, [0.0], {}), "sigmoid": (torch.sigmoid, [], {}), "tanh": (torch.tanh, [], {}),
        "exp": (torch.exp, [], {}), "neg": (torch.neg, [], {}), "abs": (torch.abs, [0.0], {}),
        "erf": (torch.erf, [], {}), "hardswish": (F.hardswish, [-3.0, 3.0], {}),
        "gelu": (F.gelu, [], {}),
    }
    for name, (fn, kinks, attrs) in unary.items():
        for shape in ((3, 4), (2, 3, 5)):
            b.grad_case(f"{name} {shape}", name, [("x", away_from(b, shape, kinks))], fn, **attrs)
    for name, fn in (("log", torch.log), ("sqrt", torch.sqrt)):
        b.grad_case(f"{name} of positive values", name, [("x", b.rand(3, 4, lo=0.2, hi=4))], fn)
    # the trigonometric and hyperbolic functions inside their domains, away from tan's
    # poles; floor, ceil, round and sign (derivative 0) away from their steps
    for name, lo, hi in (("sin", -4, 4), ("cos", -4, 4), ("tan", -1.2, 1.2), ("asin", -0.9, 0.9),
                         ("acos", -0.9, 0.9), ("atan", -4, 4), ("sinh", -3, 3), ("cosh", -3, 3),
                         ("asinh", -4, 4), ("acosh", 1.1, 4), ("atanh", -0.9, 0.9)):
        b.grad_case(f"{name} ({lo}, {hi})", name, [("x", b.rand(3, 4, lo=lo, hi=hi))], getattr(torch, name))
    steps = [float(k) for k in range(-4, 5)]
    for name, kinks in (("floor", steps), ("ceil", steps), ("round", [k + 0.5 for k in steps]), ("sign", [0.0])):
        b.grad_case(f"{name} away from its steps", name, [("x", away_from(b, (3, 4), kinks, lo=-4, hi=4))],
                    getattr(torch, name))
    b.grad_case("gelu tanh", "gelu", [("x", away_from(b, (3, 4), []))],
                lambda x: F.gelu(x, approximate="tanh"), approximate="tanh")
    for alpha in (None, 0.2):
        b.grad_case(f"leaky_relu alpha={alpha}", "leaky_relu", [("x", away_from(b, (3, 4), [0.0]))],
                    lambda x, a=alpha: F.leaky_relu(x, 0.01 if a is None else a), alpha=alpha)
    b.grad_case("clip [-1, 1]", "clip", [("x", away_from(b, (3, 4), [-1.0, 1.0]))],
                lambda x: torch.clamp(x, -1.0, 1.0), min=-1.0, max=1.0)
    for alpha, beta in ((None, None), (1 / 6, 0.5)):
        a, c = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        kinks = [-c / a, (1 - c) / a]
        b.grad_case(f"hardsigmoid alpha={alpha} beta={beta}", "hardsigmoid",
                    [("x", away_from(b, (3, 4), kinks, lo=-6, hi=6))],
                    lambda x, a=a, c=c: torch.clamp(a * x + c, 0.0, 1.0), alpha=alpha, beta=beta)

    # unary ops at their kinks: PyTorch's conventions
    kinks = np.array([-3.0, -1.0, 0.0, -0.0, 1.0, 3.0, 0.5, -2.0], dtype=np.float32)
    # hardswish' at 3 is 1.5 in PyTorch's scalar kernel and 1 in its vectorized float64
    # one; kiln takes 1.5, and the battery leaves the point out
    b.grad_case("hardswish at -3", "hardswish", [("x", np.where(kinks == 3.0, 2.0, kinks).astype(np.float32))],
                F.hardswish, smooth=False)
    for name, fn, attrs in (("relu", torch.relu, {}), ("abs", torch.abs, {}),
                            ("leaky_relu", lambda x: F.leaky_relu(x, 0.01), {}),
                            ("clip", lambda x: torch.clamp(x, -1.0, 1.0), {"min": -1.0, "max": 1.0})):
        b.grad_case(f"{name} at its kinks", name, [("x", kinks)], fn, smooth=False, **attrs)

    # binary ops with broadcasting
    pairs = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 1, 4), (3, 1)), ((), (3, 4)),
             ((3, 1), (1, 4))]
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "max": torch.maximum, "min": torch.minimum}
    for name, fn in binary.items():
        for sa, sb in pairs:
            x, y = b.rand(*sa), b.rand(*sb)
            if name == "div":
                y = np.where(np.abs(y) < 0.3, np.float32(0.7), y).astype(np.float32)
            b.grad_case(f"{name} {sa} {sb}", name, [("a", x), ("b", y)], fn)
    x, y = b.rand(3, 4, lo=0.3, hi=3), b.rand(3, 4, lo=-2, hi=2)
    b.grad_case("pow of positive bases", "pow", [("a", x), ("b", y)], torch.pow)
    b.grad_case("pow broadcast exponent", "pow", [("a", b.rand(2, 3, lo=0.3, hi=3)), ("b", b.rand(3, lo=0.5, hi=2))],
                torch.pow)
    ties = np.array([1.0, 2.0, -1.0, 0.5], dtype=np.float32)
    for name, fn in (("max", torch.maximum), ("min", torch.minimum)):
        b.grad_case(f"{name} with ties", name, [("a", ties), ("b", np.array([1.0, 1.0, -1.0, 2.0], np.float32))],
                    fn, smooth=False)

    # reductions and softmax
    x = b.rand(2, 3, 4)
    for name, fn in (("sum", torch.sum), ("mean", torch.mean)):
        b.grad_case(f"{name} over everything", name, [("x", x)], fn)
        for axes, keep in (([1], False), ([0, 2], True), ([-1], False), ([0, 1, 2], True)):
            b.grad_case(f"{name} axes={axes} keepdims={keep}", name, [("x", x)],
                        lambda v, f=fn, a=axes, kd=keep: f(v, dim=a, keepdim=kd), axes=axes, keepdims=keep)
    for name, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
        for axis in (None, 0, 1):
            b.grad_case(f"{name} axis={axis}", name, [("x", b.rand(3, 5))],
                        lambda v, f=fn, a=axis: f(v, dim=-1 if a is None else a), axis=axis)

    # linear algebra
    for sa, sb in (((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                   ((2, 1, 3, 4), (3, 4, 2)), ((5, 4), (2, 4, 3))):
        b.grad_case(f"matmul {sa} {sb}", "matmul", [("a", b.rand(*sa)), ("b", b.rand(*sb))], torch.matmul)
    for ta in (False, True):
        for tb in (False, True):
            a = b.rand(4, 3) if ta else b.rand(3, 4)
            w = b.rand(5, 4) if tb else b.rand(4, 5)
            for cshape, alpha, beta in (((5,), 1.0, 1.0), ((3, 5), 0.5, 2.0), ((), 1.5, -1.0)):
                c = b.rand(*cshape)

                def gemm(x, y, z, ta=ta, tb=tb, alpha=alpha, beta=beta):
                    return alpha * (x.T if ta else x) @ (y.T if tb else y) + beta * z

                b.grad_case(f"gemm trans_a={ta} trans_b={tb} c={cshape} alpha={alpha} beta={beta}", "gemm",
                            [("a", a), ("b", w), ("c", c)], gemm, alpha=alpha if alpha != 1 else None,
                            beta=beta if beta != 1 else None, trans_a=ta or None, trans_b=tb or None)
    for xs in ((4,), (3, 4), (2, 3, 4)):
        b.grad_case(f"linear x={xs}", "linear", [("x", b.rand(*xs)), ("w", b.rand(5, 4)), ("b", b.rand(5))],
                    F.linear)
    b.grad_case("linear without bias", "linear", [("x", b.rand(3, 4)), ("w", b.rand(2, 4))], F.linear)

    # shape ops
    x = b.rand(2, 3, 4)
    b.grad_case("reshape", "reshape", [("x", x)], lambda v: v.reshape(4, 6), shape=[4, -1])
    b.grad_case("flatten", "flatten", [("x", x)], lambda v: v.reshape(2, 12))
    b.grad_case("transpose", "transpose", [("x", x)], lambda v: v.permute(1, 2, 0), perm=[1, 2, 0])
    b.grad_case("transpose reversed", "transpose", [("x", x)], lambda v: v.permute(2, 1, 0))
    b.grad_case("squeeze", "squeeze", [("x", b.rand(2, 1, 3))], lambda v: v.squeeze(1), axes=[1])
    b.grad_case("unsqueeze", "unsqueeze", [("x", b.rand(2, 3))], lambda v: v.unsqueeze(0), axes=[0])
    b.grad_case("identity", "identity", [("x", b.rand(2, 3))], lambda v: v)
    b.grad_case("concat axis 1", "concat", [("a", b.rand(2, 3)), ("b", b.rand(2, 1)), ("c", b.rand(2, 2))],
                lambda *v: torch.cat(v, 1), axis=1)
    b.grad_case("expand", "expand", [("x", b.rand(3, 1))], lambda v: v.expand(2, 3, 4), shape=[2, 3, 4])
    b.grad_case("global_avg_pool", "global_avg_pool", [("x", b.rand(2, 3, 4, 5))],
                lambda v: v.mean(dim=(2, 3), keepdim=True))


def torch_pad(x, pads, value=0.0):
    """kiln's pads [b0, b1, ..., e0, e1, ...] over the spatial dims (from dim 2) as F.pad."""
    ns = len(pads) // 2
    widths = []
    for k in reversed(range(ns)):
        widths += [pads[k], pads[ns + k]]
    return F.pad(x, widths, value=value)


def nhwc(fn):
    """fn on nchw tensors, applied to channels-last ones (x and a conv weight alike)."""
    def to_first(t):
        return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))

    def to_last(t):
        return t.permute(0, *range(2, t.dim()), 1)

    return lambda *v: to_last(fn(*[to_first(t) if t.dim() > 2 else t for t in v]))


def gen_nn(b):
    convs = [  # (x shape, w shape, strides, pads, dilations, groups)
        ((1, 3, 6, 6), (4, 3, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ((2, 4, 7, 5), (6, 2, 3, 2), [2, 1], [0, 1, 1, 0], [1, 1], 2),
        ((1, 4, 8, 8), (4, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 4),
        ((1, 2, 9, 9), (3, 2, 3, 3), [2, 3], [2, 0, 1, 2], [2, 1], 1),
        ((2, 3, 10), (2, 3, 4), [3], [1, 2], [1], 1),
        ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), [1, 2, 1], [0, 1, 1, 1, 0, 0], [1, 1, 2], 1),
        ((1, 8, 5, 5), (8, 8, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),
    ]
    for xs, ws, st, pd, dl, gr in convs:
        for bias in (True, False):
            x, w = b.rand(*xs), b.rand(*ws)
            args = [("x", x), ("w", w)] + ([("b", b.rand(ws[0]))] if bias else [])

            def conv(x, w, bb=None, st=st, pd=pd, dl=dl, gr=gr):
                f = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
                return f(torch_pad(x, pd), w, bb, stride=st, dilation=dl, groups=gr)

            b.grad_case(f"conv x={xs} w={ws} strides={st} pads={pd} dilations={dl} groups={gr} bias={bias}",
                        "conv", args, conv, strides=st, pads=pd, dilations=dl, groups=gr if gr > 1 else None)
    for xs, ws, st, pd, dl, gr in convs[:3]:
        x, w = b.rand(*xs), b.rand(*ws)
        xl, wl = np.moveaxis(x, 1, -1).copy(), np.moveaxis(w, 1, -1).copy()

        def conv(x, w, bb, st=st, pd=pd, dl=dl, gr=gr):
            return F.conv2d(torch_pad(x, pd), w, bb, stride=st, dilation=dl, groups=gr)

        b.grad_case(f"conv nhwc x={xs} w={ws} groups={gr}", "conv",
                    [("x", xl), ("w", wl), ("b", b.rand(ws[0]))], nhwc(conv), strides=st, pads=pd, dilations=dl,
                    groups=gr if gr > 1 else None, layout="nhwc")
    transposes = [  # (x shape, w shape [C, O/g, k...], strides, pads, output_padding, dilations, groups)
        ((1, 3, 4, 4), (3, 2, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], [1, 1], 1),
        ((2, 4, 3, 5), (4, 3, 2, 3), [1, 2], [0, 1, 0, 1], [0, 1], [2, 1], 2),
        ((1, 2, 6), (2, 3, 3), [3], [1, 1], [2], [1], 1),
    ]
    for xs, ws, st, pd, op, dl, gr in transposes:
        x, w, bb = b.rand(*xs), b.rand(*ws), b.rand(ws[1] * gr)

        def convt(x, w, bb, st=st, pd=pd, op=op, dl=dl, gr=gr):
            f = {3: F.conv_transpose1d, 4: F.conv_transpose2d}[x.dim()]
            return f(x, w, bb, stride=st, padding=pd[:len(st)], output_padding=op, dilation=dl, groups=gr)

        b.grad_case(f"conv_transpose x={xs} w={ws} strides={st} pads={pd} groups={gr}", "conv_transpose",
                    [("x", x), ("w", w), ("b", bb)], convt, strides=st, pads=pd, output_padding=op, dilations=dl,
                    groups=gr if gr > 1 else None)

    pools = [  # (x shape, kernel, strides, pads, dilations, ceil_mode)
        ((1, 2, 6, 6), [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], False),
        ((2, 3, 7, 5), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], True),
        ((1, 2, 9, 8), [3, 2], [2, 3], [1, 0, 1, 0], [2, 1], False),
        ((1, 2, 10), [4], [3], [2, 2], [1], True),
        ((1, 1, 4, 5, 6), [2, 3, 2], [2, 1, 2], [1, 1, 0, 1, 1, 0], [1, 1, 1], False),
    ]
    for xs, k, st, pd, dl, ceil in pools:
        x = b.rand(*xs)
        nd = len(k)
        pad = pd[:nd]

        def maxpool(v, k=k, st=st, pad=pad, dl=dl, ceil=ceil):
            f = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(k)]
            return f(v, k, st, pad, dl, ceil_mode=ceil)

        b.grad_case(f"max_pool x={xs} kernel={k} strides={st} pads={pd} dilations={dl} ceil={ceil}", "max_pool",
                    [("x", x)], maxpool, smooth=False, kernel=k, strides=st, pads=pd, dilations=dl,
                    ceil_mode=ceil or None)
        for cip in (False, True):
            def avgpool(v, k=k, st=st, pad=pad, ceil=ceil, cip=cip):
                f = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(k)]
                return f(v, k, st, pad, ceil_mode=ceil, count_include_pad=cip)

            b.grad_case(f"avg_pool x={xs} kernel={k} strides={st} pads={pd} ceil={ceil} count_include_pad={cip}",
                        "avg_pool", [("x", x)], avgpool, kernel=k, strides=st, pads=pd, ceil_mode=ceil or None,
                        count_include_pad=cip or None)
    ties = np.array([[[[1, 1, 2, 2], [1, 0, 2, 2], [3, 3, -1, -1], [3, 3, -1, -1]]]], dtype=np.float32)
    b.grad_case("max_pool with ties", "max_pool", [("x", ties)], lambda v: F.max_pool2d(v, 2, 2), smooth=False,
                kernel=[2, 2], strides=[2, 2])
    xl = b.rand(2, 5, 5, 3)
    b.grad_case("max_pool nhwc", "max_pool", [("x", xl)], nhwc(lambda v: F.max_pool2d(v, 3, 2, 1)), smooth=False,
                kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], layout="nhwc")
    b.grad_case("avg_pool nhwc", "avg_pool", [("x", xl)], nhwc(lambda v: F.avg_pool2d(v, 2, 1)), kernel=[2, 2],
                layout="nhwc")

    for xs, layout in (((2, 3, 4, 5), None), ((4, 3), None), ((2, 4, 3, 3), "nhwc")):
        c = xs[1] if layout is None else xs[-1]
        args = [("x", b.rand(*xs)), ("scale", b.rand(c)), ("bias", b.rand(c)), ("mean", b.rand(c)),
                ("var", b.rand(c, lo=0.5, hi=2))]

        def bn(x, sc, bi, me, va):  # inference batch_norm, differentiable in every input
            shape = [-1] + [1] * (x.dim() - 2)
            return (x - me.view(shape)) / torch.sqrt(va.view(shape) + 1e-5) * sc.view(shape) + bi.view(shape)

        b.grad_case(f"batch_norm x={xs} layout={layout}", "batch_norm", args,
                    nhwc(bn) if layout else bn, layout=layout)
    for xs, axis in (((3, 4), None), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 3), 0)):
        a = (len(xs) - 1) if axis is None else axis % len(xs)
        shape = xs[a:]
        for affine in (True, False):
            x = b.rand(*xs)
            args = [("x", x)] + ([("scale", b.rand(*shape)), ("bias", b.rand(*shape))] if affine else [])

            def ln(v, sc=None, bi=None, shape=shape):
                return F.layer_norm(v, shape, sc, bi, eps=1e-5)

            b.grad_case(f"layer_norm x={xs} axis={axis} affine={affine}", "layer_norm", args, ln, axis=axis)

    x = b.rand(3, 5, 4)
    b.grad_case("slice", "slice", [("x", x)], lambda v: v[1:3, :, -3:], starts=[1, -3], ends=[3, 100], axes=[0, 2])
    b.grad_case("pad constant", "pad", [("x", x)], lambda v: F.pad(v, (1, 0, 0, 2, 2, 1), value=1.5),
                pads=[2, 0, 1, 1, 2, 0], value=1.5)
    b.grad_case("pad with negative pads", "pad", [("x", x)], lambda v: F.pad(v, (-1, 2, 0, -2, 1, 0)),
                pads=[1, 0, -1, 0, -2, 2])


def slice_indices(dim, start, end, step):
    """The positions ONNX Slice takes along one dim: Python's slicing, whose
    clamping of out-of-range starts and ends is the same."""
    return list(range(dim))[start:end:step]


def slice_ref(v, starts, ends, axes, steps):
    for s, e, a, st in zip(starts, ends, axes, steps):
        v = v.index_select(a, torch.tensor(slice_indices(v.shape[a], s, e, st), dtype=torch.long))
    return v


def pad_source(mode, i, dim, b, e):
    """The position of x that position i of a padded dim copies (ir/op_shape.c's
    pad_source, ONNX Pad after the crop of negative widths), or None for constant."""
    crop = -b if b < 0 else 0
    kept = dim - crop - (-e if e < 0 else 0)
    j = i - max(b, 0)
    if j < 0 or j >= kept:
        if mode == "constant":
            return None
        j = (0 if j < 0 else kept - 1) if mode == "edge" else (-j if j < 0 else 2 * (kept - 1) - j)
    return crop + j


def pad_gather(v, pads, mode):
    """kiln's pad in reflect or edge mode as a gather along every dim, for the pads F.pad
    does not take (negative widths, the batch and channel dims); autograd sums the
    copies back."""
    r = v.dim()
    for k in range(r):
        b, e = pads[k], pads[r + k]
        size = v.shape[k] + b + e
        index = [pad_source(mode, i, v.shape[k], b, e) for i in range(size)]
        v = v.index_select(k, torch.tensor(index, dtype=torch.long))
    return v


def torch_pads(pads, r):
    """kiln's pads [b0, ..., e0, ...] as F.pad's (last dim first), from the first padded dim."""
    widths = []
    for k in reversed(range(r)):
        widths += [pads[k], pads[r + k]]
    while widths and widths[-1] == 0 and widths[-2] == 0:
        widths = widths[:-2]
    return tuple(widths)


def gen_selections(b):
    """reduce_max, slice with steps, pad reflect and edge: gradients that select,
    route or sum copies back."""
    x = b.rand(2, 3, 4)
    for name, fn in (("sum", torch.sum), ("mean", torch.mean)):  # axes=[] is every dim too
        b.grad_case(f"{name} axes=[]", name, [("x", x)], fn, axes=[])
    b.grad_case("reduce_max over everything", "reduce_max", [("x", x)], lambda v: torch.amax(v, dim=(0, 1, 2)))
    for axes, keep in (([1], False), ([0, 2], True), ([-1], False), ([0, 1, 2], True), ([-3], True)):
        b.grad_case(f"reduce_max axes={axes} keepdims={keep}", "reduce_max", [("x", x)],
                    lambda v, a=axes, kd=keep: torch.amax(v, dim=a, keepdim=kd), axes=axes, keepdims=keep)
    b.grad_case("reduce_max axes=[] (every dim)", "reduce_max", [("x", b.rand(3, 2))],
                lambda v: torch.amax(v, dim=(0, 1)), axes=[])
    ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, 5, 0, 5], [-np.inf, -np.inf, -np.inf, -np.inf]],
                    dtype=np.float32)
    b.grad_case("reduce_max with ties, split evenly", "reduce_max", [("x", ties)],
                lambda v: torch.amax(v, dim=1), smooth=False, axes=[1])
    b.grad_case("reduce_max with ties along axis 0", "reduce_max", [("x", ties[:3])],
                lambda v: torch.amax(v, dim=0, keepdim=True), smooth=False, axes=[0], keepdims=True)
    b.grad_case("reduce_max with ties over everything", "reduce_max", [("x", ties[:3])],
                lambda v: torch.amax(v, dim=(0, 1)), smooth=False)
    nan = np.array([[1, np.nan, 3], [4, 5, 6]], dtype=np.float32)
    b.grad_case("reduce_max of a NaN", "reduce_max", [("x", nan)], lambda v: torch.amax(v, dim=1),
                smooth=False, axes=[1])

    x = b.rand(6, 5, 7)
    slices = [  # starts, ends, axes, steps
        ([0], [6], [0], [2]),
        ([1, 0], [6, 7], [0, 2], [2, 3]),
        ([-1], [-100], [1], [-1]),
        ([5, 6], [-100, 1], [0, 2], [-2, -2]),
        ([1], [100], [2], [10]),
        ([-2, 1, 4], [100, 5, -9223372036854775807], [0, 1, 2], [1, 3, -3]),
        ([-1], [-9223372036854775807], [-1], [-1]),
        ([3, 0], [0, 9223372036854775807], [-3, -1], [-1, 4]),
    ]
    for starts, ends, axes, steps in slices:
        b.grad_case(f"slice starts={starts} ends={ends} axes={axes} steps={steps}", "slice", [("x", x)],
                    lambda v, s=starts, e=ends, a=axes, st=steps: slice_ref(v, s, e, [k % 3 for k in a], st),
                    starts=starts, ends=ends, axes=axes, steps=steps)

    for mode, torch_mode in (("reflect", "reflect"), ("edge", "replicate")):
        fpads = [  # (x shape, kiln pads) that F.pad takes: the trailing dims of a 3-D to 5-D x
            ((1, 2, 5, 6), [0, 0, 2, 1, 0, 0, 1, 3]),
            ((2, 3, 7), [0, 0, 3, 0, 0, 2]),
            ((1, 2, 3, 4, 3), [0, 0, 1, 2, 0, 0, 0, 1, 2, 1]),
            ((2, 1, 4, 4), [0, 0, 0, 3, 0, 0, 3, 0]),
        ]
        if mode == "edge":
            fpads.append(((1, 1, 2, 3), [0, 0, 4, 3, 0, 0, 5, 0]))  # wider than the dim
        for xs, pads in fpads:
            v = b.rand(*xs)
            widths = torch_pads(pads, len(xs))
            fwd = F.pad(T(v), widths, mode=torch_mode)
            if not torch.equal(fwd, pad_gather(T(v), pads, mode)):
                sys.exit(f"pad {mode} {xs} {pads}: F.pad and the gather differ")
            b.grad_case(f"pad {mode} x={xs} pads={pads}", "pad", [("x", v)],
                        lambda t, w=widths, m=torch_mode: F.pad(t, w, mode=m), pads=pads, mode=mode)
        for xs, pads in (((3, 5, 4), [1, -1, 2, 0, 2, -1]), ((4, 6), [-1, 2, 1, -2]), ((2, 3, 4), [1, 1, 1, 1, 2, 3])):
            b.grad_case(f"pad {mode} x={xs} pads={pads}, cropping and padding every dim", "pad",
                        [("x", b.rand(*xs))], lambda t, p=pads, m=mode: pad_gather(t, p, m), pads=pads, mode=mode)


def gen_pools(b):
    """adaptive_avg_pool, and more shapes of global_avg_pool and flatten."""
    adaptive = [  # x shape, output_size
        ((1, 2, 7), [3]),
        ((2, 3, 7, 5), [3, 4]),
        ((1, 2, 6, 6), [3, 2]),
        ((1, 2, 3, 4), [5, 6]),
        ((1, 2, 5, 4, 3), [2, 3, 2]),
    ]
    for xs, size in adaptive:
        f = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[len(size)]
        b.grad_case(f"adaptive_avg_pool x={xs} output_size={size}", "adaptive_avg_pool", [("x", b.rand(*xs))],
                    lambda v, f=f, size=size: f(v, size), output_size=size)
    b.grad_case("adaptive_avg_pool nhwc", "adaptive_avg_pool", [("x", b.rand(2, 7, 5, 3))],
                nhwc(lambda v: F.adaptive_avg_pool2d(v, [3, 4])), output_size=[3, 4], layout="nhwc")

    for xs in ((1, 2, 7), (2, 3, 2, 3, 4), (3, 1, 1, 1)):
        dims = tuple(range(2, len(xs)))
        b.grad_case(f"global_avg_pool x={xs}", "global_avg_pool", [("x", b.rand(*xs))],
                    lambda v, d=dims: v.mean(dim=d, keepdim=True))
    b.grad_case("global_avg_pool nhwc", "global_avg_pool", [("x", b.rand(2, 4, 5, 3))],
                lambda v: v.mean(dim=(1, 2), keepdim=True), layout="nhwc")
    x = b.rand(2, 3, 4)
    for axis in (0, 2, 3, -1):
        a = axis + x.ndim if axis < 0 else axis
        b.grad_case(f"flatten axis={axis}", "flatten", [("x", x)],
                    lambda v, a=a: v.reshape(int(np.prod(v.shape[:a])), -1), axis=axis)


def quoted(expr):
    return f'"{expr}"'


def gen_fused(b):
    """The fused ops, written directly: their gradients are their parts'."""
    elementwise = [  # expr, input shapes, the same in torch
        ("tanh(add(mul($0, $1), $2))", [(2, 3, 4), (4,), (3, 1)], lambda x, y, z: torch.tanh(x * y + z)),
        ("mul($0, sigmoid($0))", [(3, 4)], lambda x: x * torch.sigmoid(x)),
        ("exp($0)", [(3, 1), (2, 3, 4)], lambda x, y: torch.exp(x).expand(2, 3, 4)),
        ("sub(pow($0, 2), div($1, add($0, 0.5)))", [(2, 5), (5,)], lambda x, y: x ** 2 - y / (x + 0.5)),
        ("gelu(hardsigmoid(neg($0), alpha=0.25, beta=0.4), approximate=tanh)", [(4, 3)],
         lambda x: F.gelu(torch.clamp(-0.25 * x + 0.4, 0, 1), approximate="tanh")),
        ("add($0, 1)", [(2, 3)], lambda x: x + 1),
    ]
    for expr, shapes, fn in elementwise:
        args = [(f"x{k}", b.rand(*s, lo=0.2, hi=2) if "pow" in expr else b.rand(*s)) for k, s in enumerate(shapes)]
        b.grad_case(f"elementwise {expr} {shapes}", "elementwise", args, fn, expr=quoted(expr))

    x, w, bias, r = b.rand(1, 3, 6, 6), b.rand(4, 3, 3, 3), b.rand(4), b.rand(1, 4, 6, 6)
    b.grad_case("fused_conv with a residual", "fused_conv", [("x", x), ("w", w), ("b", bias), ("res", r)],
                lambda x, w, bb, r: torch.tanh(F.conv2d(x, w, bb, padding=1) + r), pads=[1, 1, 1, 1],
                expr=quoted("tanh(add($0, $1))"))
    x, w = b.rand(2, 4, 7, 5), b.rand(6, 2, 3, 2)
    b.grad_case("fused_conv without bias, strided, grouped, a scalar operand", "fused_conv",
                [("x", x), ("w", w), ("b", None), ("s", b.rand(1))],
                lambda x, w, s: F.conv2d(x, w, stride=2, groups=2) * s, strides=[2, 2], groups=2,
                expr=quoted("mul($0, $1)"))
    b.grad_case("fused_conv with a one-element operand of higher rank", "fused_conv",
                [("x", b.rand(1, 2, 5, 5)), ("w", b.rand(3, 2, 3, 3)), ("b", b.rand(3)),
                 ("s", b.rand(1, 1, 1, 1, 1))],
                lambda x, w, bb, s: torch.sigmoid(F.conv2d(x, w, bb) - s.reshape(())), expr=quoted("sigmoid(sub($0, $1))"))
    xl, wl = b.rand(1, 6, 6, 3), b.rand(4, 3, 3, 3)
    b.grad_case("fused_conv nhwc", "fused_conv", [("x", xl), ("w", wl), ("b", b.rand(4))],
                nhwc(lambda x, w, bb: torch.tanh(F.conv2d(x, w, bb, padding=1))), pads=[1, 1, 1, 1], layout="nhwc",
                expr=quoted("tanh($0)"))
    b.grad_case("fused_linear", "fused_linear", [("x", b.rand(3, 4)), ("w", b.rand(5, 4)), ("b", b.rand(5)),
                                                 ("e", b.rand(3, 5))],
                lambda x, w, bb, e: torch.sigmoid(F.linear(x, w, bb) * e), expr=quoted("sigmoid(mul($0, $1))"))
    b.grad_case("fused_linear without bias, a scalar operand, $0 twice", "fused_linear",
                [("x", b.rand(2, 3, 4)), ("w", b.rand(2, 4)), ("b", None), ("s", np.array(0.7, np.float32))],
                lambda x, w, s: F.linear(x, w) * F.linear(x, w) - s, expr=quoted("sub(mul($0, $0), $1)"))


def gen_softplus(b):
    """softplus: sigmoid(beta x), and 1 where beta x > threshold (a jump, kept away from
    the smooth cases and taken by PyTorch's convention at it)."""
    for beta, threshold in ((None, None), (2.0, 3.0), (-0.5, None), (0.5, 1.0)):
        bt, th = 1.0 if beta is None else beta, 20.0 if threshold is None else threshold
        b.grad_case(f"softplus beta={beta} threshold={threshold}", "softplus",
                    [("x", away_from(b, (3, 4), [th / bt], lo=-6, hi=6))],
                    lambda x, bt=bt, th=th: F.softplus(x, beta=bt, threshold=th), beta=beta, threshold=threshold)
    at = np.array([1.5, 1.4999, 1.5001, 0.0, -40.0, 40.0, 3.0, -3.0], dtype=np.float32)
    b.grad_case("softplus at its threshold and far out", "softplus", [("x", at)],
                lambda x: F.softplus(x, beta=2.0, threshold=3.0), smooth=False, beta=2.0, threshold=3.0)


def gen_scans(b):
    """cumsum's gradient is the cumsum of dy the other way."""
    x = b.rand(3, 4, 2)
    for axis, exclusive, reverse in ((0, False, False), (1, True, False), (-1, False, True), (1, True, True)):
        def cumsum(v, axis=axis, exclusive=exclusive, reverse=reverse):
            v = v.flip(axis) if reverse else v
            s = v.cumsum(axis) - (v if exclusive else 0)
            return s.flip(axis) if reverse else s
        b.grad_case(f"cumsum axis={axis} exclusive={exclusive} reverse={reverse}", "cumsum", [("x", x)], cumsum,
                    axis=axis, exclusive=exclusive, reverse=reverse)


def gen_attention(b):
    """attention's gradient (through its definition, softmax(q k^T scale + mask) v):
    with respect to q, k, v and an f32 mask broadcast over the rows."""
    def attention(q, k, v, mask=None, scale=None, causal=False):
        s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if mask is not None:
            s = s + mask
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(s, dim=-1) @ v
    b.grad_case("attention rank 3", "attention", [("q", b.rand(2, 5, 4)), ("k", b.rand(2, 7, 4)),
                                                  ("v", b.rand(2, 7, 3))], attention)
    b.grad_case("attention with an f32 mask broadcast over the rows, scale 0.5", "attention",
                [("q", b.rand(2, 5, 4)), ("k", b.rand(2, 7, 4)), ("v", b.rand(2, 7, 3)), ("mask", b.rand(2, 1, 7))],
                lambda q, k, v, m: attention(q, k, v, m, scale=0.5), scale=0.5)
    b.grad_case("attention causal, rank 4", "attention", [("q", b.rand(1, 2, 6, 4)), ("k", b.rand(1, 2, 6, 4)),
                                                          ("v", b.rand(1, 2, 6, 5))],
                lambda q, k, v: attention(q, k, v, causal=True), is_causal=True)


def gen_gather(b):
    """gather's and gather_elements' gradients: dy's slices (elements) summed into the ones
    they came from, repeated and negative indices included (an embedding's backward)."""
    table = b.rand(6, 4)
    ids = np.array([[1, 5, 1], [0, -1, 1]], dtype=np.int64)
    b.grad_case("gather rows (an embedding), repeated and negative ids", "gather", [("x", table)],
                lambda x: x[torch.from_numpy(ids % 6)], fixed=[("i", ids)])
    x = b.rand(2, 5, 3)
    cols = np.array([4, 0, 4, -2], dtype=np.int64)
    b.grad_case("gather along axis 1 of a rank-3 tensor", "gather", [("x", x)],
                lambda v: v.index_select(1, torch.from_numpy(cols % 5)), fixed=[("i", cols)], axis=1)
    picks = np.array([[[1, -1, 0], [4, 4, 0]], [[0, 2, -5], [3, 3, 3]]], dtype=np.int64)
    b.grad_case("gather_elements along axis 1, repeated and negative indices", "gather_elements", [("x", x)],
                lambda v: torch.gather(v, 1, torch.from_numpy(picks % 5)), fixed=[("i", picks)], axis=1)
    rows = np.array([[0, 1], [1, 0], [0, 0]], dtype=np.int32)
    b.grad_case("gather_elements along axis 0, i32 indices, fewer columns", "gather_elements", [("x", table)],
                lambda v: torch.gather(v, 0, torch.from_numpy(rows.astype(np.int64))), fixed=[("i", rows)])


def main():
    b = GradBattery("grad", zlib.crc32(b"grad"))
    gen(b)
    gen_nn(b)
    gen_selections(b)
    gen_pools(b)
    gen_fused(b)
    gen_softplus(b)
    gen_scans(b)
    gen_attention(b)
    gen_gather(b)
    b.write()
    print(f"grad: {len(b.expected)} gradients")


if __name__ == "__main__":
    main()
