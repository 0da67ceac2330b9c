"""Composite ops: one eager autograd node, named as torch names it, for an op built of
several primitives (the tracer still sees the primitives, so fusion sees through them).
"""

from __future__ import annotations

import builtins
import functools
import re
from typing import Callable, Sequence

from fusegrad import dtypes, profiling
from fusegrad.grad_mode import is_grad_enabled
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims
from fusegrad.ops.operands import cast
from fusegrad.ops.tape import _FREED_MESSAGE, Node, _edge, _Saved, run_backward
from fusegrad.tensor import Tensor


class AliasNode(Node):
    """Identity edge from a composite's inner graph to the composite's real operand."""

    __slots__ = ()

    def __init__(self, t: Tensor):
        super().__init__((_edge(t),), "AliasBackward0")

    def apply(self, grad, create_graph, retain_graph):
        return (grad,)


class CompositeNode(Node):
    """One autograd node for a public op made of several primitives.

    Its backward runs the VJPs of the primitives the op recorded on aliases of its operands;
    with ``create_graph`` those VJPs are recorded too, connected through the aliases to the
    real operands, so higher-order gradients see through the composite.
    """

    __slots__ = ("_aliases", "_inner")

    def __init__(self, name: str, operands: Sequence[Tensor], aliases: Sequence[Tensor], inner):
        super().__init__(tuple(_edge(t) for t in operands), name)
        self._aliases = list(aliases)
        self._inner = inner

    def apply(self, grad, create_graph, retain_graph):
        if self._inner is None:
            raise RuntimeError(_FREED_MESSAGE)
        # The inner graph is kept (it goes with this node's release()): after a backward
        # with create_graph, the recorded gradient reaches the inner nodes too, and a second
        # backward runs them both from there and from here; freeing them on the first visit
        # failed the second (torch's composite ops have one node and never meet this).
        return tuple(run_backward([self._inner], [grad], True, create_graph,
                                  inputs=self._aliases, accumulate=False, allow_unused=True,
                                  stop_at_inputs=True))

    def release(self) -> None:
        self._inner = None


class CustomVJPNode(Node):
    """The node of an eager :class:`CustomVJP` call: the gradient of its operands is the
    rule's, as traced code's backward computes it, not the chain rule through the primitives
    that computed the value. The two differ where the chain rule meets ``0 * inf``: GELU's
    gradient at x = 100 under exp() was NaN through the primitives and is inf by the rule,
    as in torch. ``out`` (the primitives' result, connected to the operands) is what the
    rule reads, so a gradient of the gradient differentiates the rule and the forward."""

    __slots__ = ("_out", "_operands", "_rule", "_params", "_read")

    def __init__(self, out: Tensor, operands: tuple, rule: CustomVJP, params: tuple):
        super().__init__(tuple(_edge(t) for t in operands), "CustomVjpBackward0")
        self._out, self._operands, self._rule, self._params = out, operands, rule, params
        # What the rule reads, with its version now: written in place before the backward,
        # it raises as torch's saved tensors do (softmax's output, gelu's input were read
        # as modified, silently).
        self._read = tuple(_Saved(t) for t in ((out,) if rule.reads_output else ()) +
                           (operands if rule.reads_operands else ()) if t is not None)

    def apply(self, grad, create_graph, retain_graph):
        if self._out is None:
            raise RuntimeError(_FREED_MESSAGE)
        for saved in self._read:
            saved.unpack(self)
        return tuple(self._rule.bwd(grad, self._out, self._operands, self._params))

    def release(self) -> None:
        self._out = self._operands = None


def _made_by(t: Tensor, node: Node) -> Tensor:
    """A tensor on ``t``'s storage (and version counter) whose gradient flows into ``node``."""
    out = t.detach()
    out.grad_fn = node
    out._requires_grad = True
    out._fw_grads = t._fw_grads          # forward mode's tangents go through
    return out


