"""Shared helpers for the eager-core tests.

Tests compare fusegrad against numpy for values and against central finite differences
(``fusegrad.autograd.gradcheck``) for gradients. Inputs come in three layouts, because
each has broken an op before: contiguous, non-contiguous (a transposed or strided view of a
larger array) and 0-d.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Callable

# The suite never writes to the user's kernel cache, and verifies the IR after every pass.
_CACHE = tempfile.mkdtemp(prefix="fusegrad-test-cache-")
os.environ.setdefault("FUSEGRAD_CACHE_DIR", _CACHE)
os.environ.setdefault("FUSEGRAD_VERIFY", "1")
# Compiled functions keep one compile per argument shape, which is what the suite's compile
# and kernel counts assert; tests/compiler/test_dynamic_shapes.py turns torch's automatic
# dynamic shapes (fusegrad's default) on. FUSEGRAD_AUTOMATIC_DYNAMIC_SHAPES=1 runs the whole
# suite with it.
os.environ.setdefault("FUSEGRAD_AUTOMATIC_DYNAMIC_SHAPES", "0")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad.autograd.gradcheck import gradcheck  # noqa: E402

LAYOUTS = ("contiguous", "transposed", "strided")


def arr(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0,
        dtype=np.float64) -> np.ndarray:
    """Deterministic random values of ``shape`` in [low, high)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(dtype)


def positive(*shape: int, seed: int = 0) -> np.ndarray:
    """Values in [0.5, 2.5): a safe domain for log, sqrt, reciprocal, pow with float exponent."""
    return arr(*shape, seed=seed, low=0.5, high=2.5)


def layout(a: np.ndarray, kind: str) -> np.ndarray:
    """The values of ``a`` held in an array of the given memory layout.

    ``transposed`` stores the array as the transpose of a contiguous one; ``strided`` as every
    other element of a larger one. Both are non-contiguous for arrays with more than one element
    along the affected dims.
    """
    if kind == "contiguous" or a.ndim == 0:
        return np.ascontiguousarray(a)
    if kind == "transposed":
        return np.ascontiguousarray(a.T).T
    if kind == "strided":
        big = np.zeros(tuple(2 * d for d in a.shape), dtype=a.dtype)
        big[tuple(slice(None, None, 2) for _ in a.shape)] = a
        return big[tuple(slice(None, None, 2) for _ in a.shape)]
    raise ValueError(kind)


def leaf(a, requires_grad: bool = True, kind: str = "contiguous") -> fg.Tensor:
    """A float64 leaf tensor over ``a`` in the given layout (fusegrad shares the array)."""
    data = layout(np.asarray(a, dtype=np.float64), kind)
    t = fg.from_numpy(data)
    return t.requires_grad_(requires_grad)


def assert_close(actual, expected, rtol: float = 1e-6, atol: float = 1e-6, dtype=None) -> None:
    """Compare a tensor's values (and optionally dtype) with an array-like."""
    if dtype is not None:
        assert actual.dtype is dtype, f"dtype {actual.dtype}, expected {dtype}"
    got = actual.detach().numpy() if isinstance(actual, fg.Tensor) else np.asarray(actual)
    exp = expected.detach().numpy() if isinstance(expected, fg.Tensor) else np.asarray(expected)
    assert got.shape == exp.shape, f"shape {got.shape}, expected {exp.shape}"
    np.testing.assert_allclose(got.astype(np.float64) if got.dtype.kind == "V" else got,
                               exp, rtol=rtol, atol=atol, equal_nan=True)


def check_grad(fn: Callable, *arrays, kind: str = "contiguous", atol: float = 1e-5,
               rtol: float = 1e-4) -> None:
    """gradcheck ``fn`` at float64 leaves made from ``arrays`` in the memory layout ``kind``.

    Arguments that should not be differentiated are closed over by ``fn``.
    """
    inputs = [leaf(a, kind=kind) for a in arrays]
    assert gradcheck(fn, inputs, atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _fresh_state():
    """Each test starts with grad enabled, float32 as the default dtype and a fixed seed."""
    fg.set_default_dtype(fg.float32)
    fg.manual_seed(0)
    with fg.set_grad_enabled(True):
        yield
    fg.set_default_dtype(fg.float32)


def pytest_configure(config):
    # fusegrad.ops.prims silences numpy's RuntimeWarnings (log(0), 1/0: torch is silent) with
    # a filter added at import; pytest's warning capture drops filters added during
    # collection, so restate it here to keep the test output as quiet as user code.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:fusegrad.ops.prims")
