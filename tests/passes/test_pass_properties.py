"""Every pass preserves meaning: on each zoo graph and on random graphs, its output verifies,
keeps the signature, leaves its input alone, is deterministic, and computes the same bits
(``pass_testing.run_canonical``; NaN positions rather than NaN bits)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from fusegrad.ir import parse, print_graph
from fusegrad.passes.manager import PassManager
from tests.ir.ir_zoo import CASES
from tests.ir.strategies import graphs_and_args, random_args
from tests.passes.pass_testing import check_pass, rewritable_graphs

PASSES = ["cse", "fold", "simplify", "simplify{ignore_signed_zeros=false,prune=false}", "dce"]
PIPELINES = ["simplify,cse,fold,dce", "fold,simplify,cse,dce,fuse"]

PROPERTY = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _run(pipeline: str):
    return PassManager(pipeline, verify=True).run


@pytest.mark.parametrize("pipeline", PASSES + PIPELINES)
def test_zoo_graphs_keep_their_meaning(pipeline):
    for name, build in sorted(CASES.items()):
        if name == "odd_names_and_outputs":
            continue        # see test_graphs_with_duplicate_input_names below
        case = build()
        out = check_pass(_run(pipeline), case.graph, case.args, f"{pipeline} on {name}")
        again = _run(pipeline)(parse(print_graph(case.graph)))
        assert print_graph(again) == print_graph(out), f"{pipeline} is not deterministic"


@PROPERTY
@given(case=graphs_and_args(max_nodes=10))
def test_random_graphs_keep_their_meaning(case):
    g, args = case
    for pipeline in PASSES + PIPELINES[:1]:
        out = check_pass(_run(pipeline), g, args, pipeline)
        assert len(out.nodes) <= len(g.nodes)    # every rewrite replaces a node by at most one


@PROPERTY
@given(g=rewritable_graphs())
def test_graphs_full_of_rewrites_keep_their_meaning(g):
    args = random_args(g, seed=1)
    for pipeline in PASSES + PIPELINES:
        out = check_pass(_run(pipeline), g, args, pipeline)
        if pipeline in ("cse", "simplify", "dce"):
            # A second run finds nothing to do: each pass reaches its fixed point in one sweep.
            assert print_graph(_run(pipeline)(out)) == print_graph(out), pipeline


def test_graphs_with_duplicate_input_names():
    # Regression: GraphCopier once copied inputs with Graph.add_input, which refuses
    # a repeated name.
    case = CASES["odd_names_and_outputs"]()
    check_pass(_run("cse"), case.graph, case.args, "cse")


def test_passes_never_grow_special_values_into_ordinary_ones():
    # -0.0, inf and NaN inputs through every identity the simplifier knows.
    g = parse("""graph @f(%x: f32[5]) -> (f32[5], f32[5], f32[5], f32[5], f32[5]) {
  %0 = add %x, 0.0 : f32[5]
  %1 = add %x, -0.0 : f32[5]
  %2 = mul %x, 0.0 : f32[5]
  %3 = sub %x, -0.0 : f32[5]
  %4 = div %x, 1.0 : f32[5]
  return %0, %1, %2, %3, %4
}""")
    x = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan], np.float32)
    for pipeline in PASSES + PIPELINES:
        check_pass(_run(pipeline), g, (x,), pipeline)
