"""Every primitive's JVP rule, on the operands the IR zoo applies it to (tests/ir/ir_zoo.py
applies every primitive with its attributes): against central finite differences and
against the primitive's VJP (``<J v, u> == <v, J^T u>``), in float64. A primitive without
a rule is either declared without a tangent (an integer result, a cut) or listed here with
the reason it has none."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad  # noqa: F401  (registers every primitive)
import fusegrad.distributed  # noqa: F401
import fusegrad.ops.sampling  # noqa: F401
from fusegrad import dtypes as D
from fusegrad.ir import Literal
from fusegrad.ops import dual
from fusegrad.ops.primitive import PRIMITIVES, bind
from fusegrad.tensor import Tensor
from tests.ir.ir_zoo import CASES

# Primitives whose result has a tangent in principle but no derivative here, as in torch:
# forward mode refuses them (NotImplementedError).
NO_DERIVATIVE = {
    "fused_attention_backward": "a backward: its VJP refuses second order as well",
    "geqrf_a": "torch's geqrf has no derivative",
    "geqrf_tau": "torch's geqrf has no derivative",
    "nextafter": "torch's nextafter has no derivative",
    "standard_gamma_grad": "torch's _standard_gamma_grad has no derivative",
}
# Primitives whose JVP is checked against finite differences but not against their VJP.
NO_VJP_CHECK = {
    "custom_vjp": "its VJP stands for the primitives computing its value, not for itself",
    "fused_attention": "its VJP takes the cotangent of the results, not of the packed weights",
    "i1": "it has no VJP",
    "slogdet_sign": "it has no VJP (its derivative is zero)",
}
# ... and against their VJP but not finite differences.
NO_FD_CHECK = {
    "standard_gamma": "an implicit reparameterization derivative (at a fixed CDF value), "
                      "not the derivative of the sampler at a fixed key",
}

# Functions of symmetric matrices (they read one triangle): their tangents are symmetric.
SYMMETRIC = {"cholesky", "eigh_values", "eigh_vectors"}


def _wide(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    if a.dtype.kind == "f" or a.dtype == D.bfloat16.np_dtype:
        return a.astype(np.float64)
    return a


def _zoo_nodes() -> dict[str, list]:
    """Primitive name -> (case, operand arrays, attrs) of each node that applies it, with
    the operands the zoo's example inputs give it."""
    found: dict[str, list] = {}
    for name, build in sorted(CASES.items()):
        c = build()
        env = dict(zip(c.graph.inputs, c.args))
        for node in c.graph.nodes:
            arrays = [np.asarray(v.value, v.dtype.np_dtype) if isinstance(v, Literal) else env[v]
                      for v in node.inputs]
            out = node.prim.impl(*arrays, **node.attrs)
            env[node.output] = np.asarray(out).astype(node.output.type.dtype.np_dtype)
            found.setdefault(node.prim.name, []).append((name, arrays, dict(node.attrs)))
    return found


_NODES = _zoo_nodes()


def _tensor(a: np.ndarray) -> Tensor:
    return Tensor._wrap(np.array(a), D.from_numpy_dtype(a.dtype))


