"""A whole training script under ``import fusegrad as torch``: DataLoader with a seeded shuffle,
OneCycleLR, gradient clipping, a checkpoint saved midway, and a resumed run that must reproduce
the uninterrupted run's losses exactly.

    python examples/train_loop.py                 # sklearn's digits (synthetic data without sklearn)
    python examples/train_loop.py --synthetic --epochs 4 --samples 256

Exits with status 1 when the resumed losses differ from the uninterrupted ones.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import fusegrad as torch
from fusegrad import nn
from fusegrad.nn import functional as F
from fusegrad.utils.data import DataLoader, TensorDataset


def load_dataset(synthetic: bool, samples: int) -> TensorDataset:
    """sklearn's 8x8 digits (as examples/train_digits.py loads them), or a synthetic 10-class set."""
    if not synthetic:
        try:
            from sklearn.datasets import load_digits
            digits = load_digits()
            x = (digits.data / 16.0).astype(np.float32)[:samples]
            y = digits.target.astype(np.int64)[:samples]
            return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        except ImportError:
            pass
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((10, 64)).astype(np.float32)
    y = rng.integers(0, 10, samples)
    x = centers[y] + 0.5 * rng.standard_normal((samples, 64)).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))


def build(args, dataset: TensorDataset):
    """Model, optimizer, scheduler, loader and its shuffle generator, all from fixed seeds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(1234)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=generator)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, epochs=args.epochs,
                                                steps_per_epoch=len(loader))
    return model, opt, sched, loader, generator


def train_epoch(model, opt, sched, loader) -> float:
    """One pass over ``loader``; the mean loss of its batches."""
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def run(args, dataset, checkpoint: str, *, stop_at: int | None = None, resume: bool = False):
    """Train for ``args.epochs`` epochs; save a checkpoint after epoch ``stop_at`` and stop there,
    or start from the checkpoint when ``resume``. Returns {epoch: mean loss}."""
    model, opt, sched, loader, generator = build(args, dataset)
    start = 0
    if resume:
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        # The shuffle order of the next epochs comes from the generator: restore it too.
        generator.set_state(state["generator"])
        start = state["epoch"] + 1
    losses = {}
    for epoch in range(start, args.epochs):
        losses[epoch] = train_epoch(model, opt, sched, loader)
        if epoch == stop_at:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "generator": generator.get_state(),
                        "epoch": epoch}, checkpoint)
            break
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1797)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--synthetic", action="store_true", help="synthetic data, not digits")
    args = parser.parse_args(argv)
    dataset = load_dataset(args.synthetic, args.samples)
    middle = args.epochs // 2 - 1
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "checkpoint.pt")
        straight = run(args, dataset, checkpoint)
        first = run(args, dataset, checkpoint, stop_at=middle)
        resumed = run(args, dataset, checkpoint, resume=True)
    interrupted = {**first, **resumed}
    print(f"{'epoch':>5}  {'uninterrupted':>14}  {'saved+resumed':>14}")
    for epoch in range(args.epochs):
        mark = "  (resumed)" if epoch == middle + 1 else ""
        print(f"{epoch:>5}  {straight[epoch]:>14.6f}  {interrupted[epoch]:>14.6f}{mark}")
    if interrupted != straight:
        print("resumed losses differ from the uninterrupted run")
        return 1
    print("resumed run matches the uninterrupted run exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
