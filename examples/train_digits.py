"""Train an MLP on scikit-learn's 8x8 digits with the whole training step compiled (the
``make demo`` job).

The PyTorch recipe, unchanged but for the import: nn.Sequential, CrossEntropyLoss, Adam,
shuffled minibatches, eval mode and no_grad for testing. The step (``zero_grad``, forward,
loss, ``backward``, ``optimizer.step``) is one ``fusegrad.compile``d function: one graph
with the forward, its gradient and the Adam update, parameters and optimizer state updated in
place. At the end the same step is timed in fusegrad eager and compiled, and in PyTorch eager
and under torch.compile when torch is installed. The digits data set ships with scikit-learn
(1797 images), so nothing is downloaded.

    python examples/train_digits.py [--epochs 20] [--batch-size 32] [--seed 0] [--eager]
                                    [--no-timing]
"""

from __future__ import annotations

import argparse
import statistics
import sys
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


def make_model(nn=nn) -> nn.Module:
    """The 64-128-64-10 MLP, built from ``nn`` (fusegrad's, or PyTorch's for comparison)."""
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


def make_step(model, loss_fn, optimizer):
    """One training step, as written for PyTorch."""
    def step(x, y):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def progress(epoch: int, epochs: int, step: int, steps: int, loss: float) -> None:
    """One ``\\r``-updated line: a bar over the epoch's steps, the running mean loss."""
    width = 30
    done = width * step // steps
    sys.stdout.write(f"\repoch {epoch:3d}/{epochs} [{'#' * done}{'.' * (width - done)}] "
                     f"step {step:3d}/{steps}  loss {loss:.4f}")
    sys.stdout.flush()


def time_steps(step, x, y, steps: int = 300, blocks: int = 3) -> float:
    """Median seconds per step over ``blocks`` blocks of ``steps // blocks`` steps, after a
    warm-up (which includes any compiling)."""
    for _ in range(10):
        step(x, y)
    per_block = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(steps // blocks):
            step(x, y)
        per_block.append((time.perf_counter() - start) / (steps // blocks))
    return statistics.median(per_block)


def compare_step_times(x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
    """Per-step time of the same step (same model, same batch) in fusegrad eager and compiled,
    and in PyTorch eager and torch.compile when torch is installed."""
    def fusegrad_step(compiled: bool):
        model = make_model()
        step = make_step(model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=lr))
        return torch.compile(step) if compiled else step

    rows = [("fusegrad eager", time_steps(fusegrad_step(False), x, y)),
            ("fusegrad compiled step", time_steps(fusegrad_step(True), x, y))]
    try:
        import torch as pytorch
    except ImportError:
        pytorch = None
    if pytorch is not None:
        pytorch.set_num_threads(torch.get_num_threads())
        xt, yt = pytorch.from_numpy(x.numpy().copy()), pytorch.from_numpy(y.numpy().copy())
        for name in ("PyTorch eager", "torch.compile step"):
            model = make_model(pytorch.nn)
            step = make_step(model, pytorch.nn.CrossEntropyLoss(),
                             pytorch.optim.Adam(model.parameters(), lr=lr))
            if name == "torch.compile step":
                print("compiling the step with torch.compile (its first compile takes a while)")
                step = pytorch.compile(step)
            try:
                rows.append((name, time_steps(step, xt, yt)))
            except Exception as e:   # torch.compile needs a C++ compiler, among other things
                print(f"{name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    base = dict(rows).get("PyTorch eager")
    print(f"\nper-step time, batch {len(y)}, {torch.get_num_threads()} thread(s), "
          "median of 3 x 100 steps after warm-up:")
    for name, seconds in rows:
        vs = f"  ({seconds / base:.2f}x PyTorch eager)" if base else ""
        print(f"  {name:24s} {seconds * 1e3:8.3f} ms{vs}")
    if pytorch is None:
        print("  (PyTorch is not installed: no PyTorch figures)")


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true",
                        help="run the training step eagerly instead of through fusegrad.compile")
    parser.add_argument("--no-timing", action="store_true",
                        help="skip the per-step timing comparison at the end")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in model.parameters())
    print(model)
    print(f"{n_params} parameters; {len(y_train)} training and {len(y_test)} test images")
    # The whole step is one graph: forward, backward and the Adam update, with parameters,
    # gradients and Adam's moments updated in place. It compiles twice: for the first step
    # (no gradients, no optimizer state yet) and for every step after it.
    step = make_step(model, loss_fn, optimizer)
    train_step = step if args.eager else torch.compile(step)
    print("mode:", "eager" if args.eager else "the whole training step in fusegrad.compile")

    start = time.perf_counter()
    n = len(y_train)
    # Full batches only: every step has one shape, so the compiled step is reused.
    steps = n // args.batch_size
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n)
        total = 0.0
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            total += float(train_step(x_train[idx], y_train[idx]))
            progress(epoch, args.epochs, i + 1, steps, total / (i + 1))
        print(f"  train acc {accuracy(model, x_train, y_train):.4f}  "
              f"test acc {accuracy(model, x_test, y_test):.4f}")
    elapsed = time.perf_counter() - start
    test_acc = accuracy(model, x_test, y_test)
    print(f"final test accuracy: {test_acc:.4f} ({elapsed:.1f} s of training"
          f"{'' if args.eager else ', compiles included'})")
    if not args.no_timing:
        compare_step_times(x_train[:args.batch_size], y_train[:args.batch_size], args.lr)
    return test_acc


if __name__ == "__main__":
    main()
