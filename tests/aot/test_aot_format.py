"""The AOT file format and the pieces it relies on: header fields, sections, splat
constants in the graph text."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.aot import format
from fusegrad.ir.parser import parse
from fusegrad.ir.printer import SPLAT_MIN, print_graph
from tests.aot.helpers import mlp_step


def test_encode_decode_roundtrip():
    sections = {"graph": b"g", "plan": b"{}", "code": b"\x7fELF", "state": b""}
    blob = format.encode({"fusegrad": "x"}, sections)
    decoded = format.decode(blob)
    assert decoded.sections == sections
    assert decoded.header["format"] == format.FORMAT_VERSION
    assert blob.startswith(format.MAGIC)


def test_header_names_versions_and_target():
    step, model, opt, x, y = mlp_step("sgd")
    header = format.decode(fg.aot.compile(step, x, y).to_bytes()).header
    assert header["fusegrad"] == fg.__version__
    assert header["triple"] == llvm.get_process_triple()
    assert header["cpu"] == llvm.get_host_cpu_name() and header["host_build"]
    assert "sse2" in header["features"]
    assert [s["name"] for s in header["sections"]] == list(format.SECTIONS)


def test_no_state_section_without_carried_state():
    step, model, opt, x, y = mlp_step("sgd")
    decoded = format.decode(fg.aot.compile(step, x, y, carry_state=False).to_bytes())
    assert decoded.sections["state"] == b""


@pytest.mark.parametrize("dtype, text", [("f32", "0.0"), ("f32", "-0.0"), ("bf16", "1.5"),
                                         ("i1", "true"), ("i64", "-3")])
def test_splat_constants_roundtrip(dtype, text):
    src = (f"graph @f() -> ({dtype}[4,8]) {{\n  %0 = constant {{value=dense<{text}>}} : "
           f"{dtype}[4,8]\n  return %0\n}}")
    g = parse(src)
    arr = g.nodes[0].attrs["value"].array
    assert arr.shape == (4, 8) and len({a.tobytes() for a in arr.reshape(-1)}) == 1
    assert print_graph(g) == src
    assert print_graph(parse(print_graph(g))) == src


def test_small_or_mixed_constants_print_in_full():
    g = parse("graph @f() -> (f32[2]) {\n  %0 = constant {value=dense<[1.0, 1.0]>} : f32[2]\n"
              "  return %0\n}")
    assert "dense<[1.0, 1.0]>" in print_graph(g)
    assert SPLAT_MIN > 2
    mixed = np.zeros(SPLAT_MIN * 2, np.float32)
    mixed[3] = -0.0
    g = fg.trace(lambda x: x + fg.tensor(mixed), fg.zeros(SPLAT_MIN * 2))
    text = print_graph(g)
    assert "dense<[" in text and "-0.0" in text
