"""The reference interpreter: run any graph node by node on numpy.

Each node runs its primitive's numpy ``impl`` (the one definition of the op, the same code
eager tensors run), and its result is cast to the type the primitive's rule gives, exactly as
eager execution (``fusegrad.ops.primitive._eager_apply``) does. This is the oracle every later
stage (passes, codegen, runtime) is tested against, so it checks rather than trusts: inputs
must have the declared shapes and dtypes, and each result the node's shape.

>>> interpret(g, np.ones((4, 8), np.float32), np.ones((8, 16), np.float32))  # doctest: +SKIP
[array(...)]
"""

from __future__ import annotations

import numpy as np

from fusegrad.ir.graph import Graph, IRError, Literal, Node, Operand, Value
from fusegrad.ir.printer import format_type, print_node, value_names

__all__ = ["interpret"]


def _literal_array(lit: Literal) -> np.ndarray:
    return np.asarray(lit.value, dtype=lit.dtype.np_dtype)


def _check_inputs(g: Graph, arrays: tuple) -> list[np.ndarray]:
    if len(arrays) != len(g.inputs):
        sig = ", ".join(format_type(v.type) for v in g.inputs)
        raise IRError(f"interpret @{g.name}: the graph takes {len(g.inputs)} input(s) ({sig}), "
                      f"got {len(arrays)}")
    names = value_names(g)
    checked = []
    for i, (v, a) in enumerate(zip(g.inputs, arrays, strict=True)):
        arr = np.asarray(a)
        if arr.shape != v.type.shape or arr.dtype != v.type.dtype.np_dtype:
            raise IRError(f"interpret @{g.name}: input {i} ({names[v]}) must be {v.type}, got an "
                          f"array of shape {list(arr.shape)} and dtype {arr.dtype}")
        checked.append(arr)
    return checked


def _last_uses(g: Graph) -> dict[int, list[Value]]:
    """For each node position, the values whose last use it is (to free them early)."""
    last: dict[Value, int] = {}
    for i, node in enumerate(g.nodes):
        for op in node.inputs:
            if isinstance(op, Value):
                last[op] = i
    keep = {id(o) for o in g.outputs}
    freed: dict[int, list[Value]] = {}
    for v, i in last.items():
        if id(v) not in keep:
            freed.setdefault(i, []).append(v)
    return freed


def _run_node(g: Graph, node: Node, index: int, operands: list[np.ndarray]) -> np.ndarray:
    try:
        result = np.asarray(node.prim.impl(*operands, **node.attrs))
    except Exception as e:
        # Keep the primitive's own error type (IndexError for a bad gather index, ...) and
        # add which node raised it.
        if hasattr(e, "add_note"):
            text = print_node(node, value_names(g), strict=False)
            e.add_note(f"while interpreting node {index} of @{g.name}: {text}"
                       + (f" (at {node.loc})" if node.loc else ""))
        raise
    out_type = node.output.type
    # numpy returns its own dtypes from some ufuncs and reductions: the rule decides.
    if result.dtype != out_type.dtype.np_dtype:
        result = result.astype(out_type.dtype.np_dtype)
    if result.shape != out_type.shape:
        text = print_node(node, value_names(g), strict=False)
        raise IRError(f"interpret @{g.name}: node {index} `{text}` produced shape "
                      f"{list(result.shape)}, but its type is {format_type(out_type)}")
    return result


def interpret(g: Graph, *arrays) -> list[np.ndarray]:
    """Run ``g`` on numpy ``arrays`` (one per input, of the input's exact shape and dtype) and
    return its outputs as arrays, in order.

    Literal outputs come back as 0-d arrays of their dtype. Values are freed after their last
    use, so large graphs run in the memory of their live values.
    """
    env: dict[Value, np.ndarray] = dict(zip(g.inputs, _check_inputs(g, arrays), strict=True))
    freed = _last_uses(g)

    def value_of(op: Operand, where: str) -> np.ndarray:
        if isinstance(op, Literal):
            return _literal_array(op)
        try:
            return env[op]
        except (KeyError, TypeError):
            raise IRError(f"interpret @{g.name}: {where} uses a value that is not defined before "
                          f"it ({op!r}); verify(g) says why") from None

    for i, node in enumerate(g.nodes):
        operands = [value_of(op, f"node {i} ({node.op})") for op in node.inputs]
        env[node.output] = _run_node(g, node, i, operands)
        for v in freed.get(i, ()):
            env.pop(v, None)
    return [value_of(o, f"output {k}") for k, o in enumerate(g.outputs)]
