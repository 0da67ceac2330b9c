"""Errors a user can cause say what happened: the op, the shapes and dtypes, and for traced
code the user's line. Each case was once misleading (issue: "unclear errors")."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.ir.symbolic import ConcretizationError

HERE = __file__


def line_of(fn, offset: int = 0) -> str:
    """``file:line`` of ``fn``'s first line (plus ``offset``)."""
    return f"{HERE}:{fn.__code__.co_firstlineno + offset}"


def run_warning(f, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(*args)
    return out, [str(w.message) for w in caught if "fusegrad.compile" in str(w.message)]


# --------------------------------------------------------------------------- in-place writes


def test_an_inplace_write_into_a_captured_tensor_is_written_back():
    # fusegrad.compile captures it (an output written back on each call); fusegrad.trace,
    # which makes a graph and nothing more, refuses it and says why.
    counter = fg.zeros(3)

    def accumulate(x):
        counter.add_(x)
        return x * 2
    f = fg.compile(accumulate, fullgraph=True)
    out = f(fg.ones(3))
    f(fg.ones(3))
    np.testing.assert_array_equal(out.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(counter.numpy(), [2, 2, 2])
    with pytest.raises(ConcretizationError) as info:
        fg.trace(accumulate, fg.ones(3))
    msg = str(info.value)
    assert "add_: an in-place write into a tensor captured from outside the traced function" \
        in msg
    assert line_of(accumulate, 1) in msg
    assert "control flow" not in msg


def test_an_indexed_write_into_a_captured_tensor_is_written_back():
    table = fg.zeros(4)

    def store(x):
        table[1:3] = x
        return x
    fg.compile(store, fullgraph=True)(fg.tensor([5.0, 6.0]))
    np.testing.assert_array_equal(table.numpy(), [0, 5, 6, 0])
    with pytest.raises(ConcretizationError) as info:
        fg.trace(store, fg.ones(2))
    assert "captured from outside the traced function" in str(info.value)
    assert line_of(store, 1) in str(info.value)


# --------------------------------------------------------------------------- print


def test_print_in_a_compiled_function_prints_values_on_every_call(capsys):
    def show(x):
        print(x)
        return x + 1
    f = fg.compile(show)
    _, msgs = run_warning(f, fg.ones(2))
    out = f(fg.full((2,), 5.0))
    np.testing.assert_array_equal(out.numpy(), [6, 6])
    printed = capsys.readouterr().out
    assert "Traced" not in printed
    assert printed.count("tensor(") == 2 and "5." in printed
    assert len(msgs) == 1 and "print() or str() of a tensor" in msgs[0]
    assert line_of(show, 1) in msgs[0]


def test_print_under_fullgraph_raises_naming_the_line():
    def show(x):
        print("x is", x)
        return x + 1
    with pytest.raises(ConcretizationError) as info:
        fg.compile(show, fullgraph=True)(fg.ones(2))
    assert "print() or str() of a tensor" in str(info.value)
    assert line_of(show, 1) in str(info.value)


def test_fstrings_raise_and_repr_still_describes_the_traced_value():
    seen = []

    def describe(x, seen=seen):          # a default argument: not a value the compile guards
        seen.append(repr(x))
        return x * 3
    out = fg.compile(describe, fullgraph=True)(fg.ones(2))
    np.testing.assert_array_equal(out.numpy(), [3, 3])
    assert seen == ["Traced<f32[2]>"]

    def fmt(x):
        return f"{x:.3}"
    with pytest.raises(ConcretizationError, match="formatting a tensor"):
        fg.trace(fmt, fg.ones(2))


# --------------------------------------------------------------------------- logsumexp


@pytest.mark.parametrize("shape,dim,keepdim", [((2, 0), 1, False), ((2, 0), 1, True),
                                               ((0, 3), 0, False), ((2, 0), (0, 1), False)])
def test_logsumexp_over_an_empty_dim_is_minus_inf(shape, dim, keepdim):
    with np.errstate(divide="ignore"):
        want = np.log(np.sum(np.exp(np.ones(shape, np.float32)), axis=dim, keepdims=keepdim))
    for fn in (lambda t: t.logsumexp(dim, keepdim=keepdim),
               fg.compile(lambda t: fg.logsumexp(t, dim, keepdim=keepdim))):
        x = fg.ones(*shape, requires_grad=True)
        y = fn(x)
        assert y.shape == want.shape
        np.testing.assert_array_equal(y.detach().numpy(), want)
        y.sum().backward()
        assert x.grad.shape == x.shape


def test_logsumexp_of_nonempty_dims_is_unchanged():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    want = np.log(np.exp(x.astype(np.float64)).sum(1))
    np.testing.assert_allclose(fg.tensor(x).logsumexp(1).numpy(), want, rtol=1e-6)


# --------------------------------------------------------------------------- losses


@pytest.mark.parametrize("op", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("bad", [5, -3])
def test_an_out_of_range_target_names_the_op_shapes_and_dtypes(op, bad):
    logits = fg.zeros(4, 3)
    target = fg.tensor([0, 1, bad, 2])
    with pytest.raises(IndexError) as info:
        getattr(NF, op)(logits, target)
    msg = str(info.value)
    assert msg.startswith(f"Target {bad} is out of bounds.")          # torch's words
    assert op in msg and "float32[4, 3]" in msg and "int64[4]" in msg and "[0, 3)" in msg


def test_the_ignore_index_is_not_out_of_range():
    loss = NF.cross_entropy(fg.zeros(2, 3), fg.tensor([-100, 1]))
    np.testing.assert_allclose(loss.item(), np.log(3), rtol=1e-6)


def test_a_compiled_cross_entropy_with_a_bad_target_names_the_users_line():
    def loss_fn(logits, target):
        return NF.cross_entropy(logits, target)
    f = fg.compile(loss_fn)
    with pytest.raises(IndexError) as info:
        f(fg.zeros(4, 3), fg.tensor([0, 1, 5, 2]))
    msg = str(info.value)
    # torch's words first, naming the loss (not the gather it feeds), then where it ran.
    assert msg.startswith("Target 5 is out of bounds. (cross_entropy: input float32[4, 3] "
                          "has 3 classes, target int64[4]"), msg
    assert "gather" not in msg
    assert line_of(loss_fn, 1) in msg
    assert "NF.cross_entropy(logits, target)" in msg      # the user's source text
    # The same function with valid targets still runs compiled and right.
    out = f(fg.zeros(4, 3), fg.tensor([0, 1, 2, 2]))
    np.testing.assert_allclose(out.item(), np.log(3), rtol=1e-6)


# --------------------------------------------------------------------------- kernel errors


def test_errors_raised_by_compiled_kernels_name_the_users_line():
    def pick(x, idx):
        y = x * 2
        return y.gather(0, idx)
    f = fg.compile(pick)
    np.testing.assert_array_equal(f(fg.arange(4.0), fg.tensor([3, 0])).numpy(), [6, 0])
    with pytest.raises(IndexError) as info:
        f(fg.arange(4.0), fg.tensor([7, 0]))
    msg = str(info.value)
    assert msg.startswith("gather: index 7 is out of bounds"), msg
    assert line_of(pick, 2) in msg and "y.gather(0, idx)" in msg
    assert isinstance(info.value.__cause__, IndexError)


def test_the_interpreter_backend_names_the_users_line_too():
    def pick(x, idx):
        return x.gather(0, idx) + 1
    with pytest.raises(IndexError) as info:
        fg.compile(pick, backend="interpreter")(fg.arange(4.0), fg.tensor([9]))
    assert "index 9 is out of bounds" in str(info.value)
    assert line_of(pick, 1) in str(info.value)


def test_index_select_errors_from_kernels_name_the_users_line():
    def rows(x, idx):
        return fg.index_select(x, 0, idx).sum()
    with pytest.raises(IndexError) as info:
        fg.compile(rows)(fg.ones(3, 2), fg.tensor([0, 3]))
    assert line_of(rows, 1) in str(info.value)


# --------------------------------------------------------------------------- matmul dtypes


@pytest.mark.parametrize("other_dtype,name", [(fg.float64, "double"), (fg.int64, "long int"),
                                              (fg.float16, "c10::Half")])
def test_matmul_of_two_dtypes_raises_as_torch(other_dtype, name):
    a, b = fg.ones(2, 3), fg.ones(3, 4, dtype=other_dtype)
    want = f"expected m1 and m2 to have the same dtype, but got: float != {name}"
    for op in (lambda: a @ b, lambda: fg.matmul(a, b), lambda: fg.mm(a, b)):
        with pytest.raises(RuntimeError) as info:
            op()
        assert want in str(info.value)
        assert "float32[2, 3]" in str(info.value) and f"{other_dtype.name}[3, 4]" in str(info.value)


def test_matmul_dtype_errors_in_compiled_code_name_the_users_line():
    def product(a, b):
        return (a @ b).sum()
    with pytest.raises(RuntimeError) as info:
        fg.compile(product)(fg.ones(2, 3), fg.ones(3, 4, dtype=fg.float64))
    assert "but got: float != double" in str(info.value)
    assert line_of(product, 1) in str(info.value)


@pytest.mark.parametrize("make", [
    lambda: (fg.ones(3), fg.ones(3, dtype=fg.float64)),                      # dot
    lambda: (fg.ones(2, 3), fg.ones(3, dtype=fg.float64)),                   # mv
    lambda: (fg.ones(2, 2, 3), fg.ones(2, 3, 4, dtype=fg.float64)),          # bmm
])
def test_every_matmul_form_refuses_mixed_dtypes(make):
    a, b = make()
    with pytest.raises(RuntimeError, match="same dtype"):
        fg.matmul(a, b)


def test_linear_with_a_double_weight_raises():
    with pytest.raises(RuntimeError, match="float != double"):
        NF.linear(fg.ones(2, 3), fg.ones(4, 3, dtype=fg.float64))


@pytest.mark.parametrize("op,want", [
    (lambda: fg.mv(fg.ones(2, 3), fg.ones(3, 1)), "vector + matrix @ vector expected, got 1, 2, 2"),
    (lambda: fg.mv(fg.ones(2, 2, 3), fg.ones(3)), "vector + matrix @ vector expected, got 1, 3, 1"),
    (lambda: fg.outer(fg.ones(3, 1), fg.ones(4)), "outer: Expected 1-D argument self, but got 2-D"),
    (lambda: fg.outer(fg.ones(3), fg.ones(())), "outer: Expected 1-D argument vec2, but got 0-D"),
    (lambda: fg.einsum("ii->i", fg.ones(2, 3)),
     "subscript i is repeated for operand 0 but the sizes don't match, 3 != 2"),
    (lambda: fg.einsum("ij,jk->ik", fg.ones(2, 3), fg.ones(4, 5)),
     "subscript j has size 4 for operand 1 which does not broadcast with previously seen size 3"),
    (lambda: fg.einsum("...i,...i", fg.ones(2, 3), fg.ones(4, 3)),
     "subscript ... has size 4 for operand 1"),
    (lambda: fg.einsum("i1,1k->ik", fg.ones(2, 3), fg.ones(3, 5)),
     "einsum(): invalid subscript given at index 1 in the equation string"),
    (lambda: fg.einsum("ij->j->i", fg.ones(2, 3)), "invalid subscript given at index 5"),
    (lambda: fg.einsum("ij,jk->ii", fg.ones(2, 3), fg.ones(3, 5)),
     "output subscript i appears more than once in the output"),
    (lambda: fg.linalg.multi_dot([fg.ones(2, 2, 3), fg.ones(3, 5)]),
     "the first tensor must be 1D or 2D but got 3D"),
    (lambda: fg.linalg.multi_dot([fg.ones(3, 2), fg.ones(2, 2, 3), fg.ones(3)]),
     "tensor 1 must be 2D but got 3D"),
    (lambda: fg.linalg.multi_dot([fg.ones(3, 2), fg.ones(2, 4), fg.ones(5, 4)]),
     "tensors 1 and 2 with shapes [2, 4] and [5, 4] cannot be multiplied"),
    (lambda: fg.linalg.multi_dot([fg.ones(3, 2), fg.ones(2, 4, dtype=fg.float64)]),
     "all tensors must have be the same dtype"),
    (lambda: fg.linalg.vecdot(fg.ones(2, 3, dtype=fg.int64), fg.ones(3, dtype=fg.int64)),
     "linalg.vecdot: Expected a floating point or complex tensor as input. Got int64"),
    (lambda: fg.linalg.vecdot(fg.ones(2, 3, dtype=fg.float16), fg.ones(3)),
     "Expected x and y to have the same dtype, but found x of type float16 and y of type "
     "float32"),
    (lambda: NF.linear(fg.ones(2, 3), fg.ones(4, 3), fg.ones(4, dtype=fg.float64)),
     "linear: self and mat2 must have the same dtype, but got float64 and float32"),
    (lambda: NF.linear(fg.ones(2, 2, 3), fg.ones(4, 3), fg.ones(4, dtype=fg.int64)),
     "linear: self and mat2 must have the same dtype, but got int64 and float32"),
    (lambda: NF.bilinear(fg.ones(2, 3), fg.ones(2, 4), fg.ones(5, 3, 4), fg.ones(5, dtype=fg.float64)),
     "All tensors must have the same dtype, got input1: float32, input2: float32, weight: "
     "float32, bias: float64"),
])
def test_products_torch_refuses_raise_instead_of_broadcasting(op, want):
    # Each computed something before (a broadcast product, a diagonal of a non-square block).
    with pytest.raises(RuntimeError, match=re.escape(want)):
        op()


def test_a_matmul_of_a_non_tensor_names_it():
    with pytest.raises(TypeError, match="argument 'input' \\(position 1\\) must be Tensor, not int"):
        2 @ fg.ones(3)
    with pytest.raises(TypeError, match="argument 'other' \\(position 2\\) must be Tensor, not list"):
        fg.matmul(fg.ones(3), [1.0, 2.0, 3.0])


def test_einsum_sums_no_bools_but_multiplies_them():
    b = fg.ones(2, 2, dtype=fg.bool)
    with pytest.raises(NotImplementedError, match='"bmm" not implemented for \'Bool\''):
        fg.einsum("ij,jk", b, b)
    assert fg.einsum("ij,ij->ij", b, b).dtype == fg.bool and fg.einsum("ij->", b).item() == 4


def test_einsum_sizes_that_broadcast_still_work():
    out = fg.einsum("ij,jk->ik", fg.ones(2, 1), fg.ones(3, 4))      # j: 1 against 3
    np.testing.assert_array_equal(out.numpy(), np.full((2, 4), 3.0, np.float32))
    np.testing.assert_array_equal(fg.einsum("i,i->i", fg.ones(1), fg.full((3,), 2.0)).numpy(),
                                  np.full(3, 2.0, np.float32))


def test_matmul_of_one_dtype_still_works():
    a = np.arange(6).reshape(2, 3)
    b = np.arange(12).reshape(3, 4)
    for dt, npdt in ((fg.int64, np.int64), (fg.float64, np.float64), (fg.float32, np.float32)):
        out = fg.tensor(a.astype(npdt)) @ fg.tensor(b.astype(npdt))
        assert out.dtype is dt
        np.testing.assert_array_equal(out.numpy(), a @ b)
