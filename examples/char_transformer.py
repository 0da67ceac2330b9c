"""A small causal transformer (nanoGPT's shape) written as a PyTorch user writes it.

``import fusegrad as torch`` style: only torch names are used, so the same class runs on
real PyTorch (``CharTransformer(..., torch=torch)``), which the benchmarks use to compare.
Run it to train on a small built-in text, eager and with the whole step compiled::

    python examples/char_transformer.py            # compiled step
    python examples/char_transformer.py --eager
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

TEXT = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? All: Resolved. "
        "resolved. First Citizen: First, you know Caius Marcius is chief enemy to the people. ")


def make_model(torch, vocab: int, block: int = 32, n_embd: int = 64, n_head: int = 4,
               n_layer: int = 2, checkpoint: bool = False):
    """The model's class, built on ``torch`` (fusegrad or PyTorch). With ``checkpoint``
    each block runs through ``torch.utils.checkpoint.checkpoint``: its activations are
    recomputed in the backward instead of kept from the forward."""
    nn, F = torch.nn, torch.nn.functional
    run_checkpointed = torch.utils.checkpoint.checkpoint

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv = nn.Linear(n_embd, 3 * n_embd)
            self.proj = nn.Linear(n_embd, n_embd)
            self.fc, self.out = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)
            self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(
                1, 1, block, block))

        def attention(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(x).split(n_embd, dim=2)
            q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
            k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
            v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // n_head))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.proj(y)

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, n_embd)
            self.pos = nn.Embedding(block, n_embd)
            self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln = nn.LayerNorm(n_embd)
            self.head = nn.Linear(n_embd, vocab)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.tok(idx) + self.pos(torch.arange(T))
            for b in self.blocks:
                x = run_checkpointed(b, x, use_reentrant=False) if checkpoint else b(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(B * T, vocab), targets.view(B * T))

    return CharTransformer()


def batches(torch, text: str, block: int, batch: int, seed: int = 0):
    chars = sorted(set(text))
    data = np.array([chars.index(c) for c in text], dtype=np.int64)
    rng = np.random.RandomState(seed)
    while True:
        ix = rng.randint(0, len(data) - block - 1, batch)
        x = np.stack([data[i:i + block] for i in ix])
        y = np.stack([data[i + 1:i + block + 1] for i in ix])
        yield torch.tensor(x), torch.tensor(y)


def main(argv=None) -> int:
    import fusegrad as torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eager", action="store_true", help="do not compile the step")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint", action="store_true",
                    help="recompute each block's activations in the backward")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    vocab = len(set(TEXT))
    model = make_model(torch, vocab, checkpoint=args.checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    train = step if args.eager else torch.compile(step, fullgraph=True)
    data = batches(torch, TEXT, 32, 16)
    start = time.perf_counter()
    for i in range(args.steps):
        loss = train(*next(data))
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i:3d}  loss {float(loss):.4f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.2f} s "
          f"({'eager' if args.eager else 'compiled'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
