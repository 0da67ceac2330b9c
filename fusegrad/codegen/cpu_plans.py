"""How the CPU lowering's loops are planned: which loop of a kernel is parallel and how
long it is, read both by the lowering (:mod:`fusegrad.codegen.cpu_lowering`, which builds
the loops) and by the runtime (which launches ``[start, end)`` parts of them), so that the
two cannot disagree.

- :class:`LoopPlan` (:func:`loop_plan`): the loops of an elementwise kernel (or a matmul
  epilogue): adjacent axes merged into one loop, the last two in tiles when a buffer is
  read across its rows;
- :class:`ColumnPlan` (:func:`column_plan`): a reduction that keeps its innermost axis runs
  its reduced axes outside and a tile of accumulators inside;
- :class:`SplitPlan` (:func:`split_plan`): a large full reduction is split into parts
  reduced in parallel, then combined in order (several functions per kernel,
  :func:`kernel_phases`);
- :func:`parallel_extent`: the length of a kernel's parallel loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusegrad.codegen.values import MOVES_ELEMENTS
from fusegrad.codegen.values import reductions as kernel_reductions
from fusegrad.ir.graph import Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, identity_view
from fusegrad.symint import at_hints, ceil_div, is_symbolic, known_equal, size_hint

__all__ = ["ColumnPlan", "column_plan", "SplitPlan", "split_plan", "kernel_phases",
           "parallel_extent", "loop_plan", "LoopPlan", "COLUMN_TILE", "COLUMN_UNITS",
           "MIN_COLUMN_CHUNK", "SPLIT_WORK", "SPLIT_PARTS", "TILE", "TILE_WORK", "TILE_STRIDE",
           "tuning"]

# Column reductions (the innermost axis kept, see ColumnPlan): a tile holds at most this many
# accumulators (a few KiB: they stay in L1 while the reduced axis streams past them).
COLUMN_TILE = 1024
# Tiles are split until a kernel has this many parallel units (when its columns allow tiles
# of at least MIN_COLUMN_CHUNK): the runtime splits the unit loop across threads. Narrower
# tiles read each row in short pieces, which the prefetchers follow badly (a 4096x1024
# column sum: 4.3 ms in tiles of 1024, 11 ms in tiles of 128, on one thread).
COLUMN_UNITS = 8
MIN_COLUMN_CHUNK = 256

# Full reductions (no kept axes) of at least SPLIT_WORK elements (the runtime's threading
# threshold) are split into at most SPLIT_PARTS parts along their leading axes, reduced
# in parallel and combined in part order. The parts are fixed by the shape, so a result
# has the same bits whatever the thread count.
SPLIT_WORK = 1 << 16
SPLIT_PARTS = 16


@dataclass(frozen=True)
class ColumnPlan:
    """Loop order of a reduction whose innermost axis is kept (``x.sum(0)`` of a row-major
    matrix): the reduced axes run outside and a tile of accumulators, one per kept element
    of the trailing kept axes, runs inside at unit stride, where the vectorizer finds it.
    Looping the other way (one strided reduction per kept element) is 10-30x slower.

    ``outer``: kept axes before the tile, one per parallel unit; ``tile``: trailing kept
    axes held in the tile; ``chunk``: when nonzero the tile is a chunk of that many
    elements of the last axis (``tile`` is then that axis alone); when the axis would fit
    one tile the chunks are there for the threads only, and the chunks of one row in a
    thread's range run as one tile. ``units``: the parallel loop's extent, ``prod(outer)``
    times the chunks per row."""

    outer: tuple[int, ...]
    tile: tuple[int, ...]
    chunk: int
    units: int


def column_plan(kernel: Kernel) -> ColumnPlan | None:
    """The loop order of ``kernel`` when it is a reduction that keeps its innermost axis,
    else None (elementwise kernels, reductions over the last axis)."""
    shape, axes = kernel.shape, kernel.axes
    n = len(shape)
    if kernel.kind != "reduction" or not axes or n - 1 in axes or 0 in shape:
        return None
    tail = list(range(max(axes) + 1, n))
    tile, size = [], 1
    # (A tile is a stack array: of static axes only. A symbolic last axis is chunked, and
    # the choices for the thread pool are made at the sizes traced at: any is correct.)
    while tail and not is_symbolic(shape[tail[-1]]) and size * shape[tail[-1]] <= COLUMN_TILE:
        size *= shape[tail[-1]]
        tile.insert(0, tail.pop())
    last = shape[n - 1]
    chunk = 0
    if not tile:                     # the last axis alone is longer than a tile
        if is_symbolic(last):
            tile, chunk = [n - 1], COLUMN_TILE
        else:
            fewest = -(-last // COLUMN_TILE)
            tile, chunk = [n - 1], _even_chunk(last, range(fewest, 2 * fewest + 1)) or COLUMN_TILE
    outer = [a for a in range(n) if a not in axes and a not in tile]
    units = math.prod(shape[a] for a in outer)
    # More units for the thread pool: move tile axes out, then chunk the last axis.
    while len(tile) > 1 and size_hint(units) < COLUMN_UNITS and \
            size // shape[tile[0]] >= MIN_COLUMN_CHUNK:
        size //= shape[tile[0]]
        units *= shape[tile[0]]
        outer.append(tile.pop(0))
    if len(tile) == 1 and size_hint(units) < COLUMN_UNITS and not chunk:
        chunk = _even_chunk(last, range(-(-COLUMN_UNITS // size_hint(units)), 1, -1))
    if chunk:
        units *= ceil_div(last, chunk)
    return ColumnPlan(tuple(outer), tuple(tile), chunk, units)


def _even_chunk(n: int, pieces) -> int:
    """The chunk of the first count in ``pieces`` that cuts ``n`` into equal chunks of at
    least MIN_COLUMN_CHUNK and at most COLUMN_TILE elements, each a multiple of 16; 0 if
    none does. Equal chunks give the tile loop a constant trip count: LLVM then keeps the
    accumulators in registers (a 1000x3x300 sum(0) in chunks of 256 and 44: 5x slower)."""
    if is_symbolic(n):
        return 0
    for p in pieces:
        c = n // p
        if n % p == 0 and c % 16 == 0 and MIN_COLUMN_CHUNK <= c <= COLUMN_TILE:
            return c
    return 0


@dataclass(frozen=True)
class SplitPlan:
    """How a full reduction is split: the leading ``lead`` axes (``lead_size`` indices in
    all) are cut into ``parts`` ranges. Each reduction of the kernel runs as a parallel
    phase that reduces each part into a scratch cell (``kN_p<i>``, over the parts), then a
    serial one that combines the cells in order (``kN_c<i>``); the last combine stores the
    kernel's scalar outputs, and a parallel phase over the leading indices stores its
    full-size outputs (``kN``)."""

    lead: int
    lead_size: int
    parts: int
    reductions: int

    def cells(self) -> int:
        """8-byte cells of scratch: two per part and reduction (a float64 sum's
        compensation beside its total), then one final value per reduction."""
        return 2 * self.reductions * self.parts + self.reductions



def split_plan(kernel: Kernel) -> SplitPlan | None:
    """How ``kernel`` is split across threads when it is a large full reduction, else None."""
    shape = kernel.shape
    # Symbolic sizes: decided at the sizes the program was traced at (any plan is correct
    # for every size; a split's parts are fixed, some of them empty at small sizes).
    if kernel.kind != "reduction" or len(kernel.axes) != len(shape) or not shape or \
            math.prod(at_hints(shape)) < SPLIT_WORK:
        return None
    count = len(kernel_reductions(kernel))
    if not count:
        return None
    lead, size = 0, 1
    while lead < len(shape) and size_hint(size) < 4 * SPLIT_PARTS:
        size *= shape[lead]
        lead += 1
    return SplitPlan(lead, size, min(SPLIT_PARTS, size_hint(size)), count)


def kernel_phases(kernel: Kernel, kg: KernelGraph | None) -> list[tuple[str, int]]:
    """(function name, parallel extent) of each function ``kernel`` compiles to, in launch
    order: one for most kernels, several for a split full reduction (:class:`SplitPlan`).
    ``kg`` (the kernel's graph: its views decide which axes loop as one) is needed for
    elementwise and matmul kernels."""
    plan = split_plan(kernel)
    if plan is None:
        return [(kernel.name, parallel_extent(kernel, kg))]
    phases = []
    for i in range(plan.reductions):
        phases += [(f"{kernel.name}_p{i}", plan.parts), (f"{kernel.name}_c{i}", 1)]
    if any(kernel.level.get(v) == "full" for v in kernel.outputs):
        phases.append((kernel.name, plan.lead_size))
    return phases


def parallel_extent(kernel: Kernel, kg: KernelGraph | None = None) -> int:
    """Extent of ``kernel``'s parallel loop (the ``[start, end)`` the runtime splits)."""
    plan = column_plan(kernel)
    if plan is not None:
        return plan.units
    if kernel.kind == "reduction":
        kept = [d for i, d in enumerate(kernel.shape) if i not in kernel.axes]
        return kept[0] if kept else 1
    if not kernel.shape:
        return 1
    if kg is None:
        raise ValueError(f"{kernel.describe()}: its loops depend on its graph's views")
    return loop_plan(kernel, kg).parallel_extent


def _accesses(kernel: Kernel, kg: KernelGraph) -> list[list[int]] | None:
    """For each buffer an elementwise (or matmul epilogue) kernel reads or writes, the
    element step of each of the kernel's axes (0 where the buffer broadcasts); None for
    other kernels and kernels with a node of ``MOVES_ELEMENTS``, whose buffers are not
    read at the kernel's own coordinates. A matmul's operands are BLAS's (the kernel reads the
    product) and are left out: loops must be a function of the kernel's description, by
    which code is cached."""
    shape = kernel.shape
    n = len(shape)
    if kernel.kind not in ("elementwise", "matmul") or n < 2 or \
            any(nd.op in MOVES_ELEMENTS for nd in kernel.nodes):
        return None
    internal = set(kernel.nodes)

    def steps(dims, strides) -> list[int]:
        # A broadcast axis (size 1 in the buffer) steps by 0; missing leading axes too.
        return [0] * (n - len(dims)) + [st if d != 1 else 0 for d, st in zip(dims, strides)]
    accesses = []
    for v in kernel.outputs:
        if v.producer is None or v.producer.op != "matmul":
            view = identity_view(v)
            accesses.append(steps(view.shape, view.strides))
    for node in kernel.nodes:
        for x in node.inputs if node.op != "matmul" else ():
            if isinstance(x, Value) and (x.producer not in internal or x.producer.op == "matmul"):
                view = kg.views.get(x) or identity_view(x)
                accesses.append(steps(view.shape, view.strides))
    return accesses


# A transposing kernel (a buffer read across its rows) loops over tiles of TILE x TILE of its
# last two loops, from this many elements: the lines of the buffer read across stay in cache
# for the tile's rows (a 2048x2048 ``x.t() * 2``: 37 ms row by row).
TILE = 32
TILE_WORK = 1 << 16
TILE_STRIDE = 16          # elements: a buffer read across rows this far apart (a cache line)


@dataclass(frozen=True)
class LoopPlan:
    """How an elementwise kernel (or matmul epilogue) loops: ``groups`` of adjacent axes
    that run as one loop (of ``extents``), and whether the last two loops run in tiles.
    The lowering and the runtime's launch extent both read it, so they cannot disagree."""

    groups: tuple[tuple[int, ...], ...]
    extents: tuple[int, ...]
    tiled: bool

    @property
    def parallel_extent(self) -> int:
        """The first loop's extent: its tiles when it is the tiled rows."""
        first = self.extents[0]
        return -(-first // TILE) if self.tiled and len(self.extents) == 2 else first


def loop_plan(kernel: Kernel, kg: KernelGraph) -> LoopPlan:
    """The :class:`LoopPlan` of an elementwise (or matmul epilogue) kernel.

    Axes ``d`` and ``d + 1`` loop as one when every buffer the kernel reads or writes steps
    over them as one row-major block (stride of ``d`` = extent of ``d + 1`` times its
    stride, broadcast axes counting as stride 0): a (500, 10, 3) by (3,) product loops over
    (5000, 3), whose short inner loop unrolls and whose outer loop vectorizes (over (500,
    10, 3) the loop of 10 around it ran scalar). The last two loops run in tiles of
    :data:`TILE` when a buffer steps by one along the next-to-last and by
    :data:`TILE_STRIDE` or more along the last (a transpose), from :data:`TILE_WORK`
    elements. Kernels whose buffers are not read at their own coordinates (see
    :func:`_accesses`) loop over each axis, untiled."""
    shape = kernel.shape
    accesses = _accesses(kernel, kg)
    if accesses is None:
        return LoopPlan(tuple((d,) for d in range(len(shape))), tuple(shape), False)
    groups = [[len(shape) - 1]]
    for d in range(len(shape) - 2, -1, -1):
        inner = groups[0]
        size = math.prod(shape[a] for a in inner)
        # (known_equal: a symbolic stride that may equal the block at some sizes only
        # loops on its own, which is right at every size)
        if shape[d] == 1 or all(known_equal(a[d], size * a[inner[-1]]) for a in accesses):
            inner.insert(0, d)
        else:
            groups.insert(0, [d])
    extents = tuple(math.prod(shape[a] for a in g) for g in groups)
    # (Tiles of symbolic extents: not yet; such kernels loop row by row.)
    tiled = len(groups) >= 2 and not is_symbolic(extents) and min(extents[-2:]) >= TILE and \
        math.prod(shape) >= TILE_WORK and \
        any(a[groups[-2][-1]] == 1 and a[groups[-1][-1]] >= TILE_STRIDE for a in accesses)
    return LoopPlan(tuple(tuple(g) for g in groups), extents, tiled)


def tuning() -> str:
    """This module's tunable constants as text (see :func:`fusegrad.codegen.cpu_lowering.tuning`)."""
    return (f"COLUMN_TILE={COLUMN_TILE} COLUMN_UNITS={COLUMN_UNITS} "
            f"MIN_COLUMN_CHUNK={MIN_COLUMN_CHUNK} SPLIT_WORK={SPLIT_WORK} "
            f"SPLIT_PARTS={SPLIT_PARTS} TILE={TILE} TILE_WORK={TILE_WORK} TILE_STRIDE={TILE_STRIDE}")
