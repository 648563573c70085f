#!/usr/bin/python3
"""The benchmark's networks in torch, and their ONNX exports, one per model and batch size.

    /usr/bin/python3 bench/export_models.py --models resnet50 --batch 8 --out DIR
    /usr/bin/python3 bench/export_models.py --out DIR      # bench.py's models, batch 1

Every engine of bench/bench.py runs the same network with the same weights: PyTorch
runs the torch network this file builds, and kiln, ONNX Runtime and OpenVINO read the
ONNX file it exports from that network. The models:

  small_cnn, resnet18, mobilenetv2   the example models: examples/gen_examples.py's
                                     torch networks with the values of kiln's
                                     initializers (the weights of examples/*.kiln)
  resnet50, efficientnet_b0,         torchvision's networks (Debian's
  mobilenet_v3_small, densenet121,   python3-torchvision), with torchvision's random
  vgg11                              initialization under a fixed seed (the last two
                                     only for bench/compile.py)

torchvision leaves batch norm the identity (weight 1, bias 0, mean 0, variance 1),
which would let a wrong batch norm pass the output checks, and makes MobileNetV2-like
networks output values near 1e-9. So, as gen_examples.py does for the example models,
every batch norm's weight is drawn from uniform(0.5, 1), its bias and running mean from
uniform(-0.1, 0.1) and its running variance from uniform(0.5, 1.5), from a seeded
generator: each of the four is exercised and the activations stay of order one.

For a model at batch B, `export` writes into the output folder

  NAME_bB.onnx    the network in eval mode, exported by torch.onnx (opset 13, input
                  "x" of shape [B, C, H, W], output "y", constants folded)
  NAME_bB_x.npy   its input: float32 drawn from a standard normal (seeded by the model
                  and the batch, so every run times the same numbers)

and returns both paths; bench.py's engines leave their outputs beside them, as
NAME_bB_ENGINE_y.npy (output_path). Nothing is downloaded: the weights are made here.
"""

import argparse
import os
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, EXAMPLES)
import gen_examples  # noqa: E402  (the example models, their weights, their torch networks)

SEED = 0
OPSET = 13


class Model:
    """A benchmark model: its input's shape without the batch, the runs to time at batch 1
    (0: compile times only, bench/compile.py), and how its torch network is made (a
    function of no arguments returning a float32 network in eval mode)."""

    def __init__(self, image_shape, iters, build):
        self.image_shape = image_shape
        self.iters = iters
        self.build = build


def example_network(name):
    """gen_examples' torch network for an example model, with kiln's param values."""
    import torch

    builder = {"small_cnn": gen_examples.small_cnn, "resnet18": gen_examples.resnet18,
               "mobilenetv2": gen_examples.mobilenetv2}[name]
    params = builder().params
    net = gen_examples.torch_models()[name]().eval()
    state = net.state_dict()
    for key, (shape, init) in params.items():
        state[key].copy_(torch.from_numpy(gen_examples.init_values(shape, init).astype(np.float32)))
    return net


def randomize_batch_norms(net, seed):
    """Gives every BatchNorm2d of net seeded values that make it more than the identity."""
    import torch

    rng = np.random.default_rng(seed)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            c = module.num_features
            for tensor, low, high in ((module.weight.data, 0.5, 1.0), (module.bias.data, -0.1, 0.1),
                                      (module.running_mean, -0.1, 0.1), (module.running_var, 0.5, 1.5)):
                tensor.copy_(torch.from_numpy(rng.uniform(low, high, c).astype(np.float32)))
    return net


def torchvision_network(name):
    """A torchvision network, randomly initialized under a fixed seed, in eval mode."""
    import torch
    import torchvision

    torch.manual_seed(SEED)
    net = getattr(torchvision.models, name)(weights=None)
    return randomize_batch_norms(net, zlib.crc32(name.encode())).eval()


