"""Fusion: partition a graph into kernels.

The rules, in the order they are tried:

- **Views are free.** A movement op (reshape, permute, broadcast_to, slice) on a
  materialized value (a graph input, a constant, or a kernel's output) is folded into the
  index arithmetic of every load that reads through it: it never becomes a kernel. Its
  strided form is found by applying the view to a zero-size stand-in array (numpy computes
  strides without touching memory); a reshape that no strides can express ends the chain
  and the value is copied.
- **Elementwise chains fuse** into one loop over their output shape. An operand computed
  inside the kernel must have the kernel's shape (it is recomputed nowhere: LLVM's CSE
  keeps one copy of each expression per element); a smaller one (an implicit broadcast of a
  computed value) is materialized by its own kernel instead, because recomputing it per
  element would multiply its cost.
- **A reduction absorbs its elementwise producers and its consumers**: the kernel loops over
  the kept ("row") index space and, per row, runs one loop over the reduced axes per
  reduction and a final loop that stores full-size outputs. Values of row shape (a
  reduction's result, its keepdim reshape, elementwise ops on those) live in registers and
  broadcast back over the row: last-axis softmax and layer_norm each become one kernel, as
  Inductor's persistent reductions do. All reductions of a kernel share its axes.
- **matmul is its own kernel** (a BLAS call or the project's own loop nest) with an
  elementwise epilogue of its output's shape fused in (bias, activation, residual). An
  elementwise kernel of that shape that the epilogue reads joins it when the product's
  operands do not depend on it (an optimizer's ``m * beta1`` beside the gradient's update).
- **pad and concat are not views** (no strides express them): each starts an elementwise
  kernel over its result, which reads its operands from memory and which its elementwise
  consumers join. So does a **take** whose indices a ``check_index`` of its axis's size
  produced (an embedding's lookup): the check, an extern step, runs first, and the kernel
  loads rows at the indices it reads. Other takes stay extern steps (their numpy reference
  raises for an index out of range).
- Anything else (gathers and scatters, argmax/argmin, sort, cumsum, random numbers) is an
  **extern step**: its numpy reference runs between kernels. So is **every node that reads or
  makes a complex value** (views included): codegen has no complex types, and the kernel
  listing says ``extern complex`` for these steps.

Fusion is greedy in topological order: a node joins the kernel of one of its producers when
legal and when the merge keeps the kernel graph acyclic; otherwise it starts a kernel. An
elementwise node that reads only values in memory anyway, and whose users all run after a
kernel that depends on those producers, starts a kernel its users join instead: joined, it
would be computed early and held until then (a ReLU's ``out <= 0``, a bf16 output's float32
widening, computed in the forward's kernel and held until the backward's use).
Independent elementwise kernels over one shape are merged afterwards (optimizer updates).
A checkpointed region's recomputation (after its ``remat`` barriers, passes/autodiff.py)
never joins a kernel of nodes placed before it: that kernel would compute the copy in the
forward and keep it until the backward.
"""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Node, Value
from fusegrad.ir.kernel_graph import (
    Kernel,
    KernelGraph,
    View,
    identity_view,
    touches_complex,
    view_of,
)
from fusegrad.ops.lowering import REDUCE_OPS
from fusegrad.ops.primitive import Kind
from fusegrad.passes.manager import Pass, register_pass

# Kernel, KernelGraph and View live in fusegrad.ir.kernel_graph; re-exported here for the
# code that imported them from the fusion pass.
__all__ = ["Kernel", "KernelGraph", "View", "view_of", "identity_view", "fuse", "Fuse"]

# Elementwise primitives with a scalar lowering in codegen.
_FUSIBLE_SOURCES = {"full", "iota"}


def _checked_take(node: Node) -> bool:
    """Whether a take's indices are the output of a ``check_index`` of the size of the axis
    it indexes (so every index is in ``[0, size)`` by the time the take runs)."""
    x, idx = node.inputs
    check = idx.producer if isinstance(idx, Value) else None
    return isinstance(x, Value) and check is not None and check.op == "check_index" and \
        not check.attrs.get("wrap") and check.attrs["size"] == x.type.shape[node.attrs["axis"]]


