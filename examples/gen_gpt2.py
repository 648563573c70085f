#!/usr/bin/python3
"""Writes the generation example: a GPT-2-style decoder step in the kiln language, its
weights, and the tokens PyTorch generates greedily from the same weights.

    /usr/bin/python3 examples/gen_gpt2.py
    /usr/bin/python3 examples/gen_gpt2.py --size 256,4,4,1024 --vocab 1000 --out DIR  # to time

Run it from anywhere; it writes into the folder it lives in (or DIR):

  gpt2_step.kiln          one decoder step: the token (i64[1]) at position pos (i64[1])
                          in, the greedy next token (argmax, i64[1]) and the logits out;
                          the keys and values of every layer live in params (the cache)
                          that `update` statements extend at pos in every run
  gpt2_step.safetensors  the weights (random, seed 0)
  gpt2_tokens.txt         the prompt on its first line, PyTorch's 32 greedy tokens on
                          the second

The network (GPT-2's layout at a small size): token and position embeddings, LAYERS
pre-norm blocks (layer norm, causal multi-head self-attention with one q/k/v
projection, an output projection, a residual; layer norm, a 4x MLP with tanh GELU, a
residual), a final layer norm and a linear head to the logits. PyTorch runs
the whole sequence at every step, with a causal mask and no cache; kiln's step reads
the cache, so examples/generate.c giving PyTorch's tokens checks the cache too.

In the step, the cache of layer l is l{l}.k_cache and l{l}.v_cache, [HEADS, CONTEXT,
HEAD_DIM]. The new key and value are written at pos by a `where` over the positions
(so the whole cache is rewritten, and a step costs the same at every position up to
CONTEXT), and the attention op (one fused kernel, online softmax) masks the positions
after pos with a bool mask. A position at or past CONTEXT is an index out of range in
the position embedding's gather: the run fails.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from gen_reference import write_safetensors  # noqa: E402

VOCAB, DIM, HEADS, LAYERS, CONTEXT = 64, 32, 4, 2, 64
PROMPT = [5, 17, 42, 8]
STEPS = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = (y.reshape(1, t, HEADS, DIM // HEADS).transpose(1, 2)
                   for y in self.attn(self.ln1(x)).split(DIM, dim=-1))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS)).masked_fill(~causal, float("-inf"))
        a = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(1, t, DIM)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.lnf = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        for p in self.parameters():  # layer norms away from the identity, embeddings of order one
            with torch.no_grad():
                p.add_(torch.randn_like(p) * 0.1)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]).unsqueeze(0))
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def greedy(model):
    """PyTorch's tokens, and the smallest gap between the two largest logits (a gap
    near float32 rounding would make the comparison fragile)."""
    ids, gap = list(PROMPT), math.inf
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(logits, 2).values
            gap = min(gap, float(top[0] - top[1]))
            ids.append(int(logits.argmax()))
    return ids[len(PROMPT):], gap


def weights(model):
    out = {"wte": model.wte.weight, "wpe": model.wpe.weight, "lnf.w": model.lnf.weight, "lnf.b": model.lnf.bias,
           "head.w": model.head.weight}
    for i, b in enumerate(model.blocks):
        for name in ("ln1", "ln2", "attn", "proj", "fc1", "fc2"):
            out[f"l{i}.{name}.w"] = getattr(b, name).weight
            out[f"l{i}.{name}.b"] = getattr(b, name).bias
    return {k: v.detach().numpy().astype(np.float32) for k, v in out.items()}


def kiln_text(w):
    dh = DIM // HEADS
    lines = ["# A GPT-2-style decoder step with its key/value cache in params (examples/gen_gpt2.py).",
             "model gpt2_step", "input token : i64[1]", "input pos : i64[1]"]
    for name, arr in w.items():
        lines.append(f"param {name} : f32[{', '.join(map(str, arr.shape))}]")
    for i in range(LAYERS):
        lines.append(f"param l{i}.k_cache : f32[{HEADS}, {CONTEXT}, {dh}] = zeros")
        lines.append(f"param l{i}.v_cache : f32[{HEADS}, {CONTEXT}, {dh}] = zeros")
    lines += [f"const positions : i64[{CONTEXT}] = [{', '.join(map(str, range(CONTEXT)))}]",
              "tok = gather(wte, token, axis=0)",
              "at = gather(wpe, pos, axis=0)",
              "x0 = add(tok, at)",
              "# the cache slot this step writes, and the positions it may attend to",
              "is_pos = equal(positions, pos)",
              f"slot = reshape(is_pos, shape=[1, {CONTEXT}, 1])",
              "visible = less_equal(positions, pos)"]
    x = "x0"
    for i in range(LAYERS):
        p = f"l{i}."
        lines += [f"# layer {i}",
                  f"{p}h = layer_norm({x}, {p}ln1.w, {p}ln1.b)",
                  f"{p}qkv = linear({p}h, {p}attn.w, {p}attn.b)"]
        for j, part in enumerate("qkv"):
            lines += [f"{p}{part}2 = slice({p}qkv, starts=[{j * DIM}], ends=[{(j + 1) * DIM}], axes=[1])",
                      f"{p}{part} = reshape({p}{part}2, shape=[{HEADS}, 1, {dh}])"]
        lines += [f"{p}keys = where(slot, {p}k, {p}k_cache)",
                  f"{p}values = where(slot, {p}v, {p}v_cache)",
                  f"update {p}k_cache = {p}keys",
                  f"update {p}v_cache = {p}values",
                  f"{p}heads = attention({p}q, {p}keys, {p}values, visible, scale={1 / math.sqrt(dh)!r})",
                  f"{p}joined = reshape({p}heads, shape=[1, {DIM}])",
                  f"{p}out = linear({p}joined, {p}proj.w, {p}proj.b)",
                  f"{p}x = add({x}, {p}out)",
                  f"{p}h2 = layer_norm({p}x, {p}ln2.w, {p}ln2.b)",
                  f"{p}f1 = linear({p}h2, {p}fc1.w, {p}fc1.b)",
                  f"{p}g = gelu({p}f1, approximate=tanh)",
                  f"{p}f2 = linear({p}g, {p}fc2.w, {p}fc2.b)",
                  f"{p}y = add({p}x, {p}f2)"]
        x = f"{p}y"
    lines += [f"final = layer_norm({x}, lnf.w, lnf.b)",
              "logits = linear(final, head.w)",
              "next = argmax(logits, axis=1)",
              "output next, logits"]
    return "\n".join(lines) + "\n"


def main():
    global VOCAB, DIM, HEADS, LAYERS, CONTEXT
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", help="DIM,HEADS,LAYERS,CONTEXT (default %d,%d,%d,%d)" % (DIM, HEADS, LAYERS, CONTEXT))
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    if args.size:
        DIM, HEADS, LAYERS, CONTEXT = map(int, args.size.split(","))
    VOCAB = args.vocab
    torch.manual_seed(0)
    model = Gpt().eval()
    tokens, gap = greedy(model)
    w = weights(model)
    with open(os.path.join(args.out, "gpt2_step.kiln"), "w") as f:
        f.write(kiln_text(w))
    write_safetensors(os.path.join(args.out, "gpt2_step.safetensors"), w)
    with open(os.path.join(args.out, "gpt2_tokens.txt"), "w") as f:
        f.write(" ".join(map(str, PROMPT)) + "\n" + " ".join(map(str, tokens)) + "\n")
    print(f"prompt {PROMPT} -> {tokens}; smallest top-2 logit gap {gap:.3g}")


if __name__ == "__main__":
    main()
