#!/usr/bin/python3
"""Exports models from PyTorch to ONNX, with an input and PyTorch's output, for kiln's
ONNX import tests.

    /usr/bin/python3 tests/onnx/gen_models.py            # the small committed models
    /usr/bin/python3 tests/onnx/gen_models.py --large DIR # ResNet-18, MobileNetV2 into DIR

Debian's python3-torch and python3-torchvision; random weights (torch.manual_seed), so
no download. The small models (tests/onnx/models/) are committed and CTest runs them
(tests/onnx/check_models.sh); ResNet-18 (45 MB) and MobileNetV2 are too large to commit
and are checked by hand (docs/onnx.md gives the commands and results). Each model M gets
M.onnx, M_input.npy and M_expected.npy (PyTorch's output in eval mode)."""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCNN(nn.Module):
    """The ops PyTorch's exporter emits for CNNs: Conv (with bias, depthwise, strided),
    BatchNormalization, Relu, Clip (ReLU6), HardSwish, MaxPool, Add, Concat, Resize,
    AveragePool, GlobalAveragePool, Flatten, Gemm, Softmax, Reshape, Transpose, Sigmoid."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.bn2 = nn.BatchNorm2d(16)
        self.up = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))                 # [1, 8, 16, 16]
        z = F.relu6(self.dw(y)) + y                          # residual
        z = F.hardswish(self.bn2(self.pw(z)))                # [1, 16, 16, 16]
        p = F.max_pool2d(z, 2)                               # [1, 16, 8, 8]
        u = F.interpolate(self.up(p), scale_factor=2, mode="nearest")  # [1, 8, 16, 16]
        c = torch.cat([u, F.avg_pool2d(y, 3, stride=1, padding=1)], dim=1)  # [1, 16, 16, 16]
        g = torch.sigmoid(F.adaptive_avg_pool2d(c, 1)).flatten(1)  # [1, 16]
        s = z.mean(dim=(2, 3)).reshape(1, 4, 4).transpose(1, 2).reshape(1, 16)
        h = torch.cat([g, s[:, :8]], dim=1)                  # [1, 24]
        return F.softmax(self.fc(h), dim=1)


class TinyTokens(nn.Module):
    """Token ids in (INT64), the ops of a transformer's embedding: Gather at run time
    (two embeddings), a padding mask from Greater, Cast, CumSum (position ids from the
    mask), Unsqueeze of bools, Where, ArgMax."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(10, 4)
        self.positions = nn.Embedding(8, 4)

    def forward(self, x):
        mask = x > 0
        h = self.tokens(x) + self.positions(torch.cumsum(mask.long(), dim=1))
        h = torch.where(mask.unsqueeze(-1), h, torch.zeros(()))
        return h + h.argmax(-1, keepdim=True).float()


def randomize_bn(model):
    """Random running statistics, so that batch norm is not the identity."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


def export(model, shape, out_dir, name, opset):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    model.eval()
    with torch.no_grad():
        y = model(x)
    path = os.path.join(out_dir, name + ".onnx")
    torch.onnx.export(model, x, path, input_names=["x"], output_names=["y"], opset_version=opset,
                      do_constant_folding=True)
    np.save(os.path.join(out_dir, name + "_input.npy"), x.numpy().astype("<f4"))
    np.save(os.path.join(out_dir, name + "_expected.npy"), y.numpy().astype("<f4"))
    print(f"{path}: {os.path.getsize(path)} bytes, output {tuple(y.shape)}")


def export_tokens(out_dir, name, opset):
    torch.manual_seed(0)
    model = TinyTokens().eval()
    x = torch.tensor([[3, 1, 0, 7, 9, 0], [0, 2, 2, 5, 0, 4]], dtype=torch.int64)
    with torch.no_grad():
        y = model(x)
    path = os.path.join(out_dir, name + ".onnx")
    torch.onnx.export(model, x, path, input_names=["x"], output_names=["y"], opset_version=opset)
    np.save(os.path.join(out_dir, name + "_input.npy"), x.numpy().astype("<i8"))
    np.save(os.path.join(out_dir, name + "_expected.npy"), y.numpy().astype("<f4"))
    print(f"{path}: {os.path.getsize(path)} bytes, output {tuple(y.shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", metavar="DIR", help="export ResNet-18 and MobileNetV2 into DIR")
    args = ap.parse_args()
    if args.large:
        import torchvision
        os.makedirs(args.large, exist_ok=True)
        torch.manual_seed(0)
        r = torchvision.models.resnet18()
        randomize_bn(r)
        export(r, (1, 3, 224, 224), args.large, "resnet18", 13)
        torch.manual_seed(0)
        m = torchvision.models.mobilenet_v2()
        randomize_bn(m)
        export(m, (1, 3, 224, 224), args.large, "mobilenetv2", 13)
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
    os.makedirs(here, exist_ok=True)
    for opset in (11, 13):
        torch.manual_seed(0)
        t = TinyCNN()
        randomize_bn(t)
        export(t, (1, 3, 32, 32), here, f"tiny_cnn_opset{opset}", opset)
    export_tokens(here, "tiny_tokens_opset13", 13)


if __name__ == "__main__":
    main()
