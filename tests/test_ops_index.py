"""Advanced indexing, index assignment and the index ops (gather, scatter_add, index_select,
masked_fill, tril/triu, topk, sort): values against numpy, gradients against finite
differences."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, check_grad, leaf

M = np.arange(12.0).reshape(3, 4)
X = np.arange(24.0).reshape(2, 3, 4)

# name, key (fusegrad), key (numpy), source array
ADVANCED = [
    ("int_tensor", lambda: fg.tensor([2, 0]), [2, 0], M),
    ("list", lambda: [2, 0, 2], [2, 0, 2], M),
    ("negative", lambda: fg.tensor([-1, -3]), [-1, -3], M),
    ("2d_index", lambda: fg.tensor([[0, 1], [2, 2]]), np.array([[0, 1], [2, 2]]), M),
    ("pair", lambda: ([0, 2], [1, 3]), ([0, 2], [1, 3]), M),
    ("pair_broadcast", lambda: (fg.tensor([[0], [2]]), fg.tensor([1, 3])),
     (np.array([[0], [2]]), np.array([1, 3])), M),
    ("adv_then_slice", lambda: ([0, 2], slice(1, 3)), ([0, 2], slice(1, 3)), M),
    ("slice_then_adv", lambda: (slice(1, None), [0, 3]), (slice(1, None), [0, 3]), M),
    ("non_adjacent", lambda: ([0, 1], slice(None), [0, 3]), ([0, 1], slice(None), [0, 3]), X),
    ("adjacent_mid", lambda: (slice(None), [0, 2], [1, 3]), (slice(None), [0, 2], [1, 3]), X),
    # torch applies the int first, so the list stays in place (numpy would move it first)
    ("int_and_adv", lambda: (0, slice(None), [1, 2]), lambda a: a[0][:, [1, 2]], X),
    ("adv_int_split", lambda: ([0, 1], slice(None), 1), ([0, 1], slice(None), 1), X),
    ("ellipsis_adv", lambda: (Ellipsis, [0, 1]), (Ellipsis, [0, 1]), X),
    ("none_adv", lambda: (None, [0, 1]), (None, [0, 1]), M),
    ("mask_full", lambda: fg.tensor(M > 5), M > 5, M),
    ("mask_rows", lambda: fg.tensor([True, False, True]), np.array([True, False, True]), M),
    ("mask_cols", lambda: (slice(None), fg.tensor([True, False, False, True])),
     (slice(None), np.array([True, False, False, True])), M),
    ("mask_2d_of_3d", lambda: fg.tensor(X[..., 0] > 5), X[..., 0] > 5, X),
    ("numpy_index", lambda: np.array([0, 2]), np.array([0, 2]), M),
    ("numpy_mask", lambda: np.array([True, False, True]), np.array([True, False, True]), M),
    ("empty_index", lambda: fg.tensor([], dtype=fg.int64), np.array([], dtype=np.int64), M),
    ("all_false_mask", lambda: fg.zeros(3, dtype=fg.bool), np.zeros(3, dtype=bool), M),
    # a tuple within the key is an index sequence, as a list is (it raised)
    ("tuple_entries", lambda: ((1, 0), slice(None), (2, 3)), ([1, 0], slice(None), [2, 3]), X),
    ("nested_tuple", lambda: (((0,), (1,)), (2, 1)), (np.array([[0], [1]]), [2, 1]), M),
    ("one_tuple_entry", lambda: ((2, 0),), [2, 0], M),
    # None between advanced indices separates them: their dims go first
    ("adv_none_adv", lambda: ([0, 1], None, [1, 2]), ([0, 1], None, [1, 2]), X),
    ("int_tuple_none", lambda: (1, (2, 1, 0), None, (3, 1, 0)), lambda a: a[1][[2, 1, 0], None, [3, 1, 0]],
     X),
]
ADV_IDS = [a[0] for a in ADVANCED]


@pytest.mark.parametrize("name,key,np_key,src", ADVANCED, ids=ADV_IDS)
def test_advanced_indexing_values(name, key, np_key, src):
    out = fg.tensor(src)[key()]
    np.testing.assert_array_equal(out.numpy(), np_key(src) if callable(np_key) else src[np_key])


@pytest.mark.parametrize("name,key,np_key,src", ADVANCED, ids=ADV_IDS)
def test_advanced_indexing_copies(name, key, np_key, src):
    x = fg.tensor(src)
    out = x[key()]
    if out.numel():
        assert not np.shares_memory(out.numpy(), x.numpy())
        out.view(-1)[0] = -100.0
        assert (x.numpy() == src).all()


@pytest.mark.parametrize("name,key,np_key,src", ADVANCED, ids=ADV_IDS)
@pytest.mark.parametrize("kind", ["contiguous", "transposed"])
def test_advanced_indexing_grad(name, key, np_key, src, kind):
    k = key()
    check_grad(lambda x: x[k], arr(*src.shape), kind=kind)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_list_key_holding_tensors_slices_or_none_is_a_tuple(compiled):
    # torch's (and old numpy's) rule, with its deprecation warning: x[[i, j]] is x[i, j] when
    # the list holds a tensor, a sequence, a slice, ... or None; x[[i]] is x[i] (it was x[i][None])
    i, j = fg.tensor([0, 1]), fg.tensor([1, 2])

    def index(x, key):
        return x[key]

    def run(key):
        f = fg.compile(lambda x: index(x, key)) if compiled else (lambda x: index(x, key))
        with pytest.warns(UserWarning, match="Using a non-tuple sequence for multidimensional "
                                             "indexing is deprecated"):
            return f(fg.tensor(X)).numpy()
    np.testing.assert_array_equal(run([i, j]), X[[0, 1], [1, 2]])
    np.testing.assert_array_equal(run([i]), X[[0, 1]])
    np.testing.assert_array_equal(run([0, slice(None), 1]), X[0, :, 1])
    np.testing.assert_array_equal(run([None, 0]), X[None, 0])
    np.testing.assert_array_equal(run([(0, 1), (1, 2)]), X[[0, 1], [1, 2]])
    np.testing.assert_array_equal(run([1, [0, 2]]), X[1, [0, 2]])
    assert fg.tensor(X)[[1, 0]].shape == (2, 3, 4)       # plain integers stay one index
    with pytest.warns(UserWarning):
        check_grad(lambda x: x[[i, slice(None), j]], arr(2, 3, 4))
    y = fg.tensor(X)
    with pytest.warns(UserWarning):
        y[[0, slice(None), 1]] = -1.0
    assert y[0, :, 1].tolist() == [-1.0, -1.0, -1.0] and y.sum().item() == X.sum() - 15 - 3


def test_repeated_indices_accumulate_gradient():
    x = leaf(np.zeros(3))
    x[[0, 0, 2, 0]].sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]


@pytest.mark.parametrize("key,msg", [
    (lambda: fg.tensor([3]), "index 3 is out of bounds for dimension 0 with size 3"),
    (lambda: ([0], [5]), "index 5 is out of bounds for dimension 1 with size 4"),
    (lambda: ([0], [-5]), "index -5 is out of bounds for dimension 1 with size 4"),
    (lambda: fg.tensor([1.0]), "tensors used as indices must be long, int, byte or bool"),
    (lambda: fg.tensor([True, False]), r"The shape of the mask \[2\] at index 0 does not match "
                                       r"the shape of the indexed tensor \[3\]"),
    (lambda: ([0, 1], [0, 1, 2]), "size of tensor a \\(2\\) must match the size of tensor b "
                                  "\\(3\\)"),
])
def test_advanced_indexing_errors(key, msg):
    # an index past the end of one dim must not wrap into the next row once linearized
    with pytest.raises((IndexError, RuntimeError), match=msg):
        fg.tensor(M)[key()]


# --------------------------------------------------------------------------- __setitem__


def _set(key, value):
    def run(x):
        x[key() if callable(key) else key] = value() if callable(value) else value
    return run


SETITEMS = [
    ("int", _set(1, 0.0), lambda a: a.__setitem__(1, 0.0)),
    ("negative_int", _set(-1, -1.0), lambda a: a.__setitem__(-1, -1.0)),
    ("slice", _set(slice(1, None), 5.0), lambda a: a.__setitem__(slice(1, None), 5.0)),
    ("slice_step", _set((slice(None), slice(None, None, 2)), 7.0),
     lambda a: a.__setitem__((slice(None), slice(None, None, 2)), 7.0)),
    ("element", _set((0, 1), 100.0), lambda a: a.__setitem__((0, 1), 100.0)),
    ("row_tensor", _set(0, lambda: fg.tensor([1.0, 2.0, 3.0, 4.0])),
     lambda a: a.__setitem__(0, [1.0, 2.0, 3.0, 4.0])),
    ("column_broadcast", _set((slice(None), 1), lambda: fg.tensor([9.0, 8.0, 7.0])),
     lambda a: a.__setitem__((slice(None), 1), [9.0, 8.0, 7.0])),
    ("ellipsis", _set((Ellipsis, 0), 3.0), lambda a: a.__setitem__((Ellipsis, 0), 3.0)),
    ("everything", _set(slice(None), lambda: fg.zeros(4)), lambda a: a.__setitem__(slice(None), 0)),
    ("mask_scalar", _set(lambda: fg.tensor(M > 5), 0.0), lambda a: a.__setitem__(M > 5, 0.0)),
    ("mask_values", _set(lambda: fg.tensor(M > 9), lambda: fg.tensor([-1.0, -2.0])),
     lambda a: a.__setitem__(M > 9, [-1.0, -2.0])),
    ("mask_0d_value", _set(lambda: fg.tensor(M > 9), lambda: fg.tensor(-3.0)),
     lambda a: a.__setitem__(M > 9, -3.0)),
    ("mask_rows", _set(lambda: fg.tensor([True, False, True]), -1.0),
     lambda a: a.__setitem__(np.array([True, False, True]), -1.0)),
    ("mask_cols", _set(lambda: (slice(None), fg.tensor([True, False, False, True])), -1.0),
     lambda a: a.__setitem__((slice(None), np.array([True, False, False, True])), -1.0)),
    ("index_tensor", _set(lambda: fg.tensor([0, 2]), -1.0), lambda a: a.__setitem__([0, 2], -1.0)),
    ("index_rows", _set([0, 2], lambda: fg.tensor([[1.0] * 4, [2.0] * 4])),
     lambda a: a.__setitem__([0, 2], [[1.0] * 4, [2.0] * 4])),
    ("index_pairs", _set(([0, 2], [1, 3]), lambda: fg.tensor([50.0, 60.0])),
     lambda a: a.__setitem__(([0, 2], [1, 3]), [50.0, 60.0])),
    ("index_negative", _set(lambda: fg.tensor([-1]), 0.0), lambda a: a.__setitem__(-1, 0.0)),
    ("duplicate_last_wins", _set(lambda: fg.tensor([0, 0]), lambda: fg.tensor([[1.0] * 4,
                                                                                [2.0] * 4])),
     lambda a: a.__setitem__(0, 2.0)),
    ("int_value", _set(0, 5), lambda a: a.__setitem__(0, 5)),
]


@pytest.mark.parametrize("name,fg_set,np_set", SETITEMS, ids=[s[0] for s in SETITEMS])
def test_setitem(name, fg_set, np_set):
    x = fg.tensor(M)
    a = M.copy()
    fg_set(x)
    np_set(a)
    np.testing.assert_array_equal(x.numpy(), a)
    assert x._version >= 1


@pytest.mark.parametrize("name,fg_set,np_set", SETITEMS, ids=[s[0] for s in SETITEMS])
def test_setitem_on_a_transposed_tensor(name, fg_set, np_set):
    base = fg.tensor(np.ascontiguousarray(M.T))
    x = base.t()
    a = M.copy()
    fg_set(x)
    np_set(a)
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal(base.numpy(), a.T)     # written through to the base


def test_setitem_casts_into_the_target_dtype():
    t = fg.arange(4)
    t[1] = 2.7
    assert t.tolist() == [0, 2, 2, 3] and t.dtype is fg.int64
    t[fg.tensor([0, 3])] = fg.tensor([9.9, -1.5])
    assert t.tolist() == [9, 2, 2, -1]


def test_setitem_errors():
    x = fg.tensor(M)
    with pytest.raises(RuntimeError, match=r"expanded size of the tensor \(4\) must match the "
                                           r"existing size \(2\)"):
        x[0] = fg.tensor([1.0, 2.0])
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x[fg.tensor([3])] = 0.0
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 4"):
        x[1, 5] = 0.0


@pytest.mark.parametrize("key", [
    1, (slice(None), 2), (slice(None), slice(None, None, 2)), [0, 2], ([0, 2], [1, 1]),
    "mask"], ids=["int", "column", "step", "rows", "pairs", "mask"])
def test_setitem_gradients(key):
    # y = x * 1; y[key] = v: x's gradient is zero where v was written, v's is the upstream grad
    mask = M > 4
    k = fg.tensor(mask) if key == "mask" else key

    def f(x, v):
        y = x * 1
        target_shape = y[k].shape
        y[k] = v.reshape(-1)[: int(np.prod(target_shape))].reshape(target_shape) \
            if target_shape else v.reshape(-1)[0]
        return y * fg.arange(1.0, 13.0, dtype=fg.float64).reshape(3, 4)

    check_grad(f, arr(3, 4), arr(12, seed=1))


# --------------------------------------------------------------------------- gather / scatter


@pytest.mark.parametrize("dim,index", [
    (1, [[0, 0], [1, 0], [3, 2]]), (0, [[2, 1, 0, 0]]), (1, [[1], [2]]), (-1, [[3, 3, 3, 3]]),
    (0, [[0, 1, 2, 0], [2, 2, 2, 2], [1, 1, 1, 1]])])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_gather(dim, index, kind):
    idx = np.array(index)
    out = fg.tensor(M).gather(dim, fg.tensor(idx))
    sub = M[tuple(slice(0, s) if i != (dim % 2) else slice(None) for i, s in enumerate(idx.shape))]
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(sub, idx, axis=dim))
    check_grad(lambda x: x.gather(dim, fg.tensor(idx)), arr(3, 4), kind=kind)


def test_gather_errors_and_dtypes():
    m = fg.tensor(M)
    assert m.gather(1, fg.tensor([[1]], dtype=fg.int32)).tolist() == [[1.0]]
    with pytest.raises(RuntimeError, match="Index tensor must have the same number of dimensions "
                                           r"as input tensor \(input f64\[3,4\], index i64\[1\]\)"):
        m.gather(1, fg.tensor([1]))
    with pytest.raises(IndexError, match="gather: index 4 is out of bounds for dimension 1 with "
                                         "size 4"):
        m.gather(1, fg.tensor([[4]]))
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):
        m.gather(1, fg.tensor([[1.0]]))


@pytest.mark.parametrize("dim,index", [(1, [[0, 0], [1, 1], [3, 3]]), (0, [[0, 2], [0, 0]])])
def test_scatter_add(dim, index):
    idx = np.array(index)
    src = np.arange(1.0, 1.0 + idx.size).reshape(idx.shape)
    base = np.zeros((3, 4))
    out = fg.tensor(base).scatter_add(dim, fg.tensor(idx), fg.tensor(src))
    expected = base.copy()
    for pos in np.ndindex(idx.shape):
        target = list(pos)
        target[dim] = idx[pos]
        expected[tuple(target)] += src[pos]
    np.testing.assert_array_equal(out.numpy(), expected)
    check_grad(lambda x, s: x.scatter_add(dim, fg.tensor(idx), s), arr(3, 4), src)


def test_scatter_add_uses_only_the_index_extent_of_src():
    out = fg.zeros(2, 2).scatter_add(0, fg.tensor([[1]]), fg.arange(1.0, 5.0).reshape(2, 2))
    assert out.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    out = fg.zeros(2, 2).scatter_add(0, fg.tensor([[1, 0]]), fg.arange(1.0, 5.0).reshape(2, 2))
    assert out.tolist() == [[0.0, 2.0], [1.0, 0.0]]


@pytest.mark.parametrize("dim,index", [(1, [3, 0, 3]), (0, [1]), (-1, [2, 2])])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_index_select(dim, index, kind):
    out = fg.tensor(M).index_select(dim, fg.tensor(index))
    np.testing.assert_array_equal(out.numpy(), np.take(M, index, axis=dim))
    check_grad(lambda x: x.index_select(dim, fg.tensor(index)), arr(3, 4), kind=kind)


def test_index_select_details():
    m = fg.tensor(M)
    assert m.index_select(0, fg.tensor(1)).shape == (1, 4)
    assert m.index_select(0, fg.tensor([1], dtype=fg.int32)).tolist() == [M[1].tolist()]
    with pytest.raises(IndexError, match="Index is supposed to be a vector"):
        m.index_select(0, fg.tensor([[1]]))
    with pytest.raises(IndexError, match="Expected dtype int32/int64 for index"):
        m.index_select(0, fg.tensor([1.0]))


def test_index_add():
    out = fg.zeros(3).index_add(0, fg.tensor([0, 0, 2]), fg.tensor([1.0, 2.0, 3.0]))
    assert out.tolist() == [3.0, 0.0, 3.0]
    out = fg.zeros(3).index_add(0, fg.tensor([0, 0, 2]), fg.tensor([1.0, 2.0, 3.0]), alpha=2)
    assert out.tolist() == [6.0, 0.0, 6.0]
    check_grad(lambda x, s: x.index_add(1, fg.tensor([0, 3, 0]), s), arr(2, 4), arr(2, 3))


def test_index_add_rows_with_repeated_and_negative_indices_matches_numpy():
    """Along dim 0 (an embedding's gradient) rows accumulate in index order, as np.add.at
    does; a negative index is refused, as torch does (indexing's gradient, which wraps
    them, shares the primitive: see test_indexing_gradient_with_negative_indices)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3, 2)).astype(np.float32)
    idx = np.array([[0, 5, 5], [2, 0, 0]])
    src = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    want = x.copy()
    np.add.at(want, idx.reshape(-1), src.reshape(6, 3, 2))
    got = fg.tensor(x).index_add(0, fg.tensor(idx.reshape(-1)), fg.tensor(src.reshape(6, 3, 2)))
    np.testing.assert_array_equal(got.numpy(), want)
    emb = fg.nn.Embedding(6, 4)
    emb(fg.tensor(idx)).sum().backward()
    counts = np.bincount(idx.reshape(-1), minlength=6).astype(np.float32)
    np.testing.assert_array_equal(emb.weight.grad.numpy(), np.repeat(counts[:, None], 4, 1))
    with pytest.raises(IndexError, match="index_add: index -1 is out of bounds"):
        fg.zeros(6).index_add(0, fg.tensor([0, -1]), fg.ones(2))


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("compiled", [False, True])
def test_index_add_rows_into_any_layout(kind, compiled):
    """Along dim 0 of a transposed or strided x (a copy of which numpy keeps in x's order),
    and through a transposed view in place: the sums were added into a temporary and lost."""
    x = arr(3, 4)
    idx = np.array([0, 2, 0])
    src = arr(3, 4, seed=1)
    want = x.copy()
    np.add.at(want, idx, src)

    def f(t, i, s):
        return t.index_add(0, i, s), t.index_put((i,), s, accumulate=True)

    fn = fg.compile(f) if compiled else f
    for got in fn(leaf(x, False, kind), fg.tensor(idx), fg.tensor(src)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)

    def g(b, i, s):
        b.T.index_put_((i,), s, accumulate=True)
        return b * 1

    b = fg.tensor(np.ascontiguousarray(x.T))
    out = (fg.compile(g) if compiled else g)(b, fg.tensor(idx), fg.tensor(src))
    np.testing.assert_allclose(out.numpy(), want.T, rtol=1e-12)
    np.testing.assert_allclose(b.numpy(), want.T, rtol=1e-12)


