"""``fusegrad.autograd.functional``: vjp, jvp, jacobian, hessian, vhp and hvp over functions of
tensors, with ``torch.autograd.functional``'s signatures, result structures and messages.

vjp, jacobian, hessian and vhp are reverse mode (:func:`fusegrad.autograd.grad`); jvp and
hvp are forward mode (:func:`fusegrad.ops.dual.forward_product`, on the primitives' JVP
rules), hvp forward over reverse: the tangent of the gradient along ``v``. (torch computes these two by the
double-backward trick; its strict-mode messages, which speak of it, are kept.)
``vectorize`` and the strategies are accepted for the signature; the results do not depend
on them.

>>> f = lambda x: (x ** 3).sum()
>>> fusegrad.autograd.functional.hessian(f, fusegrad.tensor([1., 2.]))
tensor([[ 6.,  0.],
        [ 0., 12.]])
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fusegrad.autograd.engine import grad as _grad
from fusegrad.grad_mode import enable_grad
from fusegrad.ops import creation, dual
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]


def _as_tuple(x, arg_name: str, fn_name: str) -> tuple[bool, tuple]:
    is_tuple = isinstance(x, tuple)
    if not is_tuple:
        x = (x,)
    for i, el in enumerate(x):
        if not isinstance(el, Tensor):
            if is_tuple:
                raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a "
                                f"tuple of Tensors but the value at index {i} has type "
                                f"{type(el)}.")
            raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a "
                            f"tuple of Tensors but the given {arg_name} has type {type(el)}.")
    return is_tuple, x


def _tuple_postprocess(res, to_unpack):
    """Undo _as_tuple: a bool for a flat result, a pair of bools for a nested one."""
    if isinstance(to_unpack, tuple):
        if not to_unpack[1]:
            res = tuple(el[0] for el in res)
        if not to_unpack[0]:
            res = res[0]
    elif not to_unpack:
        res = res[0]
    return res


def _grad_preprocess(inputs: tuple, create_graph: bool, need_graph: bool) -> tuple:
    """Fresh leaves for the inputs; with create_graph, views that keep the user's graph."""
    res = []
    for inp in inputs:
        if create_graph and inp.requires_grad:
            res.append(inp.view_as(inp) if inp.is_floating_point() else inp)
        else:
            t = dual.detach_keeping_tangents(inp)    # an enclosing jvp's tangents stay
            res.append(t.requires_grad_(need_graph) if t.is_floating_point() else t)
    return tuple(res)


def _grad_postprocess(inputs, create_graph: bool):
    if isinstance(inputs[0], Tensor):
        return inputs if create_graph else tuple(dual.detach_keeping_tangents(inp)
                                                 for inp in inputs)
    return tuple(_grad_postprocess(inp, create_graph) for inp in inputs)


def _validate_v(v: tuple, other: tuple, is_other_tuple: bool) -> None:
    if len(other) != len(v):
        if is_other_tuple:
            raise RuntimeError(f"v is a tuple of invalid length: should be {len(other)} but got "
                               f"{len(v)}.")
        raise RuntimeError("The given v should contain a single Tensor.")
    for idx, (el_v, el_other) in enumerate(zip(v, other)):
        if el_v.shape != el_other.shape:
            prepend = f"Entry {idx} in " if is_other_tuple else ""
            raise RuntimeError(f"{prepend}v has invalid size: should be {el_other.size()} but "
                               f"got {el_v.size()}.")


_REQUIRES_GRAD_MESSAGES = {
    "hessian": "The hessian of the user-provided function with respect to input {i} is "
               "independent of the input. This is not allowed in strict mode. You should ensure "
               "that your function is thrice differentiable and that the hessian depends on the "
               "inputs.",
    "jacobian": "While computing the hessian, found that the jacobian of the user-provided "
                "function with respect to input {i} is independent of the input. This is not "
                "allowed in strict mode. You should ensure that your function is twice "
                "differentiable and that the jacobian depends on the inputs (this would be "
                "violated by a linear function for example).",
    "grad_inputs": "The gradient with respect to input {i} is independent of the inputs of the "
                   "user-provided function. This is not allowed in strict mode.",
    "outputs": "Output {i} of the user-provided function does not require gradients. The outputs "
               "must be computed in a differentiable manner from the input when running in "
               "strict mode.",
}


def _check_requires_grad(values: tuple, kind: str, strict: bool) -> None:
    if not strict:
        return
    for i, t in enumerate(values):
        if t is None:
            raise RuntimeError(f"The output of the user-provided function is independent of "
                               f"input {i}. This is not allowed in strict mode.")
        if not t.requires_grad:
            raise RuntimeError(_REQUIRES_GRAD_MESSAGES[kind].format(i=i))


