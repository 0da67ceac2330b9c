"""Views of cuda tensors share device memory, as torch's do: each program below runs on cpu
tensors and on cuda tensors (the simulated driver) and must give the same values, the same
strides, and the same writes through views into their bases."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.tracer import eager_cuda

TOL = {"rtol": 1e-6, "atol": 1e-6}


def _both(program, shape=(4, 6)):
    """``program(x)`` on a cpu tensor and on a cuda tensor with the same values; returns
    each x afterwards and each result, as host arrays."""
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 5
    results = []
    for dev in ("cpu", "cuda"):
        x = fg.tensor(a, device=dev)
        out = program(x)
        outs = out if isinstance(out, tuple) else (out,)
        results.append((x.cpu().numpy(), [o.cpu().numpy() for o in outs],
                        [o.stride() for o in outs], [o.is_contiguous() for o in outs]))
    return results


VIEW_PROGRAMS = {
    "select": lambda x: x[1],
    "slice": lambda x: x[1:3, ::2],
    "view": lambda x: x.view(3, 8),
    "reshape": lambda x: x.reshape(2, 2, 6),
    "transpose": lambda x: x.transpose(0, 1),
    "t": lambda x: x.t(),
    "expand": lambda x: x[:1].expand(3, 6),
    "narrow": lambda x: x.narrow(1, 2, 3),
    "size_one_column": lambda x: x[:, 2:3],
    "unsqueezed_row": lambda x: x[2].unsqueeze(1),
    "unsqueeze_squeeze": lambda x: x.unsqueeze(0)[:, 2:].squeeze(0),
    "chained": lambda x: x.t()[1:5:2],
    "unbind": lambda x: x.unbind(1),
    "split": lambda x: x.split(2, 1),
}


@pytest.mark.parametrize("name", sorted(VIEW_PROGRAMS))
def test_views_read_like_the_cpu(simulated, name):
    (_, cpu_out, cpu_strides, cpu_contig), (_, gpu_out, gpu_strides, gpu_contig) = _both(
        VIEW_PROGRAMS[name])
    for c, g in zip(cpu_out, gpu_out):
        np.testing.assert_array_equal(g, c)
    assert gpu_strides == cpu_strides and gpu_contig == cpu_contig


def _write(fn):
    def program(x):
        fn(x)
        return x
    return program


WRITE_PROGRAMS = {
    "select_add_": _write(lambda x: x[0].add_(1)),
    "row_mul_": _write(lambda x: x[2].mul_(x[1])),
    "column_fill_": _write(lambda x: x[:, 1].fill_(7)),
    "transposed_add_": _write(lambda x: x.t().add_(fg.arange(4, dtype=fg.float32, device=x.device))),
    "strided_setitem": _write(lambda x: x.__setitem__((slice(1, None), slice(None, None, 2)), -1.0)),
    "view_zero_": _write(lambda x: x.view(2, 12)[1].zero_()),
    "narrow_copy_": _write(lambda x: x.narrow(1, 2, 3).copy_(fg.ones(4, 3, device=x.device))),
    "view_of_view": _write(lambda x: x[1:3][:, 2:4].sub_(10)),
    "detached_view": _write(lambda x: x.detach()[3].neg_()),
    "size_one_column_add_": _write(lambda x: x[:, 2:3].add_(fg.ones(4, 1, device=x.device))),
    "t_then_write": _write(lambda x: x.t_()[1].mul_(-2)),
    "unsqueeze_of_a_view": _write(lambda x: x[:, 2].unsqueeze_(1).add_(100)),
}


@pytest.mark.parametrize("name", sorted(WRITE_PROGRAMS))
def test_in_place_writes_through_views_reach_the_base(simulated, name):
    (cpu_x, cpu_out, _, _), (gpu_x, gpu_out, _, _) = _both(WRITE_PROGRAMS[name])
    np.testing.assert_array_equal(gpu_x, cpu_x)
    assert not np.array_equal(cpu_x, np.arange(24, dtype=np.float32).reshape(4, 6) - 5)


def test_a_view_sees_later_writes_to_its_base(simulated):
    x = fg.zeros(3, 4, device="cuda")
    row, col, flat = x[1], x[:, 2], x.view(-1)
    x.add_(fg.arange(12, dtype=fg.float32, device="cuda").view(3, 4))
    np.testing.assert_array_equal(row.cpu().numpy(), [4, 5, 6, 7])
    np.testing.assert_array_equal(col.cpu().numpy(), [2, 6, 10])
    np.testing.assert_array_equal(flat.cpu().numpy(), np.arange(12))
    assert row._base is x and col._base is x and x._version == row._version


def test_strided_view_operands_feed_every_kernel_family(simulated):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal((8, 6)).astype(np.float32)
    x, y = fg.tensor(a, device="cuda"), fg.tensor(b, device="cuda")
    cases = [
        ((x.t() * 2 + y).exp(), np.exp(a.T * 2 + b)),              # elementwise
        (x[:, ::2].sum(1), a[:, ::2].sum(1)),                      # reduction
        (x.t()[1:7] @ y[2:8].t(), a.T[1:7] @ b[2:8].T),            # matmul
        (fg.nn.functional.softmax(y.t(), -1), None),                # a composite
        (x[::2].cumsum(1), np.cumsum(a[::2], 1)),                   # a host step
        (x[0].expand(3, 8) - x[1:4], a[0] - a[1:4]),               # a broadcast view
    ]
    for got, want in cases:
        if want is None:
            e = np.exp(b.T - b.T.max(-1, keepdims=True))
            want = e / e.sum(-1, keepdims=True)
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5, atol=1e-5)


def test_autograd_through_views_matches_the_cpu(simulated):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    grads = []
    for dev in ("cpu", "cuda"):
        w = fg.tensor(a, device=dev, requires_grad=True)
        h = w * 1.0
        h[1:3, ::2].mul_(3.0)                  # an in-place write through a view of a non-leaf
        loss = (h.t()[1:] * h[0].unsqueeze(1)[1:]).tanh().sum() + h.expand(2, 5, 4).mean()
        loss.backward()
        grads.append(w.grad.cpu().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_views_keep_their_base_alive_and_errors_match_the_cpu(simulated):
    x = fg.arange(6, dtype=fg.float32, device="cuda").view(2, 3)
    tail = x[1]
    del x
    np.testing.assert_array_equal(tail.cpu().numpy(), [3, 4, 5])
    e = fg.ones(3, device="cuda").expand(2, 3)
    with pytest.raises(RuntimeError, match="more than one element"):
        e.add_(1)
    w = fg.ones(3, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="view of a leaf Variable"):
        w[1:].add_(1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        fg.ones(3, 4, device="cuda").t().view(12)
    t = fg.ones(3, 4, device="cuda").t()
    r = t.reshape(12)                                      # a copy, as on the cpu
    assert not r._data.shares_storage(t._data) and r.is_contiguous()


def test_clone_contiguous_and_printing_of_strided_views(simulated):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = fg.tensor(a, device="cuda")
    v = x.t()[::2]
    c = v.contiguous()
    assert c.is_contiguous() and not c._data.shares_storage(x._data)
    np.testing.assert_array_equal(c.cpu().numpy(), a.T[::2])
    np.testing.assert_array_equal(v.clone().cpu().numpy(), a.T[::2])
    assert repr(v) == repr(fg.tensor(a).t()[::2])[:-1] + ", device='cuda:0')"
    assert v.contiguous() is not v and c.contiguous() is c


def test_strided_writes_run_on_the_device_where_strides_nest(simulated):
    cases = [((4, 6), lambda x: x[:, 1], True), ((4, 6), lambda x: x.t(), True),
             ((4, 6), lambda x: x[1:, ::2], True), ((4, 6), lambda x: x[:, 5:6], True),
             ((2, 3, 4), lambda x: x.permute(2, 0, 1)[1:3, :, 1:], True),
             ((4, 5), lambda x: x[:, ::2], False), ((3, 8), lambda x: x[:, 1:7:3], False)]
    for shape, view, on_device in cases:
        a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        results = []
        for dev in ("cpu", "cuda"):
            x = fg.tensor(a, device=dev)
            v = view(x)
            before = dict(eager_cuda.STATS)
            v.copy_(-fg.arange(v.numel(), dtype=fg.float32, device=dev).reshape(v.shape) - 1)
            results.append(x.cpu().numpy())
        stores = eager_cuda.STATS["strided_stores"] - before["strided_stores"]
        host = eager_cuda.STATS["strided_writes"] - before["strided_writes"]
        assert (stores, host) == ((1, 0) if on_device else (0, 1)), shape
        np.testing.assert_array_equal(results[1], results[0])


def _random_view(x, rng):
    """One random view op on ``x`` (the same choice on either device for a seeded rng)."""
    kind = rng.integers(5)
    if kind == 0 and x.ndim >= 2:
        a, b = rng.choice(x.ndim, 2, replace=False)
        return x.transpose(int(a), int(b))
    if kind == 1 and x.ndim >= 1:
        dim = int(rng.integers(x.ndim))
        n = x.shape[dim]
        start = int(rng.integers(n))
        step = int(rng.integers(1, 4))
        key = [slice(None)] * x.ndim
        key[dim] = slice(start, n, step)
        return x[tuple(key)]
    if kind == 2 and x.ndim < 4:
        return x.unsqueeze(int(rng.integers(x.ndim + 1)))
    if kind == 3 and x.ndim >= 2 and x.shape[0] > 1:
        return x[int(rng.integers(x.shape[0]))]
    return x.permute(*[int(i) for i in rng.permutation(x.ndim)])


@pytest.mark.parametrize("seed", range(24))
def test_random_view_chains_read_and_write_like_the_cpu(simulated, seed):
    a = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    finals = []
    for dev in ("cpu", "cuda"):
        rng = np.random.default_rng(seed)
        x = fg.tensor(a, device=dev)
        v = x
        for _ in range(int(rng.integers(1, 4))):
            v = _random_view(v, rng)
        read = (v * 1).cpu().numpy()                       # a kernel reading the view
        strides = v.stride()
        v.mul_(-1).add_(fg.arange(v.numel(), dtype=fg.float32, device=dev).reshape(v.shape))
        finals.append((read, strides, x.cpu().numpy(), v.cpu().numpy()))
    for c, g in zip(*finals):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(c))


def test_compiled_functions_take_views_and_write_back_through_them(simulated):
    results = []
    for dev in ("cpu", "cuda"):
        base = fg.arange(12, dtype=fg.float32, device=dev).reshape(3, 4)

        @fg.compile
        def f(a, b):
            a.add_(b)
            return (a * 2).sum(0)
        out = f(base.t(), fg.ones(4, 3, device=dev))           # a transposed argument
        out2 = f(base[:, 1:3], fg.ones(3, 2, device=dev))      # a sliced one
        results.append((base.cpu().numpy(), out.cpu().numpy(), out2.cpu().numpy()))
    for c, g in zip(*results):
        np.testing.assert_array_equal(g, c)
    np.testing.assert_array_equal(results[1][0][:, 0], [1, 5, 9])
