"""Views and movement ops: shapes, values against numpy, shared storage, gradients."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, assert_close, check_grad


def _base():
    return fg.arange(24.0).reshape(2, 3, 4)


# name, op on a (2, 3, 4) tensor, numpy reference on the same values
VIEWS = [
    ("view", lambda x: x.view(6, 4), lambda a: a.reshape(6, 4)),
    ("view_infer", lambda x: x.view(2, -1), lambda a: a.reshape(2, -1)),
    ("view_tuple", lambda x: x.view((4, 6)), lambda a: a.reshape(4, 6)),
    ("reshape", lambda x: x.reshape(-1), lambda a: a.reshape(-1)),
    ("view_as", lambda x: x.view_as(fg.zeros(6, 4)), lambda a: a.reshape(6, 4)),
    ("flatten", lambda x: x.flatten(), lambda a: a.reshape(-1)),
    ("flatten_1", lambda x: x.flatten(1), lambda a: a.reshape(2, 12)),
    ("flatten_0_1", lambda x: x.flatten(0, 1), lambda a: a.reshape(6, 4)),
    ("unflatten", lambda x: x.unflatten(2, (2, -1)), lambda a: a.reshape(2, 3, 2, 2)),
    ("transpose", lambda x: x.transpose(0, 2), lambda a: a.transpose(2, 1, 0)),
    ("transpose_neg", lambda x: x.transpose(-1, -2), lambda a: a.transpose(0, 2, 1)),
    ("swapaxes", lambda x: x.swapaxes(0, 1), lambda a: a.swapaxes(0, 1)),
    ("permute", lambda x: x.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    ("permute_tuple_neg", lambda x: x.permute((-1, 0, 1)), lambda a: a.transpose(2, 0, 1)),
    ("movedim", lambda x: x.movedim(0, 2), lambda a: np.moveaxis(a, 0, 2)),
    ("movedim_tuple", lambda x: x.movedim((0, 1), (2, 0)), lambda a: np.moveaxis(a, (0, 1), (2, 0))),
    ("mT", lambda x: x.mT, lambda a: a.swapaxes(-1, -2)),
    ("unsqueeze", lambda x: x.unsqueeze(1), lambda a: a[:, None]),
    ("unsqueeze_neg", lambda x: x.unsqueeze(-1), lambda a: a[..., None]),
    ("squeeze", lambda x: x[:, :1].squeeze(), lambda a: a[:, 0]),
    ("squeeze_dim", lambda x: x[:1].squeeze(0), lambda a: a[0]),
    ("squeeze_tuple", lambda x: x[:1, :1].squeeze((0, 1)), lambda a: a[0, 0]),
    ("squeeze_noop_dim", lambda x: x.squeeze(1), lambda a: a),
    ("expand", lambda x: x[:, :1].expand(2, 3, 4), lambda a: np.broadcast_to(a[:, :1], (2, 3, 4))),
    ("expand_new_dims", lambda x: x.expand(5, 2, 3, 4), lambda a: np.broadcast_to(a, (5, 2, 3, 4))),
    ("expand_minus_one", lambda x: x[:, :1].expand(-1, 3, -1),
     lambda a: np.broadcast_to(a[:, :1], (2, 3, 4))),
    ("expand_as", lambda x: x[0, 0].expand_as(x), lambda a: np.broadcast_to(a[0, 0], (2, 3, 4))),
    ("broadcast_to", lambda x: fg.broadcast_to(x[:, :, :1], (2, 3, 4)),
     lambda a: np.broadcast_to(a[:, :, :1], (2, 3, 4))),
    ("narrow", lambda x: x.narrow(2, 1, 2), lambda a: a[:, :, 1:3]),
    ("narrow_neg_start", lambda x: x.narrow(-1, -2, 2), lambda a: a[:, :, 2:4]),
    ("select", lambda x: x.select(1, -1), lambda a: a[:, -1]),
    ("slice_step", lambda x: x[:, ::2, 1::2], lambda a: a[:, ::2, 1::2]),
    ("slice_neg", lambda x: x[-1, -2:, :-1], lambda a: a[-1, -2:, :-1]),
    ("slice_past_end", lambda x: x[:, 1:100], lambda a: a[:, 1:100]),
    ("slice_empty", lambda x: x[:, 2:1], lambda a: a[:, 2:1]),
    ("index_ints", lambda x: x[1, 2], lambda a: a[1, 2]),
    ("index_neg_ints", lambda x: x[-1, -1, -1], lambda a: a[-1, -1, -1]),
    ("ellipsis", lambda x: x[..., 0], lambda a: a[..., 0]),
    ("ellipsis_mid", lambda x: x[0, ..., 1:], lambda a: a[0, ..., 1:]),
    ("none", lambda x: x[:, None, :, None], lambda a: a[:, None, :, None]),
    ("index_0d_tensor", lambda x: x[fg.tensor(1)], lambda a: a[1]),
    ("t_of_2d", lambda x: x[0].t(), lambda a: a[0].T),
]
VIEW_IDS = [v[0] for v in VIEWS]


@pytest.mark.parametrize("name,fn,ref", VIEWS, ids=VIEW_IDS)
def test_view_values(name, fn, ref):
    x = _base()
    out = fn(x)
    np.testing.assert_array_equal(out.numpy(), ref(x.numpy()))


@pytest.mark.parametrize("name,fn,ref", VIEWS, ids=VIEW_IDS)
def test_views_share_storage_with_the_base(name, fn, ref):
    x = _base()
    out = fn(x)
    if out.numel():      # numpy cannot tell whether an empty array is a view
        assert np.shares_memory(out.numpy(), x.numpy())
        assert out._version_counter is x._version_counter


# view() of a non-contiguous tensor raises (test_view_of_non_contiguous_raises_torch_error)
VIEW_GRAD_CASES = [pytest.param(fn, kind, id=f"{kind}-{name}") for name, fn, _ in VIEWS
                   for kind in LAYOUTS if kind == "contiguous" or not name.startswith("view")]


@pytest.mark.parametrize("fn,kind", VIEW_GRAD_CASES)
def test_view_grad(fn, kind):
    check_grad(fn, arr(2, 3, 4), kind=kind)


WRITES = [
    ("view", lambda x: x.view(-1), (5,)),
    ("transpose", lambda x: x.t(), (2, 1)),
    ("permute", lambda x: x.permute(1, 0), (0, 1)),
    ("slice_step", lambda x: x[:, ::2], (1, 1)),
    ("select", lambda x: x[1], (2,)),
    ("narrow", lambda x: x.narrow(1, 1, 2), (0, 0)),
    ("unsqueeze", lambda x: x.unsqueeze(0), (0, 1, 1)),
    ("chunk", lambda x: x.chunk(2, 1)[1], (1, 0)),
    ("split", lambda x: x.split([1, 3], 1)[1], (0, 2)),
    ("unbind", lambda x: x.unbind(1)[3], (0,)),
    ("flatten", lambda x: x.flatten(), (7,)),
    ("reshape_contiguous", lambda x: x.reshape(4, 2), (3, 1)),
]


@pytest.mark.parametrize("name,fn,index", WRITES, ids=[w[0] for w in WRITES])
def test_write_through_a_view_shows_in_the_base(name, fn, index):
    x = fg.arange(8.0).reshape(2, 4)
    before = x.numpy().copy()
    v = fn(x)
    v[index] = -1.0
    changed = np.argwhere(x.numpy() != before)
    assert len(changed) == 1 and x.numpy()[tuple(changed[0])] == -1.0
    v.add_(100.0)
    assert (x.numpy() >= 99).sum() == v.numel()
    assert x._version == 2


def test_write_into_the_base_shows_in_the_view():
    x = fg.zeros(3, 4)
    v = x[1:, ::2]
    x.fill_(1.0)
    assert v.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    x[2, 2] = 5.0
    assert v[1, 1].item() == 5.0


def test_view_as_another_dtype_shares_memory_and_version():
    x = fg.zeros(2, 3)
    bits = x.view(fg.int32)                      # one size: the same elements' bits
    bits[0, 0] = 0x3F800000                      # 1.0f
    x[1, 2] = 2.0
    assert x[0, 0].item() == 1.0 and bits[1, 2].item() == 0x40000000
    assert x._version == bits._version == 2
    halves = x[:, 1:].view(fg.int16)             # two sizes: the last dim scales
    assert tuple(halves.shape) == (2, 4)
    halves[0, 1] = 0x3F80                        # high half of x[0, 1] (little-endian)
    assert x[0, 1].item() == 1.0
    assert fg.tensor(1.0).view(fg.int32).item() == 0x3F800000


def test_reshape_copies_only_when_needed():
    x = fg.arange(6.0).reshape(2, 3)
    r = x.reshape(3, 2)
    assert np.shares_memory(r.numpy(), x.numpy())
    t = x.t()
    c = t.reshape(-1)
    assert not np.shares_memory(c.numpy(), x.numpy())
    assert c.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    # a strided tensor whose merged dims still have one uniform stride stays a view
    s = fg.arange(12.0).reshape(3, 4)[:, ::2]
    assert s.reshape(6).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert np.shares_memory(s.reshape(6).numpy(), s.numpy())
    assert s.view(6).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    u = x.t().reshape(3, 1, 2)
    assert np.shares_memory(u.numpy(), x.numpy())        # splitting a dim keeps the view


def test_view_of_non_contiguous_raises_torch_error():
    x = fg.arange(6.0).reshape(2, 3).t()
    with pytest.raises(RuntimeError, match=r"view size is not compatible with input tensor's size "
                                           r"and stride \(at least one dimension spans across two "
                                           r"contiguous subspaces\). Use .reshape\(...\) instead."):
        x.view(6)
    with pytest.raises(RuntimeError, match=r"\(view\(\[6\]\) of a tensor of size \[3, 2\] and "
                                           r"stride \[1, 3\]\)"):
        x.view(-1)
    assert x.view(3, 1, 2).shape == (3, 1, 2)    # splitting a dim is fine


@pytest.mark.parametrize("shape,msg", [
    ((5, -1), r"shape '\[5, -1\]' is invalid for input of size 24"),
    ((7,), r"shape '\[7\]' is invalid for input of size 24"),
    ((-1, -1), "only one dimension can be inferred"),
    ((0, -1), r"shape '\[0, -1\]' is invalid for input of size 24"),
])
def test_bad_view_shapes(shape, msg):
    with pytest.raises(RuntimeError, match=msg):
        _base().view(*shape)
    with pytest.raises(RuntimeError, match=msg):
        _base().reshape(shape)


def test_expanded_tensor_refuses_in_place_writes():
    e = fg.zeros(3, 1).expand(3, 4)
    assert e.stride() == (1, 0)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers "
                                           "to a single memory location"):
        e.add_(1.0)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda x: x.permute(0, 1), RuntimeError, "number of dimensions in the tensor input does not "
                                              "match the length of the desired ordering"),
    (lambda x: x.permute(0, 0, 1), RuntimeError, "duplicate dims are not allowed"),
    (lambda x: x.permute(0, 1, 3), IndexError, "Dimension out of range"),
    (lambda x: x.transpose(0, 3), IndexError, r"transpose: Dimension out of range \(expected to be "
                                              r"in range of \[-3, 2\], but got 3\)"),
    (lambda x: x.t(), RuntimeError, "t\\(\\) expects a tensor with <= 2 dimensions, but self is "
                                    "3D"),
    (lambda x: x.squeeze(3), IndexError, "Dimension out of range"),
    (lambda x: x.unsqueeze(4), IndexError, r"expected to be in range of \[-4, 3\], but got 4"),
    (lambda x: x.flatten(2, 1), RuntimeError, "start_dim cannot come after end_dim"),
    (lambda x: x.expand(2, 3, 5), RuntimeError, r"expanded size of the tensor \(5\) must match the "
                                                r"existing size \(4\) at non-singleton dimension 2"),
    (lambda x: x.expand(3, 4), RuntimeError, r"the number of sizes provided \(2\) must be greater "
                                             r"or equal to the number of dimensions in the tensor "
                                             r"\(3\)"),
    (lambda x: x.narrow(0, 1, 5), RuntimeError, r"start \(1\) \+ length \(5\) exceeds dimension "
                                                r"size \(2\)"),
    (lambda x: x.select(2, 4), IndexError, "index 4 is out of bounds for dimension 2 with size 4"),
    (lambda x: x[2], IndexError, "index 2 is out of bounds for dimension 0 with size 2"),
    (lambda x: x[:, -4], IndexError, "index -4 is out of bounds for dimension 1 with size 3"),
    (lambda x: x[0, 0, 0, 0], IndexError, "too many indices for tensor of dimension 3"),
    (lambda x: x[..., 0, ...], IndexError, "an index can only have a single ellipsis"),
    (lambda x: x[1.5], IndexError, "only integers, slices"),
    (lambda x: x[::-1], ValueError, "step must be greater than zero"),
    (lambda x: x.split([1, 3]), RuntimeError, "split_with_sizes expects split_sizes to sum exactly "
                                              "to 2"),
    (lambda x: x.chunk(0), RuntimeError, "chunk expects `chunks` to be greater than 0"),
    (lambda x: x.repeat(2), RuntimeError, "Number of dimensions of repeat dims can not be smaller"),
])
def test_movement_errors(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(_base())


def test_chunk_and_split_sizes():
    assert [t.tolist() for t in fg.arange(5).chunk(3)] == [[0, 1], [2, 3], [4]]
    assert [t.shape[0] for t in fg.arange(6).chunk(4)] == [2, 2, 2]
    assert [t.shape[0] for t in fg.arange(2).chunk(5)] == [1, 1]
    assert [t.shape for t in _base().chunk(2, -1)] == [(2, 3, 2), (2, 3, 2)]
    assert [t.tolist() for t in fg.arange(5).split(2)] == [[0, 1], [2, 3], [4]]
    assert [t.tolist() for t in fg.arange(5).split([1, 4])] == [[0], [1, 2, 3, 4]]
    assert [t.shape for t in _base().unbind(1)] == [(2, 4)] * 3
    assert isinstance(fg.arange(4).split(2), tuple)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_split_chunk_unbind_grads(kind):
    a = arr(4, 3)
    check_grad(lambda x: x.chunk(2)[1] * 2, a, kind=kind)
    check_grad(lambda x: x.split([1, 3])[1], a, kind=kind)
    check_grad(lambda x: fg.stack(x.unbind(1)[::-1]), a, kind=kind)


def test_gradient_of_several_chunks_accumulates():
    x = fg.arange(6.0).requires_grad_()
    a, b, c = x.chunk(3)
    (a * 1 + b * 2 + c * 3).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


# --------------------------------------------------------------------------- cat and stack


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(kind, dim):
    a, b = arr(2, 3), arr(2, 3, seed=1)
    out = fg.cat([fg.tensor(a), fg.tensor(b)], dim)
    assert_close(out, np.concatenate([a, b], axis=dim))
    check_grad(lambda x, y: fg.cat([x, y * 2, x], dim), a, b, kind=kind)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim):
    a, b = arr(2, 3), arr(2, 3, seed=1)
    out = fg.stack([fg.tensor(a), fg.tensor(b)], dim)
    assert_close(out, np.stack([a, b], axis=dim))
    check_grad(lambda x, y: fg.stack([x, y], dim), a, b)


def test_cat_stack_details():
    assert fg.cat([fg.zeros(2, dtype=fg.int64), fg.ones(1)]).dtype is fg.float32
    assert fg.cat([fg.zeros(0), fg.ones(2, 3)]).shape == (2, 3)   # legacy empty 1-D
    single = fg.ones(2)
    out = fg.cat([single])
    assert out.tolist() == [1.0, 1.0] and not np.shares_memory(out.numpy(), single.numpy())
    assert fg.stack([fg.tensor(1.0), fg.tensor(2.0)]).tolist() == [1.0, 2.0]
    assert fg.hstack([fg.zeros(2), fg.ones(3)]).shape == (5,)
    assert fg.hstack([fg.zeros(2, 1), fg.ones(2, 3)]).shape == (2, 4)
    assert fg.vstack([fg.zeros(3), fg.ones(3)]).shape == (2, 3)
    assert fg.concat([fg.zeros(1), fg.ones(1)]).tolist() == [0.0, 1.0]
    assert fg.cat((fg.zeros(1), fg.ones(1))).shape == (2,)


def test_cat_stack_errors():
    with pytest.raises(RuntimeError, match="expected a non-empty list of Tensors"):
        fg.cat([])
    with pytest.raises(RuntimeError, match=r"Sizes of tensors must match except in dimension 0. "
                                           r"Got f32\[2,3\], f32\[2,4\]"):
        fg.cat([fg.zeros(2, 3), fg.zeros(2, 4)])
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        fg.cat([fg.zeros(2, 3), fg.zeros(3)])
    with pytest.raises(IndexError, match="Dimension out of range"):
        fg.cat([fg.zeros(2, 3), fg.zeros(2, 3)], 2)
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size, but got "
                                           r"\[2, 3\] at entry 0 and \[2, 4\] at entry 1"):
        fg.stack([fg.zeros(2, 3), fg.zeros(2, 4)])
    with pytest.raises(RuntimeError, match="stack expects a non-empty TensorList"):
        fg.stack([])


# --------------------------------------------------------------------------- repeat, flip, roll


@pytest.mark.parametrize("reps", [(2, 3), (1, 1), (2, 1, 2), (1, 2, 1, 1)])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_repeat(reps, kind):
    a = arr(2, 3)
    assert_close(fg.tensor(a).repeat(*reps), np.tile(a, reps))
    check_grad(lambda x: x.repeat(*reps), a, kind=kind)


def test_repeat_owns_its_memory():
    # repeats of 1, or of a size-1 dim, must still copy (torch's repeat always does)
    x = fg.ones(1)
    y = x.repeat(3)
    y[0] = 5.0
    assert y.tolist() == [5.0, 1.0, 1.0] and x.tolist() == [1.0]
    a = fg.ones(2, 2)
    b = a.repeat(1, 1)
    b[0, 0] = 7.0
    assert a[0, 0].item() == 1.0
    z = fg.ones(2, requires_grad=True) * 2
    assert z.repeat(1).grad_fn.name() == "RepeatBackward0"
    assert z.grad_fn.name() == "MulBackward0"
    assert fg.tensor([[1, 2]]).repeat((2, 2)).tolist() == [[1, 2, 1, 2], [1, 2, 1, 2]]


@pytest.mark.parametrize("dims", [0, 1, (0, 1), (-1,)])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_flip(dims, kind):
    a = arr(3, 4)
    assert_close(fg.tensor(a).flip(dims), np.flip(a, dims))
    check_grad(lambda x: x.flip(dims), a, kind=kind)


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-1, 1), ((1, 2), (0, 1)), (5, None), (-7, None)])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_roll(shifts, dims, kind):
    a = arr(3, 4)
    assert_close(fg.tensor(a).roll(shifts, dims), np.roll(a, shifts, dims))
    check_grad(lambda x: x.roll(shifts, dims), a, kind=kind)


# --------------------------------------------------------------------------- 0-d and empty


def test_views_of_0d_tensors():
    s = fg.tensor(3.0, requires_grad=True)
    assert s.reshape(1, 1).shape == (1, 1) and s.view(-1).shape == (1,)
    assert s.unsqueeze(0).shape == (1,) and s.flatten().shape == (1,)
    assert s.expand(2, 3).tolist() == [[3.0] * 3] * 2
    assert s[None].shape == (1,) and s[...].shape == ()
    assert s.t().shape == () and s.transpose(0, 0).shape == () and s.squeeze().shape == ()
    (s.expand(2, 3) * 2).sum().backward()
    assert s.grad.item() == 12.0
    check_grad(lambda x: x.reshape(1, 1, 1) * x.unsqueeze(0), arr())


def test_views_of_empty_tensors():
    e = fg.zeros(0, 3)
    assert e.view(-1, 3).shape == (0, 3) and e.t().shape == (3, 0)
    assert e.reshape(3, 0).shape == (3, 0) and e[:, 1].shape == (0,)
    assert e.unsqueeze(1).shape == (0, 1, 3) and e.flatten().shape == (0,)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda: fg.ones(3).expand(-1, 3), RuntimeError,
     r"expanded size of the tensor \(-1\) isn't allowed in a leading, non-existing dimension 0"),
    (lambda: fg.ones(3).expand(-2), RuntimeError, r"expanded size of the tensor \(-2\) must be "
                                                  r"non-negative"),
    (lambda: fg.ones(6).unflatten(0, (4, -1)), RuntimeError,
     r"unflatten: Provided sizes \[4, -1\] don't multiply up to the size of dim 0 \(6\)"),
    (lambda: fg.ones(2, 3).sum_to_size(2), RuntimeError,
     r"size \{\[2\]\} is not expandable to size \{\[2, 3\]\}"),
    (lambda: fg.ones(3).narrow(0, 0, -1), RuntimeError, "narrow\\(\\): length must be "
                                                        "non-negative"),
    (lambda: fg.ones(3).split(0), RuntimeError, "split_size=0 for dimension 0 of size 3"),
    (lambda: fg.ones(2, 3).movedim((0, 0), (1, 0)), RuntimeError,
     r"movedim: repeated dim in `source` \(\[0, 0\]\)"),
    (lambda: fg.ones(2, 3).flip((0, 0)), RuntimeError, "appears multiple times in the list of dims"),
    (lambda: fg.ones(2).repeat(-1), RuntimeError, "negative dimension"),
    (lambda: fg.cat([fg.tensor(1.0), fg.tensor(2.0)]), RuntimeError,
     r"zero-dimensional tensor \(at position 0\) cannot be concatenated"),
    (lambda: fg.tensor(1.0).unbind(), IndexError, "Dimension specified as 0 but tensor has no "
                                                  "dimensions"),
    (lambda: fg.tensor(1.0).chunk(1), IndexError, "tensor has no dimensions"),
    (lambda: fg.tensor(1.0).narrow(0, 0, 1), IndexError, "tensor has no dimensions"),
])
def test_movement_misuse_gets_a_clear_error(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_sum_to_size():
    x = fg.tensor(arr(2, 3), requires_grad=True)
    assert_close(x.sum_to_size(3), x.detach().numpy().sum(0))
    assert_close(x.sum_to_size(2, 1), x.detach().numpy().sum(1, keepdims=True))
    assert x.sum_to_size(2, 3) is x
    check_grad(lambda t: t.sum_to_size(1, 3), arr(2, 3))


def test_repeat_interleave_matches_numpy():
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    np.testing.assert_array_equal(fg.repeat_interleave(x, 2).detach().numpy(),
                                  np.repeat(x.detach().numpy(), 2))
    y = x.repeat_interleave(3, dim=1)
    np.testing.assert_array_equal(y.detach().numpy(), np.repeat(x.detach().numpy(), 3, axis=1))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 2), 3.0))
    counts = fg.tensor([1, 2])
    np.testing.assert_array_equal(x.repeat_interleave(counts, dim=0).detach().numpy(),
                                  np.repeat(x.detach().numpy(), [1, 2], axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_pad_primitive_matches_np_pad(dtype):
    # The pad primitive's reference fills and copies instead of calling np.pad: the bits,
    # signed zeros and non-finite fill values included, must be np.pad's.
    from fusegrad.ops.prims import pad
    rng = np.random.default_rng(0)
    cases = [((3, 4), ((1, 2), (0, 3))), ((2, 0, 3), ((0, 0), (2, 1), (1, 1))),
             ((2, 3, 4, 5), ((0, 1), (1, 0), (2, 2), (0, 0))), ((5,), ((0, 0),))]
    values = [0, -3] if dtype == np.int64 else [0, -0.0, 1.5, float("-inf"), float("nan")]
    for shape, widths in cases:
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        for v in values:
            got = pad.impl(x, widths=widths, value=v)
            want = np.pad(x, widths, constant_values=v)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_flip_and_tile_take_torchs_varargs_and_keywords():
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    x = fg.tensor(a)
    for out, want in [(x.flip(0, 1), a[::-1, ::-1]), (x.flip(1), a[:, ::-1]),
                      (fg.flip(x, [0]), a[::-1]), (fg.flip(x, dims=(0, 1)), a[::-1, ::-1]),
                      (x.tile(2), np.tile(a, 2)), (x.tile(2, 1, 1), np.tile(a, (2, 1, 1))),
                      (fg.tile(x, dims=(2,)), np.tile(a, 2)), (x.tile((1, 2)), np.tile(a, (1, 2)))]:
        np.testing.assert_array_equal(out.numpy(), want)
    with pytest.raises(TypeError, match="multiple values"):
        x.flip(0, dims=(1,))


def test_chunk_and_softmax_of_an_empty_dim_as_torch():
    assert [tuple(c.shape) for c in fg.zeros(0, 4).chunk(2, 0)] == [(0, 4), (0, 4)]
    assert [tuple(c.shape) for c in fg.zeros(0).chunk(3)] == [(0,), (0,), (0,)]
    assert [tuple(c.shape) for c in fg.zeros(5).chunk(3)] == [(2,), (2,), (1,)]
    F = fg.nn.functional
    for fn, x in [(lambda t: F.log_softmax(t, 0), fg.zeros(0, 4)),
                  (lambda t: F.softmax(t, 1), fg.zeros(4, 0))]:
        assert fn(x).shape == x.shape and fg.compile(fn)(x).shape == x.shape
