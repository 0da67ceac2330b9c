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
from fusegrad.codegen.kernel_ir import INDEX, ExprBuilder, Loop, LoweredKernel, Param, Store, Var
from fusegrad.codegen.llvm.kernel import MAX_INTERLEAVED_BODY, KernelPrinter
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


@pytest.mark.parametrize("hoistable", [True, False])
def test_long_loops_holding_an_invariant_load_are_not_interleaved(hoistable):
    # A load at the outer loop's index inside a loop of 100 moves to that loop's preheader
    # when the kernel allows it, and the loop keeps interleaving; where loads may not move
    # ahead of loops (a kernel with an empty buffer) it stays, and the loop is not
    # interleaved.
    b = ExprBuilder()
    f32 = fg.float32
    src, dst = Param("src", f32), Param("dst", f32)
    i, j = Var("i", INDEX), Var("j", INDEX)
    x = b.load(src, b.read(i))
    for _ in range(MAX_INTERLEAVED_BODY):
        x = b.binary("add", x, x, f32)
    store = Store(dst, b.add(b.mul(b.read(i), b.index(100)), b.read(j)), x)
    inner = Loop(j, b.index(0), b.index(100), b.index(1), [store])
    kernel = LoweredKernel("k", [src, dst], [], [Loop(i, b.index(0), b.index(8), b.index(1),
                                                      [inner])], 1, 1, hoistable=hoistable)
    module = ir.Module()
    KernelPrinter(module, kernel, {src: 0, dst: 1}.__getitem__).print()
    text = str(module)
    found = loops(text)
    assert [(off, has_load) for body, off, has_load in found] == [(not hoistable,) * 2]


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
