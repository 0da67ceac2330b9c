"""Compile time is bounded whatever the program.

LLVM 22's loop vectorizer, asked to interleave a loop whose body is transcendental math on a
loop-invariant value (a broadcast load, or a concat of one-element tensors whose clamped
index is constant), takes time exponential in the body: ``cat([a, a]).cos().erf()`` took
3 to 7 s, with ``.cos().erf()`` once more over 8 minutes. Codegen emits such a load ahead of
the loop (LICM then moves the math out with it), and marks a loop with a long body that
still holds one ``llvm.loop.interleave.count 1`` (``kernel.MAX_INTERLEAVED_BODY``). The
structural tests pin both; the slow ones compile the programs that hung (they would time
out again).
"""

from __future__ import annotations

import re

import llvmlite.ir as ir
import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.codegen.llvm.kernel import MAX_INTERLEAVED_BODY, KernelEmitter
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
    # A column reduction: the operand's index is the parallel unit's coordinate.
    "broadcast_column_sum": (lambda a: heavy(a.expand(6, 50, 300)).sum(0), (1, 50, 1),
                             fg.float32),
}


def loops(llvm_ir: str) -> list[tuple[int, bool, bool]]:
    """(instructions in the body, interleaving disabled, loads in the body) for each
    innermost loop of each kernel: a loop is the span from a header block to its latch (the
    branch back to the header, which carries ``!llvm.loop`` metadata when it has any)."""
    meta = dict(re.findall(r"^(!\d+) = (.*)$", llvm_ir, flags=re.M))
    out = []
    for fn in re.findall(r"^define .*?^}", llvm_ir, flags=re.M | re.S):
        lines = fn.splitlines()
        headers = {m.group(1): i for i, ln in enumerate(lines)
                   if (m := re.match(r'^"?([\w.]+\.header(?:\.\d+)?)"?:', ln))}
        for i, ln in enumerate(lines):
            m = re.match(r'^\s*br label %"?([\w.]+\.header(?:\.\d+)?)"?(.*)$', ln)
            if not m or headers.get(m.group(1), i) >= i:
                continue                     # not a back edge
            span = lines[headers[m.group(1)]:i]
            if any(re.match(r'^"?[\w.]+\.header(\.\d+)?"?:', x) for x in span[1:]):
                continue                     # an outer loop (the vectorizer's are innermost)
            body = sum(1 for x in span if x.startswith("  ") and " = " in x
                       or x.strip().startswith("store"))
            tag = re.search(r"!llvm\.loop (!\d+)", m.group(2))
            props = re.findall(r"!\d+", meta[tag.group(1)])[1:] if tag else []
            off = any("interleave.count" in meta[p] and "i32 1" in meta[p] for p in props)
            # Loads from buffers go through an "addr" pointer (accumulators do not).
            out.append((body, off, any(re.search(r' = load .*%"addr', x) for x in span)))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_invariant_loads_leave_long_loop_bodies(name):
    # Every load of these programs is invariant in its innermost loop: all of them are
    # emitted ahead of the loop, so the long bodies left are math on values LICM hoists.
    fn, shape, dtype = PROGRAMS[name]
    lowered = fg.compile(fn).lower(fg.ones(*shape, dtype=dtype))
    found = loops(lowered.program.llvm_ir)
    heavy_loops = [(off, has_load) for body, off, has_load in found
                   if body > 2 * MAX_INTERLEAVED_BODY]
    assert heavy_loops and not any(has_load for _, has_load in heavy_loops), found


@pytest.mark.parametrize("derived", [False, True])
def test_long_loops_holding_an_invariant_load_are_not_interleaved(derived):
    # A load in a loop of 100 at an index computed inside that loop from the outer loop's
    # index only (no kernel emits one today) stays there, and the loop is not interleaved;
    # at the outer index itself it moves to the preheader and the loop keeps interleaving.
    program = fg.compile(lambda a: a.cos()).lower(fg.ones(8, 1)).program
    kernel = program.kg.kernels[0]
    em = KernelEmitter(ir.Module(), kernel, program.kg, program.slots)
    src = kernel.nodes[0].inputs[0]
    with em.loop(0, 8, "i0") as i:
        with em.loop(0, 100, "i1") as j:
            row = em.b.add(i, ir.Constant(ir.IntType(64), 0)) if derived else i
            x = em.load(src, [row, ir.Constant(ir.IntType(64), 0)])
            for _ in range(MAX_INTERLEAVED_BODY):
                x = em.b.fadd(x, x)
            em.store(kernel.outputs[0], [i, j], x)
    text = str(em.finish().module)
    found = loops(text)
    assert [(off, has_load) for body, off, has_load in found] == [(derived, derived)]


@pytest.mark.parametrize("fn", [lambda a, b: (a + b).sum(-1), lambda a, b: heavy(a * b),
                                lambda a, b: ((a * 1.5).tanh() * b).sum()],
                         ids=["light", "heavy", "tanh_sum"])
def test_loops_without_invariant_loads_stay_interleavable(fn):
    lowered = fg.compile(fn).lower(fg.ones(8, 100), fg.ones(8, 100))
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
