#!/usr/bin/python3
"""Writes recurrent ONNX models whose constant sequence_lens end some of the batch's
sequences early, with their outputs computed by ONNX Runtime (the reference
implementation of the recurrent ops; PyTorch does not export sequence_lens), into
tests/onnx/models/ in check_models.sh's layout: MODEL.onnx, MODEL_input.npy and
MODEL_expected.npy, the one output y being Y, Y_h (and Y_c) flattened and joined.

  /path/to/venv/bin/python tests/onnx/gen_sequence_lens.py   # with onnx and onnxruntime
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
rng = np.random.default_rng(20)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def rand(*shape):
    return rng.uniform(-0.8, 0.8, size=shape).astype(np.float32)


def write(name, cell, attrs, x, seq_lens, hidden, n_dirs, states):
    """cell(X, W, R, B, sequence_lens, initial_h[, initial_c]) -> Y, Y_h[, Y_c]."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[cell]
    in_size = x.shape[2]
    inits = [init("W", rand(n_dirs, gates * hidden, in_size)), init("R", rand(n_dirs, gates * hidden, hidden)),
             init("B", rand(n_dirs, 2 * gates * hidden)), init("lens", np.array(seq_lens, dtype=np.int32))]
    state_shape = (x.shape[0], n_dirs, hidden) if attrs.get("layout") else (n_dirs, x.shape[1], hidden)
    inputs = ["x", "W", "R", "B", "lens"]
    for s in states:
        inits.append(init(s, rand(*state_shape)))
        inputs.append(s)
    outs = ["Y", "Y_h", "Y_c"][:2 + (cell == "LSTM")]
    nodes = [helper.make_node(cell, inputs, outs, hidden_size=hidden, **attrs)]
    inits.append(init("flat", np.array([-1], dtype=np.int64)))
    for o in outs:
        nodes.append(helper.make_node("Reshape", [o, "flat"], [o + "_flat"]))
    nodes.append(helper.make_node("Concat", [o + "_flat" for o in outs], ["y"], axis=0))
    seq = x.shape[1] if attrs.get("layout") else x.shape[0]
    state = n_dirs * x.shape[1 - bool(attrs.get("layout"))] * hidden
    total = seq * state + state * (len(outs) - 1)
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [total])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="gen_sequence_lens")
    onnx.checker.check_model(model)
    path = os.path.join(OUT, name + ".onnx")
    onnx.save(model, path)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.save(os.path.join(OUT, name + "_input.npy"), x)
    np.save(os.path.join(OUT, name + "_expected.npy"), y.astype(np.float32))
    print(name, y.shape)


def main():
    # both directions: the reverse pass starts at each sequence's own last step
    write("lstm_seq_lens", "LSTM", {"direction": "bidirectional"}, rand(5, 3, 4), [5, 2, 3], 6, 2,
          ["initial_h", "initial_c"])
    # reverse, one sequence a single step long (ONNX Runtime has no batch-first GRU)
    write("gru_seq_lens", "GRU", {"direction": "reverse", "linear_before_reset": 1},
          rand(4, 2, 3), [1, 4], 5, 1, ["initial_h"])
    write("rnn_seq_lens", "RNN", {"direction": "forward"}, rand(6, 4, 3), [6, 3, 1, 4], 4, 1, [])


if __name__ == "__main__":
    main()
