"""The memory plan (slots, liveness, buffer sharing, donation) apart from any launcher."""

from __future__ import annotations

import numpy as np

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
