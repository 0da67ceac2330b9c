"""Train a LeNet-style CNN on scikit-learn's 8x8 digits, eagerly and with the whole training
step compiled, and check that both give the same losses.

The PyTorch recipe, unchanged but for the import: ``nn.Conv2d``, ``MaxPool2d``, ``Flatten``,
``CrossEntropyLoss``, SGD with momentum, shuffled minibatches; the step (``zero_grad``, forward, loss,
``backward``, ``optimizer.step``) runs once eagerly and once as one ``fusegrad.compile``d
graph (convolutions as window gathers into matmuls, pooling as window reductions, the
optimizer update fused), from the same initial weights and the same batches. The losses agree
to float32 rounding; the printed figure is their largest relative difference. (SGD, because
Adam divides by the root of tiny second moments, which magnifies rounding differences
step after step until the two runs drift apart by far more than one rounding.)

    python examples/train_lenet.py [--epochs 8] [--batch-size 64] [--lr 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import fusegrad as torch
from fusegrad import nn


def load_data(seed: int):
    """(N, 1, 8, 8) standardized float32 images and int64 labels, split 80/20 (stratified)."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=0.2, random_state=seed, stratify=digits.target)
    mean, std = x_train.mean(), x_train.std()
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return (torch.tensor(x_train[:, None], dtype=torch.float32), torch.tensor(y_train),
            torch.tensor(x_test[:, None], dtype=torch.float32), torch.tensor(y_test))


def make_model(nn=nn) -> nn.Module:
    """conv 1->6 3x3 pad 1, relu, maxpool 2, conv 6->16 3x3, relu, flatten, 64-64-10 MLP."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def make_step(model, loss_fn, optimizer):
    """One training step, as written for PyTorch."""
    def step(x, y):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def accuracy(model: nn.Module, x, y) -> float:
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum().item()
    model.train()
    return correct / len(y)


def train(compiled: bool, data, args, dtype=torch.float32) -> tuple[list[float], float, float]:
    """Per-step losses, test accuracy and seconds of training (compiles included);
    ``dtype=torch.float64`` gives the reference that float32 runs are measured against."""
    x_train, y_train, x_test, y_test = data
    x_train, x_test = x_train.to(dtype), x_test.to(dtype)
    torch.manual_seed(args.seed)
    model = make_model().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = make_step(model, nn.CrossEntropyLoss(), optimizer)
    if compiled:
        step = torch.compile(step)
    losses = []
    n = len(y_train)
    steps = n // args.batch_size          # full batches only: one shape, one compiled graph
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(n)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            losses.append(float(step(x_train[idx], y_train[idx])))
    return losses, accuracy(model, x_test, y_test), time.perf_counter() - start


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)

    data = load_data(args.seed)
    print(make_model())
    print(f"{len(data[1])} training and {len(data[3])} test images, batch {args.batch_size}")
    runs = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        runs[name] = train(compiled, data, args)
    steps = len(runs["eager"][0]) // args.epochs
    print(f"\n{'epoch':>5} {'eager loss':>12} {'compiled loss':>14}")
    for epoch in range(args.epochs):
        part = slice(epoch * steps, (epoch + 1) * steps)
        print(f"{epoch + 1:5d} {np.mean(runs['eager'][0][part]):12.6f} "
              f"{np.mean(runs['compiled'][0][part]):14.6f}")
    eager, comp = np.array(runs["eager"][0]), np.array(runs["compiled"][0])
    rel = float(np.max(np.abs(eager - comp) / np.abs(eager)))
    print(f"largest difference of the {len(eager)} step losses, eager vs compiled: "
          f"{np.max(np.abs(eager - comp)):.2e} absolute, {rel:.2e} relative")
    for name, (_, acc, seconds) in runs.items():
        print(f"{name:9s} test accuracy {acc:.4f}  ({seconds:.1f} s of training"
              f"{', compiles included' if name == 'compiled' else ''})")
    return rel


if __name__ == "__main__":
    main()
