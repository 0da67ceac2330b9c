"""Every CUDA kernel of whole compiled training steps, and of the kernel zoo, compiles to
machine code (:mod:`fusegrad.testing.nvcc`; the fuzzer's ``--nvcc`` stage does the same for
random programs).

The kernel zoo (test_cuda_codegen.py) holds single ops and a forward-only MLP; a training
step's fused forward-and-backward kernels are where name clashes and register pressure show
(the fused cross-entropy kernel once declared a local ``red4`` beside a shared ``red4[32]``, and
no CE training step compiled for CUDA). Each step runs on the simulated driver, which records
the kernels it is given; nvcc then builds a cubin for sm_80 and sm_90 with warnings as errors,
and ptxas reports no spilled register.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.codegen.cuda import collect
from fusegrad.codegen.cuda.printer import cuda_parts, cuda_source, join_parts
from fusegrad.config import config
from fusegrad.runtime import cuda as rt
from fusegrad.testing import nvcc
from fusegrad.testing.simulated_cuda import SimulatedDriver
from tests.codegen.test_cuda_codegen import zoo_kernels

NVCC = nvcc.find_nvcc()


def train(model, opt, batches, loss_fn=F.cross_entropy, steps: int = 3):
    @fg.compile(backend="cuda")
    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return [step(*batches).item() for _ in range(steps)]


def mlp(*layers):
    fg.manual_seed(0)
    return fg.nn.Sequential(*layers)


def classes(n, k):
    return fg.tensor(np.arange(n) % k)


def ce_adam():
    m = mlp(fg.nn.Linear(4, 8), fg.nn.ReLU(), fg.nn.Linear(8, 3))
    return train(m, fg.optim.Adam(m.parameters(), lr=0.1), (fg.randn(5, 4), classes(5, 3)))


def ce_sgd():
    m = mlp(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 3))
    return train(m, fg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                 (fg.randn(5, 4), classes(5, 3)))


def linear_ce():
    m = mlp(fg.nn.Linear(6, 4))
    return train(m, fg.optim.SGD(m.parameters(), lr=0.1), (fg.randn(7, 6), classes(7, 4)))


def layernorm_mlp():
    m = mlp(fg.nn.Linear(6, 16), fg.nn.LayerNorm(16), fg.nn.Tanh(), fg.nn.Linear(16, 5))
    return train(m, fg.optim.AdamW(m.parameters(), lr=1e-2), (fg.randn(9, 6), classes(9, 5)))


def lenet():
    m = mlp(fg.nn.Conv2d(1, 4, 3), fg.nn.ReLU(), fg.nn.MaxPool2d(2), fg.nn.Flatten(),
            fg.nn.Linear(4 * 3 * 3, 10))
    return train(m, fg.optim.SGD(m.parameters(), lr=0.05),
                 (fg.randn(4, 1, 8, 8), classes(4, 10)))


def char_transformer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from char_transformer import TEXT, batches, make_model
    fg.manual_seed(0)
    model = make_model(fg, len(set(TEXT)), block=8, n_embd=16, n_head=2, n_layer=1)
    opt = fg.optim.AdamW(model.parameters(), lr=3e-3)

    @fg.compile(backend="cuda")
    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    x, y = next(batches(fg, TEXT, 8, 2))
    return [step(x, y).item() for _ in range(3)]


STEPS = {f.__name__: f for f in (ce_adam, ce_sgd, linear_ce, layernorm_mlp, lenet,
                                 char_transformer)}


def step_kernels(make_step) -> dict:
    """Every kernel ``make_step`` ran on the simulated driver, by distinct names."""
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        losses = make_step()
    finally:
        rt.set_driver(None)
    assert all(np.isfinite(losses)), losses
    return nvcc.named_apart(drv.kernels)


def assert_cubins_without_spills(kernels: dict) -> None:
    report = nvcc.compile_kernels(kernels)
    assert not report.errors, report.errors
    assert len(report.kernels) == len(kernels) * len(nvcc.ARCHS)
    assert not report.spilled(), report.spilled()
    assert 0 < report.max_registers <= 255


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", sorted(STEPS))
def test_training_step_kernels_compile_to_cubin_without_spills(name):
    kernels = step_kernels(STEPS[name])
    assert kernels, "the step ran no CUDA kernel"
    assert_cubins_without_spills(kernels)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_zoo_kernels_compile_to_cubin_without_spills():
    # Every family and dtype, with 32- and 64-bit indices.
    assert_cubins_without_spills({k.name: k for k in zoo_kernels()})


def test_ptxas_reports_are_read_per_entry_and_architecture():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k0' for 'sm_80'
ptxas info    : Function properties for k0
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
"""
    k0, k1 = nvcc.parse_ptxas(text)
    assert (k0.name, k0.arch, k0.registers, k0.stack, k0.spills) == ("k0", "sm_80", 255, 16, True)
    assert (k1.name, k1.arch, k1.registers, k1.spills) == ("k1", "sm_90", 12, False)