def test_index_add_rows_of_no_elements():
    """Rows of no elements (x of shape (3, 0)): nothing to add, the indices still checked.
    The native loop's column loop ran at least once and wrote past the buffer."""
    from fusegrad.runtime.native import index_add_rows
    x = np.zeros((3, 0, 2), np.float32)
    out = np.empty_like(x)
    assert index_add_rows(out, x, np.array([2, 0, 2]), np.zeros((3, 0, 2), np.float32))
    assert not index_add_rows(out, x, np.array([3]), np.zeros((1, 0, 2), np.float32))
    got = fg.zeros(3, 0).index_add(0, fg.tensor([2, 0]), fg.zeros(2, 0))
    assert tuple(got.shape) == (3, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_index_add_row_loop_equals_np_add_at_bit_for_bit(dtype):
    """The native row loop (float32/float64; other dtypes take np.add.at) adds in np.add.at's
    order: duplicates, negative indices (wrapped by the primitive), a transposed source."""
    from fusegrad.ops import prims as P
    from fusegrad.runtime.native import index_add_rows
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((50, 7)) * 10).astype(dtype)
    idx = rng.integers(-50, 50, 400)
    src = (rng.standard_normal((7, 400)) * 10).astype(dtype).T     # not C-contiguous
    want = x.copy()
    np.add.at(want, np.where(idx < 0, idx + 50, idx), src)
    got = P._index_add_impl(x, idx, src, axis=0)
    np.testing.assert_array_equal(got, want)
    # Into another buffer (a compiled step's output slot, holding last call's values): x is
    # copied in first; an index out of range writes nothing and reports it.
    rows = np.where(idx < 0, idx + 50, idx)
    out = np.full_like(x, 7)
    native = index_add_rows(out, x, rows, np.ascontiguousarray(src))
    assert native == (dtype != np.int32)
    if native:
        np.testing.assert_array_equal(out, want)
        stale = out.copy()
        assert not index_add_rows(out, x, np.array([0, 50]), np.ascontiguousarray(src[:2]))
        np.testing.assert_array_equal(out, stale)


