"""torch.func's autodiff transforms (grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian)
on fusegrad's define-by-run autograd.

Each transform calls the function on fresh leaves made from its inputs (or views of them,
when they already require grad, so that an enclosing transform or ``backward`` sees through)
and differentiates with :mod:`fusegrad.autograd.functional` under ``create_graph``, so the
transforms nest (``jacrev(jacrev(f))``, ``jvp(grad(f))``) and compose with ``vmap`` and
:func:`fusegrad.compile`, which traces the autograd calls.

A result keeps its autograd history only when it depends on a tensor from outside the
transform that requires grad (a parameter the function closes over, an input that required
grad, an enclosing transform's leaf), as torch.func's do; otherwise it is returned detached.

``jvp`` and ``jacfwd`` are forward mode: each enters a level of its own
(:mod:`fusegrad.ops.dual`), gives the inputs their tangents and reads the outputs' tangents,
which the primitives' JVP rules computed alongside the values. Levels nest, and forward mode
runs through reverse mode's backward, so ``jvp(grad(f))`` (a Hessian-vector product),
``jacfwd(jacrev(f))`` and ``grad`` of a ``jvp`` all hold; results keep the tangents of
enclosing levels.

Inside ``vmap`` the inputs are taken as tensors of the innermost vmap level (an unbatched
one as the same for every example), so that the differentiation runs on that level's tape
and gives each example its own gradient (per-example gradients).
"""

from __future__ import annotations

import functools
from typing import Callable

from fusegrad.autograd import functional as AF
from fusegrad.autograd.engine import AccumulateGrad
from fusegrad.autograd.grad_mode import enable_grad, is_grad_enabled
from fusegrad.func._batching import BatchTensor, innermost_batch_trace, lift
from fusegrad.func._pytree import non_tensor_leaves, tree_flatten, tree_str, tree_unflatten
from fusegrad.func._vmap import check_randomness, randomness_mode
from fusegrad.ops import dual
from fusegrad.ops.creation import zeros_like
from fusegrad.ops.movement import stack
from fusegrad.tensor import Tensor

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian"]


# --------------------------------------------------------------------------- inputs


def _normalize_argnums(argnums, n_args: int) -> tuple[int, ...]:
    """argnums as a tuple of non-negative positions, checked as torch.func checks them."""
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not isinstance(argnums, (int, tuple)) or isinstance(argnums, bool) or \
            any(not isinstance(n, int) or isinstance(n, bool) for n in nums):
        bad = type(argnums) if not isinstance(argnums, tuple) else \
            next(type(n) for n in nums if not isinstance(n, int) or isinstance(n, bool))
        raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {bad}")
    if not nums:
        raise RuntimeError("argnums must be non-empty")
    for n in nums:
        if not -n_args <= n < n_args:
            raise RuntimeError(f"Got argnum={n}, but only {n_args} positional inputs")
    out = tuple(n % n_args for n in nums)
    if len(set(out)) != len(out):
        raise RuntimeError(f"argnums elements must be unique, got {argnums}")
    return out


def _check_transform_inputs(leaves: list, tree) -> None:
    bad = non_tensor_leaves(tree)
    if bad:
        raise ValueError(f"Thing passed to transform API must be Tensor, got {type(bad[0])}")
    for t in leaves:
        if t.is_complex():
            raise NotImplementedError("fusegrad.func transforms of complex inputs are not "
                                      "supported yet")
        if not t.is_floating_point():
            raise RuntimeError("only Tensors of floating point dtype can require gradients")


