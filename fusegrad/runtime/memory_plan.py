"""The memory plan of a kernel graph, shared by every launcher (CPU threads, CUDA streams).

:func:`plan_memory` numbers every buffer a program needs with a slot: graph inputs first,
then constants, then kernel outputs in the order they are produced. Outputs of the graph get
slots of their own (fresh per call); intermediates share a slot when their lifetimes do not
overlap (a value is live from the step that produces it to the last step that reads it,
through any view). Scratch buffers a backend asks for (a split reduction's partial results)
come last. :func:`donation_safe` says whether an output may take an input's buffer.

The plan knows shapes and numpy dtypes only, never addresses: a launcher allocates the
buffers (numpy arrays, device memory) and binds them to slots. In a graph of symbolic sizes
the shapes are expressions (:meth:`MemoryPlan.specs_at` evaluates them for a call's sizes),
and the sizes its kernels read at run time have a slot of their own (``slots[SYMBOLS]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fusegrad.codegen.cpu_lowering import split_plan
from fusegrad.codegen.values import SYMBOLS, program_symbols
from fusegrad.ir.graph import Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, identity_view
from fusegrad.symint import evaluate_shape

__all__ = ["MemoryPlan", "plan_memory", "donation_safe", "saved_between"]


@dataclass
class MemoryPlan:
    """Slots of a program's buffers.

    ``slots``: value -> slot; ``n_inputs``: the graph inputs hold slots ``0..n_inputs-1``;
    ``constants``: slot -> the constant's contiguous array; ``output_slots``: slots of graph
    outputs (a fresh buffer per call); ``intermediate_specs``: slot -> (shape, numpy dtype)
    of every buffer allocated once and reused; ``scratch_slots``: kernel index -> its scratch
    slot; ``output_specs``: (slot, shape, numpy dtype) of the outputs, by slot."""

    slots: dict[Value, int]
    n_inputs: int
    constants: dict[int, np.ndarray]
    output_slots: set[int]
    intermediate_specs: dict[int, tuple]
    scratch_slots: dict[int, int] = field(default_factory=dict)
    output_specs: list[tuple] = field(default_factory=list)
    n_slots: int = 0

    @property
    def arena_bytes(self) -> int:
        """Bytes of the buffers a program allocates once and reuses across its steps
        (intermediates and scratch): its working memory beyond inputs, constants and
        outputs, at its peak, since every such buffer is held for the whole call."""
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                   for shape, dt in self.intermediate_specs.values())

    def specs_at(self, bindings: dict) -> tuple[dict[int, tuple], list[tuple]]:
        """``intermediate_specs`` and ``output_specs`` with every shape evaluated under
        ``bindings`` (symbol name -> size)."""
        inter = {slot: (evaluate_shape(shape, bindings), dt)
                 for slot, (shape, dt) in self.intermediate_specs.items()}
        outs = [(slot, evaluate_shape(shape, bindings), dt) for slot, shape, dt in self.output_specs]
        return inter, outs


def plan_memory(kg: KernelGraph,
                scratch_cells: Callable[[Kernel], int | None] = lambda k: None) -> MemoryPlan:
    """Slots for every buffer of ``kg``; ``scratch_cells(kernel)`` gives the 8-byte cells of
    scratch a kernel needs on the target backend (None: none)."""
    g = kg.graph
    slots: dict[Value, int] = {}
    for v in g.inputs:
        slots[v] = len(slots)
    n_inputs = len(g.inputs)
    constants: dict[int, np.ndarray] = {}
    for node in g.nodes:
        if node.op == "constant":
            slots[node.output] = len(slots)
            constants[slots[node.output]] = np.ascontiguousarray(node.attrs["value"].array)
    symbols = program_symbols(g)
    if symbols:
        slots[SYMBOLS] = len(slots)
        constants[slots[SYMBOLS]] = np.zeros(len(symbols), np.int64)
    # Values that need memory: kernel outputs, and each matmul's product (a BLAS or a
    # product kernel writes it before the epilogue reads it).
    producer_step: dict[Value, int] = {}
    for i, k in enumerate(kg.kernels):
        for v in k.outputs:
            producer_step.setdefault(v, i)
        if k.kind == "matmul":
            for n in k.nodes:
                if n.op == "matmul":
                    producer_step.setdefault(n.output, i)
    outputs = {o for o in g.outputs if isinstance(o, Value)}
    # Liveness: the last step reading each value (through any view); values returned
    # as (views of) outputs live to the end.
    last_use: dict[Value, int] = dict(producer_step)
    for i, k in enumerate(kg.kernels):
        for v in k.inputs:
            last_use[v] = max(last_use.get(v, i), i)
    for o in outputs:
        if o in kg.views:
            last_use[kg.views[o].base] = len(kg.kernels)
    output_slots: set[int] = set()
    intermediate_specs: dict[int, tuple] = {}
    next_slot = len(slots)
    busy_until: dict[int, int] = {}          # intermediate slot -> its last reader
    by_spec: dict[tuple, list[int]] = {}
    for v, step in sorted(producer_step.items(), key=lambda item: item[1]):
        if v in slots:
            continue
        if v in outputs:
            slots[v] = next_slot
            output_slots.add(next_slot)
            next_slot += 1
            continue
        # The dtype itself, not its .str: bfloat16's string is '<V2', which would
        # allocate raw void buffers that numpy steps and returned views misread.
        spec = (v.type.shape, v.type.dtype.np_dtype)
        # Share a buffer whose last reader ran before this value's producer.
        slot = next((s for s in by_spec.get(spec, []) if busy_until[s] < step), None)
        if slot is None:
            slot = next_slot
            next_slot += 1
            intermediate_specs[slot] = spec
            by_spec.setdefault(spec, []).append(slot)
        slots[v] = slot
        busy_until[slot] = last_use.get(v, step)
    scratch_slots: dict[int, int] = {}
    for i, k in enumerate(kg.kernels):
        cells = scratch_cells(k)
        if cells is not None:
            scratch_slots[i] = next_slot
            intermediate_specs[next_slot] = ((cells,), np.dtype(np.int64))
            next_slot += 1
    output_specs = sorted({(s, v.type.shape, v.type.dtype.np_dtype)
                           for v, s in slots.items() if s in output_slots and v is not SYMBOLS},
                          key=lambda spec: spec[0])
    return MemoryPlan(slots, n_inputs, constants, output_slots, intermediate_specs,
                      scratch_slots, output_specs, next_slot)


def donation_safe(kg: KernelGraph, kernel: Kernel, later: list[Kernel], v: Value,
                  o: Value) -> bool:
    """Whether output ``o``, written by ``kernel`` (a compiled kernel), may take the buffer of
    input ``v``: ``kernel`` reads ``v`` only element for element at the index it writes, in
    the loop body that stores ``o`` (which computes every value it stores before it stores
    any, so each element is read before it is overwritten), and none of the ``later`` kernels
    reads ``v``. ``o`` is full-size, or a reduction kernel's row-level result (a bias's
    update after its gradient's sum). In a matmul kernel the reads are its epilogue's: the
    product (written before the epilogue runs) must neither read ``v`` nor be ``o`` (an
    optimizer's update of a weight from its gradient's product writes the weight in
    place)."""
    level = kernel.level.get(o)
    # (A split reduction runs as several functions, each storing what it computes.)
    if kernel.kind not in ("elementwise", "reduction", "matmul") or \
            split_plan(kernel) is not None:
        return False
    if level == "full":
        shape = kernel.shape
    elif level == "row" and kernel.kind == "reduction":
        shape = kernel.row_shape
    else:
        return False
    if o.type.shape != shape and (level == "full" or
                                  o.type.shape != _keepdim(kernel.shape, kernel.axes)):
        return False
    if any(v in k.inputs for k in later):
        return False
    identity = identity_view(v).strides
    for n in kernel.nodes:
        if n.op == "matmul" and n.output is o:
            return False
        for op in n.inputs:
            if not isinstance(op, Value):
                continue
            view = kg.views.get(op)
            base = view.base if view is not None else op
            if base is not v:
                continue
            if n.op == "matmul":
                return False
            op_shape = view.shape if view is not None else op.type.shape
            strides = view.strides if view is not None else identity
            same = all(a == b for a, b, d in zip(strides, identity, op_shape) if d != 1)
            if op_shape != o.type.shape or not same or kernel.level.get(n.output) != level or \
                    (view is not None and view.offset != 0) or \
                    n.prim.kind.value not in ("elementwise",):
                return False
    return True


def _keepdim(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def saved_between(kg: KernelGraph, boundary: Value, inputs=()) -> dict[Value, int]:
    """The buffers a program holds across ``boundary``, by bytes: the values its kernels
    compute up to the one that produces ``boundary`` and that a later kernel reads, and
    those of the graph ``inputs`` that a later kernel reads. In a compiled training step whose
    ``boundary`` is the loss, they are the activations the forward saves for the backward (a
    bf16 activation under autocast counts 2 bytes an element, as it is stored; ``inputs``
    the step's data, which the float32 backward reads and an autocast one reads in bf16)."""
    def base(v: Value) -> Value:
        return kg.views[v].base if v in kg.views else v
    split = next((i for i, k in enumerate(kg.kernels)
                  if boundary in k.outputs or base(boundary) in k.outputs), None)
    if split is None:
        raise ValueError(f"saved_between: no kernel computes {boundary}")
    made = {v for k in kg.kernels[:split + 1] for v in k.outputs} | set(inputs)
    for k in kg.kernels[:split + 1]:
        if k.kind == "matmul":
            made.update(n.output for n in k.nodes if n.op == "matmul")
    read_after = {base(v) for k in kg.kernels[split + 1:] for v in k.inputs}
    return {v: int(np.prod(v.type.shape, dtype=np.int64)) * v.type.dtype.np_dtype.itemsize
            for v in made if v in read_after}
