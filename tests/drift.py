"""Tolerances for two float computations that do not promise the same bits.

Eager and compiled training steps, numpy's BLAS and the generated GEMM, fusegrad and torch:
each pair sums in another order, so their float32 results differ by rounding, and every
optimizer step carries the difference into the next one. How far two runs drift apart after
many steps depends on the BLAS kernels the CPU picks (AVX2 or AVX-512, FMA or not) and on the
dynamics of the optimizer, not on the program alone: a fixed tolerance tuned on one machine
fails on the next one.

So a run under test is measured against the exact answer, approximated by a float64 run of the
same steps, and held to the error the float32 reference run (eager) makes itself::

    ||got - exact|| <= factor * ||eager - exact|| + ulps * eps32 * ||exact||

in the 2-norm over all the arrays together (every parameter of a model, or every loss of a
run). Per element, or per small tensor, the two runs' errors are not comparable: Adam divides
each gradient by its own running RMS, so an element whose gradient is rounding noise moves by a
good part of the learning rate in a direction that rounding picks, in either run. Over all
elements the ratio of the two errors stays near 1 (0.65 to 1.65 measured over AVX2, SSE-only
and AVX-512 BLAS kernels, with and without the generated GEMM); ``factor`` leaves room above
that, and the floor of a few float32 ulps covers a run where eager happens to be almost exact.
A compiled step that computes something else (a wrong gradient, a dropped update, a stale
learning rate) lands orders of magnitude beyond this bound.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def _flat64(arrays: Sequence) -> np.ndarray:
    """The values of ``arrays`` (tensors, arrays or numbers) as one float64 vector."""
    parts = [np.ravel(np.asarray(a.detach().numpy() if hasattr(a, "detach") else a,
                                 dtype=np.float64)) for a in arrays]
    return np.concatenate(parts) if parts else np.zeros(0)


def assert_no_farther_than_eager(got: Sequence, eager: Sequence, exact: Sequence, *,
                                 factor: float = 4.0, ulps: float = 4.0,
                                 what: str = "values") -> None:
    """``got`` is no farther from the float64 run ``exact`` than ``factor`` times eager's own
    distance, plus ``ulps`` float32 ulps of the values' size (2-norms over all the arrays).

    ``got``, ``eager`` and ``exact`` are parallel sequences of arrays, tensors or numbers
    (parameters, gradients, losses) with equal shapes.
    """
    assert len(got) == len(eager) == len(exact), (len(got), len(eager), len(exact))
    for i, (g, e, x) in enumerate(zip(got, eager, exact)):
        assert np.shape(_flat64([g])) == np.shape(_flat64([e])) == np.shape(_flat64([x])), \
            f"{what} {i}: sizes differ"
    g, e, x = _flat64(got), _flat64(eager), _flat64(exact)
    assert np.all(np.isfinite(g)) == np.all(np.isfinite(x)), f"{what}: not finite"
    off, eager_off, size = (float(np.linalg.norm(g - x)), float(np.linalg.norm(e - x)),
                            float(np.linalg.norm(x)))
    bound = factor * eager_off + ulps * EPS32 * size
    assert off <= bound, (
        f"{what}: {off:.3g} from the float64 run, more than {factor} x eager's {eager_off:.3g}"
        f" + {ulps} float32 ulps of their size {size:.3g} (bound {bound:.3g})")


def assert_rounding_close(got, want, *, terms: int, scale: float | None = None,
                          ulps: float = 8.0) -> None:
    """``got`` and ``want`` are two float32 evaluations of one computation whose elements
    are sums of about ``terms`` rounded products (a matrix product's inner dimension, added
    up over the layers of a model): elementwise,

        |got - want| <= ulps * terms * eps32 * scale,

    with ``scale`` (by default the largest ``|want|``) the size of the summed terms. A
    relative tolerance per element is wrong here: an element near zero after cancellation
    carries the absolute rounding error of the terms it sums, whichever kernels (BLAS with or
    without FMA, the generated GEMM) added them.
    """
    g = np.asarray(got.detach().numpy() if hasattr(got, "detach") else got, dtype=np.float64)
    w = np.asarray(want.detach().numpy() if hasattr(want, "detach") else want, dtype=np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    scale = float(np.max(np.abs(w))) if scale is None else scale
    np.testing.assert_allclose(g, w, rtol=0, atol=ulps * terms * EPS32 * scale)
