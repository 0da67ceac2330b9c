"""Compositions of the function transforms (vmap, grad, vjp, jvp, jacrev, jacfwd, hessian),
generated over a few small float64 functions, eagerly and compiled.

Each composition is checked against a reference that uses none of the transforms: a Python
loop over the examples of plain reverse mode (``autograd.grad``; Jacobians one output element
at a time, Hessians as the Jacobian of a gradient made with ``create_graph``), itself checked
against central differences. The same matrix is compared with torch.func where torch is
installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as Fn
from fusegrad import func as fgfunc

B, N = 4, 3            # examples, elements per example
# float64 throughout: the transforms and the reference differ by rounding only (a few ulps
# times the few dozen operations on a path); central differences are good to ~h**2.
TOL = {"rtol": 1e-9, "atol": 1e-10}


# --------------------------------------------------------------------------- functions
# Each case is ``case(T) -> h``, a function R^N -> R^k written against the module ``T``
# (fusegrad or torch); the scalar functions are ``sum(sin(h(x)))``.


def elementwise(T):
    return lambda x: x.sin() * x.exp() + x * x


def matmul(T):
    W = T.linspace(-0.3, 0.4, 3 * 2, dtype=T.float64).reshape(3, 2)
    return lambda x: T.tanh(x @ W) * (x @ W).cos()


def softmax(T):
    W = T.linspace(-0.5, 0.7, 3 * 3, dtype=T.float64).reshape(3, 3)
    return lambda x: T.softmax(x @ W, -1) * x + T.logsumexp(x, 0)


def reduction(T):
    return lambda x: T.stack([x.prod(), (x * x).mean().sqrt(), x.exp().cumsum(0)[-1]])


def indexing(T):
    idx = T.tensor([2, 0, 0, 1])
    return lambda x: x[idx] * x[1:].sum() + x[0] ** 3


def inplace(T):
    def h(x):
        y = x * 1.0
        y[0] = x[0] * x[1]
        y[1:].mul_(x[:2])
        y.mul_(x)
        return y.tanh_()
    return h


CASES = {"elementwise": elementwise, "matmul": matmul, "softmax": softmax,
         "reduction": reduction, "indexing": indexing, "inplace": inplace}


def scalar(h):
    return lambda x: h(x).sin().sum()


def with_weight(f):
    """``f`` of ``x * w``: a function of an example and a weight that is not batched."""
    return lambda x, w: f(x * w)


# --------------------------------------------------------------------------- compositions
# Each composition is ``(argument names, compose, expected)``: ``compose(F, h, f, fw)`` is
# the function, with ``F`` the module of transforms (fusegrad.func or torch.func), and
# ``expected(R, *args)`` its value from the per-example reference ``R``. Arguments: ``x``
# one example, ``X`` a batch, ``W`` a batch of batches, ``v``/``V`` tangents like
# ``x``/``X`` (``T`` like ``W``), ``u``/``U`` cotangents of ``h(x)``/``h(X)``, ``w`` the weight of ``fw`` (the
# same for every example) and ``d`` a tangent of it.


def _jvp_out(F, fn, x, v):
    return F.jvp(fn, (x,), (v,))[1]


def _vjp_out(F, fn, x, u):
    return F.vjp(fn, x)[1](u)[0]


COMPOSITIONS = {
    # pairs
    "vmap(grad)": ("X", lambda F, h, f, fw: F.vmap(F.grad(f)),
                   lambda R, X: R.each(R.grad, X)),
    "vmap(jacrev)": ("X", lambda F, h, f, fw: F.vmap(F.jacrev(h)),
                     lambda R, X: R.each(R.jac, X)),
    "vmap(jacfwd)": ("X", lambda F, h, f, fw: F.vmap(F.jacfwd(h)),
                     lambda R, X: R.each(R.jac, X)),
    "vmap(hessian)": ("X", lambda F, h, f, fw: F.vmap(F.hessian(f)),
                      lambda R, X: R.each(R.hess, X)),
    "vmap(jvp)": ("XV", lambda F, h, f, fw: F.vmap(lambda x, v: _jvp_out(F, h, x, v)),
                  lambda R, X, V: R.each(lambda x, v: R.jac(x) @ v, X, V)),
    "vmap(vjp)": ("XU", lambda F, h, f, fw: F.vmap(lambda x, u: _vjp_out(F, h, x, u)),
                  lambda R, X, U: R.each(lambda x, u: u @ R.jac(x), X, U)),
    "vmap(vmap)": ("W", lambda F, h, f, fw: F.vmap(F.vmap(h)),
                   lambda R, XX: R.each(lambda X: R.each(R.h, X), XX)),
    "grad(vmap)": ("X", lambda F, h, f, fw: F.grad(lambda X: F.vmap(f)(X).sum()),
                   lambda R, X: R.each(R.grad, X)),
    "vjp(vmap)": ("XU", lambda F, h, f, fw: lambda X, U: _vjp_out(F, F.vmap(h), X, U),
                  lambda R, X, U: R.each(lambda x, u: u @ R.jac(x), X, U)),
    "jvp(vmap)": ("XV", lambda F, h, f, fw: lambda X, V: _jvp_out(F, F.vmap(h), X, V),
                  lambda R, X, V: R.each(lambda x, v: R.jac(x) @ v, X, V)),
    "jacrev(vmap)": ("X", lambda F, h, f, fw: F.jacrev(F.vmap(f)),
                     lambda R, X: R.block_diag(R.each(R.grad, X))),
    "jacfwd(vmap)": ("X", lambda F, h, f, fw: F.jacfwd(F.vmap(f)),
                     lambda R, X: R.block_diag(R.each(R.grad, X))),
    "jacrev(jacrev)": ("x", lambda F, h, f, fw: F.jacrev(F.jacrev(f)),
                       lambda R, x: R.hess(x)),
    "jacrev(jacfwd)": ("x", lambda F, h, f, fw: F.jacrev(F.jacfwd(f)),
                       lambda R, x: R.hess(x)),
    "jacfwd(jacfwd)": ("x", lambda F, h, f, fw: F.jacfwd(F.jacfwd(f)),
                       lambda R, x: R.hess(x)),
    "hessian": ("x", lambda F, h, f, fw: F.hessian(f),
                lambda R, x: R.hess(x)),
    "jvp(grad)": ("xv", lambda F, h, f, fw: lambda x, v: _jvp_out(F, F.grad(f), x, v),
                  lambda R, x, v: R.hess(x) @ v),
    "grad(jvp)": ("xv", lambda F, h, f, fw: lambda x, v: F.grad(lambda y: _jvp_out(F, f, y, v))(x),
                  lambda R, x, v: R.hess(x) @ v),
    "vjp(grad)": ("xv", lambda F, h, f, fw: lambda x, v: _vjp_out(F, F.grad(f), x, v),
                  lambda R, x, v: R.hess(x) @ v),
    "jvp(vjp)": ("xvu", lambda F, h, f, fw: lambda x, v, u: _jvp_out(F, lambda y: _vjp_out(F, h, y, u), x, v),
                 lambda R, x, v, u: R.jac(lambda y: R.vjp(y, u), x) @ v),
    "jvp(jvp)": ("xv", lambda F, h, f, fw: lambda x, v: _jvp_out(F, lambda y: _jvp_out(F, f, y, v), x, v),
                 lambda R, x, v: v @ R.hess(x) @ v),
    # triples
    "vmap(jacfwd(jacrev))": ("X", lambda F, h, f, fw: F.vmap(F.jacfwd(F.jacrev(f))),
                             lambda R, X: R.each(R.hess, X)),
    "vmap(jacrev(jacrev))": ("X", lambda F, h, f, fw: F.vmap(F.jacrev(F.jacrev(f))),
                             lambda R, X: R.each(R.hess, X)),
    "vmap(jacrev(jacfwd))": ("X", lambda F, h, f, fw: F.vmap(F.jacrev(F.jacfwd(f))),
                             lambda R, X: R.each(R.hess, X)),
    "vmap(jvp(grad))": ("XV", lambda F, h, f, fw: F.vmap(lambda x, v: _jvp_out(F, F.grad(f), x, v)),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "vmap(grad(jvp))": ("XV", lambda F, h, f, fw: F.vmap(
                            lambda x, v: F.grad(lambda y: _jvp_out(F, f, y, v))(x)),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "vmap(vjp(grad))": ("XV", lambda F, h, f, fw: F.vmap(lambda x, v: _vjp_out(F, F.grad(f), x, v)),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "jvp(vmap(grad))": ("XV", lambda F, h, f, fw: lambda X, V: _jvp_out(F, F.vmap(F.grad(f)), X, V),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "grad(vmap(grad))": ("X", lambda F, h, f, fw: F.grad(lambda X: (F.vmap(F.grad(f))(X) ** 2).sum()),
                         lambda R, X: R.each(lambda x: 2 * R.hess(x) @ R.grad(x), X)),
    "vmap(vmap(grad))": ("W", lambda F, h, f, fw: F.vmap(F.vmap(F.grad(f))),
                         lambda R, XX: R.each(lambda X: R.each(R.grad, X), XX)),
    "jacrev(vmap(grad))": ("X", lambda F, h, f, fw: F.jacrev(F.vmap(F.grad(f))),
                           lambda R, X: R.block_diag(R.each(R.hess, X))),
    "jacfwd(vmap(grad))": ("X", lambda F, h, f, fw: F.jacfwd(F.vmap(F.grad(f))),
                           lambda R, X: R.block_diag(R.each(R.hess, X))),
    "hessian(vmap)": ("X", lambda F, h, f, fw: F.hessian(lambda X: F.vmap(f)(X).sum()),
                      lambda R, X: R.block_diag(R.each(R.hess, X))),
    "vmap(jacfwd(jacfwd))": ("X", lambda F, h, f, fw: F.vmap(F.jacfwd(F.jacfwd(f))),
                             lambda R, X: R.each(R.hess, X)),
    "vmap(jvp(jvp))": ("XV", lambda F, h, f, fw: F.vmap(
                           lambda x, v: _jvp_out(F, lambda y: _jvp_out(F, f, y, v), x, v)),
                       lambda R, X, V: R.each(lambda x, v: v @ R.hess(x) @ v, X, V)),
    "vjp(vmap(grad))": ("XV", lambda F, h, f, fw: lambda X, V: _vjp_out(F, F.vmap(F.grad(f)), X, V),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "jvp(vmap(jvp))": ("XV", lambda F, h, f, fw: lambda X, V: _jvp_out(
                           F, lambda Y: F.vmap(lambda y, v: _jvp_out(F, f, y, v))(Y, V), X, V),
                       lambda R, X, V: R.each(lambda x, v: v @ R.hess(x) @ v, X, V)),
    "grad(vmap(jvp))": ("XV", lambda F, h, f, fw: lambda X, V: F.grad(
                            lambda Y: F.vmap(lambda y, v: _jvp_out(F, f, y, v))(Y, V).sum())(X),
                        lambda R, X, V: R.each(lambda x, v: R.hess(x) @ v, X, V)),
    "vmap(jacrev(vmap))": ("W", lambda F, h, f, fw: F.vmap(F.jacrev(F.vmap(f))),
                           lambda R, XX: R.each(lambda X: R.block_diag(R.each(R.grad, X)), XX)),
    "vmap(jvp) over tangents": ("xV", lambda F, h, f, fw: lambda x, V: F.vmap(
                                    lambda v: _jvp_out(F, h, x, v))(V),
                                lambda R, x, V: R.each(lambda v: R.jac(x) @ v, V)),
    "vmap(vjp) over cotangents": ("xU", lambda F, h, f, fw: lambda x, U: F.vmap(F.vjp(h, x)[1])(U)[0],
                                  lambda R, x, U: R.each(lambda u: u @ R.jac(x), U)),
    "vmap(jvp(grad)) over tangents": ("xV", lambda F, h, f, fw: lambda x, V: F.vmap(
                                          lambda v: _jvp_out(F, F.grad(f), x, v))(V),
                                      lambda R, x, V: R.each(lambda v: R.hess(x) @ v, V)),
    "vmap(vjp(grad)) over cotangents": ("xV", lambda F, h, f, fw: lambda x, V: F.vmap(
                                            F.vjp(F.grad(f), x)[1])(V)[0],
                                        lambda R, x, V: R.each(lambda v: R.hess(x) @ v, V)),
    # Jacobians built as torch.func builds them: vmap over a vjp function's cotangents
    "jvp(vmap(vjp))": ("xvU", lambda F, h, f, fw: lambda x, v, U: _jvp_out(
                           F, lambda y: F.vmap(F.vjp(h, y)[1])(U)[0], x, v),
                       lambda R, x, v, U: R.each(lambda u: R.jac(lambda y: R.vjp(y, u), x) @ v, U)),
    "jacfwd(vmap(vjp))": ("xU", lambda F, h, f, fw: lambda x, U: F.jacfwd(
                              lambda y: F.vmap(F.vjp(h, y)[1])(U)[0])(x),
                          lambda R, x, U: R.each(lambda u: R.jac(lambda y: R.vjp(y, u), x), U)),
    "jacrev(vmap(vjp))": ("xU", lambda F, h, f, fw: lambda x, U: F.jacrev(
                              lambda y: F.vmap(F.vjp(h, y)[1])(U)[0])(x),
                          lambda R, x, U: R.each(lambda u: R.jac(lambda y: R.vjp(y, u), x), U)),
    "grad(vmap(vjp))": ("xU", lambda F, h, f, fw: lambda x, U: F.grad(
                            lambda y: F.vmap(F.vjp(h, y)[1])(U)[0].sin().sum())(x),
                        lambda R, x, U: R.jac(lambda y: R.each(lambda u: R.vjp(y, u), U).sin().sum()
                                              .reshape(1), x)[0]),
    # with respect to a weight that is not batched
    "vmap(grad) of the weight": ("Xw", lambda F, h, f, fw: F.vmap(F.grad(fw, argnums=1), in_dims=(0, None)),
                                 lambda R, X, w: R.each(lambda x: R.grad_w(x, w), X)),
    "vmap(hessian) of the weight": ("Xw", lambda F, h, f, fw: F.vmap(F.hessian(fw, argnums=1),
                                                                      in_dims=(0, None)),
                                    lambda R, X, w: R.each(lambda x: R.hess_w(x, w), X)),
    "vmap(jvp) of the weight": ("Xwd", lambda F, h, f, fw: lambda X, w, d: F.vmap(
                                    lambda x: _jvp_out(F, lambda w: fw(x, w), w, d))(X),
                                lambda R, X, w, d: R.each(lambda x: R.grad_w(x, w) @ d, X)),
    "jvp(vmap) of the weight": ("Xwd", lambda F, h, f, fw: lambda X, w, d: _jvp_out(
                                    F, lambda w: F.vmap(fw, in_dims=(0, None))(X, w), w, d),
                                lambda R, X, w, d: R.each(lambda x: R.grad_w(x, w) @ d, X)),
    "jvp(vmap(grad)) of the weight": ("Xwd", lambda F, h, f, fw: lambda X, w, d: _jvp_out(
                                          F, lambda w: F.vmap(F.grad(fw), in_dims=(0, None))(X, w), w, d),
                                      lambda R, X, w, d: R.each(lambda x: R.mixed(x, w) @ d, X)),
    "jacrev(vmap(grad)) of the weight": ("Xw", lambda F, h, f, fw: lambda X, w: F.jacrev(
                                             lambda w: F.vmap(F.grad(fw), in_dims=(0, None))(X, w))(w),
                                         lambda R, X, w: R.each(lambda x: R.mixed(x, w), X)),
    "jacfwd(vmap(grad)) of the weight": ("Xw", lambda F, h, f, fw: lambda X, w: F.jacfwd(
                                             lambda w: F.vmap(F.grad(fw), in_dims=(0, None))(X, w))(w),
                                         lambda R, X, w: R.each(lambda x: R.mixed(x, w), X)),
    "grad(vmap(grad)) of the weight": ("Xw", lambda F, h, f, fw: lambda X, w: F.grad(
                                           lambda w: F.vmap(F.grad(fw), in_dims=(0, None))(X, w).sum())(w),
                                       lambda R, X, w: R.each(lambda x: R.mixed(x, w).sum(0), X).sum(0)),
    "jvp(vmap(jvp)) of the weight": ("Xwdv", lambda F, h, f, fw: lambda X, w, d, v: _jvp_out(
                                         F, lambda w: F.vmap(
                                             lambda x: _jvp_out(F, lambda y: fw(y, w), x, v))(X), w, d),
                                     lambda R, X, w, d, v: R.each(lambda x: v @ R.mixed(x, w) @ d, X)),
    "vmap(jvp(vmap(grad)))": ("WT", lambda F, h, f, fw: F.vmap(
                                  lambda X, V: _jvp_out(F, F.vmap(F.grad(f)), X, V)),
                              lambda R, XX, VV: R.each(
                                  lambda X, V: R.each(lambda x, v: R.hess(x) @ v, X, V), XX, VV)),
    "vmap(jacfwd(grad of the weight))": ("Xw", lambda F, h, f, fw: F.vmap(
                                             F.jacfwd(F.grad(fw, argnums=1)), in_dims=(0, None)),
                                         lambda R, X, w: R.each(lambda x: R.mixed(x, w).T, X)),
    "vmap(vmap(hessian))": ("W", lambda F, h, f, fw: F.vmap(F.vmap(F.hessian(f))),
                            lambda R, XX: R.each(lambda X: R.each(R.hess, X), XX)),
}


# --------------------------------------------------------------------------- reference


class Reference:
    """Per-example derivatives of ``h`` and ``f`` by plain reverse mode, no transforms."""

    def __init__(self, h, f):
        self.h_fn, self.f_fn = h, f

    def h(self, x):
        return self.h_fn(x).detach()

    @staticmethod
    def each(fn, *batches):
        return fg.stack([fn(*items) for items in zip(*[b.unbind(0) for b in batches])], 0)

    def grad(self, x, create_graph: bool = False):
        if not x.requires_grad:
            x = x.detach().requires_grad_()
        (g,) = fg.autograd.grad(self.f_fn(x), x, create_graph=create_graph)
        return g if create_graph else g.detach()

    def jac(self, fn_or_x, x=None):
        """The Jacobian of ``h`` at ``x`` (or of ``fn`` at ``x``), one output at a time."""
        fn, x = (self.h_fn, fn_or_x) if x is None else (fn_or_x, x)
        x = x.detach().requires_grad_()
        out = fn(x).reshape(-1)
        rows = [fg.autograd.grad(out[k], x, retain_graph=True, allow_unused=True)[0]
                for k in range(out.numel())]
        rows = [fg.zeros_like(x) if r is None else r.detach() for r in rows]
        return fg.stack(rows, 0)

    def vjp(self, x, u):
        (g,) = fg.autograd.grad(self.h_fn(x), x, u, create_graph=True)
        return g

    def hess(self, x):
        return self.jac(lambda y: self.grad(y, create_graph=True), x)

    def _of_weight(self, x):
        return Reference(None, lambda w: self.f_fn(x * w))

    def grad_w(self, x, w):
        return self._of_weight(x).grad(w)

    def hess_w(self, x, w):
        return self._of_weight(x).hess(w)

    def mixed(self, x, w):
        """``[a, b]``: the derivative of the gradient's element ``a`` (with respect to the
        example) with respect to the weight's element ``b``."""
        return self.jac(lambda w: Reference(None, lambda y: self.f_fn(y * w)).grad(x, True), w)

    @staticmethod
    def block_diag(blocks):
        """``out[i, ..., j, ...]``: ``blocks[i]`` where i == j, else zero (the Jacobian of a
        vmapped function with respect to the whole batch)."""
        n = blocks.shape[0]
        rest = tuple(blocks.shape[1:])
        out = fg.zeros((n,) + rest[:len(rest) - 1] + (n,) + rest[len(rest) - 1:],
                       dtype=blocks.dtype)
        for i in range(n):
            out[(i,) + (slice(None),) * (len(rest) - 1) + (i,)] = blocks[i]
        return out


