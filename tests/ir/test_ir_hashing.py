"""The structural hash: blind to names and locations, sensitive to everything else."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Literal, parse, print_graph, structural_hash
from fusegrad.ops.primitive import ConstantData
from tests.ir.ir_zoo import CASES, MLP_TEXT, mlp_graph


def test_hash_is_hex_sha256_and_stable():
    h = structural_hash(mlp_graph())
    assert len(h) == 64 and int(h, 16) >= 0
    assert structural_hash(mlp_graph()) == h


def test_independent_of_names_graph_name_and_locations():
    renamed = parse(MLP_TEXT.replace("%x", "%input").replace("%w", "%weight")
                    .replace("@f", "@other"))
    assert structural_hash(renamed) == structural_hash(mlp_graph())
    g = mlp_graph()
    for n in g.nodes:
        n.loc, n.output.name = None, "tmp"
    assert structural_hash(g) == structural_hash(mlp_graph())


def test_tuple_and_list_attributes_hash_alike():
    g = mlp_graph()
    g.nodes[2].attrs["axes"] = [0, 1]
    assert structural_hash(g) == structural_hash(mlp_graph())


@pytest.mark.parametrize("mutate", [
    lambda g: g.nodes[2].attrs.update(axes=(1, 0)),
    lambda g: g.nodes[1].inputs.__setitem__(1, Literal(-0.0, D.float32)),
    lambda g: g.nodes[1].inputs.__setitem__(1, Literal(0.0, D.float64)),
    lambda g: g.outputs.reverse(),
    lambda g: g.inputs.reverse(),
    lambda g: g.outputs.pop(),
    lambda g: setattr(g.nodes[1], "inputs", [g.nodes[1].inputs[1], g.nodes[1].inputs[0]]),
])
def test_sensitive_to_structure(mutate):
    g = mlp_graph()
    mutate(g)
    assert structural_hash(g) != structural_hash(mlp_graph())


def test_node_order_matters_even_between_independent_nodes():
    text = ("graph @f(%x: f32[2]) -> (f32[2], f32[2]) {\n  %0 = exp %x : f32[2]\n"
            "  %1 = neg %x : f32[2]\n  return %0, %1\n}")
    swapped = ("graph @f(%x: f32[2]) -> (f32[2], f32[2]) {\n  %0 = neg %x : f32[2]\n"
               "  %1 = exp %x : f32[2]\n  return %1, %0\n}")
    assert structural_hash(parse(text)) != structural_hash(parse(swapped))


def _constant_graph(array: np.ndarray):
    return parse(f"graph @c() -> ({D.from_numpy_dtype(array.dtype).short}[{len(array)}]) {{\n"
                 f"  %0 = constant {{value=dense<[{', '.join(map(str, array.tolist()))}]>}} : "
                 f"{D.from_numpy_dtype(array.dtype).short}[{len(array)}]\n  return %0\n}}")


def test_constant_data_is_hashed_by_value():
    a = np.array([1.0, 2.0], np.float32)
    assert structural_hash(_constant_graph(a)) == structural_hash(_constant_graph(a.copy()))
    assert structural_hash(_constant_graph(a)) != structural_hash(_constant_graph(a + 1))
    assert structural_hash(_constant_graph(a)) != structural_hash(_constant_graph(a.astype(np.float64)))


def test_nan_payloads_hash_like_they_print():
    quiet = np.array([np.nan], np.float32)
    other = np.array([0x7FC00001], np.uint32).view(np.float32)      # another NaN payload
    g1, g2 = _constant_graph(np.array([0.0], np.float32)), _constant_graph(np.array([0.0], np.float32))
    g1.nodes[0].attrs["value"] = ConstantData(quiet)
    g2.nodes[0].attrs["value"] = ConstantData(other)
    assert print_graph(g1) == print_graph(g2)
    assert structural_hash(g1) == structural_hash(g2)


def test_distinct_zoo_graphs_hash_differently():
    hashes = {name: structural_hash(build().graph) for name, build in CASES.items()}
    # "locations" is "mlp" with other source locations: the same structure.
    assert hashes.pop("locations") == hashes["mlp"]
    assert len(set(hashes.values())) == len(hashes)
