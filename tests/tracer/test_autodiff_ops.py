"""The autodiff pass gives eager autograd's gradients on every op of the table.

For each case of :data:`tests.tracer.trace_cases.CASES` with a float input, the loss is a
weighted sum of the case's float outputs; its gradient from ``fusegrad.grad`` (trace, the
``grad_graph`` pass, replay) and from ``interpret(grad_graph(trace(loss)))`` must equal the
gradient eager ``backward()`` accumulates, to rounding (float64, rtol 1e-10).

Where eager autograd itself is wrong (the strict xfails of the table), the traced gradient is
checked against central finite differences instead.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.tracer.test_trace_ops import _params
from tests.tracer.trace_cases import CASES, check_gradient, scalar_loss, to_tensors

GRAD_CASES = [c for c in CASES if c.grad and c.float_args()]
EAGER_WRONG = [c for c in GRAD_CASES if c.xfail_grad.startswith("eager bug")]


@pytest.mark.parametrize("case", _params(GRAD_CASES, "xfail_grad"))
def test_autodiff_matches_eager_backward(case):
    """fusegrad.grad and interpret(grad_graph(...)) equal eager backward()."""
    check_gradient(case)


def _finite_differences(loss, arrays, i: int, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(arrays[i])
    for j in np.ndindex(arrays[i].shape):
        values = []
        for step in (eps, -eps):
            moved = [a.copy() for a in arrays]
            moved[i][j] += step
            values.append(float(loss(*to_tensors(moved))))
        out[j] = (values[0] - values[1]) / (2 * eps)
    return out


@pytest.mark.parametrize("case", EAGER_WRONG, ids=lambda c: c.name)
def test_autodiff_matches_finite_differences_where_eager_is_wrong(case):
    """The traced gradient is right even where the eager reference is not."""
    arrays = case.arrays()
    loss = scalar_loss(case.fn)
    grads = fg.grad(loss, case.float_args())(*to_tensors(arrays))
    for i, g in zip(case.float_args(), grads, strict=True):
        np.testing.assert_allclose(g.numpy(), _finite_differences(loss, arrays, i),
                                   rtol=1e-6, atol=1e-7)
