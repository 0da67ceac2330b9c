"""The memory plan (slots, liveness, buffer sharing, donation) apart from any launcher."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.passes.fusion import fuse
from fusegrad.runtime.memory_plan import donation_safe, plan_memory


def _chain(x):
    # Four matmul kernels in sequence: each intermediate is read by the next kernel only.
    a = (x @ x).exp()
    b = (a @ x).exp()
    c = (b @ x).exp()
    return (c @ x).exp()


def test_slots_inputs_first_outputs_fresh_intermediates_shared():
    g = fg.trace(_chain, fg.randn(8, 8))
    kg = fuse(g)
    plan = plan_memory(kg)
    assert plan.slots[g.inputs[0]] == 0 and plan.n_inputs == 1
    out = g.outputs[0]
    assert plan.slots[out] in plan.output_slots
    inter = [v for v in plan.slots if v not in g.inputs and v is not out]
    assert len(inter) >= 6
    # Values whose lifetimes do not overlap share a buffer of their shape and dtype.
    assert len({plan.slots[v] for v in inter}) < len(inter)
    assert all(spec == ((8, 8), np.dtype(np.float32)) for spec in plan.intermediate_specs.values())
    assert plan.n_slots == 1 + len(plan.output_slots) + len(plan.intermediate_specs)


def test_scratch_slots_come_last():
    g = fg.trace(lambda x: (x * 2).sum(), fg.randn(16))
    kg = fuse(g)
    plan = plan_memory(kg, lambda k: 5 if k.kind == "reduction" else None)
    (index, slot), = plan.scratch_slots.items()
    assert slot == plan.n_slots - 1
    assert plan.intermediate_specs[slot] == ((5,), np.dtype(np.int64))


def test_donation_only_for_elementwise_reads_at_the_written_index():
    g = fg.trace(lambda p, gr: p - gr * 0.1, fg.randn(8), fg.randn(8))
    kg = fuse(g)
    (k,) = kg.kernels
    p, out = g.inputs[0], g.outputs[0]
    assert donation_safe(kg, k, [], p, out)
    # A later kernel reading the input forbids it.
    assert not donation_safe(kg, k, [k], p, out)
    g2 = fg.trace(lambda p: p.t() * 2, fg.randn(4, 4))      # reads p transposed
    kg2 = fuse(g2)
    k2 = kg2.kernels[-1]
    assert not donation_safe(kg2, k2, [], g2.inputs[0], g2.outputs[0])


def test_donation_into_a_matmul_epilogue_when_the_product_does_not_read_the_input():
    # An SGD update of a weight from its gradient's product: the weight is read only by the
    # epilogue, at the index it writes.
    g = fg.trace(lambda w, x, gr: w - 0.1 * (x.t() @ gr), fg.randn(6, 5), fg.randn(4, 6),
                 fg.randn(4, 5))
    kg = fuse(g)
    (k,) = [k for k in kg.kernels if k.kind == "matmul"]
    assert donation_safe(kg, k, [], g.inputs[0], g.outputs[0])
    # The product reads the weight: BLAS would read it while writing the output.
    g2 = fg.trace(lambda w, x: w - 0.1 * (w @ x), fg.randn(5, 5), fg.randn(5, 5))
    kg2 = fuse(g2)
    (k2,) = [k for k in kg2.kernels if k.kind == "matmul"]
    assert not donation_safe(kg2, k2, [], g2.inputs[0], g2.outputs[0])
    # The output is the product itself: BLAS writes it before the epilogue reads the input.
    g3 = fg.trace(lambda a, x, y: (x @ y, a * 2), fg.randn(4, 4), fg.randn(4, 4), fg.randn(4, 4))
    kg3 = fuse(g3)
    (k3,) = [k for k in kg3.kernels if k.kind == "matmul"]
    assert g3.outputs[0] in k3.outputs
    assert not donation_safe(kg3, k3, [], g3.inputs[0], g3.outputs[0])


def test_donation_of_a_row_level_result_of_a_reduction():
    # A bias's update after its gradient's sum over the batch: read and written per row.
    g = fg.trace(lambda b, gr: b - 0.1 * gr.sum(0), fg.randn(8), fg.randn(16, 8))
    kg = fuse(g)
    (k,) = kg.kernels
    assert k.kind == "reduction"
    assert donation_safe(kg, k, [], g.inputs[0], g.outputs[0])
    # The input read at full size too (broadcast over the reduced axis): refused here, and
    # at run time a later kernel reads it.
    g2 = fg.trace(lambda b, gr: (gr * b).sum(0) + b, fg.randn(8), fg.randn(16, 8))
    kg2 = fuse(g2)
    (k2,) = kg2.kernels
    assert not donation_safe(kg2, k2, [], g2.inputs[0], g2.outputs[0])
    f = fg.compile(lambda b, gr: (b - gr.sum(0), gr * b + gr.sum(0)), donate_argnums=0)
    b, gr = fg.randn(8), fg.randn(16, 8)
    want = [b.numpy() - gr.numpy().sum(0), gr.numpy() * b.numpy() + gr.numpy().sum(0)]
    assert not f.lower(b, gr).program.donated
    for out, w in zip(f(b, gr), want):
        np.testing.assert_allclose(out.numpy(), w, rtol=1e-6, atol=1e-6)


def test_donated_outputs_are_all_computed_before_any_is_stored():
    # Three outputs of one kernel take the buffers of the three inputs they update, and each
    # reads all three inputs (an Adam-like update, full-size and per row after a reduction):
    # every value must be loaded before any output overwrites it.
    def update(p, m, v, gr):
        m2 = 0.9 * m + 0.1 * gr
        v2 = 0.99 * v + 0.01 * gr * gr + m * 0.5
        return p - 0.1 * m2 / (v2.abs().sqrt() + 1e-3) + v * 0.25 + m, m2, v2

    def full(p, m, v, gr):
        return update(p, m, v, gr)

    def per_row(p, m, v, gr):
        return update(p, m, v, gr.sum(0))

    rng = np.random.default_rng(0)
    for fn, gshape in ((full, (32,)), (per_row, (16, 32))):
        state = [rng.standard_normal(32).astype(np.float32) for _ in range(3)]
        gr = rng.standard_normal(gshape).astype(np.float32)
        p, m, v = (fg.tensor(a.copy()) for a in state)
        with fg.no_grad():
            want = [t.numpy() for t in fn(*(fg.tensor(a.copy()) for a in state), fg.tensor(gr))]
        f = fg.compile(fn, donate_argnums=(0, 1, 2))
        outs = f(p, m, v, fg.tensor(gr))
        program = f.lower(p, m, v, fg.tensor(gr)).program
        # Full size: one kernel, all three donated. Per row: m and v are also read by a
        # later kernel; the last kernel's outputs take p's and m's buffers and read m.
        assert len(program.donated) == (3 if fn is full else 2)
        for out, w in zip(outs, want):
            np.testing.assert_allclose(out.numpy(), w, rtol=1e-5, atol=1e-6)


def test_the_kernel_cache_identity_covers_the_code_kernels_are_made_from():
    # Kernels are cached by a description, not by their IR: an edit to any module that
    # shapes the IR must change the identity, or a stale kernel is served from disk (the
    # scalar lowerings moved into ops/lowering.py and were missed once).
    import ast
    from pathlib import Path

    from fusegrad.runtime import jit
    files = set(jit.codegen_files())
    assert all(f.exists() for f in files)
    root = Path(jit.__file__).resolve().parent.parent
    kernel = root / "codegen" / "llvm" / "kernel.py"
    imported = set()
    for node in ast.walk(ast.parse(kernel.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fusegrad"):
            for alias in node.names:
                base = root.parent / Path(*node.module.split("."))
                for candidate in (base / f"{alias.name}.py", base.with_suffix(".py")):
                    if candidate.exists():
                        imported.add(candidate.resolve())
                        break
    exempt = {root / "config.py", root / "ops" / "primitive.py", root / "ir" / "__init__.py"}
    missing = sorted(str(f.relative_to(root)) for f in imported - files - exempt)
    assert missing == [], f"kernel.py's imports missing from the cache identity: {missing}"


def test_a_donated_input_is_read_through_its_outputs_buffer():
    # Decided before compiling: the kernel loads and stores each updated tensor through one
    # pointer (two pointers that overlap fail the loop vectorizer's runtime check, and the
    # update ran scalar). The state evolves over calls as numpy's does.
    def update(p, m, g):
        m2 = m * 0.9 + g
        return p - 0.1 * m2, m2

    rng = np.random.default_rng(0)
    p0, m0 = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    p, m = fg.tensor(p0.copy()), fg.tensor(m0.copy())
    f = fg.compile(update, donate_argnums=(0, 1))
    for _ in range(3):
        g = rng.standard_normal(64).astype(np.float32)
        m0 = m0 * np.float32(0.9) + g
        p0 = p0 - np.float32(0.1) * m0
        p, m = f(p, m, fg.tensor(g))
        np.testing.assert_allclose(p.numpy(), p0, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m.numpy(), m0, rtol=1e-6, atol=1e-6)
    program = f.lower(p, m, fg.tensor(g)).program
    assert sorted(program.donated.values()) == [0, 1]
    (code,) = program.kernel_code.values()
    inputs = {program.slots[v] for v in program.graph.inputs[:2]}
    assert not inputs & set(code.slots)          # p and m are read through the outputs
    assert set(program.donated) <= set(code.slots)
    with pytest.raises(ValueError, match="would drop donations its kernels were compiled"):
        program.donate([])


def _row_update(b, m, g):
    m2 = m + g.sum(0)
    return b - 0.1 * m2, m2


def test_a_kernel_with_several_outputs_loads_everything_before_its_first_store():
    # Each output takes the buffer of the input it updates, and the first output's value
    # reads the second's input: in every block of the printed kernel, no load from a buffer
    # may follow a store to one (full-size outputs, and a reduction's row results).
    import re

    from fusegrad.runtime.cpu import Program

    def full_update(p, m, g):
        m2 = m * 0.9 + g
        return p - 0.1 * m2, m2

    for fn, shapes in ((full_update, [(64,), (64,), (64,)]),
                       (_row_update, [(8,), (8,), (16, 8)])):
        g = fg.trace(fn, *(fg.randn(*s) for s in shapes))
        program = Program(fuse(g), donate=[(0, 0), (1, 1)])
        assert len(program.donated) == 2
        stores = 0
        for block in re.split(r"\n(?=[\w.\"]+:\n)", program.llvm_ir):
            seen_store = False
            for line in block.splitlines():
                if re.match(r'\s*store .*%"addr', line):
                    seen_store = True
                    stores += 1
                elif re.search(r'= load .*%"addr', line):
                    assert not seen_store, block
        assert stores >= 2
