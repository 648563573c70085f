#!/usr/bin/python3
"""Writes a model whose input's batch dim has neither a size nor a name, as some
exporters leave it, with its output for a batch of 3 computed by ONNX Runtime, into
tests/onnx/models/ in check_models.sh's layout (unnamed_batch.onnx, _input.npy,
_expected.npy): Conv, Relu, GlobalAveragePool, Flatten and Gemm, x of [?, 3, 8, 8].
kiln calls that dim N (--dim 'N<=BOUND' keeps it symbolic, --dim N=SIZE fixes it).

  /path/to/venv/bin/python tests/onnx/gen_unnamed_batch.py   # with onnx and onnxruntime
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def main():
    rng = np.random.default_rng(23)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "unnamed_batch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="gen_unnamed_batch")
    onnx.checker.check_model(model)
    assert not model.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_param")
    path = os.path.join(OUT, "unnamed_batch.onnx")
    onnx.save(model, path)
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.save(os.path.join(OUT, "unnamed_batch_input.npy"), x)
    np.save(os.path.join(OUT, "unnamed_batch_expected.npy"), y.astype(np.float32))


if __name__ == "__main__":
    main()
