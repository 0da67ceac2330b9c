"""torch's public names per namespace, and the "not implemented yet" AttributeError that
fusegrad's namespaces raise for the ones it lacks.

fusegrad's namespaces mirror torch's (``fusegrad.nn.functional`` is ``torch.nn.functional``).
:data:`fusegrad._torch_names.TORCH_NAMES` lists torch's public names per namespace, taken once
from a torch install by ``tools/gen_torch_names.py``, so that fusegrad never imports torch to
know them. The module-level ``__getattr__`` of each namespace calls :func:`missing_attribute`,
which tells a torch name fusegrad lacks from a typo; Tensor gets placeholders instead
(:func:`install_tensor_placeholders`), which keep its attribute reads fast.

``docs/supported.md`` is generated from these names by :mod:`fusegrad.testing.supported_api`.
"""

from __future__ import annotations

from fusegrad._torch_names import TORCH_NAMES

__all__ = ["NAMESPACES", "missing_attribute", "install_tensor_placeholders", "torch_names"]

SUPPORTED_DOC = "docs/supported.md"

# torch namespace -> the fusegrad object that mirrors it (a module path, or "fusegrad.Tensor").
NAMESPACES: dict[str, str] = {
    "torch": "fusegrad",
    "torch.Tensor": "fusegrad.Tensor",
    "torch.nn": "fusegrad.nn",
    "torch.nn.Module": "fusegrad.nn.Module",
    "torch.nn.functional": "fusegrad.nn.functional",
    "torch.nn.init": "fusegrad.nn.init",
    "torch.nn.utils": "fusegrad.nn.utils",
    "torch.nn.utils.rnn": "fusegrad.nn.utils.rnn",
    "torch.optim": "fusegrad.optim",
    "torch.optim.Optimizer": "fusegrad.optim.Optimizer",
    "torch.optim.lr_scheduler": "fusegrad.optim.lr_scheduler",
    "torch.utils.data": "fusegrad.utils.data",
    "torch.utils.checkpoint": "fusegrad.utils.checkpoint",
    "torch.linalg": "fusegrad.linalg",
    "torch.special": "fusegrad.special",
    "torch.fft": "fusegrad.fft",
    "torch.autograd": "fusegrad.autograd",
    "torch.autograd.functional": "fusegrad.autograd.functional",
    "torch.autograd.forward_ad": "fusegrad.autograd.forward_ad",
    "torch.profiler": "fusegrad.profiler",
    "torch.func": "fusegrad.func",
}


def torch_names(namespace: str) -> frozenset[str]:
    """torch's public names in ``namespace`` (a key of :data:`NAMESPACES`), per torch 2.13."""
    return TORCH_NAMES.get(namespace, frozenset())


def missing_attribute(namespace: str, owner: str, name: str) -> AttributeError:
    """The AttributeError for ``owner.name`` that lookup did not find.

    ``namespace`` is the torch namespace ``owner`` mirrors. A name torch has there gets a message
    saying fusegrad does not implement it yet; any other name gets Python's plain message.

    For example ``missing_attribute("torch", "fusegrad", "stft")`` gives "fusegrad has no
    attribute 'stft': torch.stft is not implemented in fusegrad yet (see docs/supported.md ...)".
    """
    # An owner that is not a fusegrad module is a class name (Tensor, Parameter): an instance.
    is_module = owner == "fusegrad" or owner.startswith("fusegrad.")
    plain = f"module '{owner}' has no attribute '{name}'" if is_module else \
        f"'{owner}' object has no attribute '{name}'"
    # Dunders are protocol probes (copy, pickle, numpy, doctest), never torch API a user asked for.
    if name.startswith("__") or name not in torch_names(namespace):
        return AttributeError(plain)
    who = owner if is_module else f"'{owner}' object"
    return AttributeError(f"{who} has no attribute '{name}': {namespace}.{name} is not implemented "
                          f"in fusegrad yet (see {SUPPORTED_DOC} for what is)")


class _NotImplementedYet:
    """Stands on ``Tensor`` for a torch Tensor attribute fusegrad lacks: reading it raises the
    "not implemented yet" AttributeError (so ``hasattr`` is False).

    A class-level ``Tensor.__getattr__`` would give the message for free in principle, but on
    CPython it turns every attribute read on every tensor into the slow generic path (``t._data``
    went from 40 to 130 ns in benchmarks/bench_attribute_access.py). Names that exist are not
    touched by these descriptors; being non-data descriptors, instance attributes still win."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __get__(self, instance, owner=None):
        owner_name = (owner if instance is None else type(instance)).__name__
        raise missing_attribute("torch.Tensor", owner_name, self.name)


def install_tensor_placeholders(tensor_class: type) -> None:
    """Put a :class:`_NotImplementedYet` on ``tensor_class`` for each torch Tensor name it lacks.

    Called once by ``import fusegrad``, after every Tensor method is installed."""
    for name in torch_names("torch.Tensor"):
        if not any(name in klass.__dict__ for klass in tensor_class.__mro__):
            setattr(tensor_class, name, _NotImplementedYet(name))
