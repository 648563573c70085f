#!/usr/bin/python3
"""Writes `extremes`, a model of ops kiln imports as maps onto its other ops, at
the values where such a map could go wrong, with its output computed by ONNX
Runtime, into tests/onnx/models/ in check_models.sh's layout (gen_opset20.write's):
x holds small integers and zeros, and x / 0 infinities of both signs and NaNs.

  ArgMin (argmax of -x) of x, where ties are many, with and without
  select_last_index and keepdims; and of x / 0 with its NaNs made 0, where the
  infinities tie (ONNX Runtime passes over a NaN after the first element, where
  kiln, NumPy and PyTorch take the first NaN as the least)
  IsInf (with each of detect_negative and detect_positive off, and both) and IsNaN
  of x / 0
  ThresholdedRelu and Shrink of x, whose integers meet alpha and lambd, and of
  x / 0 (a NaN gives 0)

  /path/to/venv/bin/python tests/onnx/gen_extremes.py   # with onnx and onnxruntime
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from gen_opset20 import write


def main():
    x = np.random.default_rng(23).integers(-2, 3, size=(2, 3, 4)).astype(np.float32)
    zero = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "zero")
    tests = [("min", "ArgMin", "x", {"axis": 1}), ("min_last", "ArgMin", "x", {"axis": 1, "select_last_index": 1}),
             ("min_flat", "ArgMin", "x", {"axis": -1, "keepdims": 0}), ("min_d", "ArgMin", "finite_nan", {"axis": 1}),
             ("inf", "IsInf", "d", {}), ("inf_pos", "IsInf", "d", {"detect_negative": 0}),
             ("inf_neg", "IsInf", "d", {"detect_positive": 0}),
             ("inf_none", "IsInf", "d", {"detect_negative": 0, "detect_positive": 0}), ("nan", "IsNaN", "d", {}),
             ("thresholded", "ThresholdedRelu", "x", {}), ("thresholded_d", "ThresholdedRelu", "d", {"alpha": -1.0}),
             ("shrink", "Shrink", "x", {"lambd": 1.0, "bias": 0.5}), ("shrink_d", "Shrink", "d", {"bias": 2.0})]
    nodes = [helper.make_node("Div", ["x", "zero"], ["d"]), helper.make_node("IsNaN", ["d"], ["d_nan"]),
             helper.make_node("Where", ["d_nan", "zero", "d"], ["finite_nan"])]
    nodes += [helper.make_node(op, [source], [name], **attrs) for name, op, source, attrs in tests]
    nodes += [helper.make_node("Cast", [name], [name + "_f"], to=TensorProto.FLOAT) for name, _, _, _ in tests]
    write("extremes", 13, nodes, [name + "_f" for name, _, _, _ in tests], [zero], x)


if __name__ == "__main__":
    main()
