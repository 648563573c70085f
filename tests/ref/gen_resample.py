#!/usr/bin/python3
"""Generates the resampling batteries for kiln's `interpolate` and `resize` ops (see
gen_reference.py for the battery format: NAME.kiln, NAME.safetensors,
NAME.expected.safetensors).

  interpolate    `interpolate(x, size | scale_factor, mode, align_corners,
                 recompute_scale_factor)` in every mode (nearest, nearest-exact,
                 linear, bilinear, bicubic, trilinear, area) on 1 to 3 spatial dims:
                 size and scale_factor (one number or one per dim), up- and
                 downsampling, align_corners both ways, recompute_scale_factor both
                 ways with factors where it matters (1.7 on length 5 gives 8, a ratio
                 of 1.6), input and output length 1, and a length that a factor
                 leaves unchanged (5 * 1.1 -> 5: the linear modes copy such a dim,
                 nearest and bicubic still map through 1 / 1.1). Expected values are
                 torch.nn.functional.interpolate (torch 1.13, CPU): in float32 for
                 the nearest modes, whose source index torch computes in float
                 (floorf(i * (float)(1 / factor)); a few cases sit where float and
                 double part: 0.6 on length 9 takes element 5 for output 3), in
                 float64 for the others (the script checks that float32 agrees).
                 torch 1.13 copies a dim with out = in and halves the index with
                 out = 2 in for nearest when the input is channels-last contiguous
                 (any 4-D or 5-D input with one channel) but not otherwise; the
                 battery keeps such dims to 3-D inputs, where it does neither.
  resize         `resize(x, sizes | scales, mode, coordinate_transformation_mode,
                 nearest_mode, cubic_coeff_a, exclude_outside, roi,
                 extrapolation_value)` = ONNX Resize (opset 13) with scales, sizes and
                 roi as attributes over every dim. First every ONNX conformance test
                 test_resize_* and test_upsample_nearest from Debian's
                 libonnx-testdata (/usr/share/libonnx-testdata/data/node), its
                 output_0.pb taken verbatim; Upsample-9 becomes asymmetric + floor
                 (onnxruntime's reading of opset < 11: asymmetric, floor when
                 upsampling). Then random inputs through ONNX's own reference
                 (onnx.backend.test.case.node.resize.interpolate_nd, onnx 1.12) for
                 every mode x coordinate_transformation_mode x (scales, sizes) x (up,
                 down), every nearest_mode, cubic_coeff_a -0.5 and -0.75,
                 exclude_outside, tf_crop_and_resize with an roi partly outside [0, 1]
                 and an extrapolation value, ranks 1 to 5, and resizing the batch or
                 channel axis. The reference has no tf_half_pixel_for_nn; those cases
                 evaluate the asymmetric formula (x / scale) at x + 0.5, which
                 reproduces the conformance test. The reference's quirks, which the
                 battery therefore holds: with scales, the resized length in
                 align_corners, tf_crop_and_resize and pytorch_half_pixel's "length 1"
                 test is float32(scale * length), not the floored output length
                 (test_resize_downsample_scales_linear_align_corners depends on it);
                 pytorch_half_pixel maps an output of length 1 to -0.5 (the spec and
                 onnxruntime say 0, which differs for cubic only: one case).
  resample_grad  gradients in the gen_grad.py style (cK_f = op(...), loss
                 sum(mul(cK_f, cK_r)), grad(...)): interpolate in every mode, with
                 torch autograd as the expected value (float32 for the nearest modes,
                 checked to be the adjoint of torch's forward; float64 and checked
                 against finite differences for the others); resize in several modes,
                 whose expected gradient J^T r is exact: resize is affine in x, and
                 column j of J is the ONNX reference at the unit vector e_j minus at
                 zero. Two nearest cases with out = in and out = 2 in take J^T r from
                 torch's forward, since torch 1.13's backward applies the shortcuts
                 above there and is not the adjoint of its own forward.

Nearest-mode and tf_crop_and_resize cases are checked against an independent exact
(rational) evaluation of the source coordinates: the script stops if a coordinate
lies within 1e-6 of a rounding or extrapolation boundary without being on it, or
on it where the step to it is not exact in binary (a tie an implementation could
round either way), or if the reference's choice differs from the exact one.

Everything is deterministic (fixed seeds). Rerun after changing a battery:

    /usr/bin/python3 tests/ref/gen_resample.py [BATTERY...]

With no argument it rewrites all three.
"""
import os
import sys
import zlib
from fractions import Fraction

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from onnx.backend.test.case.node.resize import (cubic_coeffs, interpolate_nd, interpolate_nd_with_x, linear_coeffs,
                                                nearest_coeffs)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_reference import Battery  # noqa: E402
from gen_grad import GradBattery  # noqa: E402

ONNX_NODE_TESTS = "/usr/share/libonnx-testdata/data/node"


def f32(v):
    """The shortest decimal that rounds to float32 v (what ONNX stored), as a float."""
    return float(str(np.float32(v)))


# ---- interpolate (torch) ----


