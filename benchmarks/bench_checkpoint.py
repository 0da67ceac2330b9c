"""Activation checkpointing in a compiled training step: memory and time, with and without.

The char transformer of ``examples/char_transformer.py`` (vocab 65, by default 4 blocks,
n_embd 128, 4 heads, block 64, batch 16, AdamW), its whole step compiled
(``fusegrad.compile(step, fullgraph=True)``), once plain and once with each block run
through ``torch.utils.checkpoint.checkpoint`` (``make_model(..., checkpoint=True)``).

Memory (deterministic, from the memory plans of the two programs):

- ``arena``: the bytes of the buffers the program allocates once and reuses across its
  kernels (``MemoryPlan.arena_bytes``): the step's working memory at its peak;
- ``held``: the bytes computed up to the loss that a later kernel reads
  (``memory_plan.saved_between``): the activations held from the forward into the backward.

Time: both steps run in one process, alternately (the order swapped every round),
``--rounds`` rounds of ``--steps`` steps each after warm-up; each figure is the median of
the per-round step times, and the ratio the median of the rounds' ratios (each round's two
measurements are taken next to each other, so a change of load between rounds cancels).
On a machine shared with other work the times are loaded measurements: alternating keeps
the load the same for both, not low.

Run ``python benchmarks/bench_checkpoint.py [--layers 4 --embd 128 --block 64 --batch 16]``;
``--memory`` prints the memory table without timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

from char_transformer import TEXT, batches, make_model  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad.runtime.memory_plan import saved_between  # noqa: E402


def compiled_step(args, checkpoint: bool):
    """The compiled training step and its model, from the same initial weights."""
    fg.manual_seed(0)
    model = make_model(fg, len(set(TEXT)), block=args.block, n_embd=args.embd, n_head=4,
                       n_layer=args.layers, checkpoint=checkpoint)
    opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return fg.compile(step, fullgraph=True)


def memory(step, x, y) -> dict:
    program = step.lower(x, y).program
    kg = program.kg
    return {"arena": program.plan.arena_bytes,
            "held": sum(saved_between(kg, kg.graph.outputs[0]).values()),
            "kernels": len(kg.kernels)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=3, help="steps per round")
    ap.add_argument("--memory", action="store_true", help="the memory table only")
    args = ap.parse_args(argv)
    data = batches(fg, TEXT, args.block, args.batch)
    x, y = next(data)
    steps = {"plain": compiled_step(args, False), "checkpointed": compiled_step(args, True)}
    mem = {name: memory(step, x, y) for name, step in steps.items()}
    sys.path.insert(0, HERE)
    import machine
    print(f"{machine.cpu_model()} (LLVM host {machine.llvm_host()[0]}); {fg.get_num_threads()} threads")
    print(f"char transformer: {args.layers} blocks, n_embd {args.embd}, block {args.block}, "
          f"batch {args.batch}, AdamW; whole step compiled")
    print("| step | arena MiB | held MiB | kernels |")
    print("|---|---|---|---|")
    for name, m in mem.items():
        print(f"| {name} | {m['arena'] / 2**20:.2f} | {m['held'] / 2**20:.2f} | {m['kernels']} |")
    drop = 1 - mem["checkpointed"]["arena"] / mem["plain"]["arena"]
    print(f"arena down by {drop:.1%}")
    if args.memory:
        return 0
    losses = {name: [float(step(x, y)) for _ in range(2)] for name, step in steps.items()}
    print(f"losses of two steps on one batch: {losses}")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in sorted(steps, reverse=bool(r % 2)):
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name](x, y)
            times[name].append((time.perf_counter() - start) / args.steps)
    for name, t in times.items():
        quartiles = np.percentile(t, [25, 50, 75]) * 1e3
        print(f"{name}: median {quartiles[1]:.1f} ms/step (quartiles {quartiles[0]:.1f}-"
              f"{quartiles[2]:.1f}), {args.rounds} rounds of {args.steps} steps")
    ratios = [c / p for c, p in zip(times["checkpointed"], times["plain"])]
    quartiles = np.percentile(ratios, [25, 50, 75])
    print(f"step time ratio checkpointed/plain: median {quartiles[1]:.2f} of the rounds' ratios "
          f"(quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}; alternating rounds in one process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
