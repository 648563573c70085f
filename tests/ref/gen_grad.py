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
(relu at 0, clip at its bounds, ties of max and min, hardswish at -3 and 3) PyTorch's
conventions are the reference. tests/unit/test_reference.c (the interpreter) and
test_target_c.c (the C target) run the battery like any other.

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
    def grad_case(self, desc, op, args, fn, smooth=True, **attrs):
        """args: (suffix, float32 array) pairs, all differentiated; fn: the op in torch."""
        k = self.n_cases = getattr(self, "n_cases", 0) + 1
        self.lines.append(f"# {desc}")
        names = []
        for suffix, arr in args:
            name = f"c{k}_{suffix}"
            self.lines.append(f"param {name} : f32{list(arr.shape)}")
            self.inputs[name] = np.asarray(arr, dtype=np.float32)
            names.append(name)
        xs = [T(arr).requires_grad_(True) for _, arr in args]
        y = fn(*xs)
        r = self.rand(*y.shape)
        self.inputs[f"c{k}_r"] = r
        self.lines.append(f"param c{k}_r : f32{list(r.shape)}")
        attr_text = "".join(f", {key}={fmt(v)}" for key, v in attrs.items() if v is not None)
        self.lines.append(f"c{k}_f = {op}({', '.join(names)}{attr_text})")
        self.lines.append(f"c{k}_p = mul(c{k}_f, c{k}_r)")
        self.lines.append(f"c{k}_l = sum(c{k}_p)")
        grads = [f"c{k}_g{suffix}" for suffix, _ in args]
        self.lines.append(f"{', '.join(grads)} = grad(c{k}_l, {', '.join(names)})")

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


def main():
    b = GradBattery("grad", zlib.crc32(b"grad"))
    gen(b)
    b.write()
    print(f"grad: {len(b.expected)} gradients")


if __name__ == "__main__":
    main()
