"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from fusegrad.ops import primitive
from fusegrad.runtime import cuda as rt
from fusegrad.runtime import eager_cuda
from fusegrad.testing.simulated_cuda import SimulatedDriver


@pytest.fixture
def simulated():
    """The simulated CUDA driver as the process's driver, with the eager cuda caches and
    the device hook cleared before and after."""
    drv = SimulatedDriver()
    rt.set_driver(drv)
    eager_cuda.clear_cache()
    yield drv
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)