def test_indexing_gradient_with_negative_indices():
    x = fg.tensor(np.arange(5.0), requires_grad=True)
    x[fg.tensor([-1, 0, -1])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1, 0, 0, 0, 2])


def test_take_along_dim():
    a = fg.tensor([[10, 30, 20], [1, 2, 3]])
    assert fg.take_along_dim(a, fg.tensor([[2, 1]]), 1).tolist() == [[20, 30], [3, 2]]
    assert fg.take_along_dim(a, fg.tensor([[2], [0]]), 1).tolist() == [[20], [1]]
    idx = fg.tensor(np.argsort(M, axis=1))
    check_grad(lambda x: fg.take_along_dim(x, idx, 1), arr(3, 4))


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("kind", LAYOUTS)
def test_masked_fill(kind):
    mask = M > 6
    out = fg.tensor(M).masked_fill(fg.tensor(mask), -1.0)
    np.testing.assert_array_equal(out.numpy(), np.where(mask, -1.0, M))
    row_mask = np.array([True, False, False, True])
    out = fg.tensor(M).masked_fill(fg.tensor(row_mask), 0.0)
    np.testing.assert_array_equal(out.numpy(), np.where(row_mask, 0.0, M))
    check_grad(lambda x: x.masked_fill(fg.tensor(mask), 2.0), arr(3, 4), kind=kind)