def _differentiable(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc"


def _tangents(prim, arrays, rng) -> list:
    """Random tangents for the float operands that have a derivative (not igamma's ``a``)."""
    return [_random_like(a, rng) if _differentiable(a) and
            (prim.vjp is None or prim.rule(i) is not None) else None
            for i, a in enumerate(arrays)]


def _jvp(prim, arrays, tangents, attrs):
    """The primitive's value and tangent at ``arrays`` along ``tangents`` (None: none)."""
    level = dual.enter_level()
    try:
        operands = []
        for a, t in zip(arrays, tangents):
            x = _tensor(a)
            if t is not None:
                dual.set_tangent(x, level, _tensor(t))
            operands.append(x)
        out = bind(prim, *operands, **attrs)
        tangent = dual.get_tangent(out, level)
    finally:
        dual.exit_level(level)
    return out.numpy(), None if tangent is None else tangent.numpy()


def _random_like(a: np.ndarray, rng) -> np.ndarray:
    t = rng.standard_normal(a.shape)
    if a.dtype.kind == "c":
        t = t + 1j * rng.standard_normal(a.shape)
    return t.astype(a.dtype)


def _wide_attrs(attrs: dict) -> dict:
    return {k: (D.float64 if k == "dtype" and v in (D.float32, D.float16, D.bfloat16) else v)
            for k, v in attrs.items()}


def test_every_primitive_has_a_rule_or_a_reason():
    missing = [n for n, p in PRIMITIVES.items()
               if "jvp" not in p.extra and n not in NO_DERIVATIVE]
    assert missing == []
    for n, p in PRIMITIVES.items():
        if p.extra.get("jvp", 0) is None:
            assert p.extra["no_jvp"], n
    assert sorted(set(PRIMITIVES) - set(_NODES)) == []     # the zoo applies all of them


@pytest.mark.parametrize("name", sorted(n for n, p in PRIMITIVES.items()
                                        if p.extra.get("jvp", 0) is None))
def test_primitives_without_a_tangent_give_none(name):
    prim = PRIMITIVES[name]
    rng = np.random.default_rng(0)
    for _, arrays, attrs in _NODES[name]:
        tangents = [_random_like(a, rng) if _differentiable(a) else None for a in arrays]
        if all(t is None for t in tangents):
            continue
        _, tangent = _jvp(prim, arrays, tangents, attrs)
        assert tangent is None


@pytest.mark.parametrize("name", sorted(NO_DERIVATIVE))
def test_primitives_without_a_derivative_refuse(name):
    prim = PRIMITIVES[name]
    rng = np.random.default_rng(0)
    _, arrays, attrs = _NODES[name][0]
    arrays = [_wide(a) for a in arrays]
    tangents = [_random_like(a, rng) if _differentiable(a) else None for a in arrays]
    with pytest.raises(NotImplementedError, match=f"forward AD with {name}"):
        _jvp(prim, arrays, tangents, _wide_attrs(attrs))


def _inner(a: np.ndarray, b: np.ndarray) -> float:
    """The real inner product of two tangents (complex ones as pairs of reals)."""
    return float(np.sum(np.real(np.conj(a) * b)))


@pytest.mark.parametrize("name", sorted(n for n, p in PRIMITIVES.items() if p.extra.get("jvp")))
def test_jvp_matches_finite_differences_and_vjp(name):
    prim = PRIMITIVES[name]
    rng = np.random.default_rng(1)
    for case, arrays, attrs in _NODES[name]:
        arrays = [_wide(a) for a in arrays]
        attrs = _wide_attrs(attrs)
        tangents = _tangents(prim, arrays, rng)
        if name in SYMMETRIC:
            tangents = [t + np.swapaxes(t, -1, -2) for t in tangents]
        out, tangent = _jvp(prim, arrays, tangents, attrs)
        if not _differentiable(out):
            assert tangent is None
            continue
        assert tangent is not None and tangent.shape == out.shape, case
        finite = np.isfinite(out) & np.isfinite(tangent)
        scale = 1.0 + np.abs(np.where(finite, out, 0))
        if name not in NO_FD_CHECK:
            h = 1e-6
            plus = [a if t is None else a + h * t for a, t in zip(arrays, tangents)]
            minus = [a if t is None else a - h * t for a, t in zip(arrays, tangents)]
            fd = (_value(prim, plus, attrs) - _value(prim, minus, attrs)) / (2 * h)
            half = [a if t is None else a + h / 2 * t for a, t in zip(arrays, tangents)]
            fd_half = (_value(prim, half, attrs) - _value(prim, arrays, attrs)) / (h / 2)
            # Central differences in float64: truncation ~h^2 and rounding ~eps/h, relative
            # to the values' scale. Elements where a jump lies within h (floor, fmod: the two
            # quotients disagree there) are left out.
            smooth = np.abs(fd - fd_half) <= 1e-3 * (1 + np.abs(fd))
            near = finite & np.isfinite(fd) & smooth
            np.testing.assert_allclose(tangent[near], fd[near], rtol=1e-5,
                                       atol=1e-5 * float(scale.max()), err_msg=case)
        if name in NO_VJP_CHECK or out.dtype.kind == "c" or \
                any(a.dtype.kind == "c" for a in arrays):
            continue
        u = rng.standard_normal(out.shape)
        ut = _tensor(u)
        primals = [_tensor(a) for a in arrays]
        total = 0.0
        for i, t in enumerate(tangents):
            if t is None:
                continue
            ct = prim.cotangent(i, ut, _tensor(out), primals, attrs)
            total += _inner(t, ct.numpy())
        if np.all(finite):
            assert abs(_inner(tangent, u) - total) <= 1e-8 * (1 + abs(total)) * tangent.size, case


def _value(prim, arrays, attrs) -> np.ndarray:
    return _wide(bind(prim, *[_tensor(a) for a in arrays], **attrs).numpy())
