"""Split a graph's forward and backward into two programs that pass saved values between them.

``partition_joint(g, n_outputs, wrt)`` builds the joint graph of ``g`` with
:func:`~fusegrad.passes.autodiff.vjp_graph` (inputs and cotangents -> outputs and input
cotangents) and cuts it in two, as PyTorch's AOTAutograd does:

- ``forward``: ``g``'s inputs -> ``g``'s outputs, then the *saved* values;
- ``backward``: the saved values, then one cotangent per differentiated output -> the
  cotangents of the inputs ``wrt``.

Which forward values cross to the backward is the policy:

- ``"save_all"``: every forward value the backward uses; the backward recomputes nothing.
- ``"recompute_all"``: only forward inputs; the backward recomputes the forward values it
  needs (what a compiled function's backward did before this pass).
- ``"min_cut"`` (default): the fewest saved bytes, found as a minimum s-t cut, after PyTorch's
  ``min_cut_rematerialization_partition``. Each value that the backward needs, directly or
  through a chain it could recompute, becomes an edge ``v_in -> v_out`` whose capacity is
  its size in bytes; ``u_out -> v_in`` (``v`` uses ``u``) is infinite. The source feeds
  every forward input and every forward value the backward must not recompute; the sink
  takes every value a backward (cotangent-dependent) node reads. Cutting ``v_in -> v_out``
  means saving ``v``; the values left on the sink side are recomputed in the backward.
  A checkpointed region's values (``fusegrad.utils.checkpoint``) reach the backward only
  through their recomputed copies (``Node.remat``, see :mod:`fusegrad.passes.autodiff`),
  whose edges have no capacity: the cut saves the region's inputs, or what they are
  recomputed from, never a region's internal value. ``save_all`` saves the region's inputs
  (the copies are backward values); ``recompute_all`` recomputes everything as always.

Recomputable (:func:`is_recomputable`): elementwise ops, views and sources without inputs,
which fuse into the backward's kernels for free. Not recomputable: matmul, reductions, index
ops (gather, scatter, take), extern ops and random numbers; these cost a kernel of their own
(or, for random bits, a Philox round per element), so a forward value they produce is saved
(or a value downstream of it is) and never recomputed. A value only the backward needs is
computed once either way, so nothing bans it: the cut decides whether the forward computes
and saves it or the backward computes it.

Forward inputs cost their size, like any value. An input kept for the backward keeps its
buffer alive after the caller lets go of it (an activation), and with a zero cost the cut
would rebuild every elementwise chain from the inputs. Where an input outlives the call
anyway (a module's parameters and buffers), pass its position in ``free_inputs`` and saving
it is free. Ties are broken by a small term below one byte: an input before a computed value
(it exists anyway while the forward runs), a computed value before a view of one, and later
values before earlier ones (less to recompute); so the result is deterministic.

>>> p = partition_joint(g, wrt=[1])              # doctest: +SKIP
>>> fwd = interpret(p.forward, *args)            # outputs, then saved values
>>> cts = interpret(p.backward, *fwd[len(g.outputs):], *cotangents)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import networkx as nx

from fusegrad.ir.graph import Graph, IRError, Node, Operand, Value
from fusegrad.ir.rewrite import copy_marks
from fusegrad.ops.primitive import Kind, TensorType
from fusegrad.passes.autodiff import vjp_graph
from fusegrad.passes.manager import Pass, PipelineError, parse_positions, register_pass
from fusegrad.symint import SymInt, free_symbols, stand_in

__all__ = ["partition_joint", "Partition", "SavedValue", "is_recomputable", "partition_report",
           "PartitionReport", "POLICIES", "PartitionPass"]

POLICIES = ("min_cut", "save_all", "recompute_all")

# Cheap to recompute inside a backward kernel: one scalar expression or index arithmetic per
# element. Random bits are a source too, but a Philox round per element is not cheap.
_RECOMPUTABLE_KINDS = frozenset({Kind.ELEMENTWISE, Kind.MOVEMENT, Kind.SOURCE})
_NOT_RECOMPUTABLE_PRIMS = frozenset({"random_uniform"})


def is_recomputable(node: Node) -> bool:
    """Whether the backward may recompute ``node`` instead of the forward saving its result."""
    return node.prim.kind in _RECOMPUTABLE_KINDS and node.prim.name not in _NOT_RECOMPUTABLE_PRIMS


def _nbytes(t: TensorType) -> int:
    # A symbolic size counts at its hint (the size traced at), or with no hint (a graph read
    # from text) at a large nominal size: a cost, not a fact.
    return stand_in(t.numel) * t.dtype.itemsize


@dataclass(frozen=True)
class SavedValue:
    """One value the forward hands to the backward.

    ``kind`` is ``"input"`` (a forward input passed through: ``input_index`` says which, and
    the caller may keep a reference instead of a copy) or ``"residual"`` (a value the forward
    computes, produced by ``op``). The k-th saved value is output ``n_forward_outputs + k`` of
    the forward and input ``k`` of the backward, where it is called ``name``.
    """

    name: str
    type: TensorType
    kind: str
    op: str
    input_index: int | None = None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.type)


@dataclass
class Partition:
    """A forward program that saves values and a backward program that reads them."""

    forward: Graph
    backward: Graph
    saved: list[SavedValue]
    n_outputs: int                 # outputs with a cotangent input in the backward
    wrt: list[int]
    policy: str
    # The primitives of the backward's nodes that the forward computes too, in order.
    recomputed_ops: list[str] = field(default_factory=list)
    n_forward_outputs: int = 0     # the forward's outputs before the saved values

    @property
    def recomputed(self) -> int:
        """How many nodes the backward recomputes (the forward computes them too)."""
        return len(self.recomputed_ops)

    @property
    def saved_bytes(self) -> int:
        """Bytes of every saved value (inputs passed through included)."""
        return sum(s.nbytes for s in self.saved)

    @property
    def input_bytes(self) -> int:
        """Bytes of the saved values that are forward inputs."""
        return sum(s.nbytes for s in self.saved if s.kind == "input")

    @property
    def residual_bytes(self) -> int:
        """Bytes of the saved values the forward computes: new memory held until backward."""
        return sum(s.nbytes for s in self.saved if s.kind == "residual")


# --------------------------------------------------------------------------- graph walks


def _ancestors(g: Graph, roots: Iterable[Operand], stop: set | frozenset = frozenset()) -> set:
    """Values that ``roots`` depend on (roots included), not looking past values in ``stop``."""
    live = {v for v in roots if isinstance(v, Value)}
    for node in reversed(g.nodes):
        if node.output in live and node.output not in stop:
            live.update(op for op in node.inputs if isinstance(op, Value))
    return live


def _descendants(g: Graph, roots: Iterable[Value]) -> set:
    reached = set(roots)
    for node in g.nodes:
        if any(isinstance(op, Value) and op in reached for op in node.inputs):
            reached.add(node.output)
    return reached


# --------------------------------------------------------------------------- the joint graph


@dataclass
class _Joint:
    graph: Graph
    primals: list[Value]           # the joint graph's forward inputs
    cotangents: list[Value]        # its cotangent inputs
    fwd_outputs: list[Operand]     # the original graph's outputs, in the joint graph
    ct_outputs: list[Operand]      # the input cotangents
    tangent: set                   # values that depend on a cotangent
    position: dict = field(default_factory=dict)    # value -> position (inputs, then nodes)


def _joint(g: Graph, n_outputs: int, wrt: list[int]) -> _Joint:
    # Differentiate the first n_outputs outputs only: a view of g that shares its nodes
    # (vjp_graph reads a graph, never writes it).
    differentiated = Graph(g.name)
    differentiated.inputs, differentiated.nodes = g.inputs, g.nodes
    differentiated.outputs = g.outputs[:n_outputs]
    joint = vjp_graph(differentiated, wrt, name=f"{g.name}_joint", remat=True)
    n_in = len(g.inputs)
    # vjp_graph replays g's nodes first, one joint node per node: map g's values onto them,
    # so that outputs after the n_outputs differentiated ones come along too.
    mapping: dict = dict(zip(g.inputs, joint.inputs[:n_in], strict=True))
    for node, copy in zip(g.nodes, joint.nodes):
        if copy.prim is not node.prim:
            raise IRError(f"partition: the joint graph of @{g.name} does not start with a replay "
                          f"of its nodes ({copy.prim.name} where {node.prim.name} was expected)")
        mapping[node.output] = copy.output
    fwd_outputs = [mapping[o] if isinstance(o, Value) else o for o in g.outputs]
    cotangents = joint.inputs[n_in:]
    position = {v: i for i, v in enumerate(joint.inputs)}
    position.update((n.output, n_in + j) for j, n in enumerate(joint.nodes))
    return _Joint(joint, joint.inputs[:n_in], cotangents, fwd_outputs,
                  joint.outputs[n_outputs:], _descendants(joint, cotangents), position)


# --------------------------------------------------------------------------- policies


def _save_all(j: _Joint) -> set:
    # The forward computes what its outputs need; everything else is backward, and every
    # forward value a backward node reads is saved.
    forward = _ancestors(j.graph, j.fwd_outputs) | set(j.primals)
    return _ancestors(j.graph, j.ct_outputs, stop=forward) & forward


def _recompute_all(j: _Joint) -> set:
    return _ancestors(j.graph, j.ct_outputs) & set(j.primals)


def _min_cut(j: _Joint, free_inputs: set[int]) -> set:
    g = j.graph
    needed = _ancestors(g, j.ct_outputs)
    candidates = sorted((v for v in needed if v not in j.tangent), key=j.position.__getitem__)
    in_forward = _ancestors(g, j.fwd_outputs)
    primal_index = {v: i for i, v in enumerate(j.primals)}
    n = len(g.nodes) + len(g.inputs)
    # Capacities are integers: bytes scaled by `scale`, plus a tie-break below one byte
    # (the sum of all tie-breaks is under `scale`).
    scale = 2 * (n + 1) ** 2
    flow = nx.DiGraph()
    flow.add_node("source")
    flow.add_node("sink")
    cand = set(candidates)
    for v in candidates:
        pos = j.position[v]
        node_in, node_out = (pos, "in"), (pos, "out")
        node = v.producer
        if node is None:
            flow.add_edge("source", node_in)                 # no capacity: infinite
            cost = 0 if primal_index[v] in free_inputs else _nbytes(v.type) * scale
        else:
            if v in in_forward and not is_recomputable(node):
                flow.add_edge("source", node_in)             # computed in the forward only
            tie = n - pos + (n if node.prim.kind is Kind.MOVEMENT else 0)
            cost = _nbytes(v.type) * scale + tie
            for op in node.inputs:
                if isinstance(op, Value) and op in cand:
                    flow.add_edge((j.position[op], "out"), node_in)
            if node.remat:
                # A checkpointed region's recomputation: never saved (no capacity: infinite).
                flow.add_edge(node_in, node_out)
                continue
        flow.add_edge(node_in, node_out, capacity=cost)
    for node in g.nodes:
        if node.output in j.tangent and node.output in needed:
            for op in node.inputs:
                if isinstance(op, Value) and op in cand:
                    flow.add_edge((j.position[op], "out"), "sink")
    for o in j.ct_outputs:
        if isinstance(o, Value) and o in cand:
            flow.add_edge((j.position[o], "out"), "sink")
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    return {v for v in candidates
            if (j.position[v], "in") in reachable and (j.position[v], "out") not in reachable}


# --------------------------------------------------------------------------- building


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _emit(new: Graph, node: Node, env: dict) -> Value:
    ins = [env[op] if isinstance(op, Value) else op for op in node.inputs]
    out = new.add_node(node.prim, ins, node.attrs, loc=node.loc)
    copy_marks(node, out.producer)
    return out



def _bare(values) -> set[str]:
    return {d.name for v in values for d in v.type.shape if isinstance(d, SymInt) and d.name}


def _attr_symbols(value) -> set[str]:
    if isinstance(value, SymInt):
        return value.free_symbols()
    if isinstance(value, (tuple, list)):
        return set().union(*map(_attr_symbols, value)) if value else set()
    return set()


def _binders(j: _Joint, needed: set, saved_set: set) -> set:
    """Forward inputs the backward takes only for their sizes: a backward binds each symbol
    from an input dim that is that bare symbol, and one whose saved values and cotangents
    have none (a gradient of ``x[0:0]``, a saved ``f32[14*s0]``) is given a forward input
    that has it (saving an input keeps a reference, no copy)."""
    reads: set[str] = set()
    for v in needed:
        reads |= free_symbols(v.type.shape)
        if v.producer is not None:
            reads |= set().union(*map(_attr_symbols, v.producer.attrs.values())) \
                if v.producer.attrs else set()
    for o in list(j.ct_outputs) + list(j.cotangents):
        if isinstance(o, Value):
            reads |= free_symbols(o.type.shape)
    have = _bare([v for v in saved_set if v in needed] + list(j.cotangents))
    out = set()
    for name in sorted(reads - have):
        if name in have:            # bound by an input added for an earlier symbol
            continue
        v = next((p for p in j.primals if name in _bare([p])), None)
        if v is not None:
            out.add(v)
            have |= _bare([v])
    return out


def _build(g: Graph, j: _Joint, saved_set: set, n_outputs: int, wrt: list[int],
           policy: str) -> Partition:
    joint = j.graph
    needed = _ancestors(joint, j.ct_outputs, stop=saved_set)
    missing = [v.name for v in j.primals if v in needed and v not in saved_set]
    if missing:
        raise IRError(f"partition: the backward of @{g.name} needs the forward inputs "
                      f"{missing} that the {policy} cut does not save")
    # Saved values the backward reads (a saved value behind another one is not read).
    saved = sorted({v for v in saved_set if v in needed} | _binders(j, needed, saved_set),
                   key=j.position.__getitem__)
    primal_index = {v: i for i, v in enumerate(j.primals)}

    backward = Graph(f"{g.name}_backward")
    taken: set[str] = set()
    env: dict = {}
    described = []
    for k, v in enumerate(saved):
        if v.producer is None:
            index = primal_index[v]
            name = _unique(v.name or f"in{index}", taken)
            described.append(SavedValue(name, v.type, "input", "input", index))
        else:
            name = _unique(f"saved{k}", taken)
            described.append(SavedValue(name, v.type, "residual", v.producer.prim.name))
        env[v] = backward.add_input(name, v.type)
    for k, ct in enumerate(j.cotangents):
        env[ct] = backward.add_input(_unique(ct.name or f"ct{k}", taken), ct.type)
    forward_values = _ancestors(joint, j.fwd_outputs + saved)
    recomputed = []
    for node in joint.nodes:
        v = node.output
        if v in needed and v not in env:
            env[v] = _emit(backward, node, env)
            if v in forward_values or (node.remat and node.op != "stop_gradient"):
                recomputed.append(node.prim.name)
    backward.set_outputs([env[o] if isinstance(o, Value) else o for o in j.ct_outputs])
    backward.meta = None

    forward = Graph(f"{g.name}_forward")
    fenv: dict = {}
    for v in j.primals:
        # Copied as they are, as GraphCopier does (names may repeat in a traced graph).
        fenv[v] = Value(v.type, v.name)
        forward.inputs.append(fenv[v])
    for node in joint.nodes:
        if node.output in forward_values:
            fenv[node.output] = _emit(forward, node, fenv)
    forward.set_outputs([fenv[o] if isinstance(o, Value) else o for o in j.fwd_outputs]
                        + [fenv[v] for v in saved])
    forward.meta = getattr(g, "meta", None)
    return Partition(forward, backward, described, n_outputs, wrt, policy, recomputed,
                     len(j.fwd_outputs))


def partition_joint(graph: Graph, n_outputs: int | None = None, wrt: Sequence[int] | None = None,
                    policy: str = "min_cut", free_inputs: Iterable[int] = ()) -> Partition:
    """Split ``graph``'s forward and backward into two graphs that pass saved values.

    The first ``n_outputs`` outputs (all by default) are differentiated: the backward takes
    one cotangent for each; later outputs (in-place write-backs) are forward outputs only.
    ``wrt`` lists the inputs whose cotangents the backward returns (all by default);
    ``policy`` is ``"min_cut"``, ``"save_all"`` or ``"recompute_all"`` (see the module
    docstring); ``free_inputs`` lists inputs whose saving costs nothing to the min-cut
    (parameters). The input graph is not modified.

    >>> p = partition_joint(g, wrt=[0, 1])                       # doctest: +SKIP
    >>> [(s.name, s.kind, s.nbytes) for s in p.saved]            # doctest: +SKIP
    [('x', 'input', 128), ('saved1', 'residual', 64)]
    """
    if policy not in POLICIES:
        raise ValueError(f"partition: unknown policy {policy!r}; choose one of {POLICIES}")
    n_outputs = len(graph.outputs) if n_outputs is None else n_outputs
    if not 0 <= n_outputs <= len(graph.outputs):
        raise ValueError(f"partition: n_outputs={n_outputs}, but @{graph.name} has "
                         f"{len(graph.outputs)} outputs")
    wrt = list(range(len(graph.inputs))) if wrt is None else list(wrt)
    bad = [i for i in wrt if not 0 <= i < len(graph.inputs)]
    if bad:
        raise ValueError(f"partition: wrt {bad} out of range for @{graph.name}'s "
                         f"{len(graph.inputs)} inputs")
    j = _joint(graph, n_outputs, wrt)
    if policy == "save_all":
        saved = _save_all(j)
    elif policy == "recompute_all":
        saved = _recompute_all(j)
    else:
        saved = _min_cut(j, set(free_inputs))
    return _build(graph, j, saved, n_outputs, wrt, policy)


# --------------------------------------------------------------------------- report


@dataclass
class PartitionReport:
    """Saved bytes and recomputation of each policy for one graph; ``str()`` is a table."""

    name: str
    partitions: dict[str, Partition]

    def rows(self) -> list[dict]:
        """One dict per policy: saved values and bytes, recomputed and backward nodes."""
        return [{"policy": policy, "saved": len(p.saved), "saved_bytes": p.saved_bytes,
                 "input_bytes": p.input_bytes, "residual_bytes": p.residual_bytes,
                 "recomputed": p.recomputed, "forward_nodes": len(p.forward.nodes),
                 "backward_nodes": len(p.backward.nodes)}
                for policy, p in self.partitions.items()]

    def __str__(self) -> str:
        head = (f"{'policy':<15}{'saved':>6}{'saved bytes':>14}{'inputs':>12}{'residuals':>12}"
                f"{'recomputed':>12}{'fwd nodes':>11}{'bwd nodes':>11}")
        lines = [f"@{self.name}", head]
        for r in self.rows():
            lines.append(f"{r['policy']:<15}{r['saved']:>6}{r['saved_bytes']:>14,}"
                         f"{r['input_bytes']:>12,}{r['residual_bytes']:>12,}"
                         f"{r['recomputed']:>12}{r['forward_nodes']:>11}{r['backward_nodes']:>11}")
        return "\n".join(lines)


def partition_report(graph: Graph, wrt: Sequence[int] | None = None,
                     n_outputs: int | None = None,
                     free_inputs: Iterable[int] = ()) -> PartitionReport:
    """Partition ``graph`` under each policy and tabulate what each saves and recomputes.

    >>> print(partition_report(g, wrt=[1, 2]))                   # doctest: +SKIP
    """
    free = set(free_inputs)
    return PartitionReport(graph.name, {
        policy: partition_joint(graph, n_outputs, wrt, policy, free) for policy in POLICIES})


# --------------------------------------------------------------------------- pass


@register_pass
class PartitionPass(Pass):
    """``partition{part=forward|backward,policy=min_cut,wrt=all,free=}``: the forward
    (outputs, then saved values) or the backward (saved values and cotangents -> input
    cotangents) of the partitioned joint graph; the half returned carries the whole
    :class:`Partition` as ``graph.partition``. ``wrt`` is ``all`` or input positions joined
    by ``+`` (``wrt=1+2``); ``free`` lists the inputs that are saved for free (parameters:
    see ``free_inputs`` of :func:`partition_joint`), none by default."""

    name = "partition"
    changes_signature = True
    part: str = "forward"
    policy: str = "min_cut"
    wrt: str = "all"
    free: str = ""

    def run(self, graph: Graph) -> Graph:
        if self.part not in ("forward", "backward"):
            raise PipelineError(f"pass 'partition': part={self.part!r} must be forward or "
                                "backward")
        if self.policy not in POLICIES:
            raise PipelineError(f"pass 'partition': policy={self.policy!r} must be one of "
                                f"{', '.join(POLICIES)}")
        wrt = parse_positions(self.wrt, self.name, "wrt")
        free = parse_positions(self.free, self.name, "free") or ()
        p = partition_joint(graph, wrt=wrt, policy=self.policy, free_inputs=free)
        half = p.forward if self.part == "forward" else p.backward
        half.partition = p          # the other half and the saved values, for the caller
        return half