def test_masked_fill_values_and_errors():
    m = fg.tensor(M)
    assert m.masked_fill(m > 9, fg.tensor(2.5))[2].tolist() == [8.0, 9.0, 2.5, 2.5]
    assert fg.arange(3).masked_fill(fg.tensor([True, False, False]), 1.7).tolist() == [1, 1, 2]
    v = fg.tensor(2.0, dtype=fg.float64, requires_grad=True)
    m.double().masked_fill(m > 9, v).sum().backward()
    assert v.grad.item() == 2.0
    with pytest.raises(RuntimeError, match="masked_fill_ only supports boolean masks, but got mask "
                                           "with dtype float64"):
        m.masked_fill(m, 0.0)
    with pytest.raises(RuntimeError, match="only supports a 0-dimensional value tensor"):
        m.masked_fill(m > 1, fg.tensor([1.0]))


@pytest.mark.parametrize("compiled", [False, True])
def test_masked_fill_and_scatter_broadcast_the_input_to_the_mask(compiled):
    # torch: out of place, the input broadcasts to the mask's shape (fusegrad raised); in place
    # the input cannot grow, and torch's errors say so
    def fill(x, m):
        return x.masked_fill(m, 1.0)

    def scatter(x, m, s):
        return x.masked_scatter(m, s)
    if compiled:
        fill, scatter = fg.compile(fill), fg.compile(scatter)
    assert fill(fg.zeros(1), fg.ones(3, dtype=fg.bool)).tolist() == [1.0, 1.0, 1.0]
    x = fg.tensor([[5.0], [7.0]], dtype=fg.float64, requires_grad=True)
    mask = fg.tensor([True, False, True])
    y = fill(x, mask)
    assert y.tolist() == [[1.0, 5.0, 1.0], [1.0, 7.0, 1.0]]
    (g,) = fg.autograd.grad(y.sum(), x)
    assert g.tolist() == [[1.0], [1.0]]      # the one unmasked column each row reaches
    s = fg.arange(6.0, dtype=fg.float64, requires_grad=True)
    y = scatter(x, mask, s)
    assert y.tolist() == [[0.0, 5.0, 1.0], [2.0, 7.0, 3.0]]
    gx, gs = fg.autograd.grad((y * fg.tensor([1.0, 2.0, 3.0])).sum(), (x, s))
    assert gx.tolist() == [[2.0], [2.0]] and gs.tolist() == [1.0, 3.0, 1.0, 3.0, 0.0, 0.0]
    assert fg.zeros(1).masked_scatter(fg.ones(3, dtype=fg.bool), s).grad_fn.name() == \
        "MaskedScatterBackward0"
    with pytest.raises(RuntimeError, match=r"output with shape \[1\] doesn't match the broadcast "
                                           r"shape \[3\]"):
        fg.zeros(1).masked_fill_(fg.ones(3, dtype=fg.bool), 1.0)
    with pytest.raises(RuntimeError, match=r"expanded size of the tensor \(1\) must match the "
                                           r"existing size \(3\)"):
        fg.zeros(1).masked_scatter_(fg.ones(3, dtype=fg.bool), fg.arange(3.0))
    z = fg.zeros(3)
    z.masked_scatter_(fg.tensor([True]), fg.arange(3.0))
    assert z.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[3\] cannot be "
                                           r"broadcast to indexing result of shape \[1\]"):
        fg.zeros(1).index_put_((fg.tensor([0]),), fg.ones(3))


