"""Reverse-mode autodiff over graphs, from the same VJP rules eager autograd uses.

``vjp_graph(g, wrt)`` returns a graph that computes ``g``'s outputs and, given one cotangent
input per output, the cotangents of the inputs listed in ``wrt``. It replays ``g`` into a new
graph through symbolic tensors, then walks the nodes in reverse applying each primitive's
:class:`~fusegrad.ops.primitive.Rule` to the cotangent of its result: the rules are tensor
code, so running them on symbolic tensors appends the backward nodes. Only operands that
depend on a ``wrt`` input get a rule applied, and cotangents that meet are summed.

Because the result is an ordinary graph, differentiating it again gives higher-order
derivatives.

Checkpointed regions (nodes with a ``region``: ``fusegrad.utils.checkpoint`` under a trace)
are differentiated on recomputed values when ``remat`` is asked for: when the reverse walk
reaches a region, it first appends copies of the region's internal nodes (those whose
values nothing outside the region reads), marked ``remat``, which read the region's inputs
through ``stop_gradient`` barriers (marked too, kept by ``strip-barriers``, so that ``cse``
leaves the copies apart); the region's VJPs then read the copies. Nothing after the region's
forward reads its internal values any more, so the memory plan frees them there, and the
copies live from right before the region's backward to its end. A copy of
``random_uniform`` reads the forward's key and draws the same numbers (torch's
``preserve_rng_state``). The partitioner saves no ``remat`` value: the region's inputs
(and outputs) are what crosses from the forward to the backward. ``remat`` is off where the
result is itself differentiated again (a barrier would stop that derivative).

A custom VJP registered with ``recompute`` (a layer norm's, a 16-bit GELU's) reads its
operands through such barriers too: it recomputes what it needs from them (the centered and
normalized values, the GELU's erf) in the backward, and the forward keeps only the operands.
"""

from __future__ import annotations

import copy
from typing import Sequence

from fusegrad.ir.graph import Graph, Literal, Value
from fusegrad.ir.symbolic import USER_LINE, GraphTrace, SymbolicTensor, literal_tensor
from fusegrad.ops import functional as F
from fusegrad.ops import prims as P
from fusegrad.passes.manager import Pass, parse_positions, register_pass

__all__ = ["vjp_graph", "grad_graph", "autodiff", "Autodiff", "Vjp"]


def _forward(g: Graph, trace: GraphTrace, wrt: set[int]):
    env: dict[Value, SymbolicTensor] = {}
    for i, v in enumerate(g.inputs):
        env[v] = trace.new_input(v.name, v.type, requires_grad=i in wrt)
    # Which values carry a dependence on a wrt input (and so need cotangents).
    active = {v for i, v in enumerate(g.inputs) if i in wrt and v.type.dtype.is_differentiable}

    def get(op):
        return env[op] if isinstance(op, Value) else literal_tensor(op)

    for node in g.nodes:
        trace.location = node.loc
        env[node.output] = trace.process_primitive(node.prim, [get(op) for op in node.inputs],
                                                   node.attrs)
        if node.prim.vjp is not None and node.output.type.dtype.is_differentiable and any(
                isinstance(op, Value) and op in active for op in node.inputs):
            active.add(node.output)
    trace.location = USER_LINE
    return env, active, get


def _reverse(g: Graph, trace: GraphTrace, env, active, get, seeds: dict,
             remat: bool = False) -> dict:
    cts = dict(seeds)
    recomputed: dict[int, dict] = {}        # region -> {forward value: its copy}
    for node in reversed(g.nodes):
        # Read, not popped: a leaf made inside a traced function (x.detach().requires_grad_())
        # is a node's output whose cotangent backward() reads afterwards.
        ct = cts.get(node.output)
        if ct is None or node.output not in active:
            continue
        if remat and node.region is not None:
            copies = recomputed.get(node.region)
            if copies is None:
                copies = recomputed[node.region] = _recompute_region(g, node.region, trace, get)
            primals = tuple(copies[op] if op in copies else get(op) for op in node.inputs)
            out = copies[node.output] if node.output in copies else env[node.output]
        else:
            primals = tuple(get(op) for op in node.inputs)
            out = env[node.output]
        if remat and node.op == "custom_vjp" and node.attrs["rule"] in P.CUSTOM_VJP_RECOMPUTES:
            which = P.CUSTOM_VJP_RECOMPUTES[node.attrs["rule"]]
            primals = primals[:1] + tuple(
                _remat_barrier(trace, p) if which is None or i in which else p
                for i, p in enumerate(primals[1:]))
        trace.location = node.loc        # a node's VJP points at the user's line of the node
        for i, op in enumerate(node.inputs):
            if not isinstance(op, Value) or op not in active or node.prim.rule(i) is None:
                continue
            gi = node.prim.cotangent(i, ct, out, primals, node.attrs)
            if gi is None:
                continue
            if gi.dtype is not op.type.dtype:
                gi = F.cast(gi, op.type.dtype)
            if tuple(gi.shape) != op.type.shape:
                raise RuntimeError(f"VJP of {node.prim.name} gave a cotangent of shape "
                                   f"{list(gi.shape)} for an operand of type {op.type}")
            prev = cts.get(op)
            cts[op] = gi if prev is None else prev + gi
    trace.location = USER_LINE
    return cts


def _remat_barrier(trace: GraphTrace, t: SymbolicTensor) -> SymbolicTensor:
    """``t`` through a ``remat`` barrier: what a recomputing custom VJP reads (module doc).
    The rule's arithmetic on it is a copy of the forward's that CSE leaves apart and fusion
    keeps in the backward, so the forward keeps ``t`` instead of the values it computed."""
    out = trace.process_primitive(P.stop_gradient, (t,), {})
    trace.graph.nodes[-1].remat = True
    return out