def _autograd_grad(outputs: tuple, inputs: tuple, grad_outputs: tuple | None = None,
                   create_graph: bool = False) -> tuple:
    """autograd.grad over the outputs that require grad; None for unreachable inputs."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    new_outputs, new_grads = [], []
    for out, g in zip(outputs, grad_outputs):
        if out is not None and out.requires_grad:
            new_outputs.append(out)
            new_grads.append(g)
    if not new_outputs:
        return (None,) * len(inputs)
    targets = [i for i, inp in enumerate(inputs) if inp.requires_grad]
    res = [None] * len(inputs)
    if targets:
        got = _grad(new_outputs, [inputs[i] for i in targets], new_grads, retain_graph=True,
                    create_graph=create_graph, allow_unused=True)
        for i, g in zip(targets, got):
            res[i] = g
    return tuple(res)


_FILL_MESSAGES = {
    "back": "The output of the user-provided function is independent of input {i}. This is not "
            "allowed in strict mode.",
    "back_trick": "The gradient with respect to the input is independent of entry {i} in the "
                  "grad_outputs when using the double backward trick to compute forward mode "
                  "gradients. This is not allowed in strict mode.",
    "double_back": "The jacobian of the user-provided function is independent of input {i}. "
                   "This is not allowed in strict mode.",
    "double_back_trick": "The hessian of the user-provided function is independent of entry {i} "
                         "in the grad_jacobian. This is not allowed in strict mode as it prevents "
                         "from using the double backward trick to replace forward mode AD.",
}


def _fill_in_zeros(grads: tuple, refs: tuple, strict: bool, stage: str) -> tuple:
    res = []
    for i, (g, ref) in enumerate(zip(grads, refs)):
        if g is None:
            if strict:
                raise RuntimeError(_FILL_MESSAGES[stage].format(i=i))
            g = _zeros_like(ref)
        res.append(g)
    return tuple(res)


def _zeros_like(t: Tensor) -> Tensor:
    return creation.zeros_like(t)


def _check_single_element_outputs(outputs: tuple, fn_name: str) -> None:
    if len(outputs) != 1:
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
    if outputs[0].numel() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should "
                           f"contain a single element")


def vjp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T J)``: the vector-Jacobian product at ``inputs``.

    ``v`` has the outputs' structure; it may be None when ``func`` returns one single-element
    tensor. The product has the inputs' structure.
    """
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function",
                                              "vjp")
        _check_requires_grad(outputs, "outputs", strict=strict)
        if v is not None:
            _, v = _as_tuple(v, "v", "vjp")
            v = _grad_preprocess(v, create_graph=create_graph, need_graph=False)
            _validate_v(v, outputs, is_outputs_tuple)
        elif len(outputs) != 1 or outputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the user-provided function "
                               "returns a single Tensor with a single element.")
        grad_res = _autograd_grad(outputs, inputs, v, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, inputs, strict, "back")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return (_tuple_postprocess(outputs, is_outputs_tuple),
            _tuple_postprocess(result, is_inputs_tuple))


def _check_strict_with_graph(strict: bool, create_graph: bool, fn_name: str) -> None:
    if strict and create_graph:
        raise RuntimeError(f"torch.autograd.functional.{fn_name} is not supported with "
                           f"strict=True and create_graph=True: the double backward trick it "
                           f"uses cannot check strictness while building a graph.")