def opmath(fn):
    """``fn`` computed in float32 for float16 and bfloat16 tensors, its result rounded once to
    the dtype the tensor arguments promote to (float32 when one of them is: hypot(f16, f32)
    is float32): torch's accumulate type (a sum of float16 values passes 65504, and becomes
    inf, long before their mean or norm does; a Python scalar a float16 tensor meets is taken
    in float32 too, as a float32 0-d tensor that promotes no further)."""
    narrow = (dtypes.float16, dtypes.bfloat16)

    def up(v):
        return cast(v, dtypes.float32) if isinstance(v, Tensor) and v.dtype in narrow else v

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not any(t.dtype in narrow for t in tensors):
            return fn(*args, **kwargs)
        dt = dtypes.result_type(*tensors)
        out = fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        return cast(out, dt) if dt in narrow and out.dtype is dtypes.float32 else out
    return wrapper


def _profiled_name(grad_name: str, fn_name: str) -> str:
    """The profiler's name of a composite op: torch's operator that its autograd node is the
    backward of (``NativeLayerNormBackward0`` -> ``aten::native_layer_norm``,
    ``AdaptiveAvgPool2DBackward0`` -> ``aten::adaptive_avg_pool2d``), else its function's."""
    match = re.fullmatch(r"([A-Za-z0-9]+?)Backward\d+", grad_name)
    if match is None:
        return "aten::" + fn_name.strip("_")
    return "aten::" + re.sub(r"(?<=[a-z])(?=[A-Z])", "_", match.group(1)).lower()


# Makes the eager kernel of a ``composite(..., kernel=True)`` op: ``maker(fn, grad_name)``
# returns a callable ``(args, kwargs)`` that gives the op's result, or NotImplemented where
# the op runs unfused. Filled by fusegrad.tracer.eager_kernels at import
# (register_eager_kernel_maker); while empty, such ops run unfused.
_eager_kernel_maker = None


def register_eager_kernel_maker(maker) -> None:
    """Install the eager-kernel maker of ``composite(..., kernel=True)`` ops (the tracer's
    ``EagerKernel``)."""
    global _eager_kernel_maker
    _eager_kernel_maker = maker


def composite(grad_name: str, kernel: bool = False):
    """Make an op built of several primitives one autograd node named ``grad_name``.

    ``kernel``: eager calls on large float32 CPU tensors run as the fused kernels of the op's
    compiled definition (:mod:`fusegrad.tracer.eager_kernels`); for ops whose only effects are
    in-place writes to their tensor arguments (batch norm's running statistics), which the
    compiled function writes back."""
    def decorate(fn):
        kernels = []
        op_name = _profiled_name(grad_name, fn.__name__)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            # Under a profiler, one event for the public op, its primitives (or eager
            # kernels) inside it; otherwise this costs a test (and a try block, free in 3.11).
            rec = profiling.recorder
            span = None
            if rec is not None and not _primitive.compiling():
                shapes = [list(a.shape) if isinstance(a, Tensor) else [] for a in args] \
                    if rec.record_shapes else None
                span = profiling.Span(rec, op_name, shapes=shapes).__enter__()
            try:
                # (A fused eager kernel computes no tangents: not under forward mode.)
                if kernel and _eager_kernel_maker is not None and \
                        not _primitive.forward_mode_live():
                    if not kernels:
                        kernels.append(_eager_kernel_maker(fn, grad_name))
                    out = kernels[0](args, kwargs)
                    if out is not NotImplemented:
                        return out
                if not is_grad_enabled():
                    return fn(*args, **kwargs)
                operands = [a for a in args if isinstance(a, Tensor)]
                operands += [v for v in kwargs.values() if isinstance(v, Tensor)]
                if not builtins.any(t._requires_grad for t in operands) or \
                        _primitive.traced(*operands):
                    return fn(*args, **kwargs)
                alias_of = {}
                for t in operands:
                    if t._requires_grad and id(t) not in alias_of:
                        alias_of[id(t)] = (t, _made_by(t, AliasNode(t)))

                def swap(v):
                    return alias_of[id(v)][1] if isinstance(v, Tensor) and id(v) in alias_of \
                        else v
                inner = fn(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()})
                if not isinstance(inner, Tensor) or not inner._requires_grad:
                    return inner
                real = [t for t, _ in alias_of.values()]
                return _made_by(inner, CompositeNode(grad_name, real,
                                                     [a for _, a in alias_of.values()], inner))
            finally:
                if span is not None:
                    span.__exit__()
        return wrapper
    return decorate


