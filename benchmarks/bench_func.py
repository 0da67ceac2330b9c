"""Per-example gradients with ``vmap(grad(...))`` against the batched gradient.

Workload: a 784-256-256-10 MLP (ReLU, cross-entropy), batch 128, parameters passed through
``functional_call``. Rows (median milliseconds per call, after warm-up and the compiles):

- ``fusegrad compiled vmap(grad)``: the per-example gradients, compiled whole (one batched
  graph: each primitive's batching rule, the batch size does not change the kernels);
- ``fusegrad compiled batched grad``: the gradient of the batch's mean loss, compiled: the
  time the per-example gradients are judged against (the goal is within 1.5x of it);
- the same two eagerly, and torch.func's ``vmap(grad)`` and torch's batched gradient when
  torch is importable.

The first line is the machine (``benchmarks/machine.py``). The per-example gradients are
``batch x parameters`` floats (137 MB here, against 1 MB for the batched gradient), so the
last rows give the machine's limit measured in the same run: the time to write that many
bytes once (numpy filling a buffer of that size, already mapped), and the compiled
per-example gradients as a multiple of the batched gradient plus that write.

Run ``python benchmarks/bench_func.py [--quick] [--repeats N]``; ``--quick`` makes a few
calls of each, to check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from machine import median_ms  # noqa: E402

SIZES, BATCH = (784, 256, 256, 10), 128




def mlp(nn, sizes=SIZES):
    layers = []
    for i, (m, n) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(m, n))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def fusegrad_rows(repeats: int) -> dict:
    import numpy as np

    import fusegrad as fg
    import fusegrad.nn.functional as F
    from fusegrad.func import functional_call, grad, vmap

    fg.manual_seed(0)
    model = mlp(fg.nn)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, t = fg.randn(BATCH, SIZES[0]), fg.randint(0, SIZES[-1], (BATCH,))

    def example_loss(p, xi, ti):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), ti.unsqueeze(0))

    def batch_loss(p, xb, tb):
        return F.cross_entropy(functional_call(model, p, (xb,)), tb)

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
    batched = grad(batch_loss)
    compiled_per_example, compiled_batched = fg.compile(per_example), fg.compile(batched)
    got, want = compiled_per_example(params, x, t), per_example(params, x, t)
    for k in want:             # a wrong result is no result
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-5)
    kernels = len(compiled_per_example.lower(params, x, t).kernels)
    nbytes = sum(g.numel() * g.element_size() for g in got.values())
    sink = np.empty(nbytes // 4, dtype=np.float32)
    sink.fill(0.0)                                     # mapped before it is timed
    write = median_ms(lambda: sink.fill(1.0), repeats)
    return {
        "fusegrad compiled vmap(grad)": median_ms(lambda: compiled_per_example(params, x, t),
                                                  repeats),
        "fusegrad compiled batched grad": median_ms(lambda: compiled_batched(params, x, t),
                                                    repeats),
        "fusegrad eager vmap(grad)": median_ms(lambda: per_example(params, x, t), repeats),
        "fusegrad eager batched grad": median_ms(lambda: batched(params, x, t), repeats),
        f"write {nbytes / 1e6:.0f} MB once (numpy fill)": write,
    }, kernels


def torch_rows(repeats: int) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    torch.manual_seed(0)
    model = mlp(torch.nn)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, t = torch.randn(BATCH, SIZES[0]), torch.randint(0, SIZES[-1], (BATCH,))

    def example_loss(p, xi, ti):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, ti.unsqueeze(0))

    def batch_loss(p, xb, tb):
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, p, (xb,)), tb)

    per_example = torch.func.vmap(torch.func.grad(example_loss), in_dims=(None, 0, 0))
    batched = torch.func.grad(batch_loss)
    return {
        "torch.func vmap(grad)": median_ms(lambda: per_example(params, x, t), repeats),
        "torch.func batched grad": median_ms(lambda: batched(params, x, t), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few calls of each")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 50)
    import machine
    print(machine.describe(threads=(1,), n=256 if args.quick else 1024))
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}: per-example gradients, median ms "
          f"of {repeats} calls")
    rows, kernels = fusegrad_rows(repeats)
    rows.update(torch_rows(repeats))
    width = max(map(len, rows))
    for name, ms in rows.items():
        print(f"  {name:<{width}}  {ms:9.3f} ms")
    ratio = rows["fusegrad compiled vmap(grad)"] / rows["fusegrad compiled batched grad"]
    print(f"compiled vmap(grad) / compiled batched grad: {ratio:.2f}x (goal: at most 1.5x); "
          f"{kernels} kernels")
    write = next(ms for name, ms in rows.items() if name.startswith("write "))
    floor = rows["fusegrad compiled batched grad"] + write
    print(f"compiled vmap(grad) / (compiled batched grad + writing the per-example gradients "
          f"once): {rows['fusegrad compiled vmap(grad)'] / floor:.2f}x")
    if "torch.func vmap(grad)" in rows:
        print(f"compiled vmap(grad) / torch.func vmap(grad): "
              f"{rows['fusegrad compiled vmap(grad)'] / rows['torch.func vmap(grad)']:.2f}x")


if __name__ == "__main__":
    main()