class _Call:
    """One call of the user's function on the leaves the differentiation makes.

    ``flat(*leaves)`` rebuilds the positional arguments with the leaves in place of the
    differentiated ones, calls the function, checks and records its output and aux, and
    returns the output's tensors as a tuple; ``fresh`` holds the leaves made for the call,
    which results must not keep as history."""

    def __init__(self, func, args, kwargs, argnums: tuple[int, ...] | None, diff_tree,
                 originals: list[Tensor]):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.argnums, self.diff_tree = argnums, diff_tree
        self.originals = {id(t) for t in originals}
        self.fresh: set[int] = set()
        self.keep: list[Tensor] = []           # keeps the fresh leaves' ids from being reused
        self.out_tree = self.aux = None        # recorded by the call
        # The vmap level the transform runs at: its inputs are lifted to it, and the tape it
        # differentiates on is that level's.
        self.level = innermost_batch_trace()

    def call(self, leaves) -> object:
        for t in leaves:
            # An input that requires grad comes as itself (view_as of it is itself): not fresh.
            if t.is_leaf and id(t) not in self.originals:
                self.fresh.add(id(t))
                self.keep.append(t)
        diff = tree_unflatten(self.diff_tree, list(leaves))
        if self.argnums is None:
            args = diff
        else:
            args = list(self.args)
            for n, value in zip(self.argnums, diff):
                args[n] = value
        return self.func(*args, **self.kwargs)

    def detach_inner(self, t):
        """``t`` detached unless it depends on something outside the transform that requires
        grad; non-tensors (None) pass through."""
        if not isinstance(t, Tensor):
            return t
        if t.requires_grad and not _reaches_outer_graph(t, self.fresh):
            t = self.cut(t)
        # The tangents an enclosing jvp reads off the result were computed inside too
        # (jvp(grad(f)): the gradient's tangent comes from the backward on the leaves):
        # they keep their history on the same condition.
        for level, tangent in list((t._fw_grads or {}).items()):
            cut = self.detach_inner(tangent)
            if cut is not tangent:
                dual.set_tangent(t, level, cut)
        return t

    def cut(self, t: Tensor) -> Tensor:
        """``t`` cut from the tape of the transform's level, and of the vmap levels inside
        it (a vjp function called under vmap gives a tensor batched there, whose underlying
        tensor has the transform's history), keeping every level's tangents."""
        if isinstance(t, BatchTensor) and t._tr is not self.level:
            value, bdim = t._tr.unwrap(t)
            out = BatchTensor._make(self.detach_inner(value), bdim, t._tr)
            out._fw_grads = t._fw_grads
            return out
        return dual.detach_keeping_tangents(t)

    def detach_tree(self, obj):
        leaves, tree = tree_flatten(obj)
        return tree_unflatten(tree, [self.detach_inner(t) for t in leaves]) if leaves else obj


def _reaches_outer_graph(t: Tensor, fresh: set[int]) -> bool:
    """Whether ``t``'s history reaches a leaf that is not one of the transform's own."""
    if t.grad_fn is None:
        return id(t) not in fresh
    seen, stack = {id(t.grad_fn)}, [t.grad_fn]
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is None or id(child) in seen:
                continue
            if isinstance(child, AccumulateGrad):
                if id(child.variable) not in fresh:
                    return True
                continue
            seen.add(id(child))
            stack.append(child)
    return False


def _split_aux(out, has_aux: bool, api: str):
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(f"{api}: output of function f should be a tuple: (output, aux) if "
                           f"has_aux is True")
    return out


def _check_aux(aux) -> None:
    bad = non_tensor_leaves(tree_flatten(aux)[1])
    if bad:
        raise RuntimeError(f"Expected tensors, got unsupported type {type(bad[0])}")


def _output_leaves(out, api: str, call: str) -> tuple[list, object]:
    leaves, tree = tree_flatten(out)
    bad = non_tensor_leaves(tree)
    if bad:
        raise RuntimeError(f"{api}: expected {call} to return only tensors, got unsupported "
                           f"type {type(bad[0])}")
    return leaves, tree


def _select_args(args, argnums):
    """(nums, the differentiated arguments' pytree, its leaves, its tree) for ``argnums``."""
    nums = _normalize_argnums(argnums, len(args))
    diff = tuple(args[n] for n in nums)
    leaves, tree = tree_flatten(diff)
    _check_transform_inputs(leaves, tree)
    return nums, [lift(t) for t in leaves], tree


def _per_argnum(argnums, nums, diff_tree, leaves: list):
    """Leaves shaped like the differentiated arguments: one argument's pytree for an int
    argnums, a tuple of them for a tuple."""
    per_arg = tree_unflatten(diff_tree, leaves)
    return per_arg[0] if isinstance(argnums, int) else tuple(per_arg)


# --------------------------------------------------------------------------- grad


