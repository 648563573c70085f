#!/usr/bin/python3
"""Writes the hostile and edge-case ONNX files of tests/onnx/malformed/ (committed):
each must make `kiln import` fail with exit status 1, the message that
tests/onnx/malformed/expected.txt gives for it, and no output file; external_ok.onnx
(with its data in external_ok.bin) must import. Uses Debian's python3-onnx (1.12)."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "malformed")
os.makedirs(here, exist_ok=True)


def model(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="gen_malformed")


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def save(m, name):
    with open(os.path.join(here, name), "wb") as f:
        f.write(m.SerializeToString())


relu = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [2, 3])], [f32("y", [2, 3])])
good = relu.SerializeToString()
open(os.path.join(here, "truncated.onnx"), "wb").write(good[: len(good) // 2])
open(os.path.join(here, "not_protobuf.onnx"), "wb").write(b"this is not a protobuf message\n")
# field 7 (graph) written as a varint instead of a length-delimited message
open(os.path.join(here, "wrong_field_type.onnx"), "wb").write(bytes([0x08, 0x07, 0x38, 0x01]))

w = TensorProto()
w.name, w.data_type = "w", TensorProto.FLOAT
w.dims.extend([2, 3])
w.raw_data = b"\0" * 8  # 24 bytes needed
save(model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [2, 3])], [f32("y", [2, 3])], [w]),
     "initializer_size.onnx")

w = TensorProto()
w.name, w.data_type = "w", TensorProto.FLOAT
w.dims.extend([2, 3])
w.float_data.extend([1.0] * 5)  # 5 of 6
save(model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [2, 3])], [f32("y", [2, 3])], [w]),
     "initializer_count.onnx")

big = TensorProto()
big.name, big.data_type = "w", TensorProto.FLOAT
big.dims.extend([1 << 40, 1 << 40])
save(model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [2, 3])], [f32("y", [2, 3])], [big]),
     "dims_overflow.onnx")


def external(location, name):
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.extend([2, 3])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "24")):
        e = t.external_data.add()
        e.key, e.value = k, v
    save(model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [2, 3])], [f32("y", [2, 3])],
               [t]), name)


external("missing.bin", "external_missing.onnx")
external("../../../etc/passwd", "external_escape.onnx")
external("/etc/passwd", "external_absolute.onnx")
# a ".." that would land back inside is refused too: no ".." component at all
external("sub/../external_ok.bin", "external_dotdot.onnx")
# check_malformed.sh makes data/ at test time: a directory (which must work), then a
# symbolic link to one (which must not); and external_ok.bin a link to a file outside
external("data/external_ok.bin", "external_subdir.onnx")
external("external_ok.bin", "external_ok.onnx")
np.arange(6, dtype="<f4").tofile(os.path.join(here, "external_ok.bin"))
np.save(os.path.join(here, "external_ok_input.npy"), np.ones((2, 3), "<f4"))
np.save(os.path.join(here, "external_ok_expected.npy"), np.arange(6, dtype="<f4").reshape(2, 3) + 1)

save(model([helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second")],
           [f32("x", [2])], [f32("a", [2])]), "cycle.onnx")
save(model([helper.make_node("Relu", ["nope"], ["y"], name="r")], [f32("x", [2])], [f32("y", [2])]), "undefined.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r1"), helper.make_node("Relu", ["x"], ["y"], name="r2")],
           [f32("x", [2])], [f32("y", [2])]), "defined_twice.onnx")
save(model([helper.make_node("Mod", ["x", "x"], ["a"], name="mod"),
            helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top"),
            helper.make_node("Relu", ["x"], ["r"], name="ok"),
            helper.make_node("FancyOp", ["x"], ["y"], name="custom", domain="com.example")],
           [f32("x", [2, 3])], [f32("y", [2, 3])]), "unsupported.onnx")
save(model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
           [f32("x", [2, 3]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])], [f32("y", [3, 2])]),
     "unbound_shape.onnx")
np.save(os.path.join(here, "unbound_shape_bind.npy"), np.array([3, 2], "<f4"))
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[1.0, 1.0])],
           [f32("x", [1, 1, 4, 4]), f32("w", [1, 1, 3, 3])], [f32("y", [1, 1, 2, 2])]), "wrong_attr_type.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r", fancy=3)], [f32("x", [2])], [f32("y", [2])]),
     "unknown_attr.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", ["N", 3])], [f32("y", ["N", 3])]),
     "symbolic_dim.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [None, 3])], [f32("y", [None, 3])]),
     "missing_dim.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [3, None])], [f32("y", [3, None])]),
     "missing_inner_dim.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", None)], [f32("y", None)]),
     "no_shape.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [2, 3])], [f32("y", [3, 2])]),
     "output_type.onnx")
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
           [f32("x", [1, 2, 4, 4]), f32("w", [1, 3, 3, 3])], [f32("y", [1, 1, 2, 2])]), "shape_error.onnx")
# Shape arithmetic on hostile attribute values (checked arithmetic, ir/ir.h ck_*): each
# once overflowed int64, giving a crash, a negative dim or a wrapped plausible shape.
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1 << 62, 1 << 62, 0, 0])],
           [f32("x", [1, 2, 5, 5]), f32("w", [3, 2, 3, 3])], [f32("y", [1, 3, 3, 3])]), "hostile_conv_pads.onnx")
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1 << 40, 1 << 40, 0, 0])],
           [f32("x", [1, 2, 5, 5]), f32("w", [3, 2, 3, 3])], [f32("y", [1, 3, 3, 3])]), "hostile_conv_pads_result.onnx")
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[1 << 62, 1 << 62])],
           [f32("x", [1, 2, 5, 5]), f32("w", [3, 2, 3, 3])], [f32("y", [1, 3, 3, 3])]), "hostile_conv_dilations.onnx")
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[1 << 40, 1], auto_pad="SAME_UPPER")],
           [f32("x", [1, 1, 5, 5]), f32("w", [1, 1, 1 << 23 | 1, 1])], [f32("y", [1, 1, 5, 5])]),
     "hostile_conv_same_extent.onnx")
save(model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convt", strides=[(1 << 63) - 1] * 2,
                             output_padding=[5, 5])],
           [f32("x", [1, 2, 3, 3]), f32("w", [2, 2, 3, 3])], [f32("y", [1, 2, 6, 6])]),
     "hostile_conv_transpose_stride.onnx")
save(model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convt", strides=[1 << 40, 1],
                             auto_pad="SAME_UPPER")],
           [f32("x", [1, 1, 1 << 23 | 1, 1]), f32("w", [1, 1, 1, 1])], [f32("y", [1, 1, 1, 1])]),
     "hostile_conv_transpose_same.onnx")
save(model([helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[3, 3], strides=[1, 1],
                             dilations=[(1 << 63) - 1, 1])],
           [f32("x", [1, 1, 5, 5])], [f32("y", [1, 1, 3, 3])]), "hostile_max_pool_dilations.onnx")
save(model([helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")], [f32("x", [2, 3])], [f32("y", [2, 3])],
           [numpy_helper.from_array(np.array([1 << 62, 4], dtype=np.int64), "reps")]), "hostile_tile_repeats.onnx")
save(model([helper.make_node("Range", ["s", "l", "d"], ["r"], name="range"),
            helper.make_node("Reshape", ["x", "r"], ["y"], name="reshape")], [f32("x", [2, 3])], [f32("y", [2, 3])],
           [numpy_helper.from_array(np.array((1 << 63) - 1000, dtype=np.int64), "s"),
            numpy_helper.from_array(np.array((1 << 63) - 1, dtype=np.int64), "l"),
            numpy_helper.from_array(np.array(1, dtype=np.int64), "d")]), "hostile_range_overflow.onnx")
save(model([helper.make_node("Range", ["s", "l", "d"], ["r"], name="range"),
            helper.make_node("Reshape", ["x", "r"], ["y"], name="reshape")], [f32("x", [2, 3])], [f32("y", [2, 3])],
           [numpy_helper.from_array(np.array(np.nan, dtype=np.float32), "s"),
            numpy_helper.from_array(np.array(4, dtype=np.float32), "l"),
            numpy_helper.from_array(np.array(1, dtype=np.float32), "d")]), "hostile_range_nan.onnx")
save(model([helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=1 << 32)], [f32("x", [1, 4, 2, 2])],
           [f32("y", [1, 1, 4, 4])]), "hostile_depth_to_space_blocksize.onnx")
save(model([helper.make_node("Split", ["x", "split"], ["a", "b"], name="split", axis=0)], [f32("x", [4])],
           [f32("a", [2]), f32("b", [2])],
           [numpy_helper.from_array(np.array([(1 << 63) - 1, (1 << 63) - 1], dtype=np.int64), "split")]),
     "hostile_split_sizes.onnx")
save(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[])],
           [f32("x", [1, 2, 5, 5]), f32("w", [3, 2, 3, 3])], [f32("y", [1, 3, 3, 3])]), "hostile_conv_pads_empty.onnx")
save(model([helper.make_node("Reshape", ["c", "c"], ["y"], name="reshape")], [f32("x", [2])], [f32("y", [2])],
           [numpy_helper.from_array(np.array([1 << 19, 1 << 19, 4], dtype=np.int64), "c")]),
     "hostile_reshape_const_shape.onnx")
# a recurrent layer unrolled over a sequence far too long; an activation kiln lacks
rnn_weights = [numpy_helper.from_array(np.zeros((1, 4, 2), np.float32), "w"),
               numpy_helper.from_array(np.zeros((1, 4, 4), np.float32), "r")]
save(model([helper.make_node("RNN", ["x", "w", "r"], ["y"], name="rnn", hidden_size=4)],
           [f32("x", [100000, 1, 2])], [f32("y", [100000, 1, 1, 4])], rnn_weights), "hostile_rnn_steps.onnx")
save(model([helper.make_node("RNN", ["x", "w", "r"], ["y"], name="rnn", hidden_size=4, activations=["Elu"])],
           [f32("x", [3, 1, 2])], [f32("y", [3, 1, 1, 4])], rnn_weights), "rnn_activation.onnx")
# sequence_lens not one a batch entry, or outside 1 to the sequence's length; W absent;
# LSTM's input_forget
for name, lens in [("rnn_seq_lens_count.onnx", [3, 3]), ("rnn_seq_lens_range.onnx", [0])]:
    save(model([helper.make_node("RNN", ["x", "w", "r", "", "lens"], ["y"], name="rnn", hidden_size=4)],
               [f32("x", [3, 1, 2])], [f32("y", [3, 1, 1, 4])],
               rnn_weights + [numpy_helper.from_array(np.array(lens, np.int32), "lens")]), name)
save(model([helper.make_node("RNN", ["x", "", "r"], ["y"], name="rnn", hidden_size=4)],
           [f32("x", [3, 1, 2])], [f32("y", [3, 1, 1, 4])], rnn_weights[1:]), "rnn_no_w.onnx")
save(model([helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="lstm", hidden_size=1, input_forget=1)],
           [f32("x", [3, 1, 2])], [f32("y", [3, 1, 1, 1])], rnn_weights), "lstm_input_forget.onnx")
# what opsets 18 to 20 added that kiln's ops lack, and their counts that disagree
save(model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", antialias=1, mode="linear")],
           [f32("x", [1, 1, 4, 4])], [f32("y", [1, 1, 2, 2])],
           [numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], dtype=np.float32), "scales")], opset=18),
     "resize_antialias.onnx")
save(model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize",
                             keep_aspect_ratio_policy="not_larger")],
           [f32("x", [1, 1, 4, 6])], [f32("y", [1, 1, 2, 3])],
           [numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.int64), "sizes")], opset=18),
     "resize_keep_aspect.onnx")
save(model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", axes=[2])],
           [f32("x", [1, 1, 4, 4])], [f32("y", [1, 1, 8, 8])],
           [numpy_helper.from_array(np.array([2, 2], dtype=np.float32), "scales")], opset=18),
     "resize_axes_count.onnx")
save(model([helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], dilations=[1, 2])],
           [f32("x", [1, 1, 5, 5])], [f32("y", [1, 1, 4, 3])], opset=19), "avg_pool_dilated.onnx")
save(model([helper.make_node("Split", ["x"], ["a", "b"], name="split", num_outputs=3)],
           [f32("x", [6])], [f32("a", [2]), f32("b", [2])], opset=18), "split_num_outputs.onnx")
save(model([helper.make_node("Split", ["x"], ["a", "b", "c"], name="split", num_outputs=3)],
           [f32("x", [4])], [f32("a", [2]), f32("b", [2]), f32("c", [0])], opset=18), "split_parts.onnx")
save(model([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], name="pad")],
           [f32("x", [2, 3])], [f32("y", [4, 3])],
           [numpy_helper.from_array(np.array([1, 0, 1, 0], dtype=np.int64), "pads"),
            numpy_helper.from_array(np.array([0, -2], dtype=np.int64), "axes")], opset=18), "pad_axes_twice.onnx")
save(model([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], name="pad")],
           [f32("x", [2, 3])], [f32("y", [3, 3])],
           [numpy_helper.from_array(np.array([1, 0], dtype=np.int64), "pads"),
            numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "axes")], opset=18), "pad_axes_count.onnx")
save(model([helper.make_node("Split", ["x", "split"], ["a", "b"], name="split", num_outputs=2)],
           [f32("x", [4])], [f32("a", [2]), f32("b", [2])],
           [numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "split")], opset=18), "split_both.onnx")
save(model([helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="resize", axes=[2, 3],
                             coordinate_transformation_mode="tf_crop_and_resize")],
           [f32("x", [1, 1, 4, 4])], [f32("y", [1, 1, 8, 8])],
           [numpy_helper.from_array(np.array([0, 0, 1, 1], dtype=np.float32), "roi"),
            numpy_helper.from_array(np.array([2, 2], dtype=np.float32), "scales")], opset=18),
     "resize_crop_axes.onnx")
save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [2])], [f32("y", [2])], opset=21),
     "opset_21.onnx")
save(model([helper.make_node("ArgMin", ["x"], ["y"], name="argmin")],
           [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 3])],
           [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 3])]), "argmin_int.onnx")
save(model([helper.make_node("Trilu", ["x"], ["y"], name="trilu")], [f32("x", [4])], [f32("y", [4])], opset=14),
     "trilu_rank_1.onnx")
save(model([helper.make_node("Hardmax", ["x"], ["y"], name="hardmax", axis=0)], [f32("x", [2, 3])],
           [f32("y", [2, 3])], opset=11), "hardmax_opset_11.onnx")
save(model([helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="nll", reduction="avg")],
           [f32("x", [2, 3]), helper.make_tensor_value_info("t", TensorProto.INT64, [2])], [f32("y", [])]),
     "nll_reduction.onnx")
save(model([helper.make_node("GatherElements", ["x", "i"], ["y"], name="picks", axis=1)],
           [f32("x", [2, 3]), helper.make_tensor_value_info("i", TensorProto.INT64, [3, 2])], [f32("y", [3, 2])]),
     "gather_elements_rows.onnx")
# must import: a Slice folded at import with a step of INT64_MAX takes one element
save(model([helper.make_node("Slice", ["c", "starts", "ends", "axes", "steps"], ["s"], name="slice"),
            helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], [f32("x", [2])], [f32("y", [2])],
           [numpy_helper.from_array(np.array([2, 3, 4, 5, 6], dtype=np.int64), "c"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "starts"),
            numpy_helper.from_array(np.array([5], dtype=np.int64), "ends"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array([(1 << 63) - 1], dtype=np.int64), "steps")]), "hostile_slice_step_ok.onnx")
print("wrote", here)
