"""Every CUDA kernel of whole compiled training steps compiles to machine code.

The kernel zoo (test_cuda_codegen.py) holds single ops and a forward-only MLP; a training
step's fused forward-and-backward kernels are where name clashes and register pressure show
(the fused cross-entropy kernel once declared a local ``red4`` beside a shared ``red4[32]``, and
no CE training step compiled for CUDA). Each step runs on the simulated driver, which records
the kernels it is given; nvcc then builds a cubin for sm_80 and sm_90 with warnings as errors,
and ptxas reports no spilled register.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver

NVCC = shutil.which("nvcc")


class RecordingDriver(SimulatedDriver):
    """The simulated driver, keeping every kernel of every module it loads."""

    def __init__(self):
        super().__init__()
        self.kernels: dict = {}

    def load_module(self, ptx: bytes, kernels: dict):
        self.kernels.update(kernels)
        return super().load_module(ptx, kernels)


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
    drv = RecordingDriver()
    rt.set_driver(drv)
    try:
        losses = make_step()
    finally:
        rt.set_driver(None)
    assert all(np.isfinite(losses)), losses
    return drv.kernels


def nvcc_cubin(source: str, arch: str, tmp_path: Path) -> str:
    """ptxas's report of ``source`` built for ``arch``; fails on any error or warning."""
    src = tmp_path / f"{arch}.cu"
    src.write_text(source)
    run = subprocess.run([NVCC, f"-arch={arch}", "-cubin", str(src), "-o",
                          str(tmp_path / f"{arch}.cubin"), "-Werror", "all-warnings",
                          "-Xptxas", "-v"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    report = run.stderr
    assert "warning" not in report.lower(), report[-4000:]
    return report


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", sorted(STEPS))
def test_training_step_kernels_compile_to_cubin_without_spills(name, tmp_path):
    kernels = step_kernels(STEPS[name])
    assert kernels, "the step ran no CUDA kernel"
    source = cuda_source(list(kernels.values()))
    for arch in ("sm_80", "sm_90"):
        report = nvcc_cubin(source, arch, tmp_path)
        entries = re.findall(r"Compiling entry function '(\w+)'", report)
        assert sorted(entries) == sorted(kernels), (arch, entries)
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert len(spills) >= len(kernels)     # device helper functions report too
        assert all(s == ("0", "0") for s in spills), (arch, report[-4000:])


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
