"""Small models and training steps shared by the AOT tests."""

from __future__ import annotations

import numpy as np

import fusegrad as fg


def mlp_step(optimizer: str = "sgd", seed: int = 0, sizes=(12, 16, 5)):
    """A small MLP training step (zero_grad, forward, cross-entropy, backward, step), its
    model and optimizer, and example inputs."""
    fg.manual_seed(seed)
    model = fg.nn.Sequential(fg.nn.Linear(sizes[0], sizes[1]), fg.nn.ReLU(),
                             fg.nn.Linear(sizes[1], sizes[2]))
    if optimizer == "sgd":
        opt = fg.optim.SGD(model.parameters(), lr=0.1)
    elif optimizer == "adamw":
        opt = fg.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    else:
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = fg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(seed)
    x = fg.tensor(rng.standard_normal((8, sizes[0])).astype(np.float32))
    y = fg.tensor(rng.integers(0, sizes[-1], 8))
    return step, model, opt, x, y


def batches(n: int, sizes=(12, 16, 5), seed: int = 1):
    rng = np.random.default_rng(seed)
    return [(fg.tensor(rng.standard_normal((8, sizes[0])).astype(np.float32)),
             fg.tensor(rng.integers(0, sizes[-1], 8))) for _ in range(n)]
