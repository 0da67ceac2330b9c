"""The printed IR of an MLP's loss and of its gradient graph (``examples/print_ir.py``).

The checks read the printed text the way FileCheck does: each pattern must match a line
after the previous match, so they pin down the order of the key ops (the two matmuls of the
forward pass, the row reduction of log_softmax, the backward matmuls against transposed
weights and activations) without freezing every line.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusegrad as fg
from examples import print_ir
from fusegrad.ir import interpret, print_graph, verify


def check_in_order(text: str, patterns: list[str]) -> None:
    """Each regex in ``patterns`` matches a line of ``text`` after the previous one's line."""
    lines = text.splitlines()
    pos = 0
    for pattern in patterns:
        for i in range(pos, len(lines)):
            if re.search(pattern, lines[i]):
                pos = i + 1
                break
        else:
            raise AssertionError(f"no line after line {pos} matches {pattern!r} in:\n{text}")


V = r"%[\w.]+"          # a value name


@pytest.fixture(scope="module")
def graphs():
    return print_ir.mlp_loss_graphs()


def test_forward_ir(graphs):
    _, forward, _ = graphs
    text = print_graph(forward)
    check_in_order(text, [
        r"^graph @TrainingLoss\(%model_0_weight: f32\[8,4\], %model_0_bias: f32\[8\], "
        r"%model_2_weight: f32\[3,8\], %model_2_bias: f32\[3\], %x: f32\[2,4\], "
        r"%target: i64\[2\]\) -> \(f32\[\]\)",
        # layer 1: x @ W1.T + b1, then relu as where(x <= 0, 0, x)
        r"(%\d+) = permute %model_0_weight \{perm=\[1, 0\]\} : f32\[4,8\]",
        r"= matmul %x, %\d+ : f32\[2,8\]",
        r"= add %\d+, %model_0_bias : f32\[2,8\]",
        r"= le %\d+, 0\.0 : i1\[2,8\]",
        r"= where %\d+, 0\.0, %\d+ : f32\[2,8\]",
        # layer 2
        r"= permute %model_2_weight \{perm=\[1, 0\]\} : f32\[8,3\]",
        r"= matmul %\d+, %\d+ : f32\[2,3\]",
        r"= add %\d+, %model_2_bias : f32\[2,3\]",
        # log_softmax over the class dim: the row max (shift), exp, row sum, log
        r"= max %\d+ \{axes=\[1\]\} : f32\[2\]",
        r"= exp %\d+ : f32\[2,3\]",
        r"= sum %\d+ \{axes=\[1\]\} : f32\[2\]",
        r"= log %\d+ : f32\[2,1\]",
        # nll: pick the target's log-probability (the sum over the classes where the
        # class's iota equals the target), mean over the batch
        r"(%\d+) = iota \{shape=\[2, 3\], axis=1, dtype=i64\} : i64\[2,3\]",
        r"= eq %\d+, %\d+ : i1\[2,3\]",
        r"= where %\d+, %\d+, 0\.0 : f32\[2,3\]",
        r"= sum %\d+ \{axes=\[1\]\} : f32\[2\]",
        r"= div %\d+, %\d+ : f32\[\]",
        r"^  return %\d+$",
    ])
    assert [n.op for n in forward.nodes].count("matmul") == 2


def test_backward_ir(graphs):
    """The gradient graph repeats the forward, then runs the VJPs: the pick's is a select
    (where the class is the target), and each matmul's are matmuls against transposes (no
    input gradient for the batch)."""
    _, forward, backward = graphs
    text = print_graph(backward)
    check_in_order(text, [
        r"^graph @TrainingLoss_grad\(.*\) -> \(f32\[\], f32\[8,4\], f32\[8\], f32\[3,8\], "
        r"f32\[3\]\)",
        r"= full \{shape=\[\], value=1\.0, dtype=f32\} : f32\[\]",      # the seed d loss = 1
        r"= where %\d+, %\d+, %\d+ : f32\[2,3\]",                    # the pick's VJP
        r"= sum %\d+ \{axes=\[0\]\} : f32\[3\]",                       # d b2
        r"= permute %\d+ \{perm=\[1, 0\]\} : f32\[3,8\]",              # W2.T.T
        r"= matmul %\d+, %\d+ : f32\[2,8\]",                           # d h = d z @ W2
        r"= permute %\d+ \{perm=\[1, 0\]\} : f32\[8,2\]",              # h.T
        r"= matmul %\d+, %\d+ : f32\[8,3\]",                           # h.T @ d z
        r"= le %\d+, 0\.0 : i1\[2,8\]",                                # of relu's output
        r"= where %\d+, 0\.0, %\d+ : f32\[2,8\]",                       # relu's VJP
        r"= sum %\d+ \{axes=\[0\]\} : f32\[8\]",                       # d b1
        r"= permute %x \{perm=\[1, 0\]\} : f32\[4,2\]",                # x.T
        r"= matmul %\d+, %\d+ : f32\[4,8\]",                           # x.T @ d h
        r"= permute %\d+ \{perm=\[1, 0\]\} : f32\[8,4\]",              # (.).T = d W1
        r"^  return %\d+, %\d+, %\d+, %\d+, %\d+$",
    ])
    matmuls = [n for n in backward.nodes if n.op == "matmul"]
    assert len(matmuls) == 2 + 3
    for node in matmuls[2:]:
        assert any(op.producer is not None and op.producer.op == "permute"
                   for op in node.inputs), f"backward matmul without a transpose: {node}"
    assert [n.op for n in backward.nodes[:len(forward.nodes)]] == [n.op for n in forward.nodes]
    verify(forward)
    verify(backward)


def test_the_graphs_compute_the_loss_and_the_gradients_of_backward(graphs):
    module, forward, backward = graphs
    params = [p.detach().numpy() for p in module.parameters()]
    fg.manual_seed(1)
    x, target = fg.randn(2, 4), fg.tensor([2, 0])
    loss, *grads = interpret(backward, *params, x.numpy(), target.numpy())
    np.testing.assert_allclose(interpret(forward, *params, x.numpy(), target.numpy())[0], loss)
    module.zero_grad()
    eager = module(x, target)
    eager.backward()
    np.testing.assert_allclose(loss, eager.detach().numpy(), rtol=1e-6)
    for g, p in zip(grads, module.parameters(), strict=True):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_the_example_prints_both_graphs(capsys):
    print_ir.main([])
    out = capsys.readouterr().out
    assert out.count("graph @") == 2
    assert "graph @TrainingLoss(" in out and "graph @TrainingLoss_grad(" in out
    first = print_graph(print_ir.mlp_loss_graphs()[1])
    assert first in out, "the example prints the graph deterministically"
