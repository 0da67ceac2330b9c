"""The forward/backward partitioner keeps the meaning of the joint graph under every policy.

For each graph of a zoo (traced models, the hand-built IR zoo, random graphs), the forward
program runs in the interpreter, its saved values feed the backward program with random
cotangents, and the input cotangents must have the exact bits of ``vjp_graph``'s (the same
primitives on the same values, recomputed or not). The min-cut policy must also save the
fewest bytes among the valid cuts, which small graphs check against brute force.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad import dtypes as D
from fusegrad.ir import Graph, IRError, Literal, TensorType, parse, print_graph, verify
from fusegrad.ir.interpreter import interpret
from fusegrad.ops.primitive import PRIMITIVES, Kind
from fusegrad.passes.autodiff import vjp_graph
from fusegrad.passes.manager import PassManager, PipelineError
from fusegrad.passes.partition import (
    POLICIES,
    _ancestors,
    _joint,
    is_recomputable,
    partition_joint,
    partition_report,
)
from fusegrad.tracer.trace import trace
from tests.ir.ir_zoo import CASES
from tests.ir.strategies import graphs_and_args, random_args
from tests.passes.pass_testing import assert_same_results, run_canonical

# --------------------------------------------------------------------------- the zoo


def _mlp(x, w1, b1, w2, b2, y):
    h = (x @ w1 + b1).relu()
    return NF.cross_entropy(h @ w2 + b2, y)


def _softmax(x, w):
    return NF.softmax(x @ w, dim=-1)


def _layer_norm(x, g, b):
    return NF.layer_norm(x, (x.shape[-1],), g, b)


def _gelu_chain(x, w):
    h = NF.gelu(x * 1.5 + 0.25)
    return NF.gelu(NF.gelu(h @ w, approximate="tanh")).tanh().sum()


def _attention(x, wq, wk, wv, wo, g, b):
    t, c = x.shape[-2], x.shape[-1]
    h = NF.layer_norm(x, (c,), g, b)
    q, k, v = h @ wq, h @ wk, h @ wv
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c))
    causal = fg.ones(t, t).tril() == 0
    att = NF.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
    return x + (att @ v) @ wo


def _used_twice(x, w):
    h = (x @ w).tanh()
    return (h * h + h.exp()).sum()


def _stop_gradient(x, w):
    h = x @ w
    scale = h.detach().abs().max()
    return (h / scale + h.detach().sin() * h).sum()


def _int_bool(x, w, y):
    h = x @ w
    keep = (h > 0.1) & (y.reshape(-1, 1) != 2)
    count = keep.to(fg.int64).sum(1, keepdim=True)
    return (fg.where(keep, h * h, -h) * count.to(fg.float32)).mean()


def _multi_output(x, w):
    logits = x @ w
    return logits.exp().sum(), logits.argmax(-1), logits > 0, logits.tanh()


def _rng(seed: int):
    return np.random.default_rng(seed)


def _f32(seed: int, *shape: int, scale: float = 1.0) -> fg.Tensor:
    return fg.from_numpy((_rng(seed).standard_normal(shape) * scale).astype(np.float32))


MODELS = {
    "mlp_relu_cross_entropy": (_mlp, lambda: (
        _f32(0, 6, 8), _f32(1, 8, 5, scale=0.4), _f32(2, 5), _f32(3, 5, 4, scale=0.4),
        _f32(4, 4), fg.tensor([0, 3, 1, 2, 2, 0]))),
    "softmax": (_softmax, lambda: (_f32(0, 3, 4), _f32(1, 4, 6))),
    "layer_norm": (_layer_norm, lambda: (_f32(0, 3, 8), _f32(1, 8), _f32(2, 8))),
    "gelu_chain": (_gelu_chain, lambda: (_f32(0, 4, 5), _f32(1, 5, 3))),
    "attention": (_attention, lambda: (
        _f32(0, 2, 5, 8), _f32(1, 8, 8, scale=0.3), _f32(2, 8, 8, scale=0.3),
        _f32(3, 8, 8, scale=0.3), _f32(4, 8, 8, scale=0.3), _f32(5, 8), _f32(6, 8))),
    "used_twice": (_used_twice, lambda: (_f32(0, 3, 4), _f32(1, 4, 5))),
    "stop_gradient": (_stop_gradient, lambda: (_f32(0, 3, 4), _f32(1, 4, 5))),
    "int_bool": (_int_bool, lambda: (_f32(0, 4, 3), _f32(1, 3, 5), fg.tensor([0, 2, 1, 2]))),
    "multi_output": (_multi_output, lambda: (_f32(0, 3, 4), _f32(1, 4, 5))),
}


def _model(name: str) -> tuple[Graph, tuple[np.ndarray, ...]]:
    fn, make = MODELS[name]
    args = make()
    return trace(fn, *args), tuple(a.numpy() for a in args)


def _float_inputs(g: Graph) -> list[int]:
    return [i for i, v in enumerate(g.inputs) if v.type.dtype.is_floating_point]


# --------------------------------------------------------------------------- the oracle


def _cotangents(g: Graph, n_outputs: int, seed: int = 7) -> list[np.ndarray]:
    rng = _rng(seed)
    cts = []
    for o in g.outputs[:n_outputs]:
        t = o.type
        if t.dtype.is_floating_point:
            cts.append(rng.standard_normal(t.shape).astype(t.dtype.np_dtype))
        else:
            cts.append(np.zeros(t.shape, t.dtype.np_dtype))
    return cts


def check_partition(g: Graph, args: tuple, wrt: list[int] | None = None,
                    n_outputs: int | None = None, policies=POLICIES) -> dict:
    """Partition ``g`` under each policy and check the pair against ``vjp_graph``."""
    n_outputs = len(g.outputs) if n_outputs is None else n_outputs
    wrt = _float_inputs(g) if wrt is None else wrt
    before = print_graph(g)
    differentiated = Graph(g.name)
    differentiated.inputs, differentiated.nodes = g.inputs, g.nodes
    differentiated.outputs = g.outputs[:n_outputs]
    cts = _cotangents(g, n_outputs)
    want = run_canonical(vjp_graph(differentiated, wrt), *args, *cts)[n_outputs:]
    want_outputs = run_canonical(g, *args)
    results = {}
    for policy in policies:
        p = partition_joint(g, n_outputs, wrt, policy)
        assert print_graph(g) == before, f"{policy} changed its input graph"
        verify(p.forward)
        verify(p.backward)
        n_fwd = len(g.outputs)
        assert p.n_forward_outputs == n_fwd
        assert len(p.forward.outputs) == n_fwd + len(p.saved)
        assert [v.type for v in p.backward.inputs] == \
            [s.type for s in p.saved] + [o.type for o in g.outputs[:n_outputs]]
        assert p.backward.output_types == [g.inputs[i].type for i in wrt]
        for k, s in enumerate(p.saved):
            assert p.backward.inputs[k].name == s.name
            out = p.forward.outputs[n_fwd + k]
            if s.kind == "input":
                assert out is p.forward.inputs[s.input_index], s
            else:
                assert s.kind == "residual" and out.producer.prim.name == s.op, s
        fwd = run_canonical(p.forward, *args)
        context = f"{policy}:\n{print_graph(p.forward)}\n{print_graph(p.backward)}"
        assert_same_results(want_outputs, fwd[:n_fwd], context)
        got = run_canonical(p.backward, *fwd[n_fwd:], *cts)
        assert_same_results(want, got, context)
        results[policy] = p
    if set(policies) == set(POLICIES):
        _check_policies(results)
    return results


def _check_policies(ps: dict) -> None:
    assert all(s.kind == "input" for s in ps["recompute_all"].saved)
    assert ps["save_all"].recomputed == 0
    # save_all is one of the cuts the min-cut chooses from.
    assert ps["min_cut"].saved_bytes <= ps["save_all"].saved_bytes
    for p in ps.values():
        assert p.saved_bytes == p.input_bytes + p.residual_bytes


# --------------------------------------------------------------------------- meaning


@pytest.mark.parametrize("name", MODELS)
def test_partition_matches_vjp_on_models(name):
    g, args = _model(name)
    check_partition(g, args)


@pytest.mark.parametrize("name", ["mlp_relu_cross_entropy", "attention", "multi_output"])
def test_partition_matches_vjp_for_a_subset_of_inputs(name):
    g, args = _model(name)
    floats = _float_inputs(g)
    check_partition(g, args, wrt=floats[1:2])
    check_partition(g, args, wrt=floats[::-1][:2])
    check_partition(g, args, wrt=[])


def test_outputs_after_n_outputs_are_forward_only():
    """Outputs past ``n_outputs`` (in-place write-backs) get no cotangent and no backward."""
    g, args = _model("multi_output")
    ps = check_partition(g, args, n_outputs=1)
    for p in ps.values():
        assert len(p.backward.inputs) == len(p.saved) + 1
        assert len(p.forward.outputs) == len(g.outputs) + len(p.saved)


# A primitive whose VJP raises: the attention fusion never puts it where a backward is
# itself differentiated (tests/compiler/test_fused_attention.py checks that).
_NOT_DIFFERENTIABLE_TWICE = {"fused_attention_backward"}


def _zoo_cases():
    out = []
    for name, build in sorted(CASES.items()):
        case = build()
        if any(n.op in _NOT_DIFFERENTIABLE_TWICE for n in case.graph.nodes):
            continue
        if _float_inputs(case.graph) and case.graph.outputs:
            out.append(name)
    return out


@pytest.mark.parametrize("name", _zoo_cases())
def test_partition_matches_vjp_on_the_ir_zoo(name):
    case = CASES[name]()
    check_partition(case.graph, case.args)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs_and_args(max_nodes=8))
def test_partition_matches_vjp_on_random_graphs(g_args):
    g, args = g_args
    check_partition(g, args)


# --------------------------------------------------------------------------- optimality


def _brute_force_min_bytes(g: Graph, wrt: list[int]) -> int:
    """The fewest bytes any valid saved set costs: the backward recomputes no forward input
    and no forward value that is not recomputable."""
    j = _joint(g, len(g.outputs), wrt)
    needed = _ancestors(j.graph, j.ct_outputs)
    candidates = [v for v in needed if v not in j.tangent]
    in_forward = _ancestors(j.graph, j.fwd_outputs)
    banned = {v for v in candidates if v.producer is None
              or (v in in_forward and not is_recomputable(v.producer))}
    assert len(candidates) <= 16, len(candidates)
    best = None
    for r in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, r):
            s = set(subset)
            reach = _ancestors(j.graph, j.ct_outputs, stop=s)
            if any(v in reach and v not in s for v in banned):
                continue
            cost = sum(v.type.numel * v.type.dtype.itemsize for v in s if v in reach)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.slow
# (layer_norm's recomputing VJP has too many candidates for the brute force.)
@pytest.mark.parametrize("name", ["softmax", "used_twice", "stop_gradient"])
def test_min_cut_saves_the_fewest_bytes_of_any_valid_cut(name):
    g, _ = _model(name)
    wrt = _float_inputs(g)
    assert partition_joint(g, wrt=wrt).saved_bytes == _brute_force_min_bytes(g, wrt)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs_and_args(max_nodes=6))
def test_min_cut_is_optimal_on_random_graphs(g_args):
    g, _ = g_args
    wrt = _float_inputs(g)
    j = _joint(g, len(g.outputs), wrt)
    n = len([v for v in _ancestors(j.graph, j.ct_outputs) if v not in j.tangent])
    if n > 14:
        return
    assert partition_joint(g, wrt=wrt).saved_bytes == _brute_force_min_bytes(g, wrt)


@st.composite
def mixed_graphs(draw) -> Graph:
    """Random graphs over f32[3,4] values that mix what the cut decides about: matmuls and
    reductions (not recomputable), elementwise ops and comparisons (recomputable, some of
    them smaller in bytes), and values used more than once."""
    g = Graph("mixed")
    f32 = D.float32
    values = [g.add_input("x", TensorType((3, 4), f32))]
    w = g.add_input("w", TensorType((4, 4), f32))
    if draw(st.booleans()):
        values.append(g.add_input("y", TensorType((3, 4), f32)))
    for _ in range(draw(st.integers(2, 6))):
        a = draw(st.sampled_from(values))
        b = draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["matmul", "sum", "exp", "tanh", "mul", "add", "where",
                                     "cast"]))
        if kind == "matmul":
            v = g.add_node("matmul", [a, w])
        elif kind == "sum":
            s = g.add_node("sum", [a], {"axes": (1,)})
            v = g.add_node("broadcast_to", [g.add_node("reshape", [s], {"shape": (3, 1)})],
                           {"shape": (3, 4)})
        elif kind in ("exp", "tanh"):
            v = g.add_node(kind, [a])
        elif kind in ("mul", "add"):
            v = g.add_node(kind, [a, b])
        elif kind == "where":
            v = g.add_node("where", [g.add_node("lt", [a, Literal(0.0, f32)]), b, a])
        else:
            half = g.add_node("cast", [a], {"dtype": D.float16})
            v = g.add_node("cast", [g.add_node("tanh", [half])], {"dtype": f32})
        values.append(v)
    out = g.add_node("sum", [values[-1]], {"axes": (0, 1)})
    g.set_outputs([out] + ([values[-2]] if draw(st.booleans()) else []))
    return g


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_graphs())
def test_min_cut_is_optimal_on_mixed_graphs(g):
    wrt = list(range(len(g.inputs)))
    j = _joint(g, len(g.outputs), wrt)
    n = len([v for v in _ancestors(j.graph, j.ct_outputs) if v not in j.tangent])
    if n <= 14:
        assert partition_joint(g, wrt=wrt).saved_bytes == _brute_force_min_bytes(g, wrt)
    check_partition(g, random_args(g))


# --------------------------------------------------------------------------- choices


def _graph(text: str) -> Graph:
    return parse(text)


def test_elementwise_chain_is_recomputed_and_matmul_saved():
    """relu(x @ w) then sum: the matmul result is saved; the mask is recomputed from it."""
    g = _graph("""graph @f(%x: f32[4,8], %w: f32[8,16]) -> (f32[]) {
  %0 = matmul %x, %w : f32[4,16]
  %1 = maximum %0, 0.0 : f32[4,16]
  %2 = mul %1, %1 : f32[4,16]
  %3 = sum %2 {axes=[0, 1]} : f32[]
  return %3
}""")
    p = partition_joint(g, wrt=[1])
    assert [(s.kind, s.op) for s in p.saved] == [("input", "input"), ("residual", "matmul")]
    assert p.saved[0].name == "x"
    assert p.recomputed >= 1                   # maximum recomputed in the backward
    ops = [n.op for n in p.backward.nodes]
    assert "matmul" in ops and "maximum" in ops
    ps = check_partition(g, (_rng(0).standard_normal((4, 8)).astype(np.float32),
                             _rng(1).standard_normal((8, 16)).astype(np.float32)), wrt=[1])
    assert p.saved_bytes == (4 * 8 + 4 * 16) * 4
    # x and w, to recompute the matmul.
    assert ps["recompute_all"].saved_bytes == (4 * 8 + 8 * 16) * 4
    assert ps["recompute_all"].recomputed_ops == ["matmul", "maximum"]
    # x, the matmul, and the maximum its square reads.
    assert ps["save_all"].saved_bytes == (4 * 8 + 2 * 4 * 16) * 4


def test_matmul_is_never_recomputed_even_when_inputs_are_smaller():
    """An outer product is bigger than its operands, but recomputing a matmul is banned."""
    g = _graph("""graph @outer(%a: f32[16,1], %b: f32[1,16]) -> (f32[]) {
  %0 = matmul %a, %b : f32[16,16]
  %1 = tanh %0 : f32[16,16]
  %2 = sum %1 {axes=[0, 1]} : f32[]
  return %2
}""")
    p = partition_joint(g)
    assert "matmul" not in p.recomputed_ops
    # a and b for each other's cotangent, and one 16x16 residual: the matmul, or a value
    # computed from it elementwise (of same-size cuts, the later one: tanh's 1 - y * y).
    assert [(s.name, s.kind) for s in p.saved] == [("a", "input"), ("b", "input"),
                                                   ("saved2", "residual")]
    assert p.saved_bytes == 16 * 16 * 4 + 2 * 16 * 4
    rec = partition_joint(g, policy="recompute_all")
    assert rec.saved_bytes == 2 * 16 * 4 < p.saved_bytes


def test_a_smaller_mask_is_saved_instead_of_a_float():
    """where(x > 0, y, 0) in f32 with x needed only through the comparison: a bool mask (one
    byte per element) crosses, not x (four)."""
    g = _graph("""graph @m(%x: f32[64], %y: f32[64]) -> (f32[]) {
  %0 = lt 0.0:f32, %x : i1[64]
  %1 = exp %y : f32[64]
  %2 = where %0, %1, 0.0 : f32[64]
  %3 = sum %2 {axes=[0]} : f32[]
  return %3
}""")
    p = partition_joint(g, wrt=[1])
    kinds = sorted((s.type.dtype.name, s.kind) for s in p.saved)
    assert kinds == [("bool", "residual"), ("float32", "input")]
    assert p.saved_bytes == 64 + 64 * 4          # the mask, and y to recompute exp from


def test_inputs_cost_their_size_unless_free():
    """exp(cast(x, f32)) with x in f64: saving the f32 exp costs half of saving x, unless x
    is declared free (a parameter, alive anyway)."""
    g = _graph("""graph @c(%x: f64[32]) -> (f32[]) {
  %0 = cast %x {dtype=f32} : f32[32]
  %1 = exp %0 : f32[32]
  %2 = sum %1 {axes=[0]} : f32[]
  return %2
}""")
    p = partition_joint(g)
    assert [(s.kind, s.op) for s in p.saved] == [("residual", "exp")]
    free = partition_joint(g, free_inputs=[0])
    assert [(s.kind, s.name) for s in free.saved] == [("input", "x")]
    assert free.recomputed == 2
    args = (_rng(0).standard_normal(32),)
    cts = [np.float32(1.5)]
    want = run_canonical(vjp_graph(g), *args, *cts)[1:]
    for q in (p, free):
        fwd = run_canonical(q.forward, *args)
        assert_same_results(want, run_canonical(q.backward, *fwd[1:], *cts))


def test_ties_prefer_the_input():
    """exp(x): saving x or exp(x) costs the same bytes; the input is kept (it exists while
    the forward runs), and exp is recomputed."""
    g = _graph("""graph @e(%x: f32[8]) -> (f32[8]) {
  %0 = exp %x : f32[8]
  return %0
}""")
    p = partition_joint(g)
    assert [(s.kind, s.name) for s in p.saved] == [("input", "x")]


def test_random_bits_are_saved_not_recomputed():
    g = _graph("""graph @drop(%x: f32[16], %key: i64[2]) -> (f32[]) {
  %0 = random_uniform %key {shape=[16], dtype=f32} : f32[16]
  %1 = lt %0, 0.5:f32 : i1[16]
  %2 = where %1, %x, 0.0 : f32[16]
  %3 = sum %2 {axes=[0]} : f32[]
  return %3
}""")
    p = partition_joint(g, wrt=[0])
    assert "random_uniform" not in [n.op for n in p.backward.nodes]
    args = (_rng(0).standard_normal(16).astype(np.float32), np.array([3, 0], np.int64))
    check_partition(g, args, wrt=[0])


def test_layer_norm_saves_its_input_alone():
    """layer_norm's VJP recomputes (torch's NativeLayerNormBackward reads the input): its
    remat barriers leave the forward nothing to save but the inputs, and no forward
    reduction is recomputed (the backward's statistics are its own nodes)."""
    g, args = _model("layer_norm")
    p = partition_joint(g)
    assert {s.kind for s in p.saved} == {"input"}
    assert {"sum", "max", "min", "prod"}.isdisjoint(p.recomputed_ops)
    check_partition(g, args)


@pytest.mark.parametrize("name", MODELS)
def test_min_cut_recomputes_only_recomputable_ops(name):
    g, _ = _model(name)
    p = partition_joint(g, wrt=_float_inputs(g))
    banned = [op for op in p.recomputed_ops if not is_recomputable_prim(op)]
    assert banned == [], p.recomputed_ops
    assert p.recomputed == len(p.recomputed_ops)


def is_recomputable_prim(op: str) -> bool:
    prim = PRIMITIVES[op]
    return prim.kind in (Kind.ELEMENTWISE, Kind.MOVEMENT, Kind.SOURCE) and op != "random_uniform"


# --------------------------------------------------------------------------- determinism, API


@pytest.mark.parametrize("name", ["mlp_relu_cross_entropy", "attention"])
def test_partition_is_deterministic(name):
    g, _ = _model(name)
    a = partition_joint(g)
    b = partition_joint(parse(print_graph(g)))
    assert print_graph(a.forward) == print_graph(b.forward)
    assert print_graph(a.backward) == print_graph(b.backward)
    assert a.saved == b.saved


def test_bad_arguments_raise():
    g, _ = _model("softmax")
    with pytest.raises(ValueError, match="unknown policy"):
        partition_joint(g, policy="greedy")
    with pytest.raises(ValueError, match="n_outputs"):
        partition_joint(g, n_outputs=3)
    with pytest.raises(ValueError, match="wrt"):
        partition_joint(g, wrt=[5])


def test_report_tabulates_every_policy():
    g, _ = _model("mlp_relu_cross_entropy")
    report = partition_report(g, wrt=[1, 2, 3, 4])
    rows = {r["policy"]: r for r in report.rows()}
    assert set(rows) == set(POLICIES)
    for policy, r in rows.items():
        p = partition_joint(g, wrt=[1, 2, 3, 4], policy=policy)
        assert r["saved_bytes"] == p.saved_bytes and r["saved"] == len(p.saved)
    assert rows["min_cut"]["saved_bytes"] <= rows["save_all"]["saved_bytes"]
    assert rows["save_all"]["recomputed"] == 0
    text = str(report)
    assert "min_cut" in text and "recompute_all" in text and f"{rows['min_cut']['saved_bytes']:,}" \
        in text


def test_partition_pass_in_a_pipeline():
    g, args = _model("softmax")
    fwd = PassManager("partition", verify=True).run(g)
    bwd = PassManager("partition{part=backward,policy=save_all,wrt=0+1}", verify=True).run(g)
    p = partition_joint(g, policy="save_all")
    assert print_graph(bwd) == print_graph(p.backward)
    assert print_graph(fwd) == print_graph(partition_joint(g).forward)
    with pytest.raises(PipelineError, match="part"):
        PassManager("partition{part=middle}").run(g)
    with pytest.raises(PipelineError, match="policy"):
        PassManager("partition{policy=greedy}").run(g)
    with pytest.raises(PipelineError, match="wrt"):
        PassManager("partition{wrt=x}").run(g)


def test_graph_with_no_differentiable_path_saves_nothing():
    g = Graph("nodiff")
    x = g.add_input("x", TensorType((3,), D.float32))
    g.set_outputs([g.add_node("lt", [x, Literal(0.0, D.float32)])])
    for policy in POLICIES:
        p = partition_joint(g, policy=policy)
        assert p.saved == [] and p.saved_bytes == 0
    check_partition(g, random_args(g))


def test_joint_graph_must_replay_the_forward(monkeypatch):
    """The partitioner maps the forward onto the joint graph's first nodes; a vjp_graph that
    stopped replaying them would be caught, not silently mis-partitioned."""
    import fusegrad.passes.partition as part

    def shuffled(g, wrt, name=None, **options):
        out = vjp_graph(g, wrt, name, **options)
        out.nodes = out.nodes[1:] + out.nodes[:1]
        return out
    monkeypatch.setattr(part, "vjp_graph", shuffled)
    g, _ = _model("used_twice")
    with pytest.raises(IRError, match="replay"):
        partition_joint(g)


def _example_models():
    path = Path(__file__).resolve().parents[2] / "examples" / "partition_report.py"
    spec = importlib.util.spec_from_file_location("partition_report_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.model_graphs()


def test_example_models_partition_correctly():
    """The models of examples/partition_report.py (the 784-256-256-10 MLP and a transformer
    block) partition under every policy with the exact gradients of vjp_graph, and the
    min-cut keeps their matmuls and reductions out of the recomputed nodes."""
    for g, wrt in _example_models():
        args = random_args(g)
        if g.name == "MLPLoss":
            args = args[:-1] + (np.arange(128, dtype=np.int64) % 10,)
        ps = check_partition(g, args, wrt=wrt)
        assert {"matmul", "sum", "max"}.isdisjoint(ps["min_cut"].recomputed_ops)
        assert ps["min_cut"].saved_bytes < ps["save_all"].saved_bytes


def test_a_symbolic_backward_gets_an_input_that_binds_its_sizes():
    # The backward reads B (the cotangent goes back to f32[B,2]), but its saved value and
    # cotangent are f32[2*B]: it takes x too, only for its size (a reference, no copy).
    g = parse("graph @f(%x: f32[B,2]) -> (f32[2*B]) {\n"
              "  %0 = reshape %x {shape=[2*B]} : f32[2*B]\n"
              "  %1 = exp %0 : f32[2*B]\n"
              "  return %1\n}\n")
    part = partition_joint(g)
    verify(part.backward)
    assert [(s.name, s.kind) for s in part.saved if s.kind == "input"] == [("x", "input")]
    x = np.linspace(-1, 1, 6).reshape(3, 2).astype(np.float32)
    ct = np.ones(6, np.float32)
    fwd = interpret(part.forward, x)
    grad, = interpret(part.backward, *fwd[1:], ct)
    np.testing.assert_allclose(grad, np.exp(x), rtol=4 * np.finfo(np.float32).eps)
