"""How much of PyTorch's API fusegrad has: the "not implemented yet" AttributeError and
``docs/supported.md``.

fusegrad's namespaces mirror torch's (``fusegrad.nn.functional`` is ``torch.nn.functional``).
:data:`fusegrad._torch_names.TORCH_NAMES` lists torch's public names per namespace, taken once
from a torch install by ``tools/gen_torch_names.py``, so that fusegrad never imports torch to
know them. The module-level ``__getattr__`` of each namespace calls :func:`missing_attribute`,
which tells a torch name fusegrad lacks from a typo; Tensor gets placeholders instead
(:func:`install_tensor_placeholders`), which keep its attribute reads fast.

Regenerate the supported-API page with ``python -m fusegrad.torch_api > docs/supported.md``.
"""

from __future__ import annotations

import importlib
import inspect

__all__ = ["NAMESPACES", "missing_attribute", "install_tensor_placeholders", "torch_names",
           "fusegrad_names", "supported_markdown"]

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
    "torch.profiler": "fusegrad.profiler",
    "torch.func": "fusegrad.func",
}


def torch_names(namespace: str) -> frozenset[str]:
    """torch's public names in ``namespace`` (a key of :data:`NAMESPACES`), per torch 2.13."""
    from fusegrad._torch_names import TORCH_NAMES
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


def _resolve(path: str):
    """The module ``path`` names, or the class when its last name is capitalized
    (``fusegrad.Tensor``, ``fusegrad.nn.Module``)."""
    parent, _, name = path.rpartition(".")
    if name[:1].isupper():
        return getattr(importlib.import_module(parent), name)
    return importlib.import_module(path)


def _is_own(value) -> bool:
    """Whether a module attribute is fusegrad API rather than an import (math, typing.Sequence)."""
    if inspect.ismodule(value):
        return False  # submodules are counted by whether they exist (see fusegrad_names)
    if inspect.isclass(value) or inspect.isroutine(value):
        return (getattr(value, "__module__", None) or "").split(".")[0] == "fusegrad"
    return type(value).__module__.split(".")[0] not in ("typing", "typing_extensions", "__future__")


def fusegrad_names(namespace: str) -> set[str]:
    """fusegrad's public names in the namespace that mirrors torch's ``namespace``.

    Independent of what was imported before: submodules are counted by whether they exist, not
    by whether they were imported yet, and lazily provided names by asking for them."""
    import importlib.util
    path = NAMESPACES[namespace]
    obj = _resolve(path)
    if path == "fusegrad.Tensor":  # placeholders for missing names make hasattr False
        return {n for n in dir(obj) if not n.startswith("_") and hasattr(obj, n)}
    if isinstance(obj, type):        # a class: its methods and attributes
        return {n for n in dir(obj) if not n.startswith("_")}
    names = {n for n in dir(obj) if not n.startswith("_") and _is_own(getattr(obj, n))}
    is_package = hasattr(obj, "__path__")
    for name in torch_names(namespace):
        if hasattr(obj, name) or (is_package and importlib.util.find_spec(f"{path}.{name}")):
            names.add(name)
    return names


def _name_list(names) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names)) if names else "(none)"


def supported_markdown() -> str:
    """The text of ``docs/supported.md``: per torch namespace, which names fusegrad has and which
    it lacks, then the primitives of the op registry that everything is built from."""
    import fusegrad  # noqa: F401  (installs Tensor methods; registers every primitive)
    from fusegrad.ops.primitive import PRIMITIVES
    lines = [
        "# What fusegrad supports",
        "",
        "Generated by `python -m fusegrad.torch_api > docs/supported.md` from fusegrad's",
        "namespaces and op registry, compared with torch 2.13's public names",
        "(`fusegrad/_torch_names.py`); a test fails when this page is out of date.",
        "Asking fusegrad for a torch name listed as missing raises an AttributeError that says",
        "it is not implemented yet.",
        "",
        "| torch namespace | fusegrad | torch names fusegrad has | missing |",
        "|---|---|---|---|",
    ]
    sections = []
    for namespace, path in NAMESPACES.items():
        torch_set = torch_names(namespace)
        ours = fusegrad_names(namespace)
        have, missing = torch_set & ours, torch_set - ours
        extra = ours - torch_set
        share = f"{len(have)} / {len(torch_set)}"
        lines.append(f"| `{namespace}` | `{path}` | {share} | {len(missing)} |")
        sections += [
            "", f"## `{namespace}` (`{path}`)", "",
            f"Has {len(have)} of torch's {len(torch_set)} names:", "", _name_list(have), "",
            f"Missing ({len(missing)}):", "", _name_list(missing), "",
        ]
        if extra:
            sections += [f"fusegrad only ({len(extra)}):", "", _name_list(extra), ""]
    prims = sorted(PRIMITIVES.values(), key=lambda p: p.name)
    sections += ["", "## Primitives", "",
                 f"The {len(prims)} primitives of the op registry (`fusegrad/ops/prims.py`); every",
                 "public op above is a composition of them, and each lowers to fused kernels:", "",
                 _name_list(p.name for p in prims), ""]
    return "\n".join(lines + sections).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(supported_markdown(), end="")