def torch_interpolate(x, mode, size=None, scale_factor=None, align_corners=None, recompute_scale_factor=None,
                      dtype=np.float32):
    t = torch.from_numpy(np.asarray(x, dtype=np.float32).astype(dtype))
    return F.interpolate(t, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor)


def interpolate_expected(x, mode, **kw):
    """torch's result: float32 for the nearest modes (index arithmetic in float), float64
    otherwise, after checking that float32 agrees."""
    y32 = torch_interpolate(x, mode, **kw).double()
    if mode == "nearest" and x.ndim > 3 and x.shape[1] == 1 and kw["scale_factor"] is not None \
            and not kw["recompute_scale_factor"]:
        # one channel makes the input channels-last contiguous, and torch 1.13 then
        # copies a dim with out = in and halves the index with out = 2 in (not so
        # for other inputs): keep such dims out of the battery
        factors = kw["scale_factor"] if isinstance(kw["scale_factor"], list) else [kw["scale_factor"]] * (x.ndim - 2)
        for n_in, n_out, f in zip(x.shape[2:], y32.shape[2:], factors):
            if (n_out == n_in and f != 1) or (n_out == 2 * n_in and f != 2):
                sys.exit(f"interpolate nearest {kw}: torch's channels-last shortcut applies to x {x.shape}")
    if mode.startswith("nearest"):
        return y32
    y64 = torch_interpolate(x, mode, dtype=np.float64, **kw)
    if not torch.allclose(y32, y64, rtol=1e-5, atol=1e-5):
        sys.exit(f"interpolate {mode} {kw}: float32 and float64 disagree:\n{y32}\n{y64}")
    return y64


def interp_attrs(mode, size=None, scale_factor=None, align_corners=None, recompute_scale_factor=None):
    """kiln's attributes, defaults left out (a mode with a dash quoted)."""
    return dict(size=size, scale_factor=scale_factor,
                mode=None if mode == "nearest" else f'"{mode}"' if "-" in mode else mode,
                align_corners=True if align_corners else None,
                recompute_scale_factor=True if recompute_scale_factor else None)


def interp_case(b, mode, shape, note="", size=None, scale_factor=None, align_corners=None,
                recompute_scale_factor=None):
    x = b.rand(*shape)
    kw = dict(size=size, scale_factor=scale_factor, align_corners=align_corners,
              recompute_scale_factor=recompute_scale_factor)
    y = interpolate_expected(x, mode, **kw)
    desc = f"interpolate {mode} x={list(shape)}"
    for key, v in kw.items():
        if v is not None:
            desc += f" {key}={v}"
    desc += f" -> {list(y.shape)}"
    if note:
        desc += f" ({note})"
    b.case(desc, "interpolate", [("x", x)], y, **interp_attrs(mode, **kw))


