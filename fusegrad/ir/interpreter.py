"""The reference interpreter: run any graph node by node on numpy.

Each node runs its primitive's numpy ``impl`` (the one definition of the op, the same code
eager tensors run), and its result is cast to the type the primitive's rule gives, exactly as
eager execution (``fusegrad.ops.primitive._eager_apply``) does. This is the oracle every later
stage (passes, codegen, runtime) is tested against, so it checks rather than trusts: inputs
must have the declared shapes and dtypes, and each result the node's shape.

A graph with symbolic sizes (``f32[B,784]``) runs at any size: the inputs bind each symbol
(the first input dim that is that bare symbol), every other size is checked against its
expression's value, and attributes that hold sizes (a reshape's shape) are evaluated.

>>> interpret(g, np.ones((4, 8), np.float32), np.ones((8, 16), np.float32))  # doctest: +SKIP
[array(...)]
"""

from __future__ import annotations

import numpy as np

from fusegrad.ir.graph import Graph, IRError, Literal, Node, Operand, Value
from fusegrad.ir.printer import format_type, print_node, value_names
from fusegrad.ir.specialize import concrete_attr
from fusegrad.symint import MIN_SYMBOL_SIZE, SymInt, evaluate_shape, is_symbolic

__all__ = ["interpret", "bind_symbols"]


def _literal_array(lit: Literal) -> np.ndarray:
    return np.asarray(lit.value, dtype=lit.dtype.np_dtype)


def bind_symbols(g: Graph, shapes) -> dict[str, int]:
    """The value of each symbolic size of ``g`` for inputs of ``shapes`` (symbol name ->
    int), from the input dims that are bare symbols (ranks are checked by the caller)."""
    bindings: dict[str, int] = {}
    for v, shape in zip(g.inputs, shapes):
        for d, n in zip(v.type.shape, shape):
            if isinstance(d, SymInt) and d.name is not None:
                bindings.setdefault(d.name, int(n))
    for name, n in sorted(bindings.items()):
        if n < MIN_SYMBOL_SIZE:
            raise IRError(f"interpret @{g.name}: symbol {name} is bound to {n}, but a symbolic "
                          f"size is at least {MIN_SYMBOL_SIZE} (sizes 0 and 1 are specialized)")
    return bindings


def _check_inputs(g: Graph, arrays: tuple, bindings: dict) -> list[np.ndarray]:
    """The arrays, checked against the input types; ``bindings`` gets each symbol's value
    from the input shapes (a symbol already in it must have that value there)."""
    if len(arrays) != len(g.inputs):
        sig = ", ".join(format_type(v.type) for v in g.inputs)
        raise IRError(f"interpret @{g.name}: the graph takes {len(g.inputs)} input(s) ({sig}), "
                      f"got {len(arrays)}")
    names = value_names(g)
    checked = [np.asarray(a) for a in arrays]
    if any(is_symbolic(v.type.shape) for v in g.inputs):
        given = dict(bindings)
        bindings.update(bind_symbols(g, [a.shape for a in checked]))
        bindings.update(given)      # a disagreeing input shape is reported below
    for i, (v, arr) in enumerate(zip(g.inputs, checked, strict=True)):
        want = evaluate_shape(v.type.shape, bindings) if len(arr.shape) == v.type.ndim \
            else v.type.shape
        if arr.shape != want or arr.dtype != v.type.dtype.np_dtype:
            bound = "".join(f", {k}={n}" for k, n in sorted(bindings.items()))
            raise IRError(f"interpret @{g.name}: input {i} ({names[v]}) must be {v.type}"
                          f"{f' (with {bound[2:]})' if bound else ''}, got an "
                          f"array of shape {list(arr.shape)} and dtype {arr.dtype}")
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


def _run_node(g: Graph, node: Node, index: int, operands: list[np.ndarray],
              bindings: dict) -> np.ndarray:
    attrs = {k: concrete_attr(a, bindings) for k, a in node.attrs.items()} if bindings else node.attrs
    try:
        result = np.asarray(node.prim.impl(*operands, **attrs))
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
    if result.shape != (evaluate_shape(out_type.shape, bindings) if bindings else out_type.shape):
        text = print_node(node, value_names(g), strict=False)
        raise IRError(f"interpret @{g.name}: node {index} `{text}` produced shape "
                      f"{list(result.shape)}, but its type is {format_type(out_type)}")
    return result


def interpret(g: Graph, *arrays, bindings: dict[str, int] | None = None) -> list[np.ndarray]:
    """Run ``g`` on numpy ``arrays`` (one per input, of the input's exact shape and dtype) and
    return its outputs as arrays, in order.

    A graph with symbolic sizes binds each symbol from the input shapes; ``bindings``
    (symbol name -> size) gives them instead, and the inputs must then have those sizes.

    Literal outputs come back as 0-d arrays of their dtype. Values are freed after their last
    use, so large graphs run in the memory of their live values.
    """
    bindings = dict(bindings or {})
    for name, n in sorted(bindings.items()):
        if n < MIN_SYMBOL_SIZE:
            raise IRError(f"interpret @{g.name}: symbol {name} is bound to {n}, but a symbolic "
                          f"size is at least {MIN_SYMBOL_SIZE} (sizes 0 and 1 are specialized)")
    env: dict[Value, np.ndarray] = dict(zip(g.inputs, _check_inputs(g, arrays, bindings),
                                            strict=True))
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
        env[node.output] = _run_node(g, node, i, operands, bindings)
        for v in freed.get(i, ()):
            env.pop(v, None)
    return [value_of(o, f"output {k}") for k, o in enumerate(g.outputs)]
