"""Shared by the primitive definitions: broadcasting, the dtype checks of their rules, and
the conjugate and float32 compute that their VJPs and references use.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import is_grad_enabled, set_grad_enabled
from fusegrad.ops.primitive import (
    ShapeError,
    TensorType,
    bind,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- shape helpers


def broadcast_shapes(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """numpy/torch broadcasting of ``shapes``; raises with torch's message on a mismatch."""
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, d in enumerate(s):
            r = result[offset + i]
            if r == 1:
                result[offset + i] = d
            elif d != 1 and d != r:
                raise ShapeError(
                    f"{op}: the size of tensor a ({r}) must match the size of tensor b ({d}) at "
                    f"non-singleton dimension {offset + i} (shapes "
                    f"{', '.join(str(list(x)) for x in shapes)})")
    return tuple(result)


def _types_str(types) -> str:
    return ", ".join(str(t) for t in types)


def _same_dtype(op: str, *types: TensorType) -> dtypes.DType:
    dt = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dt:
            raise ShapeError(f"{op}: operands must have one dtype, got {_types_str(types)}")
    return dt


def _require_float(op: str, t: TensorType, complex_ok: bool = False) -> None:
    if not (t.dtype.is_floating_point or complex_ok and t.dtype.is_complex):
        raise ShapeError(f"{op}: expected a floating-point operand, got {t}")


def _require_real(op: str, t: TensorType) -> None:
    if t.dtype.is_complex:
        raise ShapeError(f"{op} is not implemented for complex tensors (got {t})")


def _conj(t):
    """``t``'s complex conjugate; ``t`` itself when real. VJP rules follow torch's
    convention: the cotangent of a complex value ``z`` is dL/d(conj z), so a holomorphic
    op's rule multiplies by the conjugate of its derivative (mul's ``g * conj(y)``)."""
    return t.conj_physical() if t.dtype.is_complex else t


def _np_float_compute(a: np.ndarray) -> np.ndarray:
    """16-bit floats compute in float32 (as torch does on the CPU) and are rounded back."""
    if a.dtype == np.float16 or a.dtype == ml_dtypes.bfloat16:
        return a.astype(np.float32)
    return a


def _sum_to(g, shape: tuple[int, ...]):
    """Reduce a broadcast gradient back to ``shape``."""
    return g.sum_to_size(shape) if g.shape != tuple(shape) else g


# The public view ops that VJP rules return their gradients through, so that a gradient is a
# view of its operand's storage as the public op makes it: ``slice_axes(x, starts, stops,
# steps)`` (fusegrad.ops.movement), ``view_as_real(x)`` and ``view_as_complex(x)``
# (fusegrad.ops.complex). Those modules sit above the primitives and fill this at import
# (register_view_op); the rules call view_op(name) when they run, long after.
_VIEW_OPS: dict = dict.fromkeys(("slice_axes", "view_as_real", "view_as_complex"))


def register_view_op(name: str, fn) -> None:
    """Fill the view-op slot ``name`` of :data:`_VIEW_OPS`."""
    if name not in _VIEW_OPS:
        raise KeyError(f"no view-op slot {name!r} (slots: {', '.join(_VIEW_OPS)})")
    _VIEW_OPS[name] = fn


def view_op(name: str):
    """The public view op ``name`` registered by the ops above the primitives."""
    return _VIEW_OPS[name]


# --------------------------------------------------------------------------- JVP rules
# Shared by the JVP rules of the prims_* modules (see fusegrad.primitive.jvp_rule): rules made
# from a primitive's own definition where that is exact.


def add_tangents(*terms):
    """The sum of the tangent terms that are not None (None when all are)."""
    total = None
    for t in terms:
        if t is not None:
            total = t if total is None else total + t
    return total


def tangent_or_zeros(t, primal):
    """``t``, or zeros shaped like ``primal`` where the operand has no tangent."""
    return t if t is not None else primal.new_zeros(tuple(primal.shape))


def applied_to_tangent(prim):
    """The JVP rule of a linear one-operand primitive: the primitive applied to the tangent."""
    def rule(tangents, out, x, **attrs):
        return bind(prim, tangents[0], **attrs)
    return rule


def elementwise_from_vjp(prim):
    """The JVP rule of an elementwise primitive, from its VJP rules: an elementwise Jacobian
    is diagonal, hence symmetric, so an operand's VJP applied to its tangent (operands
    broadcast to the result's shape first, so that the VJP sums nothing away) is its JVP
    term. For complex operands the VJP multiplies by the conjugate derivative
    (:func:`_conj`); conjugating around it gives a holomorphic op's ``f'(z) t``."""
    def rule(tangents, out, *primals, **attrs):
        shape = tuple(out.shape)
        full = [p if tuple(p.shape) == shape else bind(_broadcast_to(), p, shape=shape)
                for p in primals]
        terms = []
        for i, t in enumerate(tangents):
            if t is None:
                continue
            _check_differentiable(prim, i)
            if tuple(t.shape) != shape:
                t = bind(_broadcast_to(), t, shape=shape)
            terms.append(_conj(prim.cotangent(i, _conj(t), out, full, attrs)))
        return add_tangents(*terms)
    return rule


def _check_differentiable(prim, i: int) -> bool:
    """True, or torch's refusal where operand ``i`` of ``prim`` has a tangent but no
    derivative (igamma's ``a``)."""
    if prim.rule(i) is None:
        raise NotImplementedError(f"Trying to use forward AD with {prim.name} that does not "
                                  f"support it because it has not been implemented yet (the "
                                  f"derivative for operand {i} is not implemented).")
    return True


def vjp_transposed(prim):
    """The JVP rule of ``prim`` from its VJP rules, by transposition: the VJP ``u -> J^T u``
    is linear in the cotangent ``u``, so ``J t`` is the gradient with respect to ``u`` of
    ``<J^T u, t>`` (what JAX's linearize-and-transpose does, in reverse). Exact; it costs a
    backward pass through the VJP, so it serves primitives whose own rule would be long
    (decompositions, scatters with a max). Real operands only."""
    def rule(tangents, out, *primals, **attrs):
        from fusegrad.ops import tape  # tape imports the primitives' modules

        # A graph for reverse mode only where something differentiates the tangent.
        create_graph = is_grad_enabled() and any(
            x.requires_grad for x in (*primals, *tangents) if x is not None and
            not isinstance(x, TensorType))
        with set_grad_enabled(True):
            u = out.detach().new_zeros(tuple(out.shape)).requires_grad_()
            terms = [(prim.cotangent(i, u, out, primals, attrs) * t).sum()
                     for i, t in enumerate(tangents)
                     if t is not None and _check_differentiable(prim, i)]
            total = add_tangents(*terms)
            if total is None or not total.requires_grad:
                return None
            if total._trace is not None:
                (jt,) = total._trace.backward([total], [None], create_graph, [u],
                                              accumulate=False, allow_unused=True)
            else:
                (jt,) = tape.run_backward([total], [total.new_ones(())], create_graph,
                                          create_graph, inputs=[u], accumulate=False,
                                          allow_unused=True)
        return jt
    return rule


def _broadcast_to():
    from fusegrad.ops.prims_movement import broadcast_to  # prims_movement imports this module
    return broadcast_to
