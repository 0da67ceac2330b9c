"""nn.functional's ops are defined in fusegrad.ops, one module per family, and nn.functional
re-exports them: the same function objects, and nothing in ops imports nn."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fusegrad.nn.functional as NF
from fusegrad.ops import activations, dropout, layers, losses, normalization, padding, softmax

OPS = Path(__file__).resolve().parent.parent / "fusegrad" / "ops"


@pytest.mark.parametrize("module", [activations, softmax, normalization, losses, dropout, layers,
                                    padding], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_nn_functional_reexports_the_family_itself(module):
    names = [n for n in module.__all__ if n in NF.__all__]
    assert names
    for name in names:
        assert getattr(NF, name) is getattr(module, name), name


def test_every_nn_functional_name_of_a_family_is_the_ops_function():
    families = (activations, softmax, normalization, losses, dropout, layers, padding)
    defined = {n for m in families for n in m.__all__}
    assert {"softmax", "gelu", "layer_norm", "cross_entropy", "dropout", "linear",
            "pad"} <= defined & set(NF.__all__)


def test_ops_import_nothing_from_nn():
    for path in sorted(OPS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith("fusegrad.nn") for n in names), (path.name, names)
