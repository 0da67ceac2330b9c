"""``functional_call`` and ``stack_module_state``: a module called with parameters and buffers
given as arguments, so that the transforms can differentiate and map over them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor

__all__ = ["functional_call", "stack_module_state"]

_ABSENT = object()      # an attribute the module did not have before the call


def _merge_dicts(parameter_and_buffer_dicts) -> dict[str, Any]:
    if isinstance(parameter_and_buffer_dicts, dict):
        return dict(parameter_and_buffer_dicts)
    if not isinstance(parameter_and_buffer_dicts, (list, tuple)):
        raise ValueError(f"Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of "
                         f"dicts, but got {type(parameter_and_buffer_dicts)}")
    if not all(isinstance(d, dict) for d in parameter_and_buffer_dicts):
        raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
    counts: dict[str, int] = {}
    for d in parameter_and_buffer_dicts:
        for k in d:
            counts[k] = counts.get(k, 0) + 1
    repeated = [k for k, n in counts.items() if n > 1]
    if repeated:
        raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional "
                         f"call is ambiguous")
    return {k: v for d in parameter_and_buffer_dicts for k, v in d.items()}


def _tie_groups(module) -> dict[str, list[str]]:
    """For each parameter or buffer name, every name of the same tensor (tied weights)."""
    names_of: dict[int, list[str]] = {}
    for name, t in list(module.named_parameters(remove_duplicate=False)) + \
            list(module.named_buffers(remove_duplicate=False)):
        names_of.setdefault(id(t), []).append(name)
    return {name: names for names in names_of.values() for name in names}


def _expand_tied(module, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each tied name given the value of the name of its group that was given."""
    groups = _tie_groups(module)
    out = dict(values)
    done: set[str] = set()
    for name in values:
        if name not in groups or name in done:
            continue
        given = [n for n in groups[name] if n in values]
        done.update(groups[name])
        if any(values[n] is not values[given[0]] for n in given[1:]):
            raise ValueError(f"functional_call got multiple values for keys {sorted(given)}, "
                             f"which are tied. Consider using tie_weights=False")
        for n in groups[name]:
            out[n] = values[given[0]]
    return out


def _check_strict(module, values: dict[str, Any]) -> None:
    expected = set(_tie_groups(module))
    unexpected = sorted(set(values) - expected)
    missing = sorted(expected - set(values))
    if unexpected or missing:
        lines = [f"Error(s) in reparametrizing for {type(module).__name__}:"]
        if unexpected:
            lines.append("\tUnexpected key(s): " + ", ".join(f"'{k}'" for k in unexpected) + ".")
        if missing:
            lines.append("\tMissing key(s): " + ", ".join(f"'{k}'" for k in missing) + ".")
        raise RuntimeError("\n".join(lines))


@contextlib.contextmanager
def _swapped_state(module, values: dict[str, Any]):
    """Each dotted name's parameter, buffer or attribute replaced for the block and restored
    after it, also when the block raises."""
    saved = []
    try:
        for name, value in values.items():
            prefix, _, leaf = name.rpartition(".")
            owner = module.get_submodule(prefix) if prefix else module
            for table in (owner._parameters, owner._buffers):
                if leaf in table:
                    saved.append((table, leaf, table[leaf]))
                    table[leaf] = value
                    break
            else:
                # A name the module does not have becomes an attribute for the call, as torch's.
                old = owner.__dict__.get(leaf, _ABSENT)
                saved.append((owner.__dict__, leaf, old))
                owner.__dict__[leaf] = value
        yield
    finally:
        for table, key, old in reversed(saved):
            if old is _ABSENT:
                del table[key]
            else:
                table[key] = old


def functional_call(module, parameter_and_buffer_dicts, args: Any = None,
                    kwargs: dict[str, Any] | None = None, *, tie_weights: bool = True,
                    strict: bool = False) -> Any:
    """``module(*args, **kwargs)`` with its parameters and buffers replaced by the tensors in
    ``parameter_and_buffer_dicts`` (a dict from dotted names, or a list or tuple of them) for
    the call; the module's own tensors are back afterwards, also when the call raises
    (``torch.func.functional_call``).

    With ``tie_weights``, a value given for one name of tied tensors is used for all its
    names; ``strict`` requires a value for every parameter and buffer and no other name.

    >>> model = fusegrad.nn.Linear(2, 1)
    >>> params = {"weight": fusegrad.ones(1, 2), "bias": fusegrad.zeros(1)}
    >>> fusegrad.func.functional_call(model, params, (fusegrad.tensor([1., 2.]),))
    tensor([3.])
    """
    values = _merge_dicts(parameter_and_buffer_dicts)
    for v in values.values():
        if not isinstance(v, Tensor):
            raise TypeError(f"{v} is not an instance of torch.Tensor")
    if tie_weights:
        values = _expand_tied(module, values)
    if strict:
        _check_strict(module, values)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _swapped_state(module, values):
        return module(*args, **(kwargs or {}))


def stack_module_state(models: Sequence) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(params, buffers)``: each parameter and buffer of ``models`` (modules of one
    architecture) stacked along a new leading dimension, for ``vmap`` over an ensemble with
    :func:`functional_call` (``torch.func.stack_module_state``). The stacked parameters are
    new leaves that require grad as the models' do; tied parameters appear once.
    """
    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if any(m.training != models[0].training for m in models):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/"
                           "eval mode.")
    if any(type(m) is not type(models[0]) for m in models):
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    all_params = [dict(m.named_parameters()) for m in models]
    all_buffers = [dict(m.named_buffers()) for m in models]

    def stacked_leaf(tensors, name: str) -> Tensor:
        if any(t.requires_grad != tensors[0].requires_grad for t in tensors):
            raise RuntimeError(f"Expected {name} from each model to have the same "
                               f".requires_grad")
        out = F.stack([t.detach() for t in tensors])
        return out.requires_grad_() if tensors[0].requires_grad else out

    params = {k: stacked_leaf([p[k] for p in all_params], k) for k in all_params[0]}
    buffers = {k: stacked_leaf([b[k] for b in all_buffers], k) for k in all_buffers[0]}
    return params, buffers