# --------------------------------------------------------------------------- inputs


def _arrays(name: str, case: str) -> dict:
    rng = np.random.default_rng(len(name) * 31 + len(case))
    k = CASES[case](fg)(fg.ones(N, dtype=fg.float64)).shape[0]

    def draw(*shape):
        a = rng.uniform(0.2, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
        return a.astype(np.float64)
    return {"x": draw(N), "v": draw(N), "u": draw(k), "X": draw(B, N), "V": draw(B, N),
            "U": draw(B, k), "W": draw(2, B, N), "T": draw(2, B, N),
            "w": draw(N), "d": draw(N)}


def _args(T, name: str, case: str) -> list:
    arrays = _arrays(name, case)
    return [T.tensor(arrays[c], dtype=T.float64) for c in COMPOSITIONS[name][0]]


def _build(T, F, name: str, case: str):
    h = CASES[case](T)
    return COMPOSITIONS[name][1](F, h, scalar(h), with_weight(scalar(h)))


def _expected(name: str, case: str):
    h = CASES[case](fg)
    return COMPOSITIONS[name][2](Reference(h, scalar(h)), *_args(fg, name, case))


def _close(got, want, **tol):
    assert tuple(got.shape) == tuple(want.shape), (tuple(got.shape), tuple(want.shape))
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), **(tol or TOL))


