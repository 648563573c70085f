#!/usr/bin/python3
"""Exports models from PyTorch to ONNX, with an input and PyTorch's output, for kiln's
ONNX import tests.

    /usr/bin/python3 tests/onnx/gen_models.py            # the small committed models
    /usr/bin/python3 tests/onnx/gen_models.py --dynamic  # only tiny_bert_dynamic (below)
    /usr/bin/python3 tests/onnx/gen_models.py --large DIR # ResNet-18, MobileNetV2, ViT-B/16 into DIR

Debian's python3-torch and python3-torchvision; random weights (torch.manual_seed), so
no download. The small models (tests/onnx/models/) are committed and CTest runs them
(tests/onnx/check_models.sh); ResNet-18 (45 MB), MobileNetV2 and ViT-B/16 (346 MB) are
too large to commit and are checked by hand (docs/onnx.md gives the commands and results). Each model M gets
M.onnx, M_input.npy and M_expected.npy (PyTorch's output in eval mode)."""
import argparse
import copy
import math
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


class Attention(nn.Module):
    """Multi-head self-attention as BERT and GPT-2 write it: one projection to q, k, v,
    softmax(q k^T / sqrt(d) + mask) v, an output projection."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(x).split(d, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + mask
        y = F.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A transformer layer: BERT's (post-norm, erf GELU) or GPT-2's (pre-norm, tanh GELU)."""

    def __init__(self, dim, heads, pre_norm):
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = Attention(dim, heads)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x, mask):
        if self.pre_norm:
            x = x + self.attn(self.norm1(x), mask)
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    """A BERT-style encoder: int64 token ids, token types and an attention mask (1 keep,
    0 padding) in; word, position and token-type embeddings; post-norm layers."""

    def __init__(self, vocab, dim, heads, layers, max_len):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.types = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(Block(dim, heads, False) for _ in range(layers))

    def forward(self, ids, types, mask):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.norm(self.words(ids) + self.positions(positions) + self.types(types))
        additive = (1.0 - mask[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            x = layer(x, additive)
        return x


class Gpt(nn.Module):
    """A GPT-2-style decoder: int64 ids in, logits out; the causal mask a constant
    boolean buffer applied by masked_fill (Where), pre-norm layers, a final norm."""

    def __init__(self, vocab, dim, heads, layers, max_len):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(Block(dim, heads, True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)))

    def forward(self, ids):
        t = ids.shape[1]
        x = self.words(ids) + self.positions(torch.arange(t).unsqueeze(0))
        mask = torch.zeros(t, t).masked_fill(~self.causal[:t, :t], float("-inf"))
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.norm(x))


class Lstm(nn.Module):
    """Two stacked LSTM layers, batch first; the outputs of the last layer's steps."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


class Gru(nn.Module):
    """A bidirectional GRU (PyTorch's GRU is ONNX's linear_before_reset = 1) and its
    final states."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 12, bidirectional=True)

    def forward(self, x):
        y, h = self.gru(x)
        return torch.cat([y[-1], h[0], h[1]], dim=1)


class RecurrentBattery(nn.Module):
    """The recurrent layers in the configurations PyTorch exports, each on the same
    sequence x [5, 3, 8] (time first): RNN with tanh (2 layers) and with relu
    (bidirectional, no bias), LSTM bidirectional over 2 layers and without bias from
    initial states computed from x, GRU over 2 layers and bidirectional batch first.
    Every layer's outputs and final states, flattened and concatenated, are y."""

    def __init__(self):
        super().__init__()
        self.rnn_tanh = nn.RNN(8, 6, num_layers=2)
        self.rnn_relu = nn.RNN(8, 5, nonlinearity="relu", bidirectional=True, bias=False)
        self.lstm = nn.LSTM(8, 7, num_layers=2, bidirectional=True)
        self.lstm_from = nn.LSTM(8, 4, bias=False)
        self.init = nn.Linear(8, 8)
        self.gru = nn.GRU(8, 9, num_layers=2)
        self.gru_batch_first = nn.GRU(8, 3, bidirectional=True, batch_first=True)

    def forward(self, x):
        outs = []
        for layer in (self.rnn_tanh, self.rnn_relu, self.lstm, self.gru):
            y, h = layer(x)
            outs += [y, *(h if isinstance(h, tuple) else (h,))]
        h0, c0 = torch.tanh(self.init(x[0])).unsqueeze(0).split(4, dim=2)
        y, (h, c) = self.lstm_from(x, (h0.contiguous(), c0.contiguous()))
        outs += [y, h, c]
        y, h = self.gru_batch_first(x.transpose(0, 1))
        outs += [y, h]
        return torch.cat([o.flatten() for o in outs])


def randomize_vit(model):
    """torchvision's ViT starts with a zero head and class token, which would make its
    output zeros whatever the layers compute: random ones instead."""
    with torch.no_grad():
        model.heads.head.weight.normal_(0, 0.2)
        model.heads.head.bias.uniform_(-0.1, 0.1)
        model.class_token.normal_(0, 0.5)
    return model


def small_vit():
    import torchvision
    return randomize_vit(torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                              num_heads=2, hidden_dim=32, mlp_dim=64,
                                                              num_classes=10))


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


TRAIN_STEPS, TRAIN_LR = 5, 0.02


