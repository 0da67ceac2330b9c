"""Data-parallel training over MPI: each rank trains on its share of every batch, the
gradients are averaged inside the compiled training step, and rank 0 writes checkpoints.

    mpiexec -n 2 python examples/train_ddp.py
    mpiexec -n 2 python examples/train_ddp.py --epochs 6 --resume ddp_checkpoint.fg

Against single-process training the script differs by the lines marked ``# DDP``. A run
started with ``--resume`` continues from the checkpoint's epoch with the same losses as an
uninterrupted run. (As root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1 and
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment.)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import fusegrad as fg
from fusegrad import nn
from fusegrad.nn import functional as F
from fusegrad.utils.data import DataLoader, DistributedSampler, TensorDataset


def dataset(samples: int) -> TensorDataset:
    """A synthetic 10-class problem: noisy copies of 10 centres in 64 dimensions."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((10, 64)).astype(np.float32)
    y = rng.integers(0, 10, samples)
    x = centers[y] + 2.5 * rng.standard_normal((samples, 64)).astype(np.float32)
    return TensorDataset(fg.from_numpy(x), fg.from_numpy(y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--checkpoint", default="ddp_checkpoint.fg")
    parser.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    args = parser.parse_args()

    dist = fg.distributed
    dist.init()                                                          # DDP
    world, rank = dist.world_size(), dist.rank()
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 10))
    model = dist.DataParallel(model)                                     # DDP
    opt = fg.optim.AdamW(model.parameters(), lr=1e-3)
    first_epoch = 0
    if args.resume:
        state = fg.load(args.resume)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"]

    data = dataset(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)  # DDP
    loader = DataLoader(data, batch_size=args.batch // world, sampler=sampler, drop_last=True)

    @fg.compile(fullgraph=True)
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        start, total, batches = time.perf_counter(), 0.0, 0
        for x, y in loader:
            loss = step(x, y)
            dist.all_reduce(loss, "mean")         # the whole batch's loss, for the log
            total += float(loss)
            batches += 1
        if rank == 0:
            print(f"epoch {epoch}: loss {total / batches:.6f} over {batches} steps of "
                  f"{args.batch} samples on {world} ranks, {time.perf_counter() - start:.2f} s",
                  flush=True)
            state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                     "epoch": epoch + 1}
            tmp = args.checkpoint + ".tmp"
            fg.save(state, tmp)
            os.replace(tmp, args.checkpoint)      # a crash mid-write keeps the last checkpoint
        dist.barrier()


if __name__ == "__main__":
    main()
