"""The IR tools import nothing from the layers above them (tracer, passes, codegen, runtime,
the Tensor front end): data flows down the pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fusegrad.ir

IR_DIR = Path(fusegrad.ir.__file__).parent
TOOLS = ["__init__", "graph", "printer", "parser", "verifier", "interpreter", "nx", "hashing", "dot"]
HIGHER = ("fusegrad.tracer", "fusegrad.passes", "fusegrad.codegen", "fusegrad.runtime",
          "fusegrad.tensor", "fusegrad.nn", "fusegrad.optim", "fusegrad.autograd")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("module", TOOLS)
def test_ir_tool_imports_no_higher_layer(module):
    bad = [n for n in _imports(IR_DIR / f"{module}.py") if n.startswith(HIGHER)]
    assert bad == []