def gen_interpolate(b):
    # the source index is floorf(i * scale) (nearest) or floorf((i + 0.5) * scale)
    # (nearest-exact) in float, scale = (float)(1 / scale_factor) or (float)in / out
    for mode in ("nearest", "nearest-exact"):
        c = lambda *a, **k: interp_case(b, mode, *a, **k)  # noqa: E731
        c((1, 2, 5), size=8)
        c((1, 2, 5), scale_factor=1.7, note="scale 1 / 1.7, not 5 / 8")
        c((1, 2, 5), scale_factor=1.7, recompute_scale_factor=True, note="scale 5 / 8")
        c((1, 2, 5), scale_factor=1.1, note="output length = input length, still scaled by 1 / 1.1")
        c((1, 2, 4, 5), scale_factor=[2.5, 0.6])
        c((1, 2, 4, 5), scale_factor=[2.5, 0.6], recompute_scale_factor=True)
        c((1, 1, 2, 3, 4), size=[3, 5, 2])
    nearest = lambda *a, **k: interp_case(b, "nearest", *a, **k)  # noqa: E731
    exact = lambda *a, **k: interp_case(b, "nearest-exact", *a, **k)  # noqa: E731
    nearest((1, 1, 9), scale_factor=0.6, note="output 3 takes element 5: 3 * (float)(1 / 0.6) rounds to 5 in float")
    exact((1, 1, 9), scale_factor=0.3, note="output 1 takes element 5: 1.5 * (float)(1 / 0.3) rounds to 5 in float")
    nearest((1, 1, 16), scale_factor=2.2, note="output 33 takes element 15 (float); 33 / 2.2 in double is below 15")
    exact((1, 1, 16), scale_factor=1.1, note="output 16 takes element 15 (float); 16.5 / 1.1 in double is below 15")
    nearest((1, 1, 9), scale_factor=0.6, recompute_scale_factor=True, note="scale 9 / 5")
    exact((2, 1, 7), size=3)
    nearest((2, 1, 7), size=3)
    nearest = lambda *a, **k: interp_case(b, "nearest", *a, **k)  # noqa: E731
    nearest((1, 2, 5), scale_factor=2.1, note="output twice the input, scale 1 / 2.1")
    nearest((1, 3, 4, 5), size=[7, 3])
    nearest((1, 1, 2, 9, 3), scale_factor=[1.5, 0.3333, 3.0])
    nearest((1, 2, 1), size=4, note="input length 1")
    nearest((1, 2, 6), size=1, note="output length 1")

    def lin(*a, **k):
        interp_case(b, "linear", *a, **k)

    for ac in (None, True):
        lin((1, 2, 5), size=8, align_corners=ac)
        lin((2, 1, 7), size=3, align_corners=ac)
        lin((1, 2, 5), scale_factor=2.5, align_corners=ac, note="output 12, a ratio of 2.4")
        lin((1, 2, 1), size=4, align_corners=ac, note="input length 1")
        lin((1, 2, 6), size=1, align_corners=ac, note="output length 1")
    for rc in (None, True):
        lin((1, 2, 5), scale_factor=1.7, recompute_scale_factor=rc)
        lin((1, 1, 9), scale_factor=0.6, recompute_scale_factor=rc)
        lin((1, 2, 5), scale_factor=0.3, recompute_scale_factor=rc, note="output length 1")
    lin((1, 2, 5), scale_factor=1.1, note="output length = input length: torch copies the dim")

    def bil(*a, **k):
        interp_case(b, "bilinear", *a, **k)

    for ac in (None, True):
        bil((1, 2, 4, 5), size=[7, 3], align_corners=ac)
        bil((1, 2, 4, 5), scale_factor=[1.5, 0.6], align_corners=ac)
    bil((2, 1, 3, 4), scale_factor=2.0)
    bil((1, 2, 4, 5), scale_factor=[1.5, 0.6], recompute_scale_factor=True)
    bil((1, 2, 4, 5), scale_factor=[1.6, 1.1], note="width unchanged: copied")
    bil((1, 1, 3, 4), size=[1, 1], align_corners=True, note="output 1x1")

    def bic(*a, **k):
        interp_case(b, "bicubic", *a, **k)

    for ac in (None, True):
        bic((1, 2, 4, 5), size=[7, 3], align_corners=ac)
        bic((1, 1, 4, 5), size=[1, 6], align_corners=ac, note="output height 1")
    for rc in (None, True):
        bic((1, 2, 4, 5), scale_factor=1.7, recompute_scale_factor=rc)
    bic((1, 2, 4, 5), scale_factor=[0.6, 2.0])
    bic((1, 2, 4, 5), scale_factor=1.1, note="output size = input size, but not copied in bicubic")
    bic((1, 1, 1, 4), size=[3, 6], align_corners=True, note="input height 1")

    def tri(*a, **k):
        interp_case(b, "trilinear", *a, **k)

    for ac in (None, True):
        tri((1, 2, 2, 3, 4), size=[3, 5, 2], align_corners=ac)
    for rc in (None, True):
        tri((1, 1, 3, 4, 5), scale_factor=[2.0, 1.7, 0.6], recompute_scale_factor=rc)
    tri((1, 1, 3, 5, 4), scale_factor=1.1, note="every length unchanged: a copy")
    tri((1, 1, 3, 2, 4), scale_factor=[1.7, 1.0, 0.5], align_corners=True)

    def area(*a, **k):
        interp_case(b, "area", *a, **k)

    area((1, 2, 7), size=3, note="overlapping windows")
    area((1, 2, 3), size=5, note="upsampling")
    area((1, 1, 9), scale_factor=0.6, note="the output size is recomputed: 5")
    area((1, 2, 5, 7), size=[3, 4])
    area((1, 2, 4, 5), scale_factor=[0.5, 1.5])
    area((1, 1, 4, 5, 3), size=[2, 3, 2])
    area((1, 1, 4, 5, 3), scale_factor=[0.75, 0.5, 2.0])


# ---- resize (ONNX) ----


def onnx_resize(x, sizes=None, scales=None, mode="nearest", coordinate_transformation_mode="half_pixel",
                nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False, roi=None,
                extrapolation_value=0.0):
    """ONNX Resize-13 by ONNX's reference code; scales are stored as float32, as in ONNX."""
    coeffs = {"nearest": lambda r: nearest_coeffs(r, mode=nearest_mode), "linear": linear_coeffs,
              "cubic": lambda r: cubic_coeffs(r, A=cubic_coeff_a)}[mode]
    x = np.asarray(x, dtype=np.float32)
    sc = None if scales is None else np.array(scales, dtype=np.float32)
    roi = None if roi is None else np.array(roi, dtype=np.float32)
    kw = dict(exclude_outside=exclude_outside, extrapolation_value=extrapolation_value)
    if coordinate_transformation_mode != "tf_half_pixel_for_nn":
        return interpolate_nd(x, coeffs, output_size=sizes, scale_factors=sc, roi=roi,
                              coordinate_transformation_mode=coordinate_transformation_mode, **kw)
    # x_original = (x_resized + 0.5) / scale: asymmetric (x / scale) at x_resized + 0.5
    if sizes is not None:
        out, sc = list(sizes), np.array(sizes) / np.array(x.shape)
    else:
        out = list((sc * np.array(x.shape)).astype(int))
    y = np.zeros(out)
    for idx in np.ndindex(*out):
        y[idx] = interpolate_nd_with_x(x, x.ndim, sc, [i + 0.5 for i in idx], coeffs,
                                       coordinate_transformation_mode="asymmetric", **kw)
    return y


