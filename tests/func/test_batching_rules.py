"""Every primitive's batching rule against the per-example loop, generated over the IR zoo.

The zoo (``tests/ir/ir_zoo.py``) applies every primitive with its attributes to example
operands. Each node of each zoo graph is run eagerly to get its operands; the operands are
made into a batch of three examples (floating ones scaled differently per example, the
others repeated, so that indices, keys and targets stay valid) and the primitive is
vmapped with the batch at dim 0, at each operand's last dim, and with only the first or
only the last operand batched; each result must equal the stack of the per-example calls.
Every primitive is covered, or listed below with why it is not.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.func import vmap
from fusegrad.ir import Value
from fusegrad.ir.symbolic import literal_tensor
from fusegrad.ops.batching import BATCHING_RULES, FALLBACK
from fusegrad.ops.primitive import PRIMITIVES, bind
from tests.ir.ir_zoo import all_cases

SIZE = 3
SCALES = (1.0, 1.5, 0.5)

# Primitives with no operands: nothing of theirs can be batched.
NO_OPERANDS = {"full": "a source", "constant": "a source", "iota": "a source"}


def _node_operands():
    """(case, node, operand tensors) for every node of every zoo graph that runs eagerly."""
    out = []
    for name, case in sorted(all_cases().items()):
        g = case.graph
        env = {v: fg.tensor(a) if a.ndim else fg.tensor(a.item(), dtype=fg.tensor(a).dtype)
               for v, a in zip(g.inputs, case.args)}
        for node in g.nodes:
            ops = [env[o] if isinstance(o, Value) else literal_tensor(o) for o in node.inputs]
            try:
                env[node.output] = bind(node.prim, *ops, **node.attrs)
            except Exception:             # a node that needs a process group (collectives)
                break
            if ops:
                out.append((name, node, ops))
    return out


NODES = _node_operands()


def _examples(t: fg.Tensor) -> list[np.ndarray]:
    a = t.numpy()
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return [(a * s).astype(a.dtype) for s in SCALES]
    return [a.copy() for _ in SCALES]


def _tolerance(arrays) -> dict:
    dt = np.result_type(*[a.dtype for a in arrays])
    if dt.kind not in "fc":
        return {"rtol": 0, "atol": 0}
    eps = float(np.finfo(np.float32 if dt.itemsize < 4 else dt).eps)
    if dt.itemsize < 4:
        eps = 2.0 ** -7            # bfloat16 and float16 results rounded from float32 work
    return {"rtol": 64 * eps, "atol": 64 * eps}


def _configs(n: int, ndims: list[int]):
    yield "dim 0", [0] * n
    yield "last dim", [d for d in ndims]        # the batch after each example's own axes
    if n > 1:
        yield "first only", [0] + [None] * (n - 1)
        yield "last only", [None] * (n - 1) + [0]


def _run(prim, attrs, ops, dims):
    examples = [_examples(t) for t in ops]
    batched = []
    for t, ex, d in zip(ops, examples, dims):
        if d is None:
            batched.append(t)
        else:
            batched.append(fg.tensor(np.moveaxis(np.stack(ex), 0, d)))
    got = vmap(lambda *xs: bind(prim, *xs, **attrs), in_dims=tuple(dims))(*batched)
    want = [bind(prim, *[t if d is None else fg.tensor(ex[k]) for t, ex, d in
                         zip(ops, examples, dims)], **attrs) for k in range(SIZE)]
    return got, want


@pytest.mark.parametrize("name,node,ops", NODES, ids=[f"{c}-{i}-{n.op}" for i, (c, n, _) in
                                                        enumerate(NODES)])
def test_rule_equals_the_loop(name, node, ops):
    for label, dims in _configs(len(ops), [t.ndim for t in ops]):
        got, want = _run(node.prim, node.attrs, ops, dims)
        want_np = np.stack([w.numpy() for w in want])
        got_np = got.numpy()
        assert got_np.shape == want_np.shape, (label, node)
        assert got.dtype is want[0].dtype, (label, node)
        np.testing.assert_allclose(got_np, want_np, equal_nan=True, err_msg=f"{label}: {node}",
                                   **_tolerance([want_np]))


def test_every_primitive_is_covered():
    covered = {n.op for _, n, _ in NODES}
    missing = sorted(set(PRIMITIVES) - covered - set(NO_OPERANDS) - set(FALLBACK))
    assert missing == []


def test_every_primitive_has_a_rule_or_a_reason():
    without = sorted(n for n, p in PRIMITIVES.items()
                     if p not in BATCHING_RULES and n not in FALLBACK and n not in NO_OPERANDS)
    assert without == []
    assert all(reason for reason in FALLBACK.values())