def test_kernels_of_several_programs_get_distinct_names():
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        fg.compile(lambda x: x * 2, backend="cuda")(fg.ones(3))
        fg.compile(lambda x: x * 3, backend="cuda")(fg.ones(3))
    finally:
        rt.set_driver(None)
    assert len(drv.kernels) == 2 and drv.kernels[0].name == drv.kernels[1].name
    named = nvcc.named_apart(drv.kernels, "p0_")
    assert list(named) == [f"p0_{drv.kernels[0].name}", f"p0_{drv.kernels[0].name}_1"]
    assert [k.name for k in named.values()] == list(named)


def test_a_fused_cross_entropy_step_names_locals_apart_from_shared_arrays():
    # Without nvcc: no kernel declares a local with the name of one of its shared arrays.
    source = cuda_source(list(step_kernels(ce_adam).values()))
    kernels_with_shared = 0
    for body in source.split('extern "C"')[1:]:
        shared = set(re.findall(r"__shared__ \w+ (\w+)\[", body))
        declared = set(re.findall(r"^\s*(?:const )?[a-z ]+ (\w+)(?: =|;)", body, re.M))
        kernels_with_shared += bool(shared)
        assert not shared & declared, shared & declared
    assert kernels_with_shared > 0


def record_programs(folder, monkeypatch, *fns) -> SimulatedDriver:
    """Run each of ``fns`` compiled for CUDA on the simulated driver, recording its kernels
    to ``folder`` (as ``FUSEGRAD_CUDA_COLLECT`` does)."""
    monkeypatch.setattr(config, "cuda_collect", str(folder))
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        for fn in fns:
            fg.compile(fn, backend="cuda")(fg.ones(4, 8))
    finally:
        rt.set_driver(None)
    return drv


def test_the_lowering_records_each_distinct_kernel_once(tmp_path, monkeypatch):
    # x * 2 twice (two programs, one kernel), x * 3 and a softmax: three distinct kernels.
    drv = record_programs(tmp_path, monkeypatch, lambda x: x * 2, lambda x: x * 2,
                          lambda x: x * 3, lambda x: x.softmax(-1))
    assert len(drv.kernels) == 4
    recorded = collect.read(str(tmp_path))
    assert len(recorded) == 3 == len(list(tmp_path.iterdir()))
    assert sorted(k["family"] for k in recorded) == ["elementwise", "elementwise", "row_reduce"]
    source = join_parts([(k["helpers"], k["body"]) for k in recorded])
    for k in recorded:
        assert re.fullmatch(r"k_[0-9a-f]{20}", k["name"])
        assert f" {k['name']}(" in source
    # The recorded text is the kernel the driver was given, renamed.
    softmax = next(k for k in drv.kernels if k.family == "row_reduce")
    body = next(k["body"] for k in recorded if k["family"] == "row_reduce")
    assert body.replace(next(k["name"] for k in recorded if k["body"] == body), softmax.name) == \
        cuda_parts(softmax)[1]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_recorded_kernels_compile_and_a_failing_one_is_named(tmp_path, monkeypatch):
    record_programs(tmp_path, monkeypatch, lambda x: (x * 2).exp(), lambda x: x.sum(-1))
    count, report, failures = nvcc.compile_collected(str(tmp_path), jobs=1)
    assert count == 2 and not failures and not report.spilled()
    assert len(report.kernels) == 2 * len(nvcc.ARCHS)
    broken = {"name": "k_broken", "family": "elementwise", "helpers": {},
              "body": 'extern "C" __global__ void k_broken(float* x) { x[0] = undeclared; }'}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    count, report, failures = nvcc.compile_collected(str(tmp_path), jobs=1)
    assert count == 3 and list(failures) == ["k_broken"]
    assert "undeclared" in failures["k_broken"]