def test_masked_select_and_nonzero():
    m = fg.tensor(M)
    assert m.masked_select(m > 9).tolist() == [10.0, 11.0]
    assert m.masked_select(fg.tensor([True, False, False, True])).tolist() == \
        [0.0, 3.0, 4.0, 7.0, 8.0, 11.0]
    nz = fg.tensor([[0, 1], [1, 0]]).nonzero()
    assert nz.tolist() == [[0, 1], [1, 0]] and nz.dtype is fg.int64
    assert fg.argwhere(fg.tensor([0, 3, 0, 4])).tolist() == [[1], [3]]
    rows, = fg.nonzero(fg.tensor([0, 1, 1]), as_tuple=True)
    assert rows.tolist() == [1, 2]
    assert fg.zeros(2, 2).nonzero().shape == (0, 2)
    check_grad(lambda x: x.masked_select(fg.tensor(M > 4)), arr(3, 4))


@pytest.mark.parametrize("diagonal", [0, 1, -1, 2, -3])
@pytest.mark.parametrize("fn,ref", [(fg.tril, np.tril), (fg.triu, np.triu)], ids=["tril", "triu"])
def test_tril_triu(fn, ref, diagonal):
    np.testing.assert_array_equal(fn(fg.tensor(M), diagonal).numpy(), ref(M, diagonal))
    np.testing.assert_array_equal(fn(fg.tensor(X), diagonal).numpy(), ref(X, diagonal))
    check_grad(lambda x: fn(x, diagonal), arr(3, 4))
    check_grad(lambda x: fn(x, diagonal), arr(4, 3), kind="transposed")