MATRIX = [(name, case) for name in COMPOSITIONS for case in CASES]


# --------------------------------------------------------------------------- public ops
# Forward over reverse inside vmap (and jvp around vmap(grad)) through the public ops: their
# VJP rules, run on batched tensors under a forward level, need the batching and JVP rules
# of the primitives the VJPs are made of, and the saved values with their tangents.

M = fg.tensor(np.random.default_rng(3).normal(0, 0.5, (6, 6)))
PUBLIC_OPS = {
    "sigmoid": lambda x: fg.sigmoid(x),
    "softplus": lambda x: Fn.softplus(x),
    "gelu": lambda x: Fn.gelu(x),
    "gelu_tanh": lambda x: Fn.gelu(x, approximate="tanh"),
    "silu": lambda x: Fn.silu(x),
    "elu": lambda x: Fn.elu(x),
    "log_softmax": lambda x: Fn.log_softmax(x, -1),
    "softmax": lambda x: fg.softmax(x, 0),
    "layer_norm": lambda x: Fn.layer_norm(x, (6,)),
    "logsigmoid": lambda x: Fn.logsigmoid(x),
    "erf": lambda x: fg.erf(x),
    "sqrt": lambda x: (x.abs() + 1).sqrt(),
    "atan": lambda x: x.atan(),
    "cumsum": lambda x: x.cumsum(0) ** 2,
    "cumprod": lambda x: x.cumprod(0),
    "amax": lambda x: x.amax() * x,
    "max": lambda x: x.max() * x,
    "norm": lambda x: x.norm() * x,
    "var": lambda x: x.var() * x,
    "std": lambda x: x.std() * x,
    "logsumexp": lambda x: x.logsumexp(0) * x,
    "matmul": lambda x: (M @ x).tanh(),
    "where": lambda x: fg.where(x > 0, x ** 2, x.sin()),
    "clamp": lambda x: x.clamp(-0.5, 0.5) * x,
    "pow": lambda x: (x.abs() + 0.5) ** x,
    "div": lambda x: x / (x * x + 1),
    "rsqrt": lambda x: (x * x + 1).rsqrt(),
    "log1p": lambda x: (x * x).log1p(),
    "expm1": lambda x: x.expm1(),
    "sinh": lambda x: x.sinh(),
    "cosh": lambda x: x.cosh(),
    "asinh": lambda x: x.asinh(),
    "atanh": lambda x: (x / 2).atanh(),
    "mse": lambda x: Fn.mse_loss(x, M[0]),
    "l1": lambda x: Fn.l1_loss(x * x, M[0]),
    "smooth_l1": lambda x: Fn.smooth_l1_loss(x, M[0]),
    "huber": lambda x: Fn.huber_loss(x * 3, M[0]),
    "bce_logits": lambda x: Fn.binary_cross_entropy_with_logits(x, M[0].sigmoid()),
    "prod": lambda x: x.prod() * x,
    "sort": lambda x: x.sort().values * fg.arange(6.0, dtype=fg.float64),
    "topk": lambda x: x.topk(3).values ** 2,
    "gather": lambda x: x.gather(0, fg.tensor([5, 1, 1, 0])) ** 3,
    "index_select": lambda x: x.index_select(0, fg.tensor([2, 2, 4])) ** 3,
    "masked_fill": lambda x: x.masked_fill(x > 0.5, 0.0) ** 3,
    "conv1d": lambda x: Fn.conv1d(x.reshape(1, 1, 6), M[:2, :3].reshape(2, 1, 3)).tanh(),
    "linear": lambda x: Fn.linear(x, M, M[1]).tanh(),
    "einsum": lambda x: fg.einsum("i,ij,j->", x, M, x) * x,
    "det": lambda x: (x.reshape(2, 3) @ x.reshape(2, 3).T + fg.eye(2, dtype=fg.float64)).det() * x,
    "inverse": lambda x: (x.reshape(2, 3) @ x.reshape(2, 3).T + fg.eye(2, dtype=fg.float64)).inverse(),
    "cholesky":
        lambda x: fg.linalg.cholesky(x.reshape(2, 3) @ x.reshape(2, 3).T + fg.eye(2, dtype=fg.float64)),
    "log": lambda x: (x * x + 0.1).log(),
    "reciprocal": lambda x: (x * x + 0.1).reciprocal(),
    "tan": lambda x: x.tan(),
    "relu": lambda x: fg.relu(x) ** 3,
    "leaky": lambda x: Fn.leaky_relu(x, 0.1) ** 3,
    "hardtanh": lambda x: Fn.hardtanh(x) * x,
    "mish": lambda x: Fn.mish(x),
    "normalize": lambda x: Fn.normalize(x, dim=0),
    "dropout_eval": lambda x: Fn.dropout(x, 0.5, training=False) ** 3,
    "flip_roll": lambda x: x.flip(0).roll(2) * x,
    "repeat": lambda x: x.repeat(2).reshape(3, 4).tanh(),
    "unfold": lambda x: x.unfold(0, 3, 1).prod(-1),
    "pad": lambda x: Fn.pad(x, (1, 2)).cumsum(0) ** 2,
    "attention":
        lambda x: Fn.scaled_dot_product_attention(x.reshape(1, 2, 3), x.reshape(1, 2, 3), x.reshape(1, 2, 3)),
    "atan2": lambda x: fg.atan2(x, x.flip(0) + 2),
    "hypot": lambda x: fg.hypot(x, x.flip(0)),
    "logaddexp": lambda x: fg.logaddexp(x, x.flip(0)),
    "min": lambda x: x.min(0).values * x,
    "sum_dim_keepdim": lambda x: x.reshape(2, 3).sum(1, keepdim=True) * x.reshape(2, 3),
    "mean_sq": lambda x: (x.reshape(2, 3) - x.reshape(2, 3).mean(0)) ** 2,
    "cross_entropy": lambda x: Fn.cross_entropy(x.reshape(2, 3), fg.tensor([0, 2])) * x,
    "nll": lambda x: Fn.nll_loss(Fn.log_softmax(x.reshape(2, 3), -1), fg.tensor([1, 2])) * x,
    "kl_div": lambda x: Fn.kl_div(Fn.log_softmax(x, 0), M[2].softmax(0), reduction="batchmean") * x,
}


