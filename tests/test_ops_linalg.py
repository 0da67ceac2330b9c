"""matmul in every torch broadcasting case, mm/bmm/dot/mv/outer, their errors and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, assert_close, check_grad

MATMUL_SHAPES = [
    ((3,), (3,)),               # dot
    ((3,), (3, 4)),             # vector @ matrix
    ((2, 3), (3,)),             # matrix @ vector
    ((2, 3), (3, 4)),           # mm
    ((5, 2, 3), (5, 3, 4)),     # bmm
    ((5, 2, 3), (3, 4)),        # batched @ matrix
    ((2, 3), (5, 3, 4)),        # matrix @ batched
    ((3,), (5, 3, 4)),          # vector @ batched
    ((5, 2, 3), (3,)),          # batched @ vector
    ((5, 1, 2, 3), (4, 3, 2)),  # broadcast batch dims
    ((1, 2, 3), (4, 3, 1)),
    ((2, 0), (0, 3)),           # empty contraction
    ((0, 2, 3), (3, 4)),        # empty batch
]
SHAPE_IDS = ["x".join(map(str, a)) + "@" + "x".join(map(str, b)) for a, b in MATMUL_SHAPES]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=SHAPE_IDS)
def test_matmul_forward(sa, sb):
    a, b = arr(*sa), arr(*sb, seed=1)
    out = fg.tensor(a) @ fg.tensor(b)
    expected = np.matmul(a, b)
    assert out.shape == expected.shape
    assert_close(out, expected, rtol=1e-12)
    assert_close(fg.matmul(fg.tensor(a), fg.tensor(b)), expected, rtol=1e-12)


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES[:11], ids=SHAPE_IDS[:11])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_matmul_grad(sa, sb, kind):
    check_grad(lambda x, y: x @ y, arr(*sa), arr(*sb, seed=1), kind=kind)


def test_matmul_of_transposed_operands():
    a, b = arr(3, 2), arr(4, 3, seed=1)
    out = fg.tensor(a).t() @ fg.tensor(b).t()
    assert_close(out, a.T @ b.T)
    check_grad(lambda x, y: x.t() @ y.mT, a, b)


def test_matmul_float32_and_integers():
    a, b = arr(4, 5).astype(np.float32), arr(5, 3, seed=1).astype(np.float32)
    out = fg.tensor(a) @ fg.tensor(b)
    assert out.dtype is fg.float32
    assert_close(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    i = fg.tensor([[1, 2], [3, 4]]) @ fg.tensor([[5], [6]])
    assert i.dtype is fg.int64 and i.tolist() == [[17], [39]]
    assert (fg.ones(2, 2, dtype=fg.float16) @ fg.ones(2, 2, dtype=fg.float16)).dtype is fg.float16


@pytest.mark.parametrize("sa,sb,msg", [
    ((4, 8), (9, 16), r"mat1 and mat2 shapes cannot be multiplied \(4x8 and 9x16\)"),
    ((2, 4, 8), (2, 9, 16), r"mat1 and mat2 shapes cannot be multiplied \(4x8 and 9x16\)"),
    ((3,), (4, 5), r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x5\)"),
    ((2, 3), (4,), r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)"),
    ((3,), (4,), r"inconsistent tensor size, expected tensor \[3\] and src \[4\] to have the same "
                 r"number of elements, but got 3 and 4 elements respectively"),
    ((5, 2, 3), (4, 3, 2), r"matmul \(batch dims of f32\[5,2,3\] and f32\[4,3,2\]\): the size of "
                           r"tensor a \(5\) must match the size of tensor b \(4\) at non-singleton "
                           r"dimension 0"),
    ((), (3,), "both arguments to matmul need to be at least 1D, but they are 0D and 1D"),
])
def test_matmul_shape_errors(sa, sb, msg):
    with pytest.raises(RuntimeError, match=msg):
        fg.ones(*sa) @ fg.ones(*sb)


def test_matmul_type_errors():
    with pytest.raises(TypeError):
        fg.ones(2, 2) @ 2
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        fg.ones(2, 2, dtype=fg.bool) @ fg.ones(2, 2, dtype=fg.bool)


def test_mm():
    a, b = arr(2, 3), arr(3, 4, seed=1)
    assert_close(fg.tensor(a).mm(fg.tensor(b)), a @ b)
    assert_close(fg.mm(fg.tensor(a), fg.tensor(b)), a @ b)
    with pytest.raises(RuntimeError, match="self must be a matrix"):
        fg.ones(3).mm(fg.ones(3, 4))
    with pytest.raises(RuntimeError, match="mat2 must be a matrix"):
        fg.ones(2, 3).mm(fg.ones(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and "
                                           r"4x4\)"):
        fg.ones(2, 3).mm(fg.ones(4, 4))


def test_bmm():
    a, b = arr(5, 2, 3), arr(5, 3, 4, seed=1)
    out = fg.tensor(a).bmm(fg.tensor(b))
    assert out.grad_fn is None and out.shape == (5, 2, 4)
    assert_close(out, a @ b)
    check_grad(lambda x, y: fg.bmm(x, y), a, b)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        fg.ones(2, 3).bmm(fg.ones(5, 3, 4))
    with pytest.raises(RuntimeError, match="batch2 must be a 3D tensor"):
        fg.ones(5, 2, 3).bmm(fg.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"Expected size for first two dimensions of batch2 "
                                           r"tensor to be: \[5, 3\] but got: \[4, 3\]"):
        fg.ones(5, 2, 3).bmm(fg.ones(4, 3, 4))
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(2x3 and 4x4\)"):
        fg.ones(5, 2, 3).bmm(fg.ones(5, 4, 4))


def test_dot_mv_outer():
    v, w = arr(3), arr(3, seed=1)
    assert_close(fg.tensor(v).dot(fg.tensor(w)), v @ w)
    assert fg.dot(fg.tensor(v), fg.tensor(w)).shape == ()
    m = arr(2, 3)
    assert_close(fg.tensor(m).mv(fg.tensor(v)), m @ v)
    assert_close(fg.outer(fg.tensor(arr(2)), fg.tensor(v)), np.outer(arr(2), v))
    check_grad(lambda x, y: x.dot(y), v, w)
    check_grad(lambda x, y: x.mv(y), m, v)
    check_grad(lambda x, y: fg.outer(x, y), arr(2), v)
    with pytest.raises(RuntimeError, match="1D tensors expected, but got 1D and 2D tensors"):
        fg.ones(3).dot(fg.ones(3, 1))
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        fg.ones(3).dot(fg.ones(4))
    with pytest.raises(RuntimeError, match=r"size mismatch, got input \(2\), mat \(2x3\), vec "
                                           r"\(4\)"):
        fg.ones(2, 3).mv(fg.ones(4))


def test_matmul_gradient_values():
    a = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = fg.tensor([[5.0], [6.0]], requires_grad=True)
    (a @ b).sum().backward()
    assert a.grad.tolist() == [[5.0, 6.0], [5.0, 6.0]]
    assert b.grad.tolist() == [[4.0], [6.0]]


def test_broadcast_batch_gradient_is_summed():
    a = fg.ones(4, 2, 3, dtype=fg.float64, requires_grad=True)
    w = fg.ones(3, 5, dtype=fg.float64, requires_grad=True)
    (a @ w).sum().backward()
    assert w.grad.shape == (3, 5) and (w.grad == 8.0).all()
    assert a.grad.shape == (4, 2, 3) and (a.grad == 5.0).all()


def test_matmul_double_backward():
    from fusegrad.autograd.gradcheck import gradgradcheck
    x = fg.tensor(arr(2, 3), requires_grad=True)
    y = fg.tensor(arr(3, 2, seed=1), requires_grad=True)
    assert gradgradcheck(lambda p, q: (p @ q).tanh(), [x, y])
