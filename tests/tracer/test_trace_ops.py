"""Tracing then interpreting agrees with eager execution on every public op.

The table is :data:`tests.tracer.trace_cases.CASES`; each case is traced with
``fusegrad.trace`` and run by the reference interpreter, and every output must equal eager
``fn(*xs)`` (same shape, dtype and values). A second test keeps the table honest: every public
op of ``fusegrad.ops.functional``, ``fusegrad.nn.functional`` and every in-place ``Tensor``
method appears in some case, or in :data:`NOT_IN_TABLE` with the reason why.
"""

from __future__ import annotations

import inspect

import pytest

import fusegrad.nn.functional as NF
from fusegrad.ops import functional as F
from fusegrad.ops import registry
from tests.tracer.trace_cases import CASES, check_forward

# The modules whose functions fusegrad.ops.functional gathers.
OP_MODULES = ("composite", "operands", "elementwise", "movement", "reductions", "matmul", "indexing",
              "inplace", "factories", "convolution", "pooling", "normalization", "trig",
              "scatter", "products", "sampling", "pointwise", "blas", "slicing", "statistics",
              "special", "decompositions", "complex")

# Public names deliberately not in the op table, and where they are tested instead.
NOT_IN_TABLE = {
    "composite": "a decorator, not an op",
    "opmath": "a decorator (16-bit inputs computed in float32), not an op",
    "register_eager_kernel_maker": "fills composite's eager-kernel slot at import, not an op",
    "custom_vjp": "marks a composite's own VJP: tests/compiler/test_custom_vjp.py",
    "parse_to_args": "argument parsing for to(), not an op",
    "nonzero": "data-dependent shape: test_trace_concretization",
    "argwhere": "data-dependent shape: test_trace_concretization",
    "masked_select": "data-dependent shape: test_trace_concretization",
    "allclose": "returns a Python bool: test_trace_concretization",
    "equal": "returns a Python bool: test_trace_concretization",
    "bincount": "data-dependent shape: test_ops_more",
    "unique": "data-dependent shape: test_ops_more",
    "multinomial": "eager only (numpy sampling): test_ops_more",
    "standard_gamma": "random draws: tests/test_distributions.py and test_compile_extern_ops",
    "bernoulli": "random (a key input): test_ops_more",
    "is_same_size": "returns a Python bool: test_ops_parity",
    "is_signed": "returns a Python bool: test_ops_parity",
    "is_nonzero": "returns a Python bool: test_ops_parity",
    "is_inference": "returns a Python bool: test_ops_parity",
    "is_conj": "returns a Python bool: test_complex",
    "is_neg": "returns a Python bool: test_complex",
    "histogram": "data-dependent bin edges, eager only: test_ops_parity",
    "unique_consecutive": "data-dependent shape: test_ops_parity",
    **{name: "an in-place shape change, eager only (compile refuses it): test_inplace_views"
       for name in ("squeeze_", "unsqueeze_", "t_", "transpose_", "swapaxes_", "swapdims_")},
}


def _params(cases, xfail_attr: str):
    return [pytest.param(c, id=c.name, marks=pytest.mark.xfail(reason=getattr(c, xfail_attr),
                                                                strict=True))
            if getattr(c, xfail_attr) else pytest.param(c, id=c.name) for c in cases]


@pytest.mark.parametrize("case", _params(CASES, "xfail_forward"))
def test_interpret_trace_matches_eager(case):
    """interpret(trace(f), *arrays) == f(*tensors), output by output."""
    check_forward(case)


def _public_functions(module) -> dict[str, object]:
    """Public functions defined in the op modules that ``module`` gathers (not those it imports
    from elsewhere, such as ``bind``)."""
    op_modules = {registry.__name__.rsplit(".", 1)[0] + "." + m for m in OP_MODULES}
    return {name: fn for name, fn in vars(module).items()
            if not name.startswith("_") and callable(fn) and not inspect.isclass(fn)
            and getattr(fn, "__module__", "") in op_modules}


def _covered_names() -> set[str]:
    names = set()
    for c in CASES:
        names.add(c.op)
        names.update(c.covers)
    return names


def test_table_covers_every_public_op():
    """No public op of the eager core is missing from the op table (aliases count once)."""
    assert len(_public_functions(F)) > 150  # the scan finds the ops where they are defined
    covered = _covered_names()
    covered_fns = {id(getattr(F, n)) for n in covered if hasattr(F, n)}
    missing = [n for n, fn in _public_functions(F).items()
               if n not in covered and id(fn) not in covered_fns and n not in NOT_IN_TABLE]
    missing += [f"nn.functional.{n}" for n in NF.__all__ if n not in covered]
    missing += [f"Tensor.{n}_" for n in registry.inplace_methods() if f"{n}_" not in covered]
    assert not missing, f"ops without a case in trace_cases.py: {missing}"


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