def _hvp_inputs():
    rng = np.random.default_rng(0)
    X = fg.tensor(rng.uniform(0.2, 1.0, (3, 6)) * rng.choice([-1, 1], (3, 6)))
    return X, fg.tensor(rng.normal(0, 1, (3, 6)))


def _hvp_reference(f, X, V):
    return fg.stack([Reference(None, f).hess(x) @ v for x, v in zip(X.unbind(0), V.unbind(0))])


@pytest.mark.parametrize("name", list(PUBLIC_OPS))
def test_public_op_forward_over_reverse_under_vmap(name):
    op = PUBLIC_OPS[name]

    def f(x):
        return op(x).sin().sum()
    X, V = _hvp_inputs()
    want = _hvp_reference(f, X, V)
    _close(fgfunc.vmap(lambda x, v: fgfunc.jvp(fgfunc.grad(f), (x,), (v,))[1])(X, V), want)
    _close((fgfunc.vmap(fgfunc.hessian(f))(X) @ V.unsqueeze(-1)).squeeze(-1), want)
    _close(fgfunc.jvp(fgfunc.vmap(fgfunc.grad(f)), (X,), (V,))[1], want)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PUBLIC_OPS))
def test_public_op_forward_over_reverse_under_vmap_compiled(name):
    op = PUBLIC_OPS[name]

    def f(x):
        return op(x).sin().sum()
    X, V = _hvp_inputs()
    want = _hvp_reference(f, X, V)
    hvp = fg.compile(fgfunc.vmap(lambda x, v: fgfunc.jvp(fgfunc.grad(f), (x,), (v,))[1]), fullgraph=True)
    _close(hvp(X, V), want)
    outer = fg.compile(lambda X, V: fgfunc.jvp(fgfunc.vmap(fgfunc.grad(f)), (X,), (V,))[1], fullgraph=True)
    _close(outer(X, V), want)


