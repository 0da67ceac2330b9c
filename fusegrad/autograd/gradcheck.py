"""Gradient checking by finite differences, as ``torch.autograd.gradcheck``."""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import numpy as np

from fusegrad.autograd.engine import grad as autograd_grad
from fusegrad.grad_mode import enable_grad, no_grad
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError", "numerical_jacobian",
           "analytical_jacobian"]


class GradcheckError(RuntimeError):
    """Analytical and numerical gradients disagree."""


def _outputs(fn, inputs) -> list:
    out = fn(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor)]


def numerical_jacobian(fn: Callable, inputs: Sequence, eps: float = 1e-6) -> list[list[np.ndarray]]:
    """J[o][i] of shape (numel(out o), numel(input i)) by central differences."""
    with no_grad():
        base = _outputs(fn, inputs)
        jac = [[np.zeros((o.numel(), x.numel())) for x in inputs] for o in base]
        for i, x in enumerate(inputs):
            if not getattr(x, "requires_grad", False):
                continue
            # Perturb x's own array element by element (row-major order, the Jacobian's
            # column order): non-contiguous inputs (transposed, sliced) work too.
            data = x._data
            for k, pos in enumerate(np.ndindex(data.shape)):
                orig = data[pos].item()
                data[pos] = orig + eps
                plus = [o._data.astype(np.float64).reshape(-1) for o in _outputs(fn, inputs)]
                data[pos] = orig - eps
                minus = [o._data.astype(np.float64).reshape(-1) for o in _outputs(fn, inputs)]
                data[pos] = orig
                for o, (p, m) in enumerate(zip(plus, minus)):
                    jac[o][i][:, k] = (p - m) / (2 * eps)
    return jac


def analytical_jacobian(fn: Callable, inputs: Sequence) -> list[list[np.ndarray]]:
    """J[o][i] by one backward pass per output element."""
    outs = _outputs(fn, inputs)
    diff = [x for x in inputs if getattr(x, "requires_grad", False)]
    jac = [[np.zeros((o.numel(), x.numel())) for x in inputs] for o in outs]
    for oi, o in enumerate(outs):
        if not o.requires_grad:
            continue
        for k in range(o.numel()):
            seed = np.zeros(o.numel(), dtype=o.dtype.np_dtype)
            seed[k] = 1
            g = F.reshape(F.as_tensor_operand(seed), tuple(o.shape))
            grads = autograd_grad([o], diff, [g], retain_graph=True, allow_unused=True)
            it = iter(grads)
            for i, x in enumerate(inputs):
                if getattr(x, "requires_grad", False):
                    gi = next(it)
                    if gi is not None:
                        jac[oi][i][k, :] = gi._data.astype(np.float64).reshape(-1)
    return jac


def gradcheck(fn: Callable, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True) -> bool:
    """Compare backward's gradients of ``fn`` at ``inputs`` with central differences.

    Use float64 inputs with ``requires_grad=True``; returns True or raises GradcheckError
    naming the output, input and the worst element.
    """
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    for x in inputs:
        if isinstance(x, Tensor) and x.requires_grad and x.dtype.name != "float64":
            warnings.warn(f"gradcheck input of dtype {x.dtype} is not float64: the finite "
                          "differences will be imprecise", UserWarning, stacklevel=2)
    num = numerical_jacobian(fn, inputs, eps)
    ana = analytical_jacobian(fn, inputs)
    for o, (nrow, arow) in enumerate(zip(num, ana)):
        for i, (n, a) in enumerate(zip(nrow, arow)):
            if not np.allclose(a, n, rtol=rtol, atol=atol, equal_nan=True):
                if not raise_exception:
                    return False
                k = np.unravel_index(np.argmax(np.abs(a - n)), a.shape)
                raise GradcheckError(
                    f"Jacobian mismatch for output {o} with respect to input {i},\n"
                    f"numerical:{n}\nanalytical:{a}\n(worst at {k}: numerical {n[k]}, "
                    f"analytical {a[k]})")
    return True


def gradgradcheck(fn: Callable, inputs, *, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3) -> bool:
    """Check second derivatives: gradcheck of the gradient (with ``create_graph=True``)."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)

    def first_grad(*xs):
        # numerical_jacobian evaluates under no_grad; the first gradient still needs a graph.
        with enable_grad():
            outs = _outputs(fn, xs)
            total = None
            for o in outs:
                s = F.sum(o)
                total = s if total is None else total + s
            diff = [x for x in xs if x.requires_grad]
            return autograd_grad([total], diff, create_graph=True, allow_unused=True)

    return gradcheck(first_grad, inputs, eps=eps, atol=atol, rtol=rtol)
