"""Fixtures and helpers of the runtime tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fusegrad as fg
from fusegrad.ops import primitive
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer import eager_cuda


def _installed(devices: int):
    """The simulated CUDA driver with ``devices`` devices as the process's driver, with the
    eager cuda caches, the current device and the device hook reset after."""
    drv = SimulatedDriver(devices=devices)
    rt.set_driver(drv)
    eager_cuda.clear_cache()
    yield drv
    if devices > 1:
        fg.cuda.set_device(0)
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)


@pytest.fixture
def simulated():
    """One simulated device."""
    yield from _installed(1)


@pytest.fixture
def two_devices():
    """Two simulated devices."""
    yield from _installed(2)


def no_modules_after(code: str, modules) -> None:
    """Run ``code`` in a fresh interpreter and check that none of ``modules`` was imported
    by it (what a machine without a GPU, or a CPU user, must not pay for)."""
    check = (f"\nimport sys\nbad = [m for m in {tuple(modules)!r} if m in sys.modules]\n"
             "assert not bad, bad\n")
    run = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