def test_tril_needs_a_matrix():
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        fg.arange(3).tril()
    with pytest.raises(RuntimeError, match="triu: input tensor must have at least 2 dimensions"):
        fg.arange(3).triu()


# --------------------------------------------------------------------------- sort and topk


def test_sort():
    x = fg.tensor([3.0, 1.0, 2.0, 1.0])
    values, indices = x.sort()
    assert values.tolist() == [1.0, 1.0, 2.0, 3.0] and indices.tolist() == [1, 3, 2, 0]
    out = x.sort(descending=True)
    assert type(out).__name__ == "sort" and out._fields == ("values", "indices")
    assert out.values.tolist() == [3.0, 2.0, 1.0, 1.0] and out.indices.tolist() == [0, 2, 1, 3]
    v, i = fg.tensor([[3, 1], [1, 2]]).sort(0)
    assert v.tolist() == [[1, 1], [3, 2]] and i.tolist() == [[1, 0], [0, 1]]
    v, i = fg.tensor([3.0, float("nan"), 1.0]).sort()
    assert v[:2].tolist() == [1.0, 3.0] and np.isnan(v[2].item()) and i.tolist() == [2, 0, 1]
    assert x.argsort().tolist() == [1, 3, 2, 0]
    assert x.argsort(descending=True).tolist() == [0, 2, 1, 3]
    assert fg.tensor(5.0).sort().values.item() == 5.0


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dim,descending", [(-1, False), (0, True)])
def test_sort_grad(kind, dim, descending):
    a = arr(3, 4)
    values = fg.tensor(a).sort(dim, descending).values
    expected = np.sort(a, axis=dim)
    np.testing.assert_array_equal(values.numpy(), np.flip(expected, dim) if descending else expected)
    check_grad(lambda x: x.sort(dim, descending).values, a, kind=kind)


