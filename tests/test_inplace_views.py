"""torch's in-place shape methods (``squeeze_``, ``unsqueeze_``, ``t_``, ``transpose_``,
``swapaxes_``, ``swapdims_``): the tensor itself takes the view's sizes and strides over the
same storage, its version is bumped, and autograd behaves as torch's (checked against
torch 2.x: a leaf that requires grad, or a view of one, refuses under grad mode)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

CASES = [
    ("squeeze_", (), (1, 3, 1), (3,)),
    ("squeeze_", (2,), (1, 3, 1), (1, 3)),
    ("squeeze_", ((0, 2),), (1, 3, 1), (3,)),
    ("unsqueeze_", (-1,), (2, 3), (2, 3, 1)),
    ("unsqueeze_", (0,), (2, 3), (1, 2, 3)),
    ("t_", (), (2, 3), (3, 2)),
    ("transpose_", (0, 2), (2, 3, 4), (4, 3, 2)),
    ("swapaxes_", (0, 1), (2, 3, 4), (3, 2, 4)),
    ("swapdims_", (2, 1), (2, 3, 4), (2, 4, 3)),
]


@pytest.mark.parametrize("op, args, shape, want", CASES)
def test_the_tensor_itself_takes_the_views_layout(op, args, shape, want):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    x = fg.tensor(a)
    storage = x.data_ptr()
    out_of_place = getattr(x, op[:-1])(*args)
    assert getattr(x, op)(*args) is x
    assert tuple(x.shape) == want and x._version == 1 and x.data_ptr() == storage
    assert x.stride() == out_of_place.stride()
    np.testing.assert_array_equal(x.numpy(), out_of_place.numpy())
    x.add_(1)                                            # still the same memory
    np.testing.assert_array_equal(out_of_place.numpy(), x.numpy())


def test_autograd_follows_torch():
    w = fg.ones(2, 3, requires_grad=True)
    for op, args in [("t_", ()), ("unsqueeze_", (0,)), ("squeeze_", ()), ("transpose_", (0, 1))]:
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used "
                                               "in an in-place operation"):
            getattr(w, op)(*args)
        with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
            getattr(w[0:1], op)(*args)
    assert tuple(w.shape) == (2, 3)
    with fg.no_grad():                                   # allowed, and w stays a leaf
        w.t_()
    assert tuple(w.shape) == (3, 2) and w.is_leaf and w.requires_grad
    names = {}
    for op, args in [("squeeze_", ()), ("squeeze_", (0,)), ("squeeze_", ((0,),)),
                     ("unsqueeze_", (0,)), ("t_", ()), ("transpose_", (0, 1)),
                     ("swapaxes_", (0, 1)), ("swapdims_", (0, 1))]:
        a = fg.ones(1, 3, requires_grad=True)
        h = a * 1
        getattr(h, op)(*args)
        names[(op, args)] = (h.grad_fn.name(), h._version)
    assert names == {("squeeze_", ()): ("SqueezeBackward3", 1),
                     ("squeeze_", (0,)): ("SqueezeBackward4", 1),
                     ("squeeze_", ((0,),)): ("SqueezeBackward5", 1),
                     ("unsqueeze_", (0,)): ("UnsqueezeBackward1", 1),
                     ("t_", ()): ("TBackward1", 1), ("transpose_", (0, 1)): ("TransposeBackward1", 1),
                     ("swapaxes_", (0, 1)): ("TransposeBackward1", 1),
                     ("swapdims_", (0, 1)): ("TransposeBackward1", 1)}


def test_gradients_flow_through_the_changed_tensor():
    a = fg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    h = a * 2
    h.t_()
    (h * fg.tensor([[1.], [2.], [3.]])).sum().backward()     # h is (3, 2) now
    np.testing.assert_array_equal(a.grad.numpy(), [[2, 4, 6], [2, 4, 6]])
    b = fg.ones(2, 3, requires_grad=True)
    v = (b * 1)[0]
    v.unsqueeze_(0)
    assert v.grad_fn.name() == "UnsqueezeBackward1" and tuple(v.shape) == (1, 3)
    (v * fg.arange(3, dtype=fg.float32)).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), [[0, 1, 2], [0, 0, 0]])


def test_views_taken_before_the_base_changed_layout_keep_their_elements():
    """A view of ``b`` taken before ``b.t_()`` still reads (and gets gradients for) the
    elements it viewed; a view taken after starts from the new layout. The gradient went to
    the transposed positions, or replaying the view on the new layout raised."""
    a = fg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    b = a * 1
    row = b[0]                                           # a[0, :]
    b.t_()                                               # (3, 2)
    col = b[:, 1]                                        # a[1, :], taken after
    loss = (row * fg.tensor([1.0, 2.0, 3.0])).sum() + (col * fg.tensor([10.0, 20.0, 30.0])).sum() \
        + (b * fg.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))).sum()
    loss.backward(retain_graph=True)
    # row: a[0] gets [1, 2, 3]; col: a[1] gets [10, 20, 30]; b: a[i, j] gets b's weight [j, i]
    np.testing.assert_array_equal(a.grad.numpy(), [[1, 4, 7], [11, 23, 35]])
    row.mul_(2)                                          # a write through the old view
    np.testing.assert_array_equal(b.detach().numpy().T[0], [0, 2, 4])
    a.grad = None
    (b * b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [[0, 8, 16], [6, 8, 10]])


def test_views_and_in_place_layout_changes_in_any_order_match_torch():
    torch = pytest.importorskip("torch")
    import random

    def run(lib, seed):
        rng = random.Random(seed)
        a = lib.tensor(np.arange(24.0).reshape(2, 3, 4) / 7, requires_grad=True)
        views = [a * 1]
        for _ in range(6):
            t, r = views[rng.randrange(len(views))], rng.random()
            if r < 0.25 and t.dim() >= 2:
                t.transpose_(*rng.sample(range(t.dim()), 2))
            elif r < 0.4:
                t.unsqueeze_(0)
            elif r < 0.5:
                t.squeeze_()
            elif r < 0.75 and t.dim() >= 1 and t.shape[0] > 1:
                views.append(t[1:])
            elif t.dim() >= 2:
                views.append(t.transpose(0, t.dim() - 1))
            else:
                t.mul_(3)
            if rng.random() < 0.3:
                views[rng.randrange(len(views))].mul_(2)
        sum((v * v).sum() * (i + 1) for i, v in enumerate(views)).backward()
        return a.grad.detach().numpy(), [tuple(v.shape) for v in views]

    for seed in range(120):
        got, shapes = run(fg, seed)
        want, want_shapes = run(torch, seed)
        assert shapes == want_shapes, seed
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"seed {seed}")


def test_a_view_stays_a_view_of_its_base():
    base = fg.zeros(2, 3)
    v = base[0]
    v.unsqueeze_(0)
    assert tuple(v.shape) == (1, 3) and v._base is base and tuple(base.shape) == (2, 3)
    v.add_(1)
    np.testing.assert_array_equal(base.numpy(), [[1, 1, 1], [0, 0, 0]])
    e = fg.ones(3).expand(2, 3)
    e.t_()                                  # a layout change writes nothing: allowed
    assert e.stride() == (1, 0)


def test_errors_match_torch():
    with pytest.raises(RuntimeError, match="t\\(\\) expects a tensor with <= 2 dimensions, "
                                           "but self is 3D"):
        fg.ones(2, 3, 4).t_()
    with pytest.raises(IndexError, match="Dimension out of range"):
        fg.ones(2, 3).unsqueeze_(4)
    with pytest.raises(IndexError, match="Dimension out of range"):
        fg.ones(2, 3).transpose_(0, 2)
    for op, args, want in [("t_", (), ()), ("unsqueeze_", (0,), (1,)), ("squeeze_", (), ())]:
        assert tuple(getattr(fg.tensor(1.0), op)(*args).shape) == want
    x = fg.ones(2, 3)
    assert x.squeeze_(0) is x and tuple(x.shape) == (2, 3)
    with pytest.raises(NotImplementedError, match="use the out-of-place t\\(\\)"):
        fg.compile(lambda y: y.t_() * 1)(fg.ones(2, 3))


# Writes through what eager returns as a copy or as a view, compiled as in eager (torch's
# rules): a reshape that cannot be a view copies, detach() and .data share storage.
_COPY_OR_VIEW = {
    "t().reshape(-1)": (lambda y: y.t().reshape(-1), False),
    "t().flatten()": (lambda y: y.t().flatten(), False),
    "permute(1, 0).reshape(6)": (lambda y: y.permute(1, 0).reshape(6), False),
    "[:, ::2].reshape(-1)": (lambda y: y[:, ::2].reshape(-1), False),
    "repeat(1, 1)": (lambda y: y.repeat(1, 1), False),
    "tile((1,))": (lambda y: y.tile((1,)), False),
    "expand(2, 2, 3).reshape(4, 3)": (lambda y: y.expand(2, 2, 3).reshape(4, 3), False),
    "t().reshape(3, 2)": (lambda y: y.t().reshape(3, 2), True),
    "ravel()": (lambda y: y.ravel(), True),
    "detach()": (lambda y: y.detach(), True),
    "data": (lambda y: y.data, True),
    "diagonal(1)": (lambda y: y.diagonal(1), True),
    "t().diagonal(-1)": (lambda y: y.t().diagonal(-1), True),
    "unfold(1, 1, 2)": (lambda y: y.unfold(1, 1, 2), True),       # windows that do not overlap
    "unfold(0, 2, 2)": (lambda y: y.unfold(0, 2, 2), True),
}


@pytest.mark.parametrize("name", list(_COPY_OR_VIEW))
def test_a_write_reaches_the_source_exactly_when_eager_returns_a_view(name):
    make, is_view = _COPY_OR_VIEW[name]

    def f(x):
        y = x * 1
        make(y).fill_(-1)
        return y
    x = fg.arange(6.0).reshape(2, 3)
    want = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    if is_view:                     # numpy's view of the same elements, written
        ref = fg.from_numpy(want.copy())
        make(ref).fill_(-1)
        want = ref.numpy()
        assert (want == -1).any()
    np.testing.assert_array_equal(f(x).numpy(), want)
    np.testing.assert_array_equal(fg.compile(f)(x).numpy(), want)


def test_traced_layout_queries_answer_as_eager():
    # Compiled, is_contiguous() was always True and stride() row-major, so a branch on the
    # layout took the other side.
    def f(x):
        y = x.t()
        flat = y.reshape(-1) if y.is_contiguous() else y * 1
        return flat, fg.tensor(y.stride()), fg.tensor(x[:, ::2].stride())
    x = fg.zeros(3, 4)
    for e, c in zip(f(x), fg.compile(f)(x)):
        assert e.shape == c.shape
        np.testing.assert_array_equal(e.numpy(), c.numpy())


def test_write_through_detach_of_a_tensor_requiring_grad_runs_eagerly():
    # Eager hides the write from autograd; a graph cannot: the function runs eagerly.
    def f(x):
        y = x * 2
        y.detach()[0] = 100.0
        return y
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.warns(UserWarning, match="eagerly"):
        out = fg.compile(f)(x)
    np.testing.assert_array_equal(out.detach().numpy(), [100.0, 4.0, 6.0])
    with pytest.raises(fg.ir.symbolic.ConcretizationError, match="detach"):
        fg.compile(f, fullgraph=True)(x)


@pytest.mark.parametrize("args", ["same", "overlapping"])
def test_arguments_sharing_storage_see_each_others_writes(args):
    # The trace took f(a, a) for two inputs: y did not see the write to x.
    def f(x, y):
        x.mul_(2)
        return y + 1
    base = np.array([1.0, 2.0, 3.0, 4.0], np.float32)

    def call(g):
        a = fg.tensor(base.copy())
        out = g(a, a) if args == "same" else g(a[:3], a[1:])
        return out.numpy(), a.numpy()
    want = call(f)
    with pytest.warns(UserWarning, match="share storage"):
        got = call(fg.compile(f))
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    # Without a write, shared arguments stay compiled.
    h = fg.compile(lambda x, y: x + y)
    a = fg.tensor(base)
    np.testing.assert_array_equal(h(a, a).numpy(), 2 * base)
