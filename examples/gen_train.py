#!/usr/bin/python3
"""Writes the training example's data, initial weights and PyTorch loss curve.

    /usr/bin/python3 examples/gen_train.py

Run it from anywhere; it writes into the folder it lives in:

  train_x.npy                f32[256, 1, 16, 16]: 256 single-channel 16x16 images
  train_y.npy                f32[256, 4]: their classes, one-hot
  train_cnn_init.safetensors the small CNN's initial weights (torch's default init, seed 0)
  train_cnn_loss.npy         f32[300]: the loss of each of 300 training steps in PyTorch

The data: each image is a bar of 5 to 9 pixels, horizontal (class 0), vertical (1),
diagonal top-left to bottom-right (2) or anti-diagonal (3), of brightness 1.5 to 2.5
at a random place, on Gaussian noise of standard deviation 0.3; the classes take
turns (sample i has class i % 4). The model (train_cnn.kiln is the same network):

  conv 3x3, 1 -> 8, pad 1, relu, max_pool 2     [32, 8, 8, 8]
  conv 3x3, 8 -> 16, pad 1, relu, max_pool 2    [32, 16, 4, 4]
  flatten, linear 256 -> 4                      [32, 4]

and the loss is the cross-entropy of its logits, averaged over the batch
(F.cross_entropy). Training: torch.optim.SGD with lr 0.05 and momentum 0.9, batch
32, 300 steps; step s takes samples (32 s + i) % 256, i = 0 .. 31 (the data in
order, no shuffling), so the curve is what kiln's train_cnn.kiln gives step by step
(examples/train_cnn.c runs it and compares). Everything is float32 and runs on one
thread, so the script writes the same files every time.

The bars are bright enough that the loss falls from the first steps (to about 0.03
by step 50): the training never sits on a plateau, where the rounding of float32
would be amplified. So the curve is reproducible: trained in float64, the same
network gives the same losses within 4e-6 (the script prints this), while with dimmer bars (brightness 0.7
to 1.3) it waits about 40 steps near log 4, then drops, and float32 and float64
part by 0.17 after step 100 (as kiln and PyTorch then do).
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from gen_reference import write_safetensors  # noqa: E402

N, SIZE, CLASSES = 256, 16, 4
BATCH, STEPS, LR, MOMENTUM = 32, 300, 0.05, 0.9


def make_data(seed=2024):
    """Images [N, 1, SIZE, SIZE] and one-hot labels [N, CLASSES], float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.3, size=(N, 1, SIZE, SIZE))
    y = np.zeros((N, CLASSES))
    for i in range(N):
        c = i % CLASSES
        length = int(rng.integers(5, 10))
        level = rng.uniform(1.5, 2.5)
        # (dr, dc): the bar's direction; it starts at (r0, c0) and stays in the image
        dr, dc = [(0, 1), (1, 0), (1, 1), (1, -1)][c]
        rows = (0, SIZE - 1 - dr * (length - 1))
        cols = (0, SIZE - 1 - dc * (length - 1)) if dc >= 0 else (length - 1, SIZE - 1)
        r0 = int(rng.integers(rows[0], rows[1] + 1))
        c0 = int(rng.integers(cols[0], cols[1] + 1))
        for k in range(length):
            x[i, 0, r0 + dr * k, c0 + dc * k] += level
        y[i, c] = 1
    return x.astype(np.float32), y.astype(np.float32)


class TrainCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (SIZE // 4) ** 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
        return self.fc(torch.flatten(x, 1))


def batch_indices(step):
    return (step * BATCH + np.arange(BATCH)) % N


def train(net, xt, labels):
    """The losses of STEPS steps of SGD with momentum, each computed before its update."""
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = np.zeros(STEPS)
    for s in range(STEPS):
        idx = torch.from_numpy(batch_indices(s))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xt[idx]), labels[idx])
        loss.backward()
        opt.step()
        losses[s] = loss.item()
    return losses


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    x, y = make_data()
    np.save(os.path.join(HERE, "train_x.npy"), x)
    np.save(os.path.join(HERE, "train_y.npy"), y)

    torch.manual_seed(0)
    net = TrainCNN()
    init = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    write_safetensors(os.path.join(HERE, "train_cnn_init.safetensors"), init)

    xt, labels = torch.from_numpy(x), torch.from_numpy(y.argmax(1))
    net64 = TrainCNN().double()
    net64.load_state_dict({k: torch.from_numpy(v).double() for k, v in init.items()})
    losses = train(net, xt, labels).astype(np.float32)
    np.save(os.path.join(HERE, "train_cnn_loss.npy"), losses)
    # the same training in float64: how far float32's rounding moves the curve
    drift = np.abs(losses - train(net64, xt.double(), labels)) / np.maximum(1, np.abs(losses))

    with torch.no_grad():
        acc = (net(xt).argmax(1) == labels).float().mean().item()
    print("wrote train_x.npy %s, train_y.npy %s, train_cnn_init.safetensors (%s), train_cnn_loss.npy in %s"
          % (list(x.shape), list(y.shape), ", ".join(init), HERE))
    print("loss: step 0 %.6f, step %d %.6f (mean of the last 8 steps %.6f); accuracy after training %.1f%%"
          % (losses[0], STEPS - 1, losses[-1], losses[-8:].mean(), 100 * acc))
    print("trained in float64 instead, the losses differ by at most %.3g * max(1, |loss|) (step %d)"
          % (drift.max(), drift.argmax()))


if __name__ == "__main__":
    main()
