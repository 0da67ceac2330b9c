"""Compile time is bounded whatever the program.

LLVM 22's loop vectorizer, asked to interleave a loop whose body is transcendental math on a
loop-invariant value (a broadcast load, or a concat of one-element tensors whose clamped
index is constant), takes time exponential in the body: ``cat([a, a]).cos().erf()`` took
3 to 7 s, with ``.cos().erf()`` once more over 8 minutes. Codegen marks every loop with a
long body ``llvm.loop.interleave.count 1`` (``kernel.MAX_INTERLEAVED_BODY``). The structural
tests pin that; the slow ones compile the programs that hung (they would time out again).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.codegen.llvm.kernel import MAX_INTERLEAVED_BODY
from tests.compiler.compare import assert_same, tensors, values


def heavy(x):
    return x.cos().erf().cos().erf()


PROGRAMS = {
    # name: (function, input shape, dtype)
    "cat_cos_erf_twice": (lambda a: heavy(fg.cat([a, a])), (1,), fg.float32),
    "gelu_cos_cat_bf16": (lambda a: NF.gelu(fg.cat([a, a]).cos()), (1,), fg.bfloat16),
    "broadcast_rows": (lambda a: a.expand(8, 100).cos().erf(), (8, 1), fg.float32),
    "broadcast_scalar": (lambda a: heavy(a.expand(2)), (1,), fg.float32),
    "broadcast_sum": (lambda a: heavy(a.expand(4, 37)).sum(-1), (4, 1), fg.float32),
    "pad_f16": (lambda a: heavy(NF.pad(a, (1, 1))), (1,), fg.float16),
}


def loops(llvm_ir: str) -> list[tuple[int, bool]]:
    """(instructions in the body, interleaving disabled) for each loop of each kernel: a
    loop is the span from a header block to its latch (the branch carrying ``!llvm.loop``)."""
    meta = dict(re.findall(r"^(!\d+) = (.*)$", llvm_ir, flags=re.M))
    out = []
    for fn in re.findall(r"^define .*?^}", llvm_ir, flags=re.M | re.S):
        lines = fn.splitlines()
        headers = [i for i, ln in enumerate(lines) if re.match(r'^"?i\d+(\.\d+)?\.header"?:', ln)]
        for i, ln in enumerate(lines):
            m = re.search(r"!llvm\.loop (!\d+)", ln)
            if not m:
                continue
            start = max(h for h in headers if h < i)
            body = sum(1 for x in lines[start:i] if x.startswith("  ") and " = " in x
                       or x.strip().startswith("store"))
            props = re.findall(r"!\d+", meta[m.group(1)])[1:]
            off = any("interleave.count" in meta[p] and "i32 1" in meta[p] for p in props)
            out.append((body, off))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_long_loop_bodies_are_not_interleaved(name):
    fn, shape, dtype = PROGRAMS[name]
    lowered = fg.compile(fn).lower(fg.ones(*shape, dtype=dtype))
    found = loops(lowered.program.llvm_ir)
    heavy_loops = [off for body, off in found if body > 2 * MAX_INTERLEAVED_BODY]
    assert heavy_loops and all(heavy_loops), found


def test_light_loops_stay_interleavable():
    lowered = fg.compile(lambda a, b: (a + b).sum(-1)).lower(fg.ones(8, 100), fg.ones(8, 100))
    assert "interleave.count" not in lowered.program.llvm_ir


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_that_hung_compile_and_agree(name):
    fn, shape, dtype = PROGRAMS[name]
    a = values(shape, dtype, special=False)
    with fg.no_grad():
        want = fn(*tensors(a))
        got = fg.compile(fn)(*tensors(a))
    assert_same(got, want)
    assert np.isfinite(got.float().numpy()).all()
