#!/usr/bin/python3
"""Writes the ONNX models of tests/onnx/hostile/ (committed), whose names are
hostile to generated source:
  - injection.onnx: a Relu whose graph, node and output names end a comment of the
    generated C and define a constructor that prints INJECTED when the compiled
    model is loaded;
  - odd_names.onnx: a Relu and a Neg whose output names hold a line break, quotes,
    a backslash, a trigraph, `*/` and non-ASCII bytes.
kiln must compile both to models that print nothing, compute what they say and keep
the output names byte for byte. The protobuf is written by hand, so that no onnx
module is needed."""
import os

INJECT = "m */ __attribute__((constructor)) static void INJECTED(void){__builtin_puts(__func__);} /*"
INJECT_QUOTED = 'y */ __attribute__((constructor)) static void p(void){__builtin_puts("INJECTED");} /*'
ODD = 'z "line\nbreak" \\ ??/ */ \u00e9'


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, value):
    """A varint (int) or length-delimited (bytes, str) field."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def f32(name, dims):
    shape = b"".join(field(1, field(1, d)) for d in dims)  # TensorShapeProto.dim.dim_value
    tensor = field(1, 1) + field(2, shape)  # elem_type FLOAT, shape
    return field(1, name) + field(2, field(1, tensor))  # ValueInfoProto: name, type.tensor_type


def node(op, inputs, outputs, name):
    return b"".join([*(field(1, i) for i in inputs), *(field(2, o) for o in outputs), field(3, name), field(4, op)])


def save(name, graph_name, nodes, outputs):
    graph = b"".join([*(field(1, n) for n in nodes), field(2, graph_name), field(11, f32("x", [2, 3])),
                      *(field(12, f32(o, [2, 3])) for o in outputs)])
    model = field(1, 7) + field(2, "gen_hostile_names") + field(7, graph) + field(8, field(1, "") + field(2, 13))
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile")
    os.makedirs(here, exist_ok=True)
    with open(os.path.join(here, name), "wb") as f:
        f.write(model)


save("injection.onnx", INJECT, [node("Relu", ["x"], [INJECT_QUOTED], INJECT)], [INJECT_QUOTED])
save("odd_names.onnx", "odd", [node("Relu", ["x"], ["y \\ \u00e9"], ODD), node("Neg", ["x"], [ODD], "neg")],
     ["y \\ \u00e9", ODD])