def test_topk():
    x = fg.tensor([3.0, 1.0, 4.0, 1.0, 5.0])
    out = x.topk(2)
    assert type(out).__name__ == "topk"
    assert out.values.tolist() == [5.0, 4.0] and out.indices.tolist() == [4, 2]
    small = x.topk(2, largest=False)
    assert small.values.tolist() == [1.0, 1.0] and sorted(small.indices.tolist()) == [1, 3]
    m = fg.tensor(M)
    assert m.topk(1, dim=0).values.tolist() == [[8.0, 9.0, 10.0, 11.0]]
    assert m.topk(0).values.shape == (3, 0)
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        m.topk(5)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_topk_grad(kind):
    check_grad(lambda x: x.topk(2, dim=1).values, arr(3, 4), kind=kind)
    check_grad(lambda x: x.topk(2, dim=0, largest=False).values, arr(3, 4), kind=kind)


def _setitem_repeated(x, v, i):
    y = x.clone()
    y[i] = v
    return y


def _add_repeated(x, i):
    y = x.clone()
    y[i] += 1
    return y


@pytest.mark.parametrize("compiled", [False, True])
def test_setitem_with_repeated_indices_lets_the_last_write_win(compiled):
    # Compiled, x[i] = v summed the differences of repeated positions (40 where numpy, torch
    # and eager write 30), and the duplicated element's gradient was -w instead of 0.
    f = fg.compile(_setitem_repeated) if compiled else _setitem_repeated
    g = fg.compile(_add_repeated) if compiled else _add_repeated
    i = np.array([0, 2, 0, 4])
    x = leaf(np.arange(1.0, 6.0, dtype=np.float32))
    v = leaf(np.array([10.0, 20.0, 30.0, 40.0], np.float32))
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    out = f(x * 1, v, fg.tensor(i))
    want = np.arange(1.0, 6.0, dtype=np.float32)
    want[i] = [10.0, 20.0, 30.0, 40.0]
    np.testing.assert_array_equal(out.detach().numpy(), want)
    (out * fg.tensor(w)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 2, 0, 4, 0])
    # every write gets its position's gradient, the overruled one too (torch's)
    np.testing.assert_array_equal(v.grad.numpy(), [1, 3, 1, 5])
    np.testing.assert_array_equal(g(fg.zeros(5), fg.tensor([0, 0, 1, 3, 3, 3])).numpy(),
                                  [1, 1, 0, 1, 0])


@pytest.mark.parametrize("compiled", [False, True])
def test_setitem_writes_exact_values_over_inf_nan_and_large_elements(compiled):
    # The write added v - old: NaN over inf and NaN, and 1e8 + (1.0 - 1e8) is 0 in float32.
    def f(x, v):
        x = x.clone()
        x[fg.tensor([0, 1, 2])] = v
        return x
    g = fg.compile(f) if compiled else f
    x = fg.tensor([float("inf"), float("nan"), 1e8, 4.0])
    v = fg.tensor([5.0, -0.0, 1.0])
    masked = x.clone()
    masked[fg.tensor([True, True, True, False])] = v
    for out in (g(x, v), masked):
        np.testing.assert_array_equal(out.numpy(), [5.0, -0.0, 1.0, 4.0])
        assert np.signbit(out.numpy()[1])
    b = fg.tensor([True, False, True])
    b[fg.tensor([1])] = True                           # bool: raised (bool subtraction)
    assert b.tolist() == [True, True, True]


