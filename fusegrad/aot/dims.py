"""Symbolic dimensions of an ahead-of-time artifact: :class:`Dim` (torch.export's name) and
the ``dynamic_shapes`` argument that says which dims of which example arguments it stands
for.

``fusegrad.aot.compile(step, x, y, dynamic_shapes={"x": {0: batch}, "y": {0: batch}})``
traces those dims as symbols; one Dim given to several dims means that their sizes are
equal. The bounds are stored in the artifact and checked by every call of the loaded one.
"""

from __future__ import annotations

import inspect
import itertools

from fusegrad.symint import COMPARE, MIN_SYMBOL_SIZE, SymInt, evaluate_dim, symbol
from fusegrad.tensor import Tensor

__all__ = ["Dim", "symbolic_dims", "unchecked_assumptions", "INT64_MAX"]

INT64_MAX = 2 ** 63 - 1
# The most size combinations an assumption of the trace is checked at, over the bounds.
_MAX_CHECKED = 1 << 16


class Dim:
    """A symbolic dimension of an artifact's arguments, with the sizes it accepts:
    ``min`` (default 2; sizes 0 and 1 are specialized, as torch's are) to ``max`` (default
    unbounded), both included (``torch.export.Dim``)."""

    def __init__(self, name: str, *, min: int | None = None,  # noqa: A002
                 max: int | None = None):                      # noqa: A002
        if not isinstance(name, str) or not name.isidentifier():
            raise AssertionError(f"Dim name must be a valid identifier, got {name}")
        lo = MIN_SYMBOL_SIZE if min is None else min
        hi = INT64_MAX if max is None else max
        if not isinstance(lo, int) or not isinstance(hi, int) or lo > hi:
            raise AssertionError(f"Cannot create Dim with inconsistent min={min}, max={max}")
        if lo < MIN_SYMBOL_SIZE:
            raise ValueError(f"Dim {name!r}: min={lo}, but a symbolic size is at least "
                             f"{MIN_SYMBOL_SIZE} (sizes 0 and 1 are specialized: an artifact "
                             "for them is compiled with static shapes)")
        self.__name__, self.min, self.max = name, lo, hi

    def __repr__(self) -> str:
        bounds = f", min={self.min}" + (f", max={self.max}" if self.max != INT64_MAX else "")
        return f"Dim({self.__name__!r}{bounds})"


def _arg_names(fn, n: int) -> list[str]:
    target = fn.forward if hasattr(fn, "named_parameters") and hasattr(fn, "forward") else fn
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (names + [f"args[{k}]" for k in range(len(names), n)])[:n]


def symbolic_dims(fn, args: tuple, dynamic_shapes) -> tuple[dict, dict, dict]:
    """``dynamic_shapes`` (by argument name or position: ``{dim: Dim}``, a list of a Dim or
    None per dim, or None) checked against the example ``args``: {leaf index: {dim:
    symbol}} for the trace, {symbol name: Dim}, and {symbol name: "x.size(0)"}."""
    names = _arg_names(fn, len(args))
    if isinstance(dynamic_shapes, dict):
        unknown = [k for k in dynamic_shapes if k not in names and not isinstance(k, int)]
        if unknown:
            raise ValueError(f"When `dynamic_shapes` is specified as a dict, its top-level keys "
                             f"must be the arg names {names} of `inputs`, but here they are "
                             f"{list(dynamic_shapes)}. Alternatively, you could also ignore arg "
                             "names entirely and specify `dynamic_shapes` as a list/tuple "
                             "matching `inputs`.")
        per_arg = [dynamic_shapes.get(n, dynamic_shapes.get(k)) for k, n in enumerate(names)]
    elif isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) != len(args):
            raise ValueError(f"`dynamic_shapes` has {len(dynamic_shapes)} entries for the "
                             f"{len(args)} inputs {names}")
        per_arg = list(dynamic_shapes)
    else:
        raise TypeError(f"dynamic_shapes must be a dict by argument name or a list/tuple by "
                        f"position, got {type(dynamic_shapes).__name__}")
    leaf = 0
    out: dict[int, dict[int, SymInt]] = {}
    dims_by_name: dict[str, Dim] = {}
    where: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for k, (a, spec) in enumerate(zip(args, per_arg)):
        if not isinstance(a, Tensor):
            if spec is not None:
                raise ValueError(f"dynamic_shapes gives dims of {names[k]}, which is not a "
                                 f"tensor ({type(a).__name__})")
            from fusegrad.tracer.trace import tree_flatten
            leaf += len(tree_flatten(a)[0])
            continue
        if spec is None:
            leaf += 1
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for d, dim in items:
            if dim is None:
                continue
            if not isinstance(dim, Dim):
                raise TypeError(f"dynamic_shapes[{names[k]!r}][{d}] must be a "
                                f"fusegrad.aot.Dim, got {dim!r}")
            if not isinstance(d, int) or not -a.dim() <= d < a.dim():
                raise IndexError(f"dynamic_shapes[{names[k]!r}] names dim {d} of a tensor of "
                                 f"{a.dim()} dims")
            d %= a.dim()
            name, n, said = dim.__name__, a.shape[d], f"{names[k]}.size({d})"
            other = dims_by_name.setdefault(name, dim)
            if other is not dim and (other.min, other.max) != (dim.min, dim.max):
                raise ValueError(f"two Dims named {name!r} with other bounds: {other!r} and "
                                 f"{dim!r}")
            if not dim.min <= n <= dim.max:
                hi = "inf" if dim.max == INT64_MAX else dim.max
                raise ValueError(f"{said} = {n} not in range [{dim.min}, {hi}] of {dim!r}")
            if name in sizes and sizes[name] != n:
                raise ValueError(f"{said} = {n} and {where[name]} = {sizes[name]} are both "
                                 f"{dim!r}, which means equal sizes")
            sizes.setdefault(name, n)
            where.setdefault(name, said)
            out.setdefault(leaf, {})[d] = symbol(name, n)
        leaf += 1
    return out, dims_by_name, where


def unchecked_assumptions(assumed: list, dims: dict[str, Dim]) -> list[str]:
    """What the trace and compiler assumed of the sizes (``(expression, op, value)``) that
    does not hold for every size within the bounds of ``dims``, in words."""
    bad = []
    for assumption in assumed:
        expr, op, value = assumption
        names = sorted(set(expr.free_symbols()) |
                       (set(value.free_symbols()) if isinstance(value, SymInt) else set()))
        ranges = [range(dims[n].min, dims[n].max + 1) for n in names]
        count = 1
        for r in ranges:
            count *= len(r)
        text = f"{expr} {op} {value}"
        why = f": {assumption.reason}" if getattr(assumption, "reason", None) else ""
        if count > _MAX_CHECKED:
            bad.append(f"{text} (not checked over {', '.join(map(repr, (dims[n] for n in names)))}"
                       f"; narrower bounds let it be{why})")
            continue
        for values in itertools.product(*ranges):
            b = dict(zip(names, values))
            if not COMPARE[op](evaluate_dim(expr, b), evaluate_dim(value, b)):
                at = ", ".join(f"{n} = {v}" for n, v in b.items())
                bad.append(f"{text} (false at {at}{why})")
                break
    return bad