MODELS = {
    "small_cnn": Model((3, 32, 32), 300, lambda: example_network("small_cnn")),
    "resnet18": Model((3, 224, 224), 20, lambda: example_network("resnet18")),
    "mobilenetv2": Model((3, 224, 224), 50, lambda: example_network("mobilenetv2")),
    "resnet50": Model((3, 224, 224), 10, lambda: torchvision_network("resnet50")),
    "efficientnet_b0": Model((3, 224, 224), 30, lambda: torchvision_network("efficientnet_b0")),
    "mobilenet_v3_small": Model((3, 224, 224), 100, lambda: torchvision_network("mobilenet_v3_small")),
    "densenet121": Model((3, 224, 224), 0, lambda: torchvision_network("densenet121")),
    "vgg11": Model((3, 224, 224), 0, lambda: torchvision_network("vgg11")),
}

# The models bench.py times (the others only compile: bench/compile.py).
TIMED = [name for name, model in MODELS.items() if model.iters > 0]

# The example models whose PyTorch output is checked against examples/NAME_expected.npy
# (computed in float64 from kiln's initializers) on examples/INPUT at batch 1.
EXAMPLE_INPUTS = {"small_cnn": "small_cnn_input.npy", "resnet18": "input_224.npy",
                  "mobilenetv2": "input_224.npy"}


def torch_network(name):
    """The float32 torch network of a benchmark model, in eval mode."""
    if name not in MODELS:
        raise ValueError("unknown model '%s' (%s)" % (name, ", ".join(MODELS)))
    return MODELS[name].build()


def file_paths(out_dir, name, batch):
    """(ONNX file, input file) of a model at a batch size in out_dir."""
    stem = os.path.join(out_dir, "%s_b%d" % (name, batch))
    return stem + ".onnx", stem + "_x.npy"


def output_path(folder, name, batch, engine):
    """Where bench.py's engines leave their output for the model at the batch size."""
    return os.path.join(folder, "%s_b%d_%s_y.npy" % (name, batch, engine))


def make_input(name, batch):
    """The model's float32 input at the batch size, from a standard normal, seeded."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode()), batch])
    return rng.standard_normal((batch,) + MODELS[name].image_shape).astype(np.float32)


def export(name, batch, out_dir, net=None):
    """Writes the model's ONNX file and input at the batch size into out_dir; returns their
    paths. net, when given, is torch_network(name), so that a caller exporting several batch
    sizes builds it once."""
    import torch

    if batch < 1:
        raise ValueError("batch size %d: it must be at least 1" % batch)
    if net is None:
        net = torch_network(name)
    onnx_path, input_path = file_paths(out_dir, name, batch)
    x = make_input(name, batch)
    with torch.no_grad():
        torch.onnx.export(net, torch.from_numpy(x), onnx_path, input_names=["x"], output_names=["y"],
                          opset_version=OPSET, do_constant_folding=True)
    np.save(input_path, x)
    return onnx_path, input_path


def parse_list(text, what, convert=str):
    try:
        items = [convert(item) for item in text.split(",")]
    except ValueError:
        sys.exit("bad %s list '%s' (comma-separated, e.g. 1,8,32)" % (what, text))
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(TIMED), help="models, comma-separated")
    ap.add_argument("--batch", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--out", required=True, help="the folder the files go to (made if missing)")
    args = ap.parse_args()
    models = parse_list(args.models, "model")
    for name in models:
        if name not in MODELS:
            sys.exit("unknown model '%s' (%s)" % (name, ", ".join(MODELS)))
    batches = parse_list(args.batch, "batch size", int)
    if any(b < 1 for b in batches):
        sys.exit("batch sizes must be at least 1: %s" % args.batch)
    os.makedirs(args.out, exist_ok=True)
    for name in models:
        net = torch_network(name)
        for batch in batches:
            onnx_path, input_path = export(name, batch, args.out, net)
            print("%s batch %d: %s, %s" % (name, batch, onnx_path, input_path))


if __name__ == "__main__":
    main()