def grad_and_value(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """``(gradient, value)`` of the scalar function ``func`` (``torch.func.grad_and_value``).

    The gradient has the structure of argument ``argnums`` (a tuple of them for a tuple of
    argnums); with ``has_aux``, ``func`` returns ``(value, aux)`` and the result is
    ``(gradient, (value, aux))``.
    """
    api = "grad_and_value(f)(*args)"

    @functools.wraps(func, updated=())
    def wrapper(*args, **kwargs):
        nums, leaves, tree = _select_args(args, argnums)
        call = _Call(func, args, kwargs, nums, tree, leaves)

        def flat(*inputs):
            out, aux = _split_aux(call.call(inputs), has_aux, api)
            if not isinstance(out, Tensor):
                raise RuntimeError(f"{api}: Expected f(*args) to return a Tensor, got "
                                   f"{type(out)}")
            if out.dim() != 0:
                raise RuntimeError(f"{api}: Expected f(*args) to return a scalar Tensor, got "
                                   f"tensor with {out.dim()} dims. Maybe you wanted to use the "
                                   f"vjp or jacrev APIs instead?")
            if has_aux:
                _check_aux(aux)
            call.aux = aux
            return out

        value, grads = AF.vjp(flat, tuple(leaves), create_graph=is_grad_enabled())
        grads = [call.detach_inner(g) for g in (grads if isinstance(grads, tuple) else (grads,))]
        result = _per_argnum(argnums, nums, tree, grads)
        value = call.detach_inner(value)
        return (result, (value, call.detach_tree(call.aux))) if has_aux else (result, value)

    return wrapper


def grad(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """The gradient of the scalar function ``func`` with respect to argument(s) ``argnums``
    (``torch.func.grad``); with ``has_aux``, ``(gradient, aux)``.

    >>> fusegrad.func.grad(lambda x: (x ** 3).sum())(fusegrad.tensor([1., 2.]))
    tensor([ 3., 12.])
    """
    gv = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func, updated=())
    def wrapper(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapper


# --------------------------------------------------------------------------- vjp, jvp


def vjp(func: Callable, *primals, has_aux: bool = False):
    """``(func(*primals), vjp_fn)`` (and ``aux`` with ``has_aux``), as ``torch.func.vjp``.

    ``vjp_fn(cotangents)`` takes cotangents with the structure of the output and returns a
    tuple with one gradient per primal; it may be called many times.
    """
    api = "vjp(f, *primals)"
    leaves, tree = tree_flatten(primals)
    _check_transform_inputs(leaves, tree)
    leaves = [lift(t) for t in leaves]
    call = _Call(func, primals, {}, None, tree, leaves)
    with enable_grad():
        inputs = AF._grad_preprocess(tuple(leaves), create_graph=True, need_graph=True)
        out, aux = _split_aux(call.call(inputs), has_aux, api)
        out_leaves, out_tree = _output_leaves(out, api, "f(*primals)")
        if has_aux:
            _check_aux(aux)

    def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
        ct_leaves, ct_tree = tree_flatten(cotangents)
        if ct_tree != out_tree or non_tensor_leaves(ct_tree):
            raise RuntimeError(f"Expected pytree structure of cotangents to be the same as "
                               f"pytree structure of outputs to the function. cotangents: "
                               f"{tree_str(ct_tree)}, primal output: {tree_str(out_tree)}")
        for k, (ct, o) in enumerate(zip(ct_leaves, out_leaves)):
            if ct.shape != o.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of "
                                   f"{ct.shape} and output[{k}] has a shape of {o.shape}.")
        graph = is_grad_enabled() if create_graph is None else create_graph
        with enable_grad():
            grads = AF._autograd_grad(tuple(out_leaves), inputs, tuple(ct_leaves),
                                      create_graph=graph)
        grads = AF._fill_in_zeros(grads, inputs, False, "back")
        return tree_unflatten(tree, [call.detach_inner(g) for g in grads])

    value = call.detach_tree(out)
    return (value, vjp_fn, call.detach_tree(aux)) if has_aux else (value, vjp_fn)


def jvp(func: Callable, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """``(func(*primals), J tangents)`` (and ``aux`` with ``has_aux``), as ``torch.func.jvp``.

    Forward mode: one call of ``func`` whose primitives carry the tangents along (see the
    module docstring). ``strict`` is accepted and ignored, as in torch.
    """
    api = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{api}: Expected primals to be a tuple. E.g. it should be valid to "
                           f"call f(*primals).")
    leaves, tree = tree_flatten(primals)
    t_leaves, t_tree = tree_flatten(tangents)
    if t_tree != tree or not isinstance(tangents, tuple):
        raise RuntimeError(f"{api}: Expected primals and tangents to have the same python "
                           f"structure. For example, if primals is a tuple of 3 tensors, "
                           f"tangents also must be. Got primals with structure "
                           f"{tree_str(tree)} and tangents with structure {tree_str(t_tree)}")
    if not leaves:
        raise RuntimeError(f"{api}: Expected primals to contain at least one Tensor.")
    _check_transform_inputs(leaves, tree)
    for p, t in zip(leaves, t_leaves):
        if p.shape != t.shape:
            raise RuntimeError(f"Trying to set a forward gradient that has a different size than "
                               f"that of the original Tensor, this is not supported. Tensor is "
                               f"of size {list(p.shape)} while the given forward gradient is of "
                               f"size {list(t.shape)}.")
    leaves = [lift(t) for t in leaves]
    call = _Call(func, primals, {}, None, tree, leaves)

    def flat(*inputs):
        out, aux = _split_aux(call.call(inputs), has_aux, api)
        out_leaves, call.out_tree = _output_leaves(out, api, "f(*primals)")
        if has_aux:
            _check_aux(aux)
        call.aux = aux
        return tuple(out_leaves)

    outs, jvps = dual.forward_product(flat, leaves, t_leaves)
    value = tree_unflatten(call.out_tree, [call.detach_inner(o) for o in outs])
    tangent_out = tree_unflatten(call.out_tree, [call.detach_inner(j) for j in jvps])
    if has_aux:
        return value, tangent_out, call.detach_tree(call.aux)
    return value, tangent_out


# --------------------------------------------------------------------------- Jacobians


def _jacobian(func, argnums, has_aux: bool, api: str, forward: bool = False) -> Callable:
    """The Jacobian transform behind jacrev and jacfwd: per output tensor, the Jacobian
    blocks ``output.shape + input.shape`` shaped like the differentiated arguments."""

    @functools.wraps(func, updated=())
    def wrapper(*args, **kwargs):
        nums, leaves, tree = _select_args(args, argnums)
        call = _Call(func, args, kwargs, nums, tree, leaves)

        def flat(*inputs):
            out, aux = _split_aux(call.call(inputs), has_aux, api)
            out_leaves, call.out_tree = _output_leaves(out, api, "f(*primals)")
            if has_aux:
                _check_aux(aux)
            call.aux = aux
            return tuple(out_leaves)

        if forward:
            blocks = _forward_jacobian(flat, tuple(leaves))
        else:
            blocks = AF.jacobian(flat, tuple(leaves), create_graph=is_grad_enabled())
        jac = tree_unflatten(call.out_tree, [
            _per_argnum(argnums, nums, tree, [call.detach_inner(b) for b in row])
            for row in blocks])
        return (jac, call.detach_tree(call.aux)) if has_aux else jac

    return wrapper


def jacrev(func: Callable, argnums=0, *, has_aux: bool = False, chunk_size: int | None = None,
           _preallocate_and_copy: bool = False) -> Callable:
    """The Jacobian of ``func`` by reverse mode (``torch.func.jacrev``): one backward pass
    per output element. For each output tensor, blocks of shape
    ``output.shape + input.shape`` with the structure of argument(s) ``argnums``.
    ``chunk_size`` is checked and otherwise changes nothing.
    """
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")
    return _jacobian(func, argnums, has_aux, "vjp(f, *primals)")


def _forward_jacobian(flat: Callable, inputs: tuple) -> list[list]:
    """Per output of ``flat``, the Jacobian blocks ``output.shape + input.shape`` by forward
    mode: one call of ``flat`` per input element, along that element's basis vector."""
    columns: list[list] = [[] for _ in inputs]     # per input: per element, the outputs' tangents
    outs = None
    for j, x in enumerate(inputs):
        for k in range(x.numel()):
            tangents = [zeros_like(p) for p in inputs]
            tangents[j] = _basis(x, k)
            outs, jvps = dual.forward_product(flat, inputs, tangents)
            columns[j].append(jvps)
    if outs is None:            # no input element: the outputs' shapes from one plain call
        outs = flat(*inputs)
    blocks = []
    for i, o in enumerate(outs):
        row = []
        for j, x in enumerate(inputs):
            if x.numel() == 0:
                row.append(o.new_zeros(tuple(o.shape) + tuple(x.shape)))
                continue
            # (elements of x, *o.shape) -> (*o.shape, *x.shape)
            col = stack([c[i] for c in columns[j]], 0)
            col = col.reshape((x.numel(), o.numel())).transpose(0, 1)
            row.append(col.reshape(tuple(o.shape) + tuple(x.shape)))
        blocks.append(row)
    return blocks


def _basis(x: Tensor, k: int) -> Tensor:
    """The ``k``-th basis tensor (row-major) of ``x``'s shape."""
    e = zeros_like(x).reshape(-1)
    e[k] = 1.0
    return e.reshape(tuple(x.shape))


def jacfwd(func: Callable, argnums=0, has_aux: bool = False, *,
           randomness: str = "error") -> Callable:
    """The Jacobian of ``func`` by forward mode (``torch.func.jacfwd``): one forward pass
    per input element, each carrying that element's basis vector as the tangent. For each
    output tensor, blocks of shape ``output.shape + input.shape`` with the structure of
    argument(s) ``argnums``. ``randomness`` is vmap's: "error" (the default) refuses random
    ops inside ``func``, as torch's jacfwd does.
    """
    check_randomness(randomness)
    jac = _jacobian(func, argnums, has_aux, "jvp(f, primals, tangents)", forward=True)

    @functools.wraps(func, updated=())
    def wrapper(*args, **kwargs):
        with randomness_mode(randomness):
            return jac(*args, **kwargs)

    return wrapper


def hessian(func: Callable, argnums=0) -> Callable:
    """The Hessian of the scalar ``func`` with respect to ``argnums``
    (``torch.func.hessian``): ``jacfwd(jacrev(func, argnums), argnums)``.

    >>> fusegrad.func.hessian(lambda x: (x ** 3).sum())(fusegrad.tensor([1., 2.]))
    tensor([[ 6.,  0.],
            [ 0., 12.]])
    """
    return jacfwd(jacrev(func, argnums), argnums)
