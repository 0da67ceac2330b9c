"""Artifacts built for a named CPU (one build for a fleet): the code uses only that CPU's
features, runs here and gives the host build's results."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.runtime import jit
from tests.aot.helpers import batches, mlp_step

_LOOP = """
define void @"fg_kernel"(float* noalias %a, float* noalias %b, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %pa = getelementptr inbounds float, float* %a, i64 %i
  %pb = getelementptr inbounds float, float* %b, i64 %i
  %x = load float, float* %pa
  %y = fmul fast float %x, 3.0
  %z = fadd fast float %y, 1.0
  store float %z, float* %pb
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _assembly() -> str:
    tm = jit._codegen_machine()
    mod = llvm.parse_assembly(jit._prefer_wide_vectors(_LOOP))
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    jit._optimize(mod, tm, 3)
    return tm.emit_assembly(mod)


def test_compile_target_selects_the_instruction_set():
    with jit.compile_target("x86-64-v3"):
        v3 = _assembly()
    assert "ymm" in v3 and "zmm" not in v3
    with jit.compile_target("x86-64-v4"):
        v4 = _assembly()
    assert "zmm" in v4
    assert jit._target is None                     # restored on exit


def test_v3_artifact_has_no_avx512_and_matches_the_host_build():
    step, model, opt, x, y = mlp_step("adamw", sizes=(64, 128, 10))
    v3 = fg.aot.compile(step, x, y, cpu="x86-64-v3")
    host = fg.aot.compile(step, x, y)
    assert v3.target["cpu"] == "x86-64-v3"
    assert {"avx2", "fma"} <= set(v3.target["features"])
    assert not any(f.startswith("avx512") for f in v3.target["features"])
    host_has_avx512 = any(f.startswith("avx512") for f in host.target["features"])
    if host_has_avx512:
        # Equal kernels (same symbols), different machine code: the kernel cache keeps
        # the targets apart.
        common = set(v3.objects) & set(host.objects)
        assert common and any(v3.objects[s] != host.objects[s] for s in common)
    run_v3, run_host = fg.aot.loads(v3.to_bytes()), fg.aot.loads(host.to_bytes())
    for xb, yb in batches(3, sizes=(64, 128, 10)):
        a, b = run_v3(xb, yb), run_host(xb, yb)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    for name in run_host.state:
        np.testing.assert_allclose(run_v3.state[name], run_host.state[name], rtol=1e-4,
                                   atol=1e-6)


def test_named_cpu_needs_its_features():
    step, model, opt, x, y = mlp_step("sgd")
    with pytest.raises(ValueError, match="features"):
        fg.aot.compile(step, x, y, cpu="haswell")
    art = fg.aot.compile(step, x, y, cpu="haswell", features="+avx2,+fma,+avx,+sse4.2")
    assert art.target["features"] == ["avx", "avx2", "fma", "sse4.2"]
    assert np.isfinite(fg.aot.loads(art.to_bytes())(x, y).item())