def jvp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), J v)``: the Jacobian-vector product at ``inputs``.

    ``v`` has the inputs' structure; it may be None when the input is one single-element
    tensor. The product has the outputs' structure.
    """
    _check_strict_with_graph(strict, create_graph, "jvp")
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        if v is not None:
            _, v = _as_tuple(v, "v", "jvp")
            v = _grad_preprocess(v, create_graph=create_graph, need_graph=False)
            _validate_v(v, inputs, is_inputs_tuple)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided "
                               "function is a single Tensor with a single element.")
        else:
            v = (creation.ones_like(inputs[0]),)
        shape: list = []

        def flat(*xs):
            is_tuple, outs = _as_tuple(func(*xs), "outputs of the user-provided function", "jvp")
            _check_requires_grad(outs, "outputs", strict=strict)
            shape.append(is_tuple)
            return outs

        outputs, tangents = dual.forward_product(flat, inputs, v, zeros=False)
        is_outputs_tuple = shape[0]
        result = _fill_in_zeros(tangents, outputs, strict, "back_trick")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return (_tuple_postprocess(outputs, is_outputs_tuple),
            _tuple_postprocess(result, is_outputs_tuple))


def jacobian(func: Callable, inputs, create_graph: bool = False, strict: bool = False,
             vectorize: bool = False, strategy: str = "reverse-mode"):
    """The Jacobian of ``func`` at ``inputs``.

    One tensor in, one out: a tensor of shape ``output.shape + input.shape``. With a tuple of
    inputs and/or outputs: a tuple (of tuples) whose entry ``[i][j]`` is d output_i / d input_j.
    """
    if strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode". '
                             'Hint: If your function has more outputs than inputs, '
                             '"forward-mode" tends to be more performant. Otherwise, prefer to '
                             'use "reverse-mode".')
    if strategy == "forward-mode":
        if create_graph:
            raise NotImplementedError("torch.autograd.functional.jacobian: `strategy="
                                      "\"forward-mode\"` does not support `create_graph=True`")
        if not vectorize:
            raise NotImplementedError("torch.autograd.functional.jacobian: `strategy="
                                      "\"forward-mode\"` requires `vectorize=True`.")
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function",
                                              "jacobian")
        _check_requires_grad(outputs, "outputs", strict=strict)
        jacobian_rows: list[tuple] = []
        for i, out in enumerate(outputs):
            n = out.numel()
            rows: list[list] = [[] for _ in inputs]
            for j in range(n):
                # One reverse pass per output element, seeded with a one-hot cotangent.
                seed = np.zeros(out.shape, dtype=out.dtype.np_dtype)
                seed.reshape(-1)[j] = 1
                grads = _autograd_grad((out,), inputs, (creation.tensor(seed),), create_graph=create_graph)
                for k, (g, inp) in enumerate(zip(grads, inputs)):
                    if g is None:
                        if strict:
                            raise RuntimeError(f"Output {i} of the user-provided function is "
                                               f"independent of input {k}. This is not allowed "
                                               f"in strict mode.")
                        g = _zeros_like(inp)
                    rows[k].append(g)
            jacobian_rows.append(tuple(
                F.reshape(F.stack(r), tuple(out.shape) + tuple(inp.shape)) if r
                else creation.zeros(tuple(out.shape) + tuple(inp.shape), dtype=inp.dtype)
                for r, inp in zip(rows, inputs)))
    result = _grad_postprocess(tuple(jacobian_rows), create_graph)
    return _tuple_postprocess(result, (is_outputs_tuple, is_inputs_tuple))


def hessian(func: Callable, inputs, create_graph: bool = False, strict: bool = False,
            vectorize: bool = False, outer_jacobian_strategy: str = "reverse-mode"):
    """The Hessian of the scalar function ``func`` at ``inputs``: a tensor of shape
    ``input.shape + input.shape``, or for a tuple of inputs a tuple of tuples of blocks."""
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode".')

    def single_output(*inp):
        out = func(*inp)
        _, t_out = _as_tuple(out, "outputs of the user-provided function", "hessian")
        _check_requires_grad(t_out, "outputs", strict=strict)
        _check_single_element_outputs(t_out, "hessian")
        return t_out[0].reshape(())

    def jac_func(*inp):
        jac = jacobian(single_output, inp, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict=strict)
        return jac

    res = jacobian(jac_func, inputs, create_graph=create_graph, strict=strict,
                   vectorize=vectorize, strategy=outer_jacobian_strategy)
    return _tuple_postprocess(res, (is_inputs_tuple, is_inputs_tuple))


def vhp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T H)``: the vector-Hessian product of the scalar ``func``."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vhp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        if v is not None:
            _, v = _as_tuple(v, "v", "vhp")
            v = _grad_preprocess(v, create_graph=create_graph, need_graph=False)
            _validate_v(v, inputs, is_inputs_tuple)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided "
                               "function is a single Tensor with a single element.")
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function",
                                              "vhp")
        _check_requires_grad(outputs, "outputs", strict=strict)
        _check_single_element_outputs(outputs, "vhp")
        jac = _autograd_grad(outputs, inputs, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict=strict)
        grad_res = _autograd_grad(jac, inputs, v, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, inputs, strict, "double_back")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return (_tuple_postprocess(outputs, is_outputs_tuple),
            _tuple_postprocess(result, is_inputs_tuple))


def hvp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), H v)``: the Hessian-vector product of the scalar ``func``, by forward
    mode over reverse mode: the tangent along ``v`` of the gradient (equal to :func:`vhp` for
    twice continuously differentiable functions, whose Hessian is symmetric)."""
    _check_strict_with_graph(strict, create_graph, "hvp")
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hvp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        if v is not None:
            _, v = _as_tuple(v, "v", "hvp")
            v = _grad_preprocess(v, create_graph=create_graph, need_graph=False)
            _validate_v(v, inputs, is_inputs_tuple)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided "
                               "function is a single Tensor with a single element.")
        else:
            v = (creation.ones_like(inputs[0]),)
        found: list = []

        def gradient(*xs):
            # forward over reverse: the gradient's tangent along v is H v
            is_tuple, outs = _as_tuple(func(*xs), "outputs of the user-provided function", "hvp")
            _check_requires_grad(outs, "outputs", strict=strict)
            _check_single_element_outputs(outs, "hvp")
            jac = _autograd_grad(outs, xs, create_graph=True)
            _check_requires_grad(jac, "jacobian", strict=strict)
            found.append((is_tuple, outs))
            return _fill_in_zeros(jac, xs, False, "double_back")

        _, tangents = dual.forward_product(gradient, inputs, v, zeros=False)
        is_outputs_tuple, outputs = found[0]
        result = _fill_in_zeros(tangents, inputs, strict, "double_back_trick")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return (_tuple_postprocess(outputs, is_outputs_tuple),
            _tuple_postprocess(result, is_inputs_tuple))