def dyadic(q):
    """Whether the rational q is exact in binary floating point (small denominators)."""
    d = q.denominator
    return d & (d - 1) == 0


def exact_source(in_len, out_len, scale, sizes, ctm, roi0, roi1):
    """The source coordinate of every output index along one dim in exact arithmetic,
    following the reference's formulas (the resized length from scales is its float32
    product), and the multiplier that maps the output index to it."""
    if sizes:
        s = Fraction(out_len, in_len)
        out_w = Fraction(float((np.array([out_len]) / np.array([in_len]))[0] * in_len))
    else:
        s = Fraction(float(np.float32(scale)))
        out_w = Fraction(float(np.float32(scale) * in_len))
    coords, mult = [], 1 / s
    for xr in range(out_len):
        if ctm == "half_pixel" or (ctm == "pytorch_half_pixel" and out_w != 1):
            v = (xr + Fraction(1, 2)) / s - Fraction(1, 2)
        elif ctm == "pytorch_half_pixel":
            v = Fraction(-1, 2)
        elif ctm == "asymmetric":
            v = xr / s
        elif ctm == "tf_half_pixel_for_nn":
            v = (xr + Fraction(1, 2)) / s
        elif ctm == "align_corners":
            mult = 0 if out_w == 1 else Fraction(in_len - 1) / (out_w - 1)
            v = xr * mult
        elif ctm == "tf_crop_and_resize":
            r0, r1 = Fraction(float(np.float32(roi0))), Fraction(float(np.float32(roi1)))
            if out_w == 1:
                mult, v = 0, (r1 - r0) * (in_len - 1) / 2 + r0 * (in_len - 1)
            else:
                mult = (r1 - r0) * (in_len - 1) / (out_w - 1)
                v = xr * mult + r0 * (in_len - 1)
        coords.append(v)
    return coords, Fraction(mult)


def nearest_index(v, mode, in_len):
    fl = v.numerator // v.denominator
    frac = v - fl
    if frac == 0:
        i = fl
    elif mode == "round_prefer_floor":
        i = fl if frac <= Fraction(1, 2) else fl + 1
    elif mode == "round_prefer_ceil":
        i = fl if frac < Fraction(1, 2) else fl + 1
    elif mode == "floor":
        i = fl
    else:
        i = fl + 1
    return min(max(i, 0), in_len - 1)


def check_resize(desc, x, y, sizes, scales, mode, ctm, nearest_mode, roi, extrapolation_value):
    """Stops on a knife edge (see the module docstring) and, for nearest, on any
    disagreement between the reference and an exact evaluation."""
    rank = x.ndim
    index, outside = [], []
    for d in range(rank):
        out_len = y.shape[d]
        coords, mult = exact_source(x.shape[d], out_len, None if scales is None else scales[d], sizes is not None,
                                    ctm, None if roi is None else roi[d], None if roi is None else roi[rank + d])
        # a coordinate on an edge is fine where every implementation gets it exactly:
        # the step is exact in binary, or (a corner, a crop's start) multiplies zero
        exact_step = dyadic(mult) and (roi is None or all(dyadic(Fraction(float(np.float32(r)))) for r in roi))
        zero_step = ctm in ("align_corners", "asymmetric", "tf_crop_and_resize")
        bounds = []
        if mode == "nearest":
            half = nearest_mode.startswith("round")
            for v in coords:
                fl = v.numerator // v.denominator
                bounds.append(fl + Fraction(1, 2) if half else min(fl, fl + 1, key=lambda c: abs(v - c)))
        for k, v in enumerate(coords):
            near = [bounds[k]] if mode == "nearest" else []
            if ctm == "tf_crop_and_resize":
                near += [Fraction(0), Fraction(x.shape[d] - 1)]
            for bd in near:
                dist = abs(v - bd)
                if 0 < dist < Fraction(1, 10**6) or (dist == 0 and not exact_step and not (zero_step and k == 0)):
                    sys.exit(f"{desc}: dim {d} output {k}: source {float(v)!r} is on the edge {float(bd)}")
        index.append([nearest_index(v, nearest_mode, x.shape[d]) if mode == "nearest" else 0 for v in coords])
        outside.append([ctm == "tf_crop_and_resize" and (v < 0 or v > x.shape[d] - 1) for v in coords])
    if mode == "nearest":
        want = x[np.ix_(*index)].astype(np.float64)
        out = np.zeros(y.shape, dtype=bool)
        for d in range(rank):
            shape = [1] * rank
            shape[d] = y.shape[d]
            out = out | np.array(outside[d]).reshape(shape)
        want = np.where(out, extrapolation_value, want)
        if not np.array_equal(want, y):
            sys.exit(f"{desc}: the reference and the exact evaluation disagree:\n{y}\n{want}")