def _named(out: Tensor, name: str, src: Tensor | None = None) -> Tensor:
    """Give the node that made ``out`` torch's name for the public op.

    ``src``: the op's input, when the op may return it unchanged (a no-op view), whose node
    must keep its own name.
    """
    if out.grad_fn is not None and out._trace is None and out is not src:
        out.grad_fn._name = name
    return out


class CustomVJP:
    """A function whose operands' gradient is a backward rule of its own, attached to it (the
    shape of ``jax.custom_vjp``), instead of the chain rule through the primitives that
    compute its value: torch's formula where that one is numerically better or reads fewer
    values (softmax saves its output alone)::

        @custom_vjp("softmax", reads_output=True, reads_operands=False)
        def softmax_values(x: Tensor, dim: int) -> Tensor:
            ...                                   # the value, from primitives

        @softmax_values.defvjp
        def _softmax_vjp(g, out, operands, params):
            (dim,) = params
            return (out * (g - (g * out).sum(dim, keepdim=True)),)

    A call ``softmax_values(x, dim)`` computes ``fn``'s value; its tensor arguments are the
    rule's ``operands``, its other arguments the rule's ``params``. :meth:`mark` gives a
    value computed another way the same rule (attention's softmax, whose rows of no keys
    give zeros). The rule is ``bwd(g, out, operands, params)``, one cotangent (or None) per
    operand; ``reads_output`` and ``reads_operands`` say what it reads, which an eager
    backward checks for in-place writes since the forward, as torch checks what it saved.

    Traced, the value is a ``custom_vjp`` node whose ``rule`` attribute is ``name``: the IR
    text's spelling of the rule, as a node's op names its primitive
    (:data:`fusegrad.ops.prims.CUSTOM_VJPS` maps it back for autodiff). Eagerly it is the
    value with a :class:`CustomVJPNode` applying the rule (where an operand requires grad),
    so that eager and compiled gradients are computed alike.
    """

    def __init__(self, name: str, fn: Callable | None = None, *, reads_output: bool = False,
                 reads_operands: bool = True, recompute: bool | tuple = False):
        self.name, self.fn, self.bwd = name, fn, None
        self.reads_output, self.reads_operands = reads_output, reads_operands
        self.recompute = recompute
        if fn is not None:
            functools.update_wrapper(self, fn)

    def defvjp(self, bwd: Callable) -> Callable:
        """Attach ``bwd(g, out, operands, params)`` as the rule; returns ``bwd``."""
        if self.bwd is not None or self.name in prims.CUSTOM_VJPS:
            raise ValueError(f"custom_vjp: the rule {self.name!r} is defined twice")
        self.bwd = bwd
        prims.register_vjp(self.name, self.reads_output, self.reads_operands, self.recompute)(bwd)
        return bwd

    def __call__(self, *args):
        if self.fn is None:
            raise TypeError(f"custom_vjp {self.name!r} has no function of its own: mark a "
                            "value with its mark()")
        operands = tuple(a for a in args if isinstance(a, Tensor))
        params = tuple(a for a in args if not isinstance(a, Tensor))
        return self.mark(self.fn(*args), operands, params)

    def mark(self, out: Tensor, operands: Sequence[Tensor], params: tuple = ()) -> Tensor:
        """``out``, computed from ``operands``, whose gradient is this rule's (given
        ``params``) instead of the primitives' that computed it."""
        if self.bwd is None:
            raise TypeError(f"custom_vjp {self.name!r} has no rule: call defvjp first")
        if _primitive.traced(out, *operands):
            return _primitive.bind(prims.custom_vjp, out, *operands, rule=self.name,
                                   params=tuple(params))
        operands = tuple(operands)
        if not is_grad_enabled() or not builtins.any(t._requires_grad for t in operands):
            return out
        return _made_by(out, CustomVJPNode(out, operands, self, tuple(params)))


def custom_vjp(name: str, *, reads_output: bool = False, reads_operands: bool = True,
               recompute: bool | tuple = False):
    """Decorator: ``fn`` as a :class:`CustomVJP` whose rule ``name`` is given by its
    ``defvjp``."""
    def decorate(fn: Callable) -> CustomVJP:
        return CustomVJP(name, fn, reads_output=reads_output, reads_operands=reads_operands,
                         recompute=recompute)
    return decorate
