"""How many bytes a compiled forward keeps for its backward, under each partition policy.

The forward and backward of two models are split by ``fusegrad.passes.partition``:
``min_cut`` (save what is expensive to recompute, recompute cheap elementwise values),
``save_all`` (every forward value the backward reads) and ``recompute_all`` (only the
forward inputs; the backward recomputes the rest). Models:

- the 784-256-256-10 MLP with ReLU and cross-entropy, batch 128, gradients of the parameters;
- a transformer block (LayerNorm, 4-head causal self-attention, LayerNorm, GELU MLP, both
  residual), batch 16, T=32, C=64, gradients of the parameters and of the block's input.

"inputs" counts saved forward inputs (the batch, the parameters), "residuals" the values the
forward computes and hands over; "recomputed" the backward nodes the forward computes too.
Every input is costed at its size (``partition_joint(..., free_inputs=...)`` can make the
parameters free; for these two models the cut is the same).

    python examples/partition_report.py
"""

from __future__ import annotations

import math

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.ir import Graph
from fusegrad.passes.partition import partition_report
from fusegrad.tracer.trace import trace


class MLPLoss(nn.Module):
    """Cross-entropy of a 784-256-256-10 ReLU MLP."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))

    def forward(self, x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        return F.cross_entropy(self.net(x), y)


class Block(nn.Module):
    """A pre-LayerNorm transformer block with causal self-attention."""

    def __init__(self, channels: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4 * channels)
        self.out = nn.Linear(4 * channels, channels)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        b, t, c = x.shape
        hd = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        causal = fg.ones(t, t).tril() == 0
        att = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def model_graphs() -> list[tuple[Graph, list[int]]]:
    """(graph, wrt) of each model: the parameters are the graphs' leading inputs."""
    fg.manual_seed(0)
    mlp = MLPLoss()
    g_mlp = trace(mlp, fg.randn(128, 784), fg.randint(0, 10, (128,)))
    n_mlp = len(list(mlp.parameters()))
    block = Block()
    x = fg.randn(16, 32, 64, requires_grad=True)
    g_block = trace(block, x)
    n_block = len(list(block.parameters()))
    return [(g_mlp, list(range(n_mlp))), (g_block, list(range(n_block + 1)))]


def main() -> None:
    for g, wrt in model_graphs():
        print(f"{g.name}: {len(g.nodes)} forward nodes, gradients of {len(wrt)} inputs")
        print(partition_report(g, wrt))
        print()


if __name__ == "__main__":
    main()
