#!/usr/bin/env python3
"""Greedy token-by-token generation from the shell, through the Python package
(docs/python.md), with a decoder step as examples/generate.c runs it:

    python3 examples/generate.py MODEL STEPS PROMPT... [--weights W.safetensors] [--expect TOKENS.txt]

MODEL is a decoder step: a .so made by `kiln compile`, or a .kiln model (with its
--weights) compiled here. It takes two inputs, the token and its position (i64[1]
each), gives the next token as its first output (i64[1]), and keeps its key/value
cache in params that its `update` statements extend at every run
(examples/gpt2_step.kiln), so one Model, called once per token, carries the sequence.
The prompt's tokens run at positions 0, 1, ...; the last one's step gives the first
new token, which runs next, until STEPS tokens are generated. Each run prints

    pos P token T next N time_us U

and the end prints the generated tokens on one line. With --expect, TOKENS.txt holds
the prompt on its first line and the expected tokens on its second (as
examples/gen_gpt2.py writes PyTorch's): the prompt must be the same and the first
STEPS tokens must match, or it is an error naming the first that does not.
Exit status: 0 success, 1 a failure (bad model, failed run, tokens that differ),
2 a malformed command line.
"""
import argparse
import sys
import time

import numpy as np

import kiln


def fail(message):
    print(f"generate: error: {message}", file=sys.stderr)
    return 1


def read_tokens(path):
    """The prompt and the expected tokens: the file's first two lines."""
    with open(path) as f:
        lines = f.read().splitlines()
    if len(lines) < 2:
        raise ValueError(f"{path}: needs the prompt and the tokens on two lines")
    rows = []
    for number, line in enumerate(lines[:2], 1):
        try:
            rows.append([int(t) for t in line.split()])
        except ValueError:
            raise ValueError(f"{path}: line {number}: not a line of token ids") from None
    return rows


def is_token(t):
    return t.dtype == np.int64 and t.shape == (1,)


def main():
    ap = argparse.ArgumentParser(description="Greedy generation with a decoder step compiled by kiln.")
    ap.add_argument("model")
    ap.add_argument("steps", type=int)
    ap.add_argument("prompt", type=int, nargs="+")
    ap.add_argument("--weights")
    ap.add_argument("--expect")
    args = ap.parse_args()
    if args.steps < 1 or min(args.prompt) < 0:
        ap.error("STEPS must be positive, and the prompt's tokens 0 or more")
    want = None
    if args.expect:
        try:
            prompt, want = read_tokens(args.expect)
        except (OSError, ValueError) as e:
            return fail(e)
        if prompt != args.prompt:
            return fail(f"{args.expect}: the prompt on its first line is not the one given")
        if len(want) < args.steps:
            return fail(f"{args.expect}: {len(want)} tokens, fewer than the {args.steps} steps asked for")
    try:
        model = (kiln.load(args.model) if args.model.endswith(".so")
                 else kiln.compile(args.model, weights=args.weights))
    except kiln.Error as e:
        return fail(e)
    if len(model.inputs) != 2 or not all(is_token(t) for t in model.inputs):
        return fail(f"{args.model}: a decoder step takes two inputs, the token and its position (i64[1] each)")
    if not model.outputs or not is_token(model.outputs[0]):
        return fail(f"{args.model}: a decoder step's first output is the next token (i64[1])")
    got = []
    pos = 0
    while len(got) < args.steps:
        token = args.prompt[pos] if pos < len(args.prompt) else got[-1]
        start = time.perf_counter()
        try:
            outputs = model(np.array([token], np.int64), np.array([pos], np.int64))
        except kiln.Error as e:
            return fail(f"{args.model}: run failed at position {pos} (past the model's context?): {e}")
        took = time.perf_counter() - start
        first = outputs[0] if isinstance(outputs, tuple) else outputs
        nxt = int(first[0])
        print(f"pos {pos} token {token} next {nxt} time_us {took * 1e6:.1f}")
        if pos >= len(args.prompt) - 1:
            got.append(nxt)
        pos += 1
    print("generated", " ".join(map(str, got)))
    if want is not None:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                return fail(f"token {i} is {g}, {args.expect} expects {w}")
        print(f"all {args.steps} tokens match {args.expect}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
