"""Walk every graph the IR tests build (``ir_zoo.CASES``) through every IR tool."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad.ir import interpret, parse, print_graph, structural_hash, verify
from fusegrad.ops.primitive import PRIMITIVES
from tests.ir.ir_zoo import CASES, all_cases


def test_zoo_covers_every_primitive():
    used = {n.op for c in all_cases().values() for n in c.graph.nodes}
    assert sorted(set(PRIMITIVES) - used) == []


def test_zoo_sets_every_attribute_of_every_primitive():
    for c in all_cases().values():
        for n in c.graph.nodes:
            assert set(n.attrs) == set(n.prim.attrs), n


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("locations", [False, True])
def test_round_trip(name, locations):
    g = CASES[name]().graph
    verify(g)
    text = print_graph(g, locations=locations)
    back = parse(text)
    verify(back)
    assert print_graph(back, locations=locations) == text
    assert structural_hash(back) == structural_hash(g)
    if locations:
        assert [n.loc for n in back.nodes] == [n.loc for n in g.nodes]


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_numpy(name):
    c = CASES[name]()
    got = interpret(c.graph, *c.args)
    assert len(got) == len(c.graph.outputs)
    for value, t in zip(got, c.graph.output_types, strict=True):
        assert value.shape == t.shape and value.dtype == t.dtype.np_dtype
    if c.expected is None:
        return
    want = c.expected(*c.args)
    assert len(got) == len(want)
    for k, (g_, w) in enumerate(zip(got, want, strict=True)):
        w = np.asarray(w)
        assert g_.dtype == w.dtype, (k, g_.dtype, w.dtype)
        assert g_.shape == w.shape, (k, g_.shape, w.shape)
        wide = np.complex128 if w.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(g_.astype(wide), w.astype(wide), rtol=2e-6,
                                   atol=1e-7, equal_nan=True, err_msg=f"output {k}")