def resize_attrs(sizes=None, scales=None, mode="nearest", coordinate_transformation_mode="half_pixel",
                 nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False, roi=None,
                 extrapolation_value=0.0):
    """kiln's attributes, defaults left out."""
    return dict(sizes=sizes, scales=scales, mode=None if mode == "nearest" else mode,
                coordinate_transformation_mode=None if coordinate_transformation_mode == "half_pixel"
                else coordinate_transformation_mode,
                nearest_mode=None if nearest_mode == "round_prefer_floor" else nearest_mode,
                cubic_coeff_a=None if cubic_coeff_a == -0.75 else cubic_coeff_a,
                exclude_outside=True if exclude_outside else None, roi=roi,
                extrapolation_value=None if extrapolation_value == 0 else extrapolation_value)


def resize_desc(shape, attrs):
    text = " ".join(f"{k}={v}" for k, v in attrs.items() if v is not None)
    return f"resize x={list(shape)} {text}"


def checked_resize(desc, x, **kw):
    """onnx_resize, after check_resize."""
    y = onnx_resize(x, **kw)
    full = dict(sizes=None, scales=None, mode="nearest", coordinate_transformation_mode="half_pixel",
                nearest_mode="round_prefer_floor", roi=None, extrapolation_value=0.0)
    full.update({k: v for k, v in kw.items() if k in full})
    check_resize(desc, x, y, full["sizes"], full["scales"], full["mode"], full["coordinate_transformation_mode"],
                 full["nearest_mode"], full["roi"], full["extrapolation_value"])
    return y