def sgd_losses(model, x):
    """The loss sum(model(x) ** 2) before each of TRAIN_STEPS steps of plain SGD on a
    copy of the model (tests/onnx/check_train.sh takes the same steps in kiln)."""
    model = copy.deepcopy(model)
    sgd = torch.optim.SGD(model.parameters(), lr=TRAIN_LR)
    losses = []
    for _ in range(TRAIN_STEPS):
        sgd.zero_grad()
        loss = (model(x) ** 2).sum()
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    return np.array(losses, "<f4")


def export_inputs(model, inputs, out_dir, name, opset=13, grad=False, train=False, dynamic_axes=None):
    """A model of several named inputs (int64 or float32): each saved as
    NAME_input_INPUT.npy (or NAME_input.npy for a single one named x). With grad, also
    the gradient of sum(y * y) with respect to x, as NAME_grad_x.npy; with train, the
    loss sum(y * y) over TRAIN_STEPS steps of SGD on every weight, as
    NAME_train_loss.npy. dynamic_axes as torch.onnx.export takes it."""
    model.eval()
    if grad:
        x = inputs["x"].clone().requires_grad_()
        (model(x) ** 2).sum().backward()
        np.save(os.path.join(out_dir, name + "_grad_x.npy"), x.grad.numpy().astype("<f4"))
    if train:
        np.save(os.path.join(out_dir, name + "_train_loss.npy"), sgd_losses(model, inputs["x"]))
    with torch.no_grad():
        y = model(*inputs.values())
    path = os.path.join(out_dir, name + ".onnx")
    torch.onnx.export(model, tuple(inputs.values()), path, input_names=list(inputs), output_names=["y"],
                      opset_version=opset, dynamic_axes=dynamic_axes)
    for key, value in inputs.items():
        suffix = "" if list(inputs) == ["x"] else "_" + key
        kind = "<i8" if value.dtype == torch.int64 else "<f4"
        np.save(os.path.join(out_dir, f"{name}_input{suffix}.npy"), value.numpy().astype(kind))
    np.save(os.path.join(out_dir, name + "_expected.npy"), y.numpy().astype("<f4"))
    print(f"{path}: {os.path.getsize(path)} bytes, output {tuple(y.shape)}")


def export_sequence_models(out_dir):
    torch.manual_seed(0)
    tokens = torch.tensor([[3, 1, 0, 7, 9, 0], [0, 2, 2, 5, 0, 4]], dtype=torch.int64)
    export_inputs(TinyTokens(), {"x": tokens}, out_dir, "tiny_tokens_opset13")
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 10))
    types = (torch.arange(10) >= 6).long().expand(2, 10).contiguous()
    mask = torch.ones(2, 10, dtype=torch.int64)
    mask[1, 7:] = 0
    export_inputs(Bert(50, 32, 4, 2, 16), {"ids": ids, "types": types, "mask": mask}, out_dir, "tiny_bert")
    torch.manual_seed(0)
    export_inputs(Gpt(50, 32, 4, 2, 16), {"ids": torch.randint(0, 50, (1, 12))}, out_dir, "tiny_gpt")
    torch.manual_seed(0)
    export_inputs(small_vit(), {"x": torch.randn(1, 3, 32, 32)}, out_dir, "tiny_vit")
    torch.manual_seed(0)
    export_inputs(Lstm(), {"x": torch.randn(2, 5, 8)}, out_dir, "lstm2", grad=True, train=True)
    torch.manual_seed(0)
    export_inputs(Gru(), {"x": torch.randn(6, 2, 8)}, out_dir, "gru_bidirectional", grad=True, train=True)
    torch.manual_seed(0)
    export_inputs(RecurrentBattery(), {"x": torch.randn(5, 3, 8)}, out_dir, "recurrent_battery", grad=True)


def export_dynamic(out_dir):
    """The BERT-style encoder as serving exports it: batch and sequence length symbolic
    (dynamic_axes), so the graph computes its shapes from Shape; kiln imports it with
    --dim batch=3 --dim seq=9."""
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (3, 9))
    types = (torch.arange(9) >= 5).long().expand(3, 9).contiguous()
    mask = torch.ones(3, 9, dtype=torch.int64)
    mask[2, 6:] = 0
    axes = {name: {0: "batch", 1: "seq"} for name in ("ids", "types", "mask")}
    axes["y"] = {0: "batch", 1: "seq"}
    export_inputs(Bert(50, 32, 4, 2, 16), {"ids": ids, "types": types, "mask": mask}, out_dir,
                  "tiny_bert_dynamic", dynamic_axes=axes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", metavar="DIR", help="export ResNet-18, MobileNetV2 and ViT-B/16 into DIR")
    ap.add_argument("--dynamic", action="store_true", help="export only tiny_bert_dynamic")
    args = ap.parse_args()
    if args.dynamic:
        export_dynamic(os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
        return
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
        torch.manual_seed(0)
        export(randomize_vit(torchvision.models.vit_b_16()), (1, 3, 224, 224), args.large, "vit_b_16", 13)
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
    os.makedirs(here, exist_ok=True)
    for opset in (11, 13):
        torch.manual_seed(0)
        t = TinyCNN()
        randomize_bn(t)
        export(t, (1, 3, 32, 32), here, f"tiny_cnn_opset{opset}", opset)
    export_sequence_models(here)
    export_dynamic(here)


if __name__ == "__main__":
    main()