# --------------------------------------------------------------------------- grouping


def _keepdim(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


class _Partitioner:
    def __init__(self, g: Graph, max_inputs: int):
        self.g = g
        self.max_inputs = max_inputs
        self.users = g.users()
        self.outputs = {o for o in g.outputs if isinstance(o, Value)}
        self.views: dict[Value, View] = {}
        self.materialized: set[Value] = set(g.inputs)
        self.group_of: dict[Node, Kernel] = {}
        self.kernels: list[Kernel] = []
        # Reachability between kernels, kept up to date as nodes join and kernels merge (a
        # search per query made fusion quadratic: minutes for a transformer's training
        # step). Each kernel ever made owns one bit; ``bits[k]`` holds the bits of every
        # kernel merged into k, ``ancestors[k]`` those of every kernel k reads from,
        # transitively (never k's own).
        self.bits: dict[Kernel, int] = {}
        self.ancestors: dict[Kernel, int] = {}
        self.made = 0
        self.position = {n: i for i, n in enumerate(g.nodes)}
        self.floor = _recompute_floors(g, self.position)

    # -- kinds of nodes
    def is_view(self, v) -> bool:
        return isinstance(v, Value) and v in self.views

    def internal(self, v, k: Kernel) -> bool:
        return isinstance(v, Value) and v.producer is not None and \
            self.group_of.get(v.producer) is k

    def new_kernel(self, kind: str, node: Node, shape, axes=()) -> Kernel:
        k = Kernel(f"k{len(self.kernels)}", kind, [node], tuple(shape), tuple(axes))
        self.kernels.append(k)
        self.group_of[node] = k
        self.bits[k] = 1 << self.made
        self.ancestors[k] = 0
        self.made += 1
        self.add_edges(k, node)
        return k

    def depends(self, a: Kernel, b: Kernel) -> bool:
        """Whether kernel ``a`` (transitively) reads something kernel ``b`` computes."""
        return bool(self.ancestors[a] & self.bits[b])

    def add_edges(self, k: Kernel, node: Node) -> None:
        """Record that ``k`` (now holding ``node``) reads what ``node`` reads, and pass its
        new ancestors on to every kernel that already reads from ``k``."""
        reach = 0
        for op in node.inputs:
            pk = self._producer_kernel(op)
            if pk is not None and pk is not k:
                reach |= self.bits[pk] | self.ancestors[pk]
        added = reach & ~self.bits[k] & ~self.ancestors[k]
        if added:
            self.ancestors[k] |= added
            self.extend_descendants(k, added)

    def extend_descendants(self, k: Kernel, added: int) -> None:
        mine = self.bits[k]
        for c in self.kernels:
            if self.ancestors[c] & mine:
                self.ancestors[c] |= added

    def _producer_kernel(self, op) -> Kernel | None:
        while isinstance(op, Value) and op in self.views and op.producer is not None:
            op = op.producer.inputs[0]
        if isinstance(op, Value) and op.producer is not None:
            return self.group_of.get(op.producer)
        return None

    def producer_kernels(self, node: Node) -> list[Kernel]:
        out = []
        for op in node.inputs:
            if isinstance(op, Value) and op.producer is not None and not self.is_view(op):
                k = self.group_of.get(op.producer)
                if k is not None and k not in out:
                    out.append(k)
        return out

    def reads_own_view(self, nodes: list[Node]) -> bool:
        """Whether a kernel of ``nodes`` would read, through a view, a value that it computes
        itself. A view operand is a load from memory, and a kernel's outputs are stored only
        after its loops (a reduction's result after every reduction of the row): the load
        would read the buffer before it is written (stale memory, often NaN)."""
        own = {n.output for n in nodes}
        return any(isinstance(op, Value) and (op in self.views and self.views[op].base in own
                                              or n.op == "take" and op in own)
                   for n in nodes for op in n.inputs)

    def acyclic_join(self, node: Node, k: Kernel) -> bool:
        """Adding ``node`` to ``k`` is acyclic unless another producer kernel depends on k,
        or ``node`` reads a view of something ``k`` computes (a cycle through memory)."""
        if self.reads_own_view(k.nodes + [node]):
            return False
        for other in self.all_producer_kernels(node):
            if other is not k and self.depends(other, k):
                return False
        return True

    def epilogue_can_take(self, k: Kernel, other: Kernel) -> bool:
        """Whether elementwise kernel ``other`` can run in matmul kernel ``k``'s epilogue:
        its nodes are elementwise math, and the product's operands do not depend on it (the
        epilogue runs after the product)."""
        if not all(n.prim.kind is Kind.ELEMENTWISE or n.op in _FUSIBLE_SOURCES
                   for n in other.nodes):
            return False
        for op in k.nodes[0].inputs:
            pk = self._producer_kernel(op)
            if pk is not None and (pk is other or self.depends(pk, other)):
                return False
        return True

    def all_producer_kernels(self, node: Node) -> list[Kernel]:
        out = []
        for op in node.inputs:
            pk = self._producer_kernel(op)
            if pk is not None and pk not in out:
                out.append(pk)
        return out

    # -- legality
    def level(self, v, k: Kernel) -> str | None:
        return k.level.get(v) if self.internal(v, k) else None

    def fits(self, node: Node, k: Kernel) -> str | None:
        """The level ``node``'s result would have in kernel ``k``, or None if it can't join."""
        kind = node.prim.kind
        out_shape = node.output.type.shape
        internal = [op for op in node.inputs if self.internal(op, k)]
        if not internal:
            return None
        if k.kind == "matmul":
            if kind is Kind.ELEMENTWISE and out_shape == k.shape and all(
                    op.type.shape == k.shape for op in internal):
                return "full"
            return None
        if k.kind == "elementwise":
            if kind is Kind.ELEMENTWISE and out_shape == k.shape and all(
                    op.type.shape == k.shape for op in internal):
                return "full"
            if kind is Kind.REDUCE and node.op in REDUCE_OPS and \
                    node.inputs[0].type.shape == k.shape and node.attrs["axes"]:
                return "row"
            return None
        if k.kind == "reduction":
            row, keep = k.row_shape, _keepdim(k.shape, k.axes)
            levels = [self.level(op, k) for op in internal]
            if kind is Kind.ELEMENTWISE:
                if out_shape == k.shape and all(
                        (lv == "full" and op.type.shape == k.shape) or
                        (lv == "row" and op.type.shape == keep)
                        for op, lv in zip(internal, levels)):
                    return "full"
                if out_shape in (row, keep) and all(
                        lv == "row" and op.type.shape in (out_shape, ()) for op, lv in
                        zip(internal, levels)):
                    return "row"
                return None
            if kind is Kind.REDUCE and node.op in REDUCE_OPS:
                if levels == ["full"] and node.inputs[0].type.shape == k.shape and \
                        tuple(node.attrs["axes"]) == k.axes:
                    return "row"
                return None
            if node.op == "reshape" and levels == ["row"] and \
                    {internal[0].type.shape, out_shape} <= {row, keep}:
                return "row"
            if node.op == "broadcast_to" and levels == ["row"] and \
                    internal[0].type.shape == keep and out_shape == k.shape:
                return "full"
        return None

    def may_group(self, nodes: list[Node]) -> bool:
        """Whether ``nodes`` may form one kernel: within the input budget, and no
        recomputation of a checkpointed region grouped with a node before it."""
        return self.within_budget(nodes) and self.recomputes_in_place(nodes)

    def recomputes_in_place(self, nodes: list[Node]) -> bool:
        """Whether no node of ``nodes`` that depends on a checkpointed region's recomputation
        (a ``remat`` barrier) shares them with a node placed before that barrier. A kernel
        runs where its earliest node is: a recomputed copy that joined a forward kernel
        (the layer norm of the region's input, beside the forward's own) would be computed
        in the forward and held until the backward, as if never checkpointed."""
        floor = max(self.floor.get(n, -1) for n in nodes)
        return floor < 0 or min(self.position[n] for n in nodes) >= floor

    def within_budget(self, nodes: list[Node]) -> bool:
        """Whether a kernel of ``nodes`` reads at most ``max_inputs`` buffers (``fuse``'s
        option: a kernel with many inputs spends its registers and cache on addresses)."""
        own = {n.output for n in nodes}
        bases = set()
        for n in nodes:
            for op in n.inputs:
                if isinstance(op, Value):
                    base = self.views[op].base if op in self.views else op
                    if base not in own:
                        bases.add(base)
        return len(bases) <= self.max_inputs

    def join(self, node: Node, k: Kernel, level: str) -> None:
        if k.kind == "elementwise" and level == "row":
            k.kind = "reduction"
            k.axes = tuple(node.attrs["axes"])
        k.nodes.append(node)
        k.level[node.output] = level
        self.group_of[node] = k
        self.add_edges(k, node)

    # -- the walk
    def run(self) -> list[Kernel]:
        for node in self.g.nodes:
            self.place(node)
        self.merge_siblings()
        self.finish()
        return self.kernels

    def place(self, node: Node) -> None:
        prim = node.prim
        src = node.inputs[0] if node.inputs else None
        if touches_complex(node) and node.op != "constant":
            k = self.new_kernel("extern", node, node.output.type.shape)
            for op in node.inputs:
                self.materialize(op, k)
            return
        if (prim.kind is Kind.MOVEMENT and node.op not in ("pad", "concat") or
                node.op == "stop_gradient") and isinstance(src, Value):
            # stop_gradient as a view: alone in a kernel of its own it was a copy (of the
            # transposed activations a backward matmul reads, say).
            # Computed in a kernel, even if already materialized for another reader: a view
            # of it inside its own kernel must be computed there, never loaded back.
            computed = src not in self.views and src.producer in self.group_of
            if computed:
                # A view of a value computed in a kernel: joins it if the reduction rules
                # allow (keepdim reshape, broadcast of a row value), else reads it from memory.
                k = self.group_of.get(src.producer)
                level = self.fits(node, k) if k is not None else None
                if level is not None and self.may_group(k.nodes + [node]):
                    self.join(node, k, level)
                    return
            v = view_of(node, self.views.get(src) or identity_view(src))
            if v is not None:
                if computed:
                    self.materialized.add(src)
                self.views[node.output] = v
                return
        if node.op == "constant":
            self.materialized.add(node.output)
            return
        if prim.kind in (Kind.ELEMENTWISE, Kind.REDUCE, Kind.MOVEMENT) or \
                node.op in _FUSIBLE_SOURCES:
            producers = [] if self.waits_for_users(node) else self.producer_kernels(node)
            for k in reversed(producers):
                level = self.fits(node, k)
                if level is not None and self.acyclic_join(node, k) and \
                        self.may_group(k.nodes + [node]):
                    self.join(node, k, level)
                    # Pull in other elementwise producers of the same shape (a diamond
                    # whose two arms started separate kernels; into a matmul's epilogue,
                    # an optimizer's decay of its state, ``m * beta1``, beside the
                    # gradient the product computes).
                    for other in producers:
                        if other is not k and other.kind == "elementwise" and \
                                other.shape == k.shape and \
                                (k.kind != "matmul" or self.epilogue_can_take(k, other)) and \
                                self.mergeable(k, other) and \
                                not self.reads_own_view(k.nodes + other.nodes) and \
                                self.may_group(k.nodes + other.nodes):
                            self.absorb(k, other)
                    return
        if prim.kind is Kind.ELEMENTWISE or node.op in _FUSIBLE_SOURCES:
            k = self.new_kernel("elementwise", node, node.output.type.shape)
            k.level[node.output] = "full"
        elif prim.kind is Kind.REDUCE and node.op in REDUCE_OPS \
                and node.attrs["axes"]:
            k = self.new_kernel("reduction", node, node.inputs[0].type.shape,
                                node.attrs["axes"])
            k.level[node.output] = "row"
        elif node.op == "take" and _checked_take(node):
            k = self.new_kernel("elementwise", node, node.output.type.shape)
            k.level[node.output] = "full"
        elif prim.kind is Kind.CONTRACTION:
            k = self.new_kernel("matmul", node, node.output.type.shape)
            k.level[node.output] = "full"
        elif prim.kind is Kind.MOVEMENT or (prim.kind is Kind.REDUCE and
                                            node.op in REDUCE_OPS):
            # A view of a computed value, or an empty-axes reduction: a copy kernel.
            k = self.new_kernel("elementwise", node, node.output.type.shape)
            k.level[node.output] = "full"
        else:
            k = self.new_kernel("extern", node, node.output.type.shape)
        # Whatever this node reads from another kernel must be in memory.
        for op in node.inputs:
            self.materialize(op, k)

    def waits_for_users(self, node: Node) -> bool:
        """Whether elementwise ``node`` should start a kernel of its own, which its users
        join, rather than join its producers' kernel: every value it reads is in memory
        anyway (another kernel reads it), and every user is elementwise of its shape and
        reads a value of a kernel that depends on those producers, so runs later. Joined,
        ``node`` would be computed early and stored until then: a ReLU's ``out <= 0`` in the
        forward's kernel, held as a byte mask until the backward's ``where`` reads it
        beside the cotangent. Waiting, the users' kernel computes it from what it loads."""
        if node.prim.kind is not Kind.ELEMENTWISE or node.output in self.outputs:
            return False
        producers = self.all_producer_kernels(node)
        if not producers:
            return False
        for op in node.inputs:
            base = self.views[op].base if isinstance(op, Value) and op in self.views else op
            if isinstance(base, Value) and base.producer is not None and \
                    base not in self.materialized:
                return False
        users = self.users.get(node.output, [])
        if not users:
            return False
        for user in users:
            if user.prim.kind is not Kind.ELEMENTWISE or \
                    user.output.type.shape != node.output.type.shape:
                return False
            if not any(self.runs_after(op, producers) for op in user.inputs
                       if op is not node.output):
                return False
        return True

    def runs_after(self, op, kernels: list[Kernel], depth: int = 4) -> bool:
        """Whether ``op`` is computed by a kernel that depends on one of ``kernels``, or
        (not placed yet) from such a value within ``depth`` nodes."""
        k = self._producer_kernel(op)
        if k is not None:
            return any(self.depends(k, p) for p in kernels)
        if depth == 0 or not isinstance(op, Value) or op.producer is None:
            return False
        return any(self.runs_after(o, kernels, depth - 1) for o in op.producer.inputs)

    def materialize(self, op, reader: Kernel) -> None:
        while isinstance(op, Value) and op in self.views:
            op = self.views[op].base
        if isinstance(op, Value) and op.producer is not None:
            owner = self.group_of.get(op.producer)
            if owner is not None and owner is not reader:
                self.materialized.add(op)

    def mergeable(self, a: Kernel, b: Kernel) -> bool:
        """Merging ``a`` and ``b`` keeps the kernel graph acyclic: no third kernel lies on a
        path between them."""
        anc, bits = self.ancestors, self.bits
        ba, bb = bits[a], bits[b]
        for c in self.kernels:
            if c is a or c is b:
                continue
            bc, ac = bits[c], anc[c]
            if (ac & ba and anc[b] & bc) or (ac & bb and anc[a] & bc):
                return False
        return True

    def absorb(self, into: Kernel, other: Kernel) -> None:
        for n in other.nodes:
            self.group_of[n] = into
        into.nodes.extend(other.nodes)
        into.level.update(other.level)
        self.kernels.remove(other)
        # The merged kernel reads what either read; whoever read either now reads it and so
        # everything it reads. (Legal merges leave no path between the two through a third
        # kernel, so this closure has no cycle.)
        mine = self.bits[into] | self.bits.pop(other)
        reach = (self.ancestors[into] | self.ancestors.pop(other)) & ~mine
        self.bits[into], self.ancestors[into] = mine, reach
        self.extend_descendants(into, mine | reach)

    def merge_siblings(self) -> None:
        """Merge independent elementwise kernels over one shape (horizontal fusion).

        Each kernel, in order, absorbs every later kernel it can: that is the merge order of
        rescanning from the first pair after each merge, without the rescans. A pair that
        failed stays failed: merges only add paths between kernels, and between
        independent kernels a larger one reads only more buffers. Two independent kernels
        have no third kernel between them either, so ``mergeable`` holds for them."""
        # Kernels after a collective's wait merge only among themselves: a merged kernel
        # runs where its earliest part did, which would pull the wait (and the end of the
        # communication it overlaps) forward (passes/schedule.py).
        waits = 0
        for k in self.kernels:
            if k.kind == "extern" and k.nodes[0].prim.extra.get("collective") == "wait":
                waits |= self.bits[k]
        i = 0
        while i < len(self.kernels):
            a = self.kernels[i]
            i += 1
            if a.kind != "elementwise":
                continue
            j = i
            while j < len(self.kernels):
                b = self.kernels[j]
                if b.kind == "elementwise" and b.shape == a.shape and \
                        not self.depends(b, a) and not self.depends(a, b) and \
                        bool(self.ancestors[a] & waits) == bool(self.ancestors[b] & waits) and \
                        self.may_group(a.nodes + b.nodes):
                    self.absorb(a, b)         # removes b: the next candidate moves to j
                else:
                    j += 1

    def finish(self) -> None:
        """Order kernels topologically and fill in their input and output buffers."""
        # Values read across kernels, or returned, are materialized.
        for node in self.g.nodes:
            k = self.group_of.get(node)
            for op in node.inputs:
                self.materialize(op, k)
        for o in self.g.outputs:
            if isinstance(o, Value):
                base = o
                if o in self.views:
                    continue        # returned views are copied by the runtime
                self.materialized.add(base)
        position = {n: i for i, n in enumerate(self.g.nodes)}
        for k in self.kernels:
            k.nodes.sort(key=position.__getitem__)
        self.kernels.sort(key=lambda k: position[k.nodes[-1]] if k.kind == "extern"
                          else min(position[n] for n in k.nodes))
        self.kernels = _topo_order(self.kernels, self)
        for i, k in enumerate(self.kernels):
            k.name = f"k{i}"
            own = set(k.nodes)
            reads: list[Value] = []
            for n in k.nodes:
                for op in n.inputs:
                    if not isinstance(op, Value):
                        continue
                    base = self.views[op].base if op in self.views else op
                    if (base.producer is None or base.producer not in own) and base not in reads:
                        reads.append(base)
            k.inputs = reads
            k.outputs = [n.output for n in k.nodes if n.output in self.materialized]


def _recompute_floors(g: Graph, position: dict) -> dict[Node, int]:
    """For each node that depends on a ``remat`` barrier (the start of a checkpointed
    region's recomputation, see passes/autodiff.py), the position of the latest such
    barrier among its ancestors; nodes that depend on none are left out."""
    floor: dict[Node, int] = {}
    for node in g.nodes:
        f = position[node] if node.remat and node.op == "stop_gradient" else -1
        for op in node.inputs:
            if isinstance(op, Value) and op.producer is not None:
                f = max(f, floor.get(op.producer, -1))
        if f >= 0:
            floor[node] = f
    return floor


def _topo_order(kernels: list[Kernel], part: _Partitioner) -> list[Kernel]:
    """Kernels in an order where every kernel runs after the kernels it reads from."""
    order, done = [], set()

    def visit(k: Kernel, stack: set):
        if id(k) in done:
            return
        stack.add(id(k))
        for n in k.nodes:
            for op in n.inputs:
                pk = part._producer_kernel(op)
                if pk is not None and pk is not k and id(pk) not in done:
                    visit(pk, stack)
        done.add(id(k))
        order.append(k)

    for k in kernels:
        visit(k, set())
    return order


def fuse(g: Graph, max_inputs: int = 64) -> KernelGraph:
    """Partition ``g`` into kernels (see the module docstring for the rules)."""
    part = _Partitioner(g, max_inputs)
    kernels = part.run()
    return KernelGraph(g, kernels, part.views, part.materialized)


@register_pass
class Fuse(Pass):
    """Partition into kernels; the graph is unchanged and ``graph.kernels`` describes them."""

    name = "fuse"
    max_inputs: int = 64

    def run(self, graph: Graph) -> Graph:
        graph.kernels = fuse(graph, self.max_inputs)
        return graph