@pytest.mark.parametrize("compiled", [False, True])
def test_index_copy_and_index_put_with_repeated_indices_take_the_last(compiled):
    # They summed the slices (3 from writes of 1 and 2): torch leaves the winner unspecified,
    # its CPU kernel (and numpy's assignment) keeps the last.
    def f(x, i, v):
        return x.index_copy(0, i, v), x.index_put((i,), v), x.clone().index_put_((i,), v)
    g = fg.compile(f) if compiled else f
    x = fg.zeros(4, 2)
    v = fg.tensor(np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2))
    for out in g(x, fg.tensor([0, 3, 0]), v):
        np.testing.assert_array_equal(out.numpy(), [[5, 6], [0, 0], [0, 0], [3, 4]])


def test_index_fill_keeps_the_dtype_of_its_input():
    out = fg.tensor([1, 2, 3]).index_fill(0, fg.tensor([1]), 3.9)
    assert out.dtype is fg.int64 and out.tolist() == [1, 3, 3]
    assert fg.tensor([True, False]).index_fill(0, fg.tensor([1]), 2).tolist() == [True, True]


@pytest.mark.parametrize("fn, i", [
    (lambda x, i: x[fg.tensor([0]), i], [4]),
    (lambda x, i: x[:, i], [-5]),
    (lambda x, i: x[i, 1:], [3, 4]),
])
def test_compiled_advanced_index_out_of_range_raises(fn, i):
    # Compiled, each index tensor was linearized unchecked: x[0, 4] of a 4x4 read x[1, 0].
    x = fg.arange(16.0).reshape(4, 4)
    with pytest.raises(IndexError, match="out of bounds"):
        fn(x, fg.tensor(i))
    with pytest.raises(IndexError, match="out of bounds"):
        fg.compile(fn)(x, fg.tensor(i))
    # In range, negative indices wrap as in eager.
    j = fg.tensor([-1, 0])
    np.testing.assert_array_equal(fg.compile(fn)(x, j).numpy(), fn(x, j).numpy())


@pytest.mark.parametrize("compiled", [False, True])
def test_zero_dim_index_tensor_selects_like_an_int(compiled):
    # torch reads a 0-d integer index as an int: x[i0, :, j] is x[1, :, j] (shape [4, 2]), not
    # numpy's placement of separated advanced dims first. Traced, i0 has no value to read.
    def f(x, i0, j):
        return x[i0, :, j], x[None, i0, None, 1:, -i0 - 1]

    x = leaf(X)
    a, b = (fg.compile(f) if compiled else f)(x, fg.tensor(1), fg.tensor([[0, 2]]))
    assert a.shape == (3, 1, 2) and b.shape == (1, 1, 2)
    np.testing.assert_array_equal(a.detach().numpy(), X[1][:, [[0, 2]]])
    np.testing.assert_array_equal(b.detach().numpy(), X[None, 1, None, 1:, -2])
    (a.sum() + (2 * b).sum()).backward()
    expected = np.zeros_like(X)
    expected[1, :, [0, 2]] = 1
    expected[1, 1:, -2] += 2
    np.testing.assert_array_equal(x.grad.numpy(), expected)


@pytest.mark.parametrize("compiled", [False, True])
def test_index_put_take_and_put_refuse_out_of_range_indices(compiled):
    # An index one past a dim's end, once linearized with the others, named the first element
    # of the next row; take(-28) of 24 elements wrapped twice. torch raises for both.
    x = fg.tensor(arr(4, 6))
    cases = [
        (lambda t, i: t.index_put((i % 4, i), fg.ones(2)), "index_put: index 6 is out of bounds",
         [0, 6]),
        (lambda t, i: t.index_put((i % 4, i), fg.ones(2), accumulate=True),
         "index_put: index -7 is out of bounds", [0, -7]),
        (lambda t, i: t.take(i), "take: index -28 is out of bounds", [0, -28]),
        (lambda t, i: t.put(i, fg.ones(2), accumulate=True), "index_put: index 24 is out of bounds",
         [0, 24]),
    ]
    for f, message, index in cases:
        with pytest.raises(IndexError, match=message):
            (fg.compile(f) if compiled else f)(x, fg.tensor(index))
    ok = (fg.compile(cases[0][0]) if compiled else cases[0][0])(x, fg.tensor([0, -6]))
    want = arr(4, 6)
    want[[0, 2], [0, -6]] = 1
    np.testing.assert_array_equal(ok.numpy(), want)


@pytest.mark.parametrize("compiled", [False, True])
def test_empty_list_index_and_take_along_dim_without_dim(compiled):
    def f(x, i):
        y = x * 1
        y[:, []] = 5.0
        return x[[]], x[:, [], 1], y, fg.take_along_dim(x, i)

    x = leaf(X)
    empty, empty2, y, taken = (fg.compile(f) if compiled else f)(x, fg.tensor([[5, 0], [23, 5]]))
    assert empty.shape == (0, 3, 4) and empty2.shape == (2, 0)
    np.testing.assert_array_equal(y.detach().numpy(), X)
    np.testing.assert_array_equal(taken.detach().numpy(), X.reshape(-1)[[5, 0, 23, 5]])
    taken.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy().reshape(-1),
                                  np.bincount([5, 0, 23, 5], minlength=24))
