"""The kernel graph: a graph partitioned into fused kernels, the backend-neutral result of
the fusion pass (:mod:`fusegrad.passes.fusion`) that every backend (LLVM, CUDA C) and every
launcher (CPU threads, CUDA streams) reads.

It sits in ``ir`` rather than ``codegen`` because it is data about a graph, produced by a
pass: passes may build it without importing codegen (data flows down the pipeline).

- :class:`View`: a strided window on a materialized value (a movement op folded into loads);
- :class:`Kernel`: one fusion group, its index space and its buffers;
- :class:`KernelGraph`: the kernels in execution order, the views they read, and which
  values live in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusegrad.ir.graph import Graph, Node, Value
from fusegrad.ops.primitive import Kind
from fusegrad.symint import SymInt, holds_symbol, is_symbolic, known_equal

__all__ = ["View", "Kernel", "KernelGraph", "view_of", "identity_view", "touches_complex"]


def touches_complex(node: Node) -> bool:
    """Whether ``node`` reads or makes a complex value."""
    return node.output.type.dtype.is_complex or any(
        isinstance(op, Value) and op.type.dtype.is_complex for op in node.inputs)


@dataclass
class View:
    """A strided window on a materialized value: ``value[offset + sum(idx * strides)]``,
    strides in elements over ``shape``."""

    base: Value
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclass(eq=False)
class Kernel:
    """One fused kernel: its nodes, the buffers it reads and writes, and its index space.

    ``kind`` is "elementwise", "reduction", "matmul" or "extern". ``shape`` is the full
    index space; for reductions ``axes`` are the reduced axes of it.
    """

    name: str
    kind: str
    nodes: list[Node] = field(default_factory=list)
    shape: tuple[int, ...] = ()
    axes: tuple[int, ...] = ()
    inputs: list[Value] = field(default_factory=list)    # materialized values read
    outputs: list[Value] = field(default_factory=list)   # values written
    level: dict = field(default_factory=dict)            # Value -> "full" | "row"

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(d for i, d in enumerate(self.shape) if i not in self.axes)

    @property
    def complex(self) -> bool:
        """Whether a node of this kernel reads or makes a complex value (such nodes run as
        numpy extern steps: codegen has no complex types)."""
        return any(touches_complex(n) for n in self.nodes)

    def describe(self) -> str:
        ops = ",".join(n.op for n in self.nodes)
        kind = f"{self.kind} complex" if self.complex else self.kind
        return f"{self.name}[{kind} {'x'.join(map(str, self.shape)) or 'scalar'}]({ops})"

    def __repr__(self) -> str:
        return f"<Kernel {self.describe()}>"


@dataclass
class KernelGraph:
    """A graph partitioned into kernels, in execution order, plus the views they read."""

    graph: Graph
    kernels: list[Kernel]
    views: dict[Value, View]            # movement results folded into loads
    materialized: set[Value]            # values that live in memory

    def __str__(self) -> str:
        return "\n".join(k.describe() for k in self.kernels)

    def summary(self) -> list[str]:
        return [k.describe() for k in self.kernels]


# --------------------------------------------------------------------------- views


def view_of(node: Node, source: View) -> View | None:
    """The strided form of a movement ``node`` applied to ``source``, or None when no
    strides express it (a reshape that would need a copy). ``stop_gradient`` is the
    identity view: it only matters to differentiation, which is over by fusion."""
    if node.op == "stop_gradient":
        return source
    if node.prim.kind is not Kind.MOVEMENT or node.op in ("pad", "concat"):
        return None
    if is_symbolic(source.shape) or is_symbolic(source.strides) or \
            isinstance(source.offset, SymInt) or any(holds_symbol(a) for a in node.attrs.values()):
        return _symbolic_view(node, source)
    np_dtype = source.base.type.dtype.np_dtype
    item = np_dtype.itemsize
    # A stand-in with the view's shape and strides over one element: numpy computes the
    # strides of reshape/transpose/slice/broadcast results without reading memory.
    stand = np.lib.stride_tricks.as_strided(
        np.empty(1, dtype=np_dtype), shape=source.shape,
        strides=tuple(s * item for s in source.strides))
    try:
        if node.op == "reshape":
            out = np.reshape(stand, node.attrs["shape"], copy=False)
        else:
            out = node.prim.impl(stand, **node.attrs)
    except ValueError:
        return None
    shift = out.__array_interface__["data"][0] - stand.__array_interface__["data"][0]
    return View(source.base, tuple(out.shape), tuple(s // item for s in out.strides),
                source.offset + shift // item)


def _symbolic_view(node: Node, source: View) -> View | None:
    """:func:`view_of` for symbolic sizes (no numpy stand-in can hold them): permutes,
    broadcasts, slices, and reshapes of a view whose elements are in row-major order; None
    for the others (the value is then computed into a buffer)."""
    shape, strides = source.shape, source.strides
    out_shape = node.output.type.shape
    if node.op == "permute":
        perm = node.attrs["perm"]
        return View(source.base, tuple(shape[p] for p in perm), tuple(strides[p] for p in perm),
                    source.offset)
    if node.op == "broadcast_to":
        lead = len(out_shape) - len(shape)
        out = [0] * lead + [0 if d == 1 and not known_equal(t, 1) else st
                            for d, t, st in zip(shape, out_shape[lead:], strides)]
        return View(source.base, tuple(out_shape), tuple(out), source.offset)
    if node.op == "slice":
        offset = source.offset
        for a, st in zip(node.attrs["starts"], strides):
            offset = offset + a * st
        return View(source.base, tuple(out_shape),
                    tuple(st * step for st, step in zip(strides, node.attrs["steps"])), offset)
    if node.op == "reshape":
        dense = _row_major(shape)
        if all(d == 1 or known_equal(a, b) for d, a, b in zip(shape, strides, dense)):
            return View(source.base, tuple(out_shape), _row_major(out_shape), source.offset)
    return None


def _row_major(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d if isinstance(d, SymInt) else acc * max(d, 1)
    return tuple(reversed(strides))


def identity_view(v: Value) -> View:
    shape = v.type.shape
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return View(v, shape, tuple(reversed(strides)), 0)
