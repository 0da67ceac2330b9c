"""Compiled results against eager ones: the oracle of the compiled-path tests.

Eager execution (numpy references) is the oracle. Inputs mix ordinary values with NaN, ±Inf
and -0.0, and come in the layouts that have broken compilers before: contiguous, transposed
and sliced arrays passed to the compiled function, views taken inside it, broadcasting, and
0-d tensors.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import fusegrad as fg
from fusegrad.runtime.cpu import NumpyStep
from fusegrad.tracer.trace import tree_flatten

# Float values whose handling differs between careless implementations.
SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-30, 60.0)

# rtol per dtype for a compiled result against eager: the vector math of the LLVM backend
# is not libm, so transcendental float32 results agree to a few ulp, not bit for bit.
RTOL = {fg.float64: 1e-11, fg.float32: 1e-5, fg.float16: 2e-3, fg.bfloat16: 1.6e-2}


def values(shape, dtype, seed: int = 0, special: bool = True, low: float = -3.0,
           high: float = 3.0) -> np.ndarray:
    """Deterministic values of ``shape`` and fusegrad ``dtype``; float arrays with more than
    three elements carry the SPECIALS at random places (``special=False``: none); integers
    lie in [3 * low, 3 * high]."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype is fg.bool:
        flat = rng.random(n) < 0.5
    elif not dtype.is_floating_point:
        flat = rng.integers(int(low) * 3, int(high) * 3 + 1, n)    # [-9, 9] by default
    else:
        flat = rng.uniform(low, high, n)
        if special and n > 3:
            k = min(n // 2, len(SPECIALS))
            flat[rng.choice(n, k, replace=False)] = SPECIALS[:k]
    return flat.reshape(shape).astype(dtype.np_dtype)


def strided(a: np.ndarray, kind: str) -> np.ndarray:
    """``a``'s values in a non-contiguous array: ``"T"`` the transpose of a contiguous
    array, ``"slice"`` every other row of a larger one."""
    if a.ndim == 0 or kind == "contiguous":
        return a
    if kind == "T":
        out = np.ascontiguousarray(a.T).T
    else:
        big = np.zeros((2 * a.shape[0],) + a.shape[1:], dtype=a.dtype)
        big[::2] = a
        out = big[::2]
    assert not out.flags.c_contiguous or a.size <= 1
    return out


def tensors(*arrays) -> list[fg.Tensor]:
    return [fg.from_numpy(a) if isinstance(a, np.ndarray) else a for a in arrays]


def _as_numpy(t) -> np.ndarray:
    a = t.detach().numpy() if isinstance(t, fg.Tensor) else np.asarray(t)
    return a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a


def labelled_leaves(obj, path: str = "out") -> list[tuple[str, object]]:
    """(path, leaf) for the leaves of nested tuples, lists and dicts: ``out['exp'][1]``."""
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in labelled_leaves(v, f"{path}[{k!r}]")]
    if isinstance(obj, (tuple, list)):
        return [kv for i, v in enumerate(obj) for kv in labelled_leaves(v, f"{path}[{i}]")]
    return [(path, obj)]


def assert_same(got, want, rtol: float | None = None, atol: float | None = None) -> None:
    """Compiled results ``got`` equal eager ``want``: same structure, shapes and dtypes;
    exact for integers and bools, ``rtol`` (by dtype by default) for floats, NaN == NaN.
    A failure names the output by its path (``out['exp'][1]``)."""
    got_tree, want_tree = tree_flatten(got)[1], tree_flatten(want)[1]
    assert got_tree == want_tree, f"structure {got_tree} != {want_tree}"
    for (path, g), (_, w) in zip(labelled_leaves(got), labelled_leaves(want), strict=True):
        if not isinstance(w, fg.Tensor):
            assert g == w, f"{path}: {g!r}, eager {w!r}"
            continue
        assert g.dtype is w.dtype, f"{path}: dtype {g.dtype}, eager {w.dtype}"
        assert tuple(g.shape) == tuple(w.shape), f"{path}: shape {g.shape}, eager {w.shape}"
        ga, wa = _as_numpy(g), _as_numpy(w)
        if w.dtype.is_floating_point:
            r = RTOL[w.dtype] if rtol is None else rtol
            a = r * 1e-2 if atol is None else atol
            np.testing.assert_allclose(ga, wa, rtol=r, atol=a, equal_nan=True, err_msg=path)
        else:
            np.testing.assert_array_equal(ga, wa, err_msg=path)


def check_compiled(fn, *args, rtol=None, atol=None, **compile_options):
    """Run ``fn`` eagerly and compiled (fullgraph) on ``args``; assert they agree. Returns
    the compiled function (``.lower(*args)`` shows its kernels)."""
    args = tensors(*args)
    with fg.no_grad():
        want = fn(*args)
        compiled = fg.compile(fn, fullgraph=True, **compile_options)
        got = compiled(*args)
    assert_same(got, want, rtol, atol)
    return compiled


def numpy_steps(compiled, *args) -> list[str]:
    """The kernels of ``compiled(*args)`` that run numpy references instead of LLVM code."""
    program = compiled.lower(*tensors(*args)).program
    return [step.kernel.describe() for step in program.steps if isinstance(step, NumpyStep)]
