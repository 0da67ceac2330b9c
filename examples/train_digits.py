"""Train an MLP on scikit-learn's 8x8 digits in eager mode (the ``make demo`` job).

The PyTorch recipe, unchanged but for the import: nn.Sequential, CrossEntropyLoss, Adam,
shuffled minibatches, eval mode and no_grad for testing. The digits data set ships with
scikit-learn (1797 images), so nothing is downloaded.

    python examples/train_digits.py [--epochs 20] [--batch-size 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import fusegrad as torch
from fusegrad import nn


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardized float32 features and int64 labels, split 80/20 (stratified)."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target)
    mean = x_train.mean(axis=0)
    # Some border pixels are always 0: keep their std at 1 instead of dividing by 0.
    std = np.where(x_train.std(axis=0) > 0, x_train.std(axis=0), 1.0)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return (torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train),
            torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test))


def make_model() -> nn.Module:
    """The 64-128-64-10 MLP."""
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(128, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of correct argmax predictions, in eval mode without recording autograd."""
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum().item()
    model.train()
    return correct / len(y)


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true",
                        help="run the model eagerly instead of through fusegrad.compile")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in model.parameters())
    print(model)
    print(f"{n_params} parameters; {len(y_train)} training and {len(y_test)} test images")
    # The compiled model fuses each Linear with its activation into one kernel; its
    # parameters stay graph inputs, so the optimizer's in-place updates need no recompile,
    # and the backward runs a compiled VJP program.
    forward = model if args.eager else torch.compile(model)
    print("mode:", "eager" if args.eager else "fusegrad.compile")

    start = time.perf_counter()
    n = len(y_train)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n)
        total = 0.0
        for i in range(0, n, args.batch_size):
            idx = order[i:i + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(forward(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch:3d}  loss {total / n:.4f}  "
              f"train acc {accuracy(model, x_train, y_train):.4f}  "
              f"test acc {accuracy(model, x_test, y_test):.4f}")
    elapsed = time.perf_counter() - start
    test_acc = accuracy(model, x_test, y_test)
    print(f"final test accuracy: {test_acc:.4f} ({elapsed:.1f} s of training)")
    return test_acc


if __name__ == "__main__":
    main()
