"""Print the IR of a small MLP's training loss, and of its gradient from the autodiff pass.

A 2-layer ``nn.Sequential`` MLP (4 -> 8 -> 3, ReLU) under a cross-entropy loss is traced with
``fusegrad.trace``: the parameters become the graph's leading inputs (``%model_0_weight``,
...), the batch and the labels follow. ``grad_graph`` then appends the backward pass, built
from the same VJP rules eager autograd runs, and returns the loss and one gradient per
parameter.

    python examples/print_ir.py [--locations]
"""

from __future__ import annotations

import argparse

import fusegrad as fg
from fusegrad import nn
from fusegrad.ir import Graph, print_graph
from fusegrad.passes.autodiff import grad_graph


class TrainingLoss(nn.Module):
    """``loss(model(x), target)`` as one module, so tracing lifts the model's parameters."""

    def __init__(self, model: nn.Module, loss: nn.Module):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x: fg.Tensor, target: fg.Tensor) -> fg.Tensor:
        return self.loss(self.model(x), target)


def mlp_loss_graphs(batch: int = 2, features: int = 4, hidden: int = 8,
                    classes: int = 3) -> tuple[TrainingLoss, Graph, Graph]:
    """The module, its traced forward graph, and that graph's gradient graph with respect to
    every parameter: ``(*params, x, target) -> (loss, *d loss / d params)``."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    module = TrainingLoss(model, nn.CrossEntropyLoss())
    x = fg.randn(batch, features)
    target = fg.randint(0, classes, (batch,))
    forward = fg.trace(module, x, target)
    backward = grad_graph(forward, wrt=range(forward.meta.n_state))
    return module, forward, backward


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locations", action="store_true",
                        help="print each node's source location (file:line)")
    args = parser.parse_args(argv)
    _, forward, backward = mlp_loss_graphs()
    print("// forward: the loss of a 2-layer MLP")
    print(print_graph(forward, locations=args.locations))
    print()
    print("// grad_graph(forward): the loss and its gradient with respect to each parameter")
    print(print_graph(backward, locations=args.locations))


if __name__ == "__main__":
    main()
