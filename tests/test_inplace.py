"""In-place ops and autograd: what is refused, what the version counter catches, and that
gradients through in-place writes (on tensors and through views, torch's CopySlices) are the
ones finite differences give."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import arr, check_grad, positive

MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace"


def test_in_place_on_a_leaf_that_requires_grad_is_refused():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    for write in (lambda: x.add_(1), lambda: x.mul_(2), lambda: x.zero_(),
                  lambda: x.__iadd__(1), lambda: x.copy_(fg.ones(2)),
                  lambda: x.__setitem__(0, 5.0), lambda: x.exp_()):
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used "
                                               "in an in-place operation."):
            write()
    assert x.tolist() == [1.0, 2.0] and x._version == 0


def test_in_place_on_a_view_of_such_a_leaf_is_refused():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for view in (lambda: x[1:], lambda: x[0], lambda: x.view(3, 1), lambda: x.unsqueeze(0)):
        with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is "
                                               "being used in an in-place operation."):
            view().mul_(2)
    assert x.tolist() == [1.0, 2.0, 3.0]


def test_in_place_on_a_leaf_under_no_grad_is_allowed():
    w = fg.tensor([1.0, 2.0], requires_grad=True)
    with fg.no_grad():
        w.sub_(0.5)
        w[0] = 10.0
    assert w.tolist() == [10.0, 1.5] and w.is_leaf and w.requires_grad and w.grad_fn is None
    (w * 2).sum().backward()
    assert w.grad.tolist() == [2.0, 2.0]


def test_in_place_under_no_grad_keeps_a_non_leaf_history():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    with fg.no_grad():
        y.add_(1)
    assert y.grad_fn.name() == "MulBackward0" and y.tolist() == [4.0, 7.0]
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


@pytest.mark.parametrize("make,saved", [
    (lambda y: y * y, "an input"),
    (lambda y: y.sin(), "an input"),
    (lambda y: y.log(), "an input"),
    (lambda y: y.exp(), None),          # saves its output, not y
    (lambda y: y @ y, "an input"),
], ids=["mul", "sin", "log", "exp_of_y", "dot"])
def test_version_counter_catches_a_modified_saved_input(make, saved):
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    z = make(y)
    y.add_(1)
    if saved is None:
        z.sum().backward()                              # nothing saved of y: fine
        return
    with pytest.raises(RuntimeError, match=MODIFIED) as err:
        z.sum().backward()
    assert "is at version 1; expected version 0 instead" in str(err.value)
    assert "[fusegrad.FloatTensor [" in str(err.value)


def test_modifying_a_tensor_whose_backward_reads_the_output_raises():
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x.exp()
    y.t()[0].add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED + r".*output 0 of ExpBackward0"):
        y.sum().backward()


def test_version_counter_catches_a_modified_saved_output():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    y.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED + r".*output 0 of ExpBackward0"):
        y.sum().backward()


def test_modified_saved_input_is_named_by_the_node_that_made_it_when_saved():
    # The saved input's origin is the node that made it at save time; the in-place op gives
    # y a new grad_fn (AddBackward0) afterwards, which the message must not name.
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    z = y * y
    y.add_(1)
    assert y.grad_fn.name() != "ExpBackward0"
    with pytest.raises(RuntimeError, match=MODIFIED + r".*output 0 of ExpBackward0"):
        z.sum().backward()


def test_version_counter_is_shared_with_detached_tensors_and_views():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    with pytest.raises(RuntimeError, match=MODIFIED):
        x.detach().add_(1)                              # x's data changed under y's feet
        y.sum().backward()
    a = fg.ones(4)
    v = a[1:3]
    a.add_(1)
    v.mul_(2)
    assert a._version == v._version == 2


def test_mul_by_constant_then_in_place_is_fine():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2                                           # saves the constant, not x
    with fg.no_grad():
        x.add_(100.0)
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    a = x * 1
    b = a * 2
    a.add_(1)
    b.sum().backward()
    assert x.grad.tolist() == [4.0, 4.0]


# ops whose backward reads the value of self from before the write
INPLACE_OPS = [
    ("add_", lambda y, x: y.add_(x)),
    ("add_alpha", lambda y, x: y.add_(x, alpha=2)),
    ("iadd", lambda y, x: y.__iadd__(x * 2)),
    ("sub_", lambda y, x: y.sub_(x * x)),
    ("mul_scalar", lambda y, x: y.mul_(3)),
    ("mul_tensor", lambda y, x: y.mul_(x)),
    ("imul", lambda y, x: y.__imul__(x)),
    ("div_", lambda y, x: y.div_(x + 3)),
    ("pow_", lambda y, x: y.pow_(2)),
    ("pow_tensor", lambda y, x: y.pow_(x)),
    ("exp_", lambda y, x: y.exp_()),
    ("log_", lambda y, x: y.log_()),
    ("sqrt_", lambda y, x: y.sqrt_()),
    ("sin_", lambda y, x: y.sin_()),
    ("tanh_", lambda y, x: y.tanh_()),
    ("sigmoid_", lambda y, x: y.sigmoid_()),
    ("abs_", lambda y, x: y.abs_()),
    ("neg_", lambda y, x: y.neg_()),
    ("reciprocal_", lambda y, x: y.reciprocal_()),
    ("clamp_", lambda y, x: y.clamp_(1.0, 2.0)),
    ("relu_", lambda y, x: y.sub_(1.5).relu_()),
    ("masked_fill_", lambda y, x: y.masked_fill_(x > 1.5, 0.0)),
    ("fill_", lambda y, x: y.fill_(3.0)),
    ("zero_", lambda y, x: y.zero_()),
    ("copy_", lambda y, x: y.copy_(x * x)),
    ("copy_constant", lambda y, x: y.copy_(fg.ones(3, dtype=fg.float64))),
    ("chain", lambda y, x: y.mul_(x).add_(1).exp_().mul_(x)),
]


@pytest.mark.parametrize("name,op", INPLACE_OPS, ids=[o[0] for o in INPLACE_OPS])
def test_in_place_on_a_non_leaf_flows_gradients(name, op):
    def f(x):
        y = x * 1.5
        out = op(y, x)
        assert out is y                                  # in-place ops return self
        return y * fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)

    check_grad(f, positive(3))


# in-place ops on a tensor that needs no gradient, written with one that does: the backward
# reads the tensor's value from before the write (torch saves ``original_self``)
INPLACE_ON_CONSTANT = [
    ("mul_", lambda a, w: a.mul_(w), lambda a, w: a * w),
    ("imul", lambda a, w: a.__imul__(w), lambda a, w: a * w),
    ("div_", lambda a, w: a.div_(w + 3), lambda a, w: a / (w + 3)),
    ("pow_", lambda a, w: a.pow_(w), lambda a, w: a ** w),
    ("scatter_", lambda a, w: a.scatter_(0, fg.tensor([2, 0]), w[:2]),
     lambda a, w: a.scatter(0, fg.tensor([2, 0]), w[:2])),
]


@pytest.mark.parametrize("name,op,ref", INPLACE_ON_CONSTANT, ids=[o[0] for o in INPLACE_ON_CONSTANT])
def test_in_place_on_a_constant_with_an_operand_that_requires_grad(name, op, ref):
    values = np.array([1.5, 2.0, 0.5])
    w = fg.tensor([0.5, 1.0, 2.0], dtype=fg.float64, requires_grad=True)
    a = fg.tensor(values)
    out = op(a, w)
    assert out is a
    out.sum().backward()
    w2 = fg.tensor([0.5, 1.0, 2.0], dtype=fg.float64, requires_grad=True)
    ref(fg.tensor(values), w2).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=1e-12)


def test_in_place_keeps_identity_and_bumps_version():
    x = fg.tensor([1.0, 2.0])
    ident = id(x)
    x += 1
    x *= 2
    assert id(x) == ident and x.tolist() == [4.0, 6.0] and x._version == 2
    assert x.add_(1) is x and x._version == 3


def test_in_place_node_names():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    y.add_(1)
    assert y.grad_fn.name() == "AddBackward0"
    y.mul_(x)
    assert y.grad_fn.name() == "MulBackward0"
    z = x * 1
    z[0] = 5.0
    assert z.grad_fn.name() == "CopySlices"


def test_zero_and_fill_keep_the_tensor_in_the_graph():
    # a constant written over a non-leaf: zero gradient to its past, not a new leaf (torch)
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.fill_(3.0)
    assert not y.is_leaf and y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]



def test_copy_or_fill_of_a_value_that_requires_grad_zeroes_the_past():
    # the overwritten history gets a zero gradient (torch's CopyBackwards), not none at all:
    # x.grad is zeros, not None (an optimizer skips a None gradient, but not a zero one)
    for write in (lambda y, w: y.copy_(w * 2), lambda y, w: y.fill_(w.sum())):
        x = fg.tensor([1.0, 2.0], requires_grad=True)
        w = fg.tensor([3.0, 4.0], requires_grad=True)
        y = x * 2
        write(y, w)
        y.sum().backward()
        assert x.grad.tolist() == [0.0, 0.0]
        assert w.grad.tolist() == [2.0, 2.0]


def test_what_a_composites_backward_reads_is_version_checked():
    # softmax's backward reads its output, gelu's its input (as torch's save them): a write
    # into either was read by the backward as written, a wrong gradient without an error
    F = fg.nn.functional
    for op, write_output in ((lambda y: F.softmax(y, 1), True),
                             (lambda y: F.log_softmax(y, 1), True), (F.gelu, False)):
        x = fg.tensor(arr(3, 4), requires_grad=True)
        y = x * 1
        z = op(y)
        (z if write_output else y).add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (z * z).sum().backward()
    # what the backward does not read may be written, as in torch
    for op, write_output in ((lambda y: F.softmax(y, 1), False), (F.gelu, True)):
        x = fg.tensor(arr(3, 4), requires_grad=True)
        y = x * 1
        z = op(y)
        (z if write_output else y).add_(1)
        z.sum().backward()
        assert x.grad is not None

# --------------------------------------------------------------------------- through views


VIEW_WRITES = [
    ("slice_mul", lambda y, x: y[1:].mul_(10)),
    ("slice_mul_tensor", lambda y, x: y[1:].mul_(x[:-1])),
    ("select_add", lambda y, x: y[0].add_(x[2] * x[1])),
    ("step_exp", lambda y, x: y[::2].exp_()),
    ("setitem_int", lambda y, x: y.__setitem__(0, x[1] * 2)),
    ("setitem_slice", lambda y, x: y.__setitem__(slice(1, None), x[:2] ** 2)),
    ("setitem_constant", lambda y, x: y.__setitem__(1, 7.0)),
    ("setitem_mask", lambda y, x: y.__setitem__(x > 1.0, 0.0)),
    ("setitem_index", lambda y, x: y.__setitem__(fg.tensor([2, 0]), x[:2] * 3)),
    ("view_then_inplace", lambda y, x: y.view(3, 1)[2].log_()),
    ("two_writes", lambda y, x: (y[:2].mul_(x[1:]), y[1:].add_(y[:2] * 1))),
]


@pytest.mark.parametrize("name,write", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_in_place_through_a_view_of_a_non_leaf(name, write):
    def f(x):
        y = x * 1.5
        write(y, x)
        return y * fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)

    check_grad(f, positive(3))


@pytest.mark.parametrize("kind", ["contiguous", "transposed"])
def test_in_place_through_2d_views(kind):
    def through_column(x):
        y = x * 1
        y[:, 1].mul_(x[:, 2] * 3)
        return y * fg.arange(1.0, 7.0, dtype=fg.float64).reshape(2, 3)

    def through_transpose(x):
        y = x * 2
        y.t()[0].add_(x[:, 1] ** 2)
        return y

    check_grad(through_column, arr(2, 3), kind=kind)
    check_grad(through_transpose, arr(2, 3), kind=kind)


def test_copy_slices_values():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    y[1:].mul_(10)
    assert y.grad_fn.name() == "CopySlices"
    (y * fg.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 20.0, 30.0]


def test_view_used_after_its_base_is_modified_sees_the_new_history():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    v = y.view(3, 1)
    y.mul_(2)
    v.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_other_views_see_a_write_through_one_view():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    a, b = y[:2], y[1:]
    a.mul_(2)
    assert b.tolist() == [4.0, 3.0]
    (b * fg.tensor([1.0, 10.0])).sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 10.0]


def test_view_of_a_constant_base_that_gains_history():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = fg.zeros(3)
    v = y[:2]
    y.copy_(x * 2)
    assert y.requires_grad
    (v * 1).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 0.0]


def test_view_values_after_in_place_on_the_view():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    v = y[1:]
    v.mul_(10)
    assert v.tolist() == [20.0, 30.0] and y.tolist() == [1.0, 20.0, 30.0]
    (v * fg.tensor([1.0, 2.0])).sum().backward()
    assert x.grad.tolist() == [0.0, 10.0, 20.0]


# --------------------------------------------------------------------------- dtype and shape


def test_in_place_dtype_rules():
    i = fg.tensor([1, 2])
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output "
                                           "type Long"):
        i.mul_(1.5)
    with pytest.raises(RuntimeError, match="result type Float can't be cast"):
        i /= 2
    i.copy_(fg.tensor([2.7, -1.2]))                     # copy_ casts
    assert i.tolist() == [2, -1]
    f = fg.tensor([1.0, 2.0])
    f.add_(fg.tensor([1, 1]))                           # int into float: fine
    assert f.tolist() == [2.0, 3.0] and f.dtype is fg.float32
    h = fg.tensor([1.0], dtype=fg.float16)
    h.mul_(fg.tensor([3.0], dtype=fg.float64))
    assert h.dtype is fg.float16 and h.item() == 3.0


def test_in_place_shape_rules():
    x = fg.ones(3)
    with pytest.raises(RuntimeError, match=r"add_: output with shape \[3\] doesn't match the "
                                           r"broadcast shape \[2, 3\]"):
        x.add_(fg.ones(2, 3))
    y = fg.ones(2, 3)
    y.add_(fg.tensor([1.0, 2.0, 3.0]))                   # broadcasting the other operand: fine
    assert y[1].tolist() == [2.0, 3.0, 4.0]
    y.copy_(fg.tensor([5.0, 6.0, 7.0]))
    assert y.tolist() == [[5.0, 6.0, 7.0]] * 2
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        fg.ones(3, 1).expand(3, 2).mul_(2)


def test_copy_gives_gradient_to_the_source():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = fg.zeros(2)
    y.copy_(x * 3)
    assert y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_random_fills_are_in_place():
    x = fg.zeros(100)
    out = x.uniform_(0.0, 1.0)
    assert out is x and x._version == 1 and (x.numpy() > 0).any()
    np.testing.assert_array_less(x.numpy(), 1.0)
    z = fg.zeros(3)
    assert z.normal_() is z and z._version == 1


def test_copy_slices_when_the_base_is_not_row_major():
    # y is laid out transposed; the view y.t().reshape(6) is still a view of it, but applying
    # those view ops to a row-major gradient would copy instead of selecting the region
    x = fg.arange(6.0, dtype=fg.float64).reshape(3, 2).requires_grad_()
    y = x.t() * 1
    assert not y.is_contiguous()
    y.t().reshape(6).mul_(fg.arange(6.0, dtype=fg.float64))
    (y * fg.arange(6.0, dtype=fg.float64).reshape(2, 3)).sum().backward()
    assert x.grad.tolist() == [[0.0, 3.0], [2.0, 12.0], [8.0, 25.0]]


def test_double_backward_through_copy_slices():
    from fusegrad.autograd.gradcheck import gradgradcheck

    def f(x):
        y = x * x
        y[1:].mul_(x[:-1])
        y[0] = x[2] ** 3
        return y

    assert gradgradcheck(f, [fg.tensor(positive(3), requires_grad=True)])


def test_matmul_assignment_rebinds_as_in_torch():
    # torch has no __imatmul__: x @= w is x = x @ w, a new tensor (its shape may change, a
    # leaf that requires grad may be its operand, and other names for x keep its values).
    x = fg.ones(4, 3)
    alias = x
    x @= fg.full((3, 5), 2.0)
    assert x is not alias and x.shape == (4, 5) and alias.shape == (4, 3)
    np.testing.assert_array_equal(alias.numpy(), np.ones((4, 3), np.float32))
    np.testing.assert_array_equal(x.numpy(), np.full((4, 5), 6.0, np.float32))
    w = fg.ones(3, 3, requires_grad=True)
    leaf = w
    w @= fg.eye(3)
    w.sum().backward()
    np.testing.assert_array_equal(leaf.grad.numpy(), np.ones((3, 3), np.float32))