def resize_case(b, shape, note="", **kw):
    x = b.rand(*shape)
    attrs = resize_attrs(**kw)
    desc = resize_desc(shape, attrs)
    y = checked_resize(desc, x, **kw)
    desc += f" -> {list(y.shape)}" + (f" ({note})" if note else "")
    b.case(desc, "resize", [("x", x)], y, **attrs)


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def conformance_tests():
    """(test name, x, kiln attributes as onnx_resize keywords, expected) for every
    Resize / Upsample conformance test."""
    if not os.path.isdir(ONNX_NODE_TESTS):
        sys.exit(f"{ONNX_NODE_TESTS} is missing (Debian's libonnx-testdata)")
    names = sorted(n for n in os.listdir(ONNX_NODE_TESTS) if n.startswith("test_resize_")) + ["test_upsample_nearest"]
    for name in names:
        d = os.path.join(ONNX_NODE_TESTS, name)
        model = onnx.load(os.path.join(d, "model.onnx"))
        values = {}
        for i, inp in enumerate(model.graph.input):
            values[inp.name] = load_pb(os.path.join(d, "test_data_set_0", f"input_{i}.pb"))
        expected = load_pb(os.path.join(d, "test_data_set_0", "output_0.pb"))
        node = None
        for n in model.graph.node:
            if n.op_type == "Constant":
                values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
            elif n.op_type in ("Resize", "Upsample"):
                node = n
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}

        def given(k):
            if k >= len(node.input) or not node.input[k]:
                return None
            v = values[node.input[k]]
            return v if v.size else None

        x = values[node.input[0]]
        if node.op_type == "Upsample":  # opset 9: asymmetric, floor (onnxruntime's reading of opset < 11)
            kw = dict(scales=[f32(s) for s in given(1)], mode=attrs.get("mode", "nearest"),
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            roi, scales, sizes = given(1), given(2), given(3)
            kw = dict(mode=attrs.get("mode", "nearest"))
            for key in ("coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "extrapolation_value"):
                if key in attrs:
                    kw[key] = f32(attrs[key]) if isinstance(attrs[key], float) else attrs[key]
            if attrs.get("exclude_outside"):
                kw["exclude_outside"] = True
            if scales is not None:
                kw["scales"] = [f32(s) for s in scales]
            if sizes is not None:
                kw["sizes"] = [int(s) for s in sizes]
            if kw.get("coordinate_transformation_mode") == "tf_crop_and_resize":
                kw["roi"] = [f32(r) for r in roi]
        yield name, x, kw, expected


def gen_resize(b):
    # (a) the ONNX conformance tests, their outputs verbatim; the reference (with the
    # tf_half_pixel_for_nn loop and Upsample read as asymmetric + floor) must agree
    for name, x, kw, expected in conformance_tests():
        mine = onnx_resize(x, **kw)
        if mine.shape != expected.shape or not np.allclose(mine, expected, rtol=1e-5, atol=1e-5):
            sys.exit(f"{name}: the reference with {kw} does not reproduce output_0.pb:\n{mine}\n{expected}")
        b.case(f"onnx conformance {name}", "resize", [("x", x)], expected, **resize_attrs(**kw))

    # (b) ONNX's reference on random inputs
    def case(shape, note="", **kw):
        resize_case(b, shape, note, **kw)

    roi4 = [0.0, 0.0, -0.25, 0.125, 1.0, 1.0, 0.75, 1.375]  # dim 2 starts outside, dim 3 ends outside
    forms = [  # (name, keywords, extrapolation value) on x [1, 1, 5, 7]
        ("scales up", dict(scales=[1.0, 1.0, 1.7, 2.0]), 2.5),    # 5 * 1.7 = 8.5 -> 8
        ("scales down", dict(scales=[1.0, 1.0, 0.7, 0.6]), 0.0),  # 3.5 -> 3, 4.2 -> 4
        ("sizes up", dict(sizes=[1, 1, 8, 9]), -1.25),
        ("sizes down", dict(sizes=[1, 1, 3, 2]), 0.5),
    ]
    for mode in ("nearest", "linear", "cubic"):
        for ctm in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"):
            for form, kw, ev in forms:
                extra = dict(roi=roi4, extrapolation_value=ev) if ctm == "tf_crop_and_resize" else {}
                case((1, 1, 5, 7), form, mode=mode, coordinate_transformation_mode=ctm, **kw, **extra)
        case((1, 1, 4, 5), mode=mode, coordinate_transformation_mode="tf_half_pixel_for_nn",
             scales=[1.0, 1.0, 1.7, 2.0])
        case((1, 1, 4, 4), mode=mode, coordinate_transformation_mode="tf_half_pixel_for_nn", sizes=[1, 1, 2, 8])

    # every other nearest_mode (round_prefer_floor is the default above), with ties
    # where they are exact in binary
    for nm in ("round_prefer_ceil", "floor", "ceil"):
        case((1, 1, 4, 6), "exact ties", nearest_mode=nm, scales=[1.0, 1.0, 2.0, 0.5])
        case((1, 1, 4, 5), nearest_mode=nm, coordinate_transformation_mode="asymmetric", scales=[1.0, 1.0, 1.25, 0.75])
        case((1, 1, 3, 4), nearest_mode=nm, coordinate_transformation_mode="align_corners", sizes=[1, 1, 5, 7])
        case((1, 1, 4, 6), "exact ties", nearest_mode=nm, coordinate_transformation_mode="tf_half_pixel_for_nn",
             scales=[1.0, 1.0, 2.0, 0.5])

    # cubic: the coefficient and exclude_outside, up and down
    for a, ex, shape, kw in ((-0.5, False, (1, 1, 4, 5), dict(scales=[1.0, 1.0, 2.0, 1.5])),
                             (-0.5, True, (1, 1, 4, 5), dict(scales=[1.0, 1.0, 2.0, 1.5])),
                             (-0.75, True, (1, 1, 4, 5), dict(scales=[1.0, 1.0, 2.0, 1.5])),
                             (-0.5, True, (1, 1, 5, 6), dict(sizes=[1, 1, 3, 4])),
                             (-0.75, True, (1, 1, 5, 6), dict(sizes=[1, 1, 3, 4]))):
        case(shape, mode="cubic", cubic_coeff_a=a, exclude_outside=ex, **kw)
    case((1, 1, 4, 5), mode="cubic", cubic_coeff_a=-0.5, exclude_outside=True,
         coordinate_transformation_mode="align_corners", sizes=[1, 1, 7, 3])

    # tf_crop_and_resize: an roi wholly inside, an output of length 1, cropping the channels
    for mode in ("nearest", "linear", "cubic"):
        case((1, 1, 5, 6), mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
             roi=[0.0, 0.0, 0.25, 0.125, 1.0, 1.0, 0.75, 0.625], sizes=[1, 1, 4, 3])
        case((1, 1, 4, 5), "output height 1", mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
             roi=[0.0, 0.0, 0.25, -0.5, 1.0, 1.0, 0.5, 1.5], extrapolation_value=-3.0, sizes=[1, 1, 1, 6])
    case((1, 4, 3, 3), "crop and resize the channel axis", mode="linear",
         coordinate_transformation_mode="tf_crop_and_resize", roi=[0.0, 0.25, 0.0, 0.0, 1.0, 1.25, 1.0, 1.0],
         extrapolation_value=7.0, sizes=[1, 3, 3, 3])

    # pytorch_half_pixel to length 1: source -0.5 in the reference (0 in the spec and onnxruntime)
    for mode in ("nearest", "linear", "cubic"):
        case((1, 1, 4, 5), "output height 1: source -0.5 as in the reference, 0 in the spec", mode=mode,
             coordinate_transformation_mode="pytorch_half_pixel", sizes=[1, 1, 1, 3])

    # ranks 1, 3 and 5, and resizing the batch and channel axes
    case((5,), "rank 1", mode="linear", sizes=[8])
    case((6,), "rank 1", mode="cubic", scales=[0.7])
    case((2, 3, 5), "rank 3, every dim", mode="linear", coordinate_transformation_mode="align_corners",
         sizes=[3, 2, 7])
    case((1, 1, 2, 3, 4), "rank 5, three dims", mode="linear", scales=[1.0, 1.0, 2.0, 1.5, 0.5])
    case((1, 1, 3, 2, 4), "rank 5, three dims", mode="cubic", coordinate_transformation_mode="asymmetric",
         sizes=[1, 1, 5, 3, 3])
    case((1, 1, 2, 3, 4), "rank 5, three dims", mode="nearest", nearest_mode="round_prefer_ceil",
         scales=[1.0, 1.0, 1.7, 2.0, 0.5])
    case((1, 2, 3, 3), "the channel axis", mode="linear", scales=[1.0, 2.0, 1.0, 1.0])
    case((2, 2, 3, 3), "the batch axis", coordinate_transformation_mode="asymmetric", sizes=[3, 2, 3, 3])
    case((2, 3, 4, 4), "every axis", mode="linear", coordinate_transformation_mode="asymmetric",
         scales=[1.5, 0.6666667, 1.25, 0.5])

    # cross-checks with torch where the two agree (the reference's reading of the modes)
    checks = [
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel", sizes=[1, 2, 7, 3]),
         dict(mode="bilinear", size=[7, 3], align_corners=False)),
        (dict(mode="linear", coordinate_transformation_mode="align_corners", sizes=[1, 2, 7, 3]),
         dict(mode="bilinear", size=[7, 3], align_corners=True)),
        (dict(mode="cubic", sizes=[1, 2, 7, 3]), dict(mode="bicubic", size=[7, 3], align_corners=False)),
        (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor", sizes=[1, 2, 8, 3]),
         dict(mode="nearest", size=[8, 3])),
    ]
    x = b.rng.uniform(-2, 2, size=(1, 2, 4, 5)).astype(np.float32)
    for onnx_kw, torch_kw in checks:
        y, t = onnx_resize(x, **onnx_kw), interpolate_expected(x, **torch_kw).numpy()
        if not np.allclose(y, t, rtol=1e-5, atol=1e-5):
            sys.exit(f"resize {onnx_kw} and torch {torch_kw} disagree:\n{y}\n{t}")


# ---- gradients ----


class ResampleGradBattery(GradBattery):
    def _emit(self, desc, op, x, out_shape, attrs):
        """The lines of one gradient case; returns its weight r."""
        k = self.n_cases = getattr(self, "n_cases", 0) + 1
        self.lines.append(f"# {desc}")
        self.lines.append(f"param c{k}_x : f32{list(x.shape)}")
        self.inputs[f"c{k}_x"] = np.asarray(x, dtype=np.float32)
        r = self.loss(k, op, [f"c{k}_x"], out_shape, attrs)
        self.lines.append(f"c{k}_gx = grad(c{k}_l, c{k}_x)")
        return k, r

    def float32_case(self, desc, op, x, fn, **attrs):
        """torch autograd in float32 (the nearest modes: their indices are float
        arithmetic), after checking that it is the adjoint of torch's forward."""
        xt = torch.from_numpy(np.asarray(x, dtype=np.float32)).requires_grad_(True)
        y = fn(xt)
        k, r = self._emit(desc, op, x, y.shape, attrs)
        (g,) = torch.autograd.grad((y * torch.from_numpy(r)).sum(), [xt])
        jac, _ = jacobian(lambda v: fn(torch.from_numpy(v)).double().numpy(), x)
        if not np.allclose(g.numpy(), (jac.T @ r.ravel().astype(np.float64)).reshape(x.shape), rtol=1e-5, atol=1e-6):
            sys.exit(f"{desc}: torch's backward is not the adjoint of its forward")
        self.expected[f"c{k}_gx"] = g.detach().numpy().astype(np.float32)

    def affine_case(self, desc, op, x, fn, **attrs):
        """fn (numpy to numpy) is affine in x: the gradient is J^T r exactly."""
        jac, base = jacobian(fn, x)
        k, r = self._emit(desc, op, x, base.shape, attrs)
        self.expected[f"c{k}_gx"] = (jac.T @ r.ravel().astype(np.float64)).reshape(x.shape).astype(np.float32)


def jacobian(fn, x):
    """J and fn(0) for fn affine in x: J's column j is fn(e_j) - fn(0), evaluated on
    float32 inputs; stops if fn(x) is not J x + fn(0)."""
    base = np.asarray(fn(np.zeros_like(x)), dtype=np.float64)
    cols = []
    for j in range(x.size):
        e = np.zeros(x.size, dtype=np.float32)
        e[j] = 1
        cols.append((np.asarray(fn(e.reshape(x.shape)), dtype=np.float64) - base).ravel())
    jac = np.stack(cols, axis=1)
    if not np.allclose(jac @ x.ravel().astype(np.float64) + base.ravel(), np.ravel(fn(x)), rtol=1e-5, atol=1e-5):
        sys.exit("the op is not affine in x")
    return jac, base


def gen_resample_grad(b):
    def interp(mode, shape, size=None, scale_factor=None, align_corners=None, recompute_scale_factor=None):
        x = b.rand(*shape)
        kw = dict(size=size, scale_factor=scale_factor, align_corners=align_corners,
                  recompute_scale_factor=recompute_scale_factor)
        desc = f"interpolate {mode} x={list(shape)} " + " ".join(f"{k}={v}" for k, v in kw.items() if v is not None)
        attrs = interp_attrs(mode, **kw)

        def fn(v):
            return F.interpolate(v, mode=mode, **kw)

        if mode.startswith("nearest"):
            b.float32_case(desc, "interpolate", x, fn, **attrs)
        else:
            b.grad_case(desc, "interpolate", [("x", x)], fn, **attrs)

    for mode in ("nearest", "nearest-exact"):
        interp(mode, (1, 2, 5), size=8)
        interp(mode, (1, 2, 5), scale_factor=1.7)
        interp(mode, (1, 1, 9), scale_factor=0.6)
        interp(mode, (1, 2, 4, 5), scale_factor=[2.5, 0.6], recompute_scale_factor=True)
        interp(mode, (1, 1, 2, 3, 4), size=[3, 5, 2])
    # torch 1.13's nearest backward (and its channels-last forward, which a 4-D or 5-D
    # input with one channel takes) copies a dim when out = in and halves the index
    # when out = 2 in, whatever the factor; its contiguous forward does not. kiln's
    # gradient is the adjoint of its forward, so these two take J^T r from the forward.
    for shape, factor in (((1, 2, 5), 1.1), ((1, 2, 5), 2.1)):
        x = b.rand(*shape)
        b.affine_case(f"interpolate nearest x={list(shape)} scale_factor={factor} (the adjoint of the forward; "
                      "torch's backward differs)", "interpolate", x,
                      lambda v, f=factor: F.interpolate(torch.from_numpy(v), scale_factor=f).double().numpy(),
                      scale_factor=factor)
    for ac in (None, True):
        interp("linear", (1, 2, 5), size=8, align_corners=ac)
        interp("linear", (1, 2, 7), scale_factor=0.6, align_corners=ac)
        interp("bilinear", (1, 2, 4, 5), size=[7, 3], align_corners=ac)
        interp("bicubic", (1, 1, 4, 5), size=[7, 3], align_corners=ac)
        interp("trilinear", (1, 1, 2, 3, 4), size=[3, 5, 2], align_corners=ac)
    interp("linear", (1, 2, 5), scale_factor=1.1)
    interp("bilinear", (1, 2, 4, 5), scale_factor=[1.5, 0.6])
    interp("bilinear", (1, 2, 4, 5), scale_factor=[1.5, 0.6], recompute_scale_factor=True)
    interp("bicubic", (1, 1, 4, 5), scale_factor=1.7)
    interp("bicubic", (1, 1, 5, 6), scale_factor=0.6)
    interp("trilinear", (1, 1, 3, 4, 5), scale_factor=[2.0, 1.7, 0.6])
    interp("area", (1, 2, 7), size=3)
    interp("area", (1, 2, 3), size=5)
    interp("area", (1, 2, 5, 7), size=[3, 4])
    interp("area", (1, 1, 4, 5, 3), scale_factor=[0.75, 0.5, 2.0])

    def resize(shape, **kw):
        x = b.rand(*shape)
        attrs = resize_attrs(**kw)
        desc = resize_desc(shape, attrs)
        checked_resize(desc, x, **kw)
        b.affine_case(desc, "resize", x, lambda v: onnx_resize(v, **kw), **attrs)

    resize((1, 1, 3, 4), scales=[1.0, 1.0, 2.0, 1.7])
    resize((1, 1, 3, 4), nearest_mode="ceil", coordinate_transformation_mode="asymmetric", sizes=[1, 1, 5, 3])
    resize((1, 1, 3, 4), mode="linear", scales=[1.0, 1.0, 1.7, 0.6])
    resize((1, 1, 3, 4), mode="linear", coordinate_transformation_mode="align_corners", sizes=[1, 1, 5, 7])
    resize((1, 1, 3, 4), mode="linear", coordinate_transformation_mode="pytorch_half_pixel", sizes=[1, 1, 2, 6])
    resize((1, 1, 3, 4), mode="cubic", scales=[1.0, 1.0, 2.0, 1.5])
    resize((1, 1, 3, 4), mode="cubic", cubic_coeff_a=-0.5, exclude_outside=True, sizes=[1, 1, 5, 3])
    resize((1, 1, 3, 4), mode="cubic", coordinate_transformation_mode="asymmetric", scales=[1.0, 1.0, 0.7, 1.7])
    resize((1, 1, 3, 4), mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
           roi=[0.0, 0.0, -0.25, 0.125, 1.0, 1.0, 0.75, 1.375], extrapolation_value=2.5, sizes=[1, 1, 4, 5])
    resize((1, 1, 3, 4), mode="cubic", coordinate_transformation_mode="tf_crop_and_resize",
           roi=[0.0, 0.0, 0.25, -0.5, 1.0, 1.0, 1.25, 0.75], extrapolation_value=-1.0, sizes=[1, 1, 3, 4])
    resize((1, 1, 3, 4), nearest_mode="round_prefer_ceil", coordinate_transformation_mode="tf_half_pixel_for_nn",
           sizes=[1, 1, 2, 7])
    resize((1, 2, 2, 3), mode="linear", scales=[1.0, 1.5, 2.0, 1.0])


BATTERIES = {"interpolate": (Battery, gen_interpolate), "resize": (Battery, gen_resize),
             "resample_grad": (ResampleGradBattery, gen_resample_grad)}


def main(argv):
    names = argv[1:] or list(BATTERIES)
    for name in names:
        cls, gen = BATTERIES[name]
        b = cls(name, zlib.crc32(name.encode()))
        gen(b)
        b.write()
        print(f"{name}: {len(b.expected)} cases")


if __name__ == "__main__":
    main(sys.argv)