# --------------------------------------------------------------------------- tests


def test_reference_matches_central_differences():
    """The reference's gradient, Jacobian and Hessian against central differences."""
    eps = 1e-5
    for case in CASES:
        h = CASES[case](fg)
        R = Reference(h, scalar(h))
        x = fg.tensor(_arrays("fd", case)["x"], dtype=fg.float64)
        cols_h, cols_g = [], []
        for j in range(N):
            e = fg.zeros(N, dtype=fg.float64)
            e[j] = eps
            cols_h.append((h(x + e) - h(x - e)) / (2 * eps))
            cols_g.append((R.grad(x + e) - R.grad(x - e)) / (2 * eps))
        _close(R.jac(x), fg.stack(cols_h, 1), rtol=1e-7, atol=1e-8)
        _close(R.hess(x), fg.stack(cols_g, 1), rtol=1e-7, atol=1e-8)
        _close(R.grad(x), R.jac(scalar(h), x)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,case", MATRIX)
def test_composition_eager(name, case):
    got = _build(fg, fgfunc, name, case)(*_args(fg, name, case))
    _close(got, _expected(name, case))
    assert not got.requires_grad


# Compiled, the matrix runs on the functions whose compiled programs differ most from eager
# ones (a reduction fused with exp, writes functionalized); the matmul column runs below in
# both profiles, and every column runs eagerly above.
COMPILED_CASES = ("softmax", "inplace")


@pytest.mark.slow
@pytest.mark.parametrize("name,case", [(n, c) for n, c in MATRIX if c in COMPILED_CASES])
def test_composition_compiled(name, case):
    fn = fg.compile(_build(fg, fgfunc, name, case), fullgraph=True)
    _close(fn(*_args(fg, name, case)), _expected(name, case))


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_composition_compiled_matmul(name):
    """One function of the matrix compiled per composition (the rest are marked slow)."""
    fn = fg.compile(_build(fg, fgfunc, name, "matmul"), fullgraph=True)
    _close(fn(*_args(fg, name, "matmul")), _expected(name, "matmul"))


@pytest.mark.parametrize("name,case", MATRIX)
def test_composition_matches_torch_func(name, case):
    torch = pytest.importorskip("torch")
    tfunc = pytest.importorskip("torch.func")
    if case == "inplace" and name in ("jacfwd(jacfwd)", "vmap(jacfwd(jacfwd))", "vmap(jvp(jvp))"):
        pytest.skip("torch.func refuses forward over forward through in-place writes "
                    "(ZeroTensors are immutable)")
    got = _build(fg, fgfunc, name, case)(*_args(fg, name, case))
    want = _build(torch, tfunc, name, case)(*_args(torch, name, case))
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), **TOL)