def _recompute_region(g: Graph, region: int, trace: GraphTrace, get) -> dict:
    """Append copies of the internal nodes of checkpointed ``region`` of ``g`` (module doc);
    return {forward value: its recomputed tensor}."""
    nodes = [n for n in g.nodes if n.region == region]
    inside = {n.output for n in nodes}
    read_outside = {o for o in g.outputs if isinstance(o, Value)}
    for n in g.nodes:
        if n.region != region:
            read_outside.update(op for op in n.inputs if isinstance(op, Value) and op in inside)
    copied = [n for n in nodes if n.output not in read_outside]
    start = len(trace.graph.nodes)
    # The barriers first: the recomputation starts at them (fusion keeps every copy in
    # kernels after that point).
    copies: dict = {}
    for n in copied:
        for op in n.inputs:
            if isinstance(op, Value) and op not in copies and \
                    (op not in inside or op in read_outside):
                copies[op] = trace.process_primitive(P.stop_gradient, (get(op),), {})
    saved_location = trace.location
    for n in copied:
        trace.location = n.loc
        copies[n.output] = trace.process_primitive(
            n.prim, [copies[op] if isinstance(op, Value) else literal_tensor(op)
                     for op in n.inputs], n.attrs)
    trace.location = saved_location
    for n in trace.graph.nodes[start:]:
        n.remat = True
    return copies


def vjp_graph(g: Graph, wrt: Sequence[int] | None = None, name: str | None = None,
              remat: bool = False) -> Graph:
    """Graph ``(*inputs, *cotangents) -> (*outputs, *input_cotangents[wrt])``; with
    ``remat``, checkpointed regions are differentiated on recomputed values (module doc)."""
    wrt = list(range(len(g.inputs))) if wrt is None else list(wrt)
    new = Graph(name or f"{g.name}_vjp")
    trace = GraphTrace(new)
    env, active, get = _forward(g, trace, set(wrt))
    seeds = {}
    for k, out in enumerate(g.outputs):
        ct = trace.new_input(f"ct{k}", out.type)
        if isinstance(out, Value) and out.type.dtype.is_differentiable:
            seeds[out] = ct if out not in seeds else seeds[out] + ct
    cts = _reverse(g, trace, env, active, get, seeds, remat)
    outputs = [get(o) for o in g.outputs]
    outputs += [_cotangent_or_zeros(cts, g.inputs[i], env) for i in wrt]
    new.set_outputs([_as_operand(trace, t) for t in outputs])
    return new


def grad_graph(g: Graph, wrt: Sequence[int] | None = None, output: int = 0,
               name: str | None = None) -> Graph:
    """Graph ``(*inputs) -> (*outputs, *d outputs[output] / d inputs[wrt])``.

    The differentiated output must be a floating-point scalar (seeded with 1).
    """
    wrt = list(range(len(g.inputs))) if wrt is None else list(wrt)
    out = g.outputs[output]
    if out.type.shape != () or not out.type.dtype.is_floating_point:
        raise TypeError(f"grad requires a real scalar output, but output {output} of @{g.name} "
                        f"is {out.type}; use vjp for non-scalar outputs")
    new = Graph(name or f"{g.name}_grad")
    trace = GraphTrace(new)
    env, active, get = _forward(g, trace, set(wrt))
    seeds = {}
    if isinstance(out, Value):
        seeds[out] = F.ones_like(env[out])
    cts = _reverse(g, trace, env, active, get, seeds)
    outputs = [get(o) for o in g.outputs]
    outputs += [_cotangent_or_zeros(cts, g.inputs[i], env) for i in wrt]
    new.set_outputs([_as_operand(trace, t) for t in outputs])
    return new


autodiff = grad_graph


def _cotangent_or_zeros(cts: dict, v: Value, env) -> SymbolicTensor:
    ct = cts.get(v)
    return ct if ct is not None else F.zeros_like(env[v])


def _as_operand(trace: GraphTrace, t):
    op = trace.operand(t)
    if isinstance(op, Literal):
        # A graph output that is a concrete scalar: materialize it as a node.
        return trace.graph.add_node(P.full, [], {"shape": (), "value": op.value,
                                                 "dtype": op.dtype})
    return op


@register_pass
class Autodiff(Pass):
    """``autodiff{wrt=all}`` or ``autodiff{wrt=1}``: the graph of the outputs followed by the
    gradient of the first (scalar) output with respect to all inputs or input ``wrt``."""

    name = "autodiff"
    wrt: str = "all"

    def run(self, graph: Graph) -> Graph:
        wrt = None if self.wrt == "all" else [int(self.wrt)]
        return grad_graph(graph, wrt, name=graph.name)


@register_pass
class Vjp(Pass):
    """``vjp{wrt=all,outputs=all}``: ``(*inputs, *cotangents) -> input cotangents[wrt]``,
    the VJP of the outputs ``outputs`` (``all`` or output positions joined by ``+``; one
    cotangent input each), named ``<graph>_backward``. Only the outputs listed are seeded:
    a zero cotangent for the others would go down their paths, where 0 * inf is NaN."""

    name = "vjp"
    changes_signature = True
    wrt: str = "all"
    outputs: str = "all"

    def run(self, graph: Graph) -> Graph:
        wrt = parse_positions(self.wrt, self.name, "wrt")
        seeded = parse_positions(self.outputs, self.name, "outputs", what="output")
        forward = graph
        if seeded is not None:
            forward = copy.copy(graph)          # the input graph keeps its outputs
            forward.set_outputs([graph.outputs[k] for k in seeded])
        g = vjp_graph(forward, wrt, name=f"{graph.name}_backward")
        g.set_outputs(g.outputs[len(forward.outputs):])
        return g
