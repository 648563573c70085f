#!/usr/bin/python3
"""Writes models of the default domain's opsets 18 and 20 that use what those opsets
changed in the ops kiln imports, with their outputs computed by ONNX Runtime, into
tests/onnx/models/ in check_models.sh's layout (MODEL.onnx, MODEL_input.npy,
MODEL_expected.npy; the one output y every result flattened and joined):

  opset18  Split by num_outputs, unevenly (8 into 3, 3 and 2); Pad with axes;
           Resize with axes, antialias and keep_aspect_ratio_policy at their
           defaults; ReduceMean with axes as an input
  opset20  Gelu exact and with the tanh approximation; AveragePool with dilations
           of 1 (opset 19's); Cast with saturate (opset 19's)

  /path/to/venv/bin/python tests/onnx/gen_opset20.py   # with onnx and onnxruntime
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
rng = np.random.default_rng(18)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def write(name, opset, nodes, results, inits, x):
    """Joins the results, flattened, into y, and saves the model and ORT's y."""
    nodes = list(nodes)
    inits = list(inits) + [ints("flat", [-1])]
    for r in results:
        nodes.append(helper.make_node("Reshape", [r, "flat"], [r + "_flat"]))
    nodes.append(helper.make_node("Concat", [r + "_flat" for r in results], ["y"], axis=0))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="gen_opset20")
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    path = os.path.join(OUT, name + ".onnx")
    onnx.save(model, path)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.save(os.path.join(OUT, name + "_input.npy"), x)
    np.save(os.path.join(OUT, name + "_expected.npy"), y.astype(np.float32))
    print(name, y.shape)


def main():
    x = rng.uniform(-2, 2, size=(2, 3, 6, 8)).astype(np.float32)
    write("opset18", 18, [
        helper.make_node("Split", ["x"], ["s0", "s1", "s2"], axis=3, num_outputs=3),
        helper.make_node("Pad", ["s2", "pads", "value", "pad_axes"], ["padded"], mode="constant"),
        helper.make_node("Resize", ["s0", "", "scales"], ["resized"], axes=[3, 2], mode="linear",
                         antialias=0, keep_aspect_ratio_policy="stretch"),
        helper.make_node("Resize", ["s1", "", "", "sizes"], ["sized"], axes=[-1], mode="nearest"),
        helper.make_node("ReduceMean", ["x", "mean_axes"], ["mean"], keepdims=0),
    ], ["s0", "s1", "padded", "resized", "sized", "mean"], [
        ints("pads", [1, 0, 2, 3]), numpy_helper.from_array(np.array(0.5, dtype=np.float32), "value"),
        ints("pad_axes", [-2, 1]),
        numpy_helper.from_array(np.array([2, 1.5], dtype=np.float32), "scales"),
        ints("sizes", [5]), ints("mean_axes", [1, -1]),
    ], x)
    write("opset20", 20, [
        helper.make_node("Gelu", ["x"], ["exact"]),
        helper.make_node("Gelu", ["x"], ["tanh"], approximate="tanh"),
        helper.make_node("AveragePool", ["x"], ["pooled"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         dilations=[1, 1], count_include_pad=0),
        helper.make_node("Cast", ["x"], ["cast"], to=TensorProto.FLOAT, saturate=1),
    ], ["exact", "tanh", "pooled", "cast"], [], x)


if __name__ == "__main__":
    main()