@pytest.mark.parametrize("op,second", [
    (fg.exp, lambda x: x.exp()),
    (fg.tanh, lambda x: -2 * x.tanh() * (1 - x.tanh() ** 2)),
])
def test_vmap_of_forward_over_reverse_through_a_rule_that_reads_its_output(op, second):
    """exp's and tanh's VJPs read the saved output: inside vmap, the backward's copy of it
    must carry the tangent, or jvp(grad) and the Hessians lose that term."""
    X = fg.linspace(-1, 1, 6, dtype=fg.float64).reshape(2, 3)
    V = fg.linspace(0.5, 2, 6, dtype=fg.float64).reshape(2, 3)

    def f(x):
        return op(x).sum()
    hvp = fgfunc.vmap(lambda x, v: fgfunc.jvp(fgfunc.grad(f), (x,), (v,))[1])(X, V)
    _close(hvp, second(X) * V)
    _close(fgfunc.vmap(fgfunc.hessian(f))(X), fg.diag_embed(second(X)))


def test_a_transform_around_vmap_sees_through_grad_inside_it():
    """grad inside vmap cuts only its own (batched) tape: the underlying tensors keep the
    history that a jvp or jacrev around the vmap differentiates."""
    X = fg.linspace(-1, 1, 6, dtype=fg.float64).reshape(2, 3)
    V = fg.linspace(0.5, 2, 6, dtype=fg.float64).reshape(2, 3)
    g = fgfunc.vmap(fgfunc.grad(lambda x: (x ** 3).sum()))
    _close(fgfunc.jvp(g, (X,), (V,))[1], 6 * X * V)
    _close(fgfunc.jacrev(g)(X).sum((2, 3)), 6 * X)


def test_detach_inside_vmap_still_stops_every_gradient():
    """A user's detach() inside vmap is torch's: no gradient flows through it, for a
    transform inside the vmap or around it."""
    X = fg.tensor([[1., 2.], [3., 4.]], dtype=fg.float64)

    def f(y):
        return (y.detach() * y).sum()
    _close(fgfunc.grad(lambda X: fgfunc.vmap(f)(X).sum())(X), X)
    _close(fgfunc.vmap(fgfunc.grad(f))(X), X)


def test_forward_over_reverse_returns_no_history():
    """jvp(grad(f)) and hessian(f) cut the history made inside them, tangents included."""
    x = fg.tensor([0.5, -1.0, 2.0], dtype=fg.float64)
    v = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)

    def f(x):
        return x.sin().sum()
    out = fgfunc.jvp(fgfunc.grad(f), (x,), (v,))[1]
    assert not out.requires_grad and out.grad_fn is None
    assert not fgfunc.hessian(f)(x).requires_grad
