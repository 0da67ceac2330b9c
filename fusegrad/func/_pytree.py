"""Pytree helpers shared by the ``fusegrad.func`` transforms, on the tracer's tree_flatten.

The tracer's trees keep every non-tensor leaf as a "static" node; the transforms need to
refuse those by name (torch refuses them) and to print a structure as torch's messages do.
"""

from __future__ import annotations

from typing import Any

from fusegrad.tracer.trace import TreeDef, tree_flatten, tree_unflatten

__all__ = ["tree_flatten", "tree_unflatten", "non_tensor_leaves", "tree_str", "tree_map"]


def non_tensor_leaves(tree: TreeDef) -> list[Any]:
    """The leaves of ``tree`` that are not tensors (None included: torch.func refuses it)."""
    if tree.kind == "static":
        return [tree.meta]
    return [leaf for child in tree.children for leaf in non_tensor_leaves(child)]


def tree_str(tree: TreeDef) -> str:
    """The structure as torch's pytree messages print it: ``*`` per leaf, ``(*, [*])``."""
    if tree.kind in ("leaf", "static"):
        return "*"
    kids = [tree_str(c) for c in tree.children]
    if tree.kind == "dict":
        return "{" + ", ".join(f"{k!r}: {s}" for k, s in zip(tree.meta, kids)) + "}"
    if tree.kind == "list":
        return "[" + ", ".join(kids) + "]"
    return "(" + ", ".join(kids) + ("," if len(kids) == 1 else "") + ")"


def tree_map(fn, obj) -> Any:
    """``obj`` with each tensor leaf ``t`` replaced by ``fn(t)``."""
    leaves, tree = tree_flatten(obj)
    return tree_unflatten(tree, [fn(t) for t in leaves]) if leaves else obj
