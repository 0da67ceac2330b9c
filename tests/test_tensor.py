"""The Tensor surface: shape and strides, autograd node names, devices, conversions.

Expected node names and error messages are the ones torch 2.13 gives for the same calls.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.device import device


def test_size_is_a_tuple_that_prints_like_torch():
    x = fg.zeros(2, 2)
    assert isinstance(x.shape, fg.Size) and isinstance(x.shape, tuple)
    assert repr(x.shape) == "fusegrad.Size([2, 2])" and str(x.shape) == "fusegrad.Size([2, 2])"
    assert x.shape == (2, 2) and x.size() == x.shape
    assert repr(fg.tensor(1.0).shape) == "fusegrad.Size([])"
    y = fg.zeros(2, 3, 4)
    assert repr(y.shape[1:]) == "fusegrad.Size([3, 4])" and y.shape[-1] == 4
    assert isinstance(y.shape + (5,), fg.Size) and y.shape.numel() == 24
    assert fg.zeros(y.shape).shape == (2, 3, 4)


def test_size_with_dim():
    x = fg.zeros(2, 3, 4)
    assert x.size(1) == 3 and x.size(-1) == 4 and x.size(-3) == 2
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of "
                                         r"\[-3, 2\], but got 3\)"):
        x.size(3)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.size(-4)


def test_basic_metadata():
    x = fg.zeros(2, 3, 4)
    assert x.ndim == 3 and x.dim() == 3 and x.ndimension() == 3
    assert x.numel() == 24 and x.nelement() == 24 and fg.numel(x) == 24
    assert x.dtype is fg.float32 and x.element_size() == 4 and x.nbytes == 96
    assert x.device == device("cpu") and str(x.device) == "cpu" and not x.is_cuda
    assert fg.tensor(3.0).numel() == 1 and fg.tensor(3.0).ndim == 0
    assert fg.zeros(0, 3).numel() == 0
    assert fg.is_tensor(x) and not fg.is_tensor(np.zeros(2))
    assert fg.is_floating_point(x) and not fg.tensor([1]).is_floating_point()
    assert not x.is_complex()


def test_strides_and_contiguity():
    x = fg.arange(24.0).reshape(2, 3, 4)
    assert x.stride() == (12, 4, 1) and x.stride(1) == 4 and x.stride(-1) == 1
    assert x.is_contiguous()
    t = x.transpose(0, 2)
    assert t.stride() == (1, 4, 12) and not t.is_contiguous()
    assert x[:, ::2].stride() == (12, 8, 1) and not x[:, ::2].is_contiguous()
    e = fg.ones(3, 1).expand(3, 4)
    assert e.stride() == (1, 0) and not e.is_contiguous()
    c = t.contiguous()
    assert c.is_contiguous() and c.stride() == (6, 2, 1)
    np.testing.assert_array_equal(c.numpy(), t.numpy())
    assert x.contiguous() is x
    assert fg.zeros(0, 3).stride() == (3, 1)


def test_contiguous_of_a_transposed_tensor_keeps_gradients():
    x = fg.arange(6.0).reshape(2, 3).requires_grad_()
    y = x.t().contiguous()
    assert y.grad_fn.name() == "CloneBackward0"
    (y * fg.arange(6.0).reshape(3, 2)).sum().backward()
    assert x.grad.tolist() == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]


def test_transpose_properties():
    x = fg.arange(6.0).reshape(2, 3)
    assert x.T.shape == (3, 2) and x.T.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert fg.zeros(2, 3, 4).T.shape == (4, 3, 2)
    assert fg.zeros(2, 3, 4).mT.shape == (2, 4, 3)
    assert fg.zeros(3).T.shape == (3,) and fg.tensor(1.0).T.shape == ()


def test_data_and_is_leaf():
    a = fg.ones(2, requires_grad=True)
    b = a * 2
    assert a.is_leaf and not b.is_leaf and fg.ones(2).is_leaf
    assert (fg.ones(2) * 2).is_leaf        # no grad required: no history
    d = b.data
    assert d.is_leaf and not d.requires_grad and d.tolist() == [2.0, 2.0]
    d[0] = 5.0                             # .data shares storage
    assert b[0].item() == 5.0
    a.data = fg.tensor([3.0, 4.0])
    assert a.tolist() == [3.0, 4.0] and a.requires_grad


# name of the node each op leaves, as torch names it
GRAD_FN_NAMES = [
    ("add", lambda x, v: x + 1, "AddBackward0"),
    ("sub", lambda x, v: x - 1, "SubBackward0"),
    ("mul", lambda x, v: x * x, "MulBackward0"),
    ("div", lambda x, v: x / 2, "DivBackward0"),
    ("pow", lambda x, v: x ** 3, "PowBackward0"),
    ("pow_square", lambda x, v: x ** 2, "PowBackward0"),
    ("pow_tensor", lambda x, v: x ** x, "PowBackward1"),
    ("neg", lambda x, v: -x, "NegBackward0"),
    ("exp", lambda x, v: x.exp(), "ExpBackward0"),
    ("log", lambda x, v: x.log(), "LogBackward0"),
    ("log1p", lambda x, v: x.log1p(), "Log1PBackward0"),
    ("sqrt", lambda x, v: x.sqrt(), "SqrtBackward0"),
    ("rsqrt", lambda x, v: x.rsqrt(), "RsqrtBackward0"),
    ("tanh", lambda x, v: x.tanh(), "TanhBackward0"),
    ("sigmoid", lambda x, v: x.sigmoid(), "SigmoidBackward0"),
    ("relu", lambda x, v: x.relu(), "ReluBackward0"),
    ("abs", lambda x, v: x.abs(), "AbsBackward0"),
    ("trunc", lambda x, v: x.trunc(), "TruncBackward0"),
    ("round_decimals", lambda x, v: x.round(decimals=2), "RoundBackward1"),
    ("clamp", lambda x, v: x.clamp(0, 1), "ClampBackward1"),
    ("clamp_tensor", lambda x, v: x.clamp(min=x), "ClampBackward0"),
    ("fmod", lambda x, v: fg.fmod(x, 2.0), "FmodBackward0"),
    ("where", lambda x, v: fg.where(x > 0, x, 0.0), "WhereBackward0"),
    ("sum", lambda x, v: x.sum(), "SumBackward0"),
    ("sum_dim", lambda x, v: x.sum(1), "SumBackward1"),
    ("mean", lambda x, v: x.mean(), "MeanBackward0"),
    ("mean_dim", lambda x, v: x.mean(1), "MeanBackward1"),
    ("prod", lambda x, v: x.prod(), "ProdBackward0"),
    ("prod_dim", lambda x, v: x.prod(1), "ProdBackward1"),
    ("var", lambda x, v: x.var(), "VarBackward0"),
    ("std", lambda x, v: x.std(), "StdBackward0"),
    ("max", lambda x, v: x.max(), "MaxBackward1"),
    ("max_dim", lambda x, v: x.max(0).values, "MaxBackward0"),
    ("min_dim", lambda x, v: x.min(0).values, "MinBackward0"),
    ("amax", lambda x, v: x.amax(0), "AmaxBackward0"),
    ("norm", lambda x, v: x.norm(), "LinalgVectorNormBackward0"),
    ("logsumexp", lambda x, v: x.logsumexp(1), "LogsumexpBackward0"),
    ("cumsum", lambda x, v: x.cumsum(1), "CumsumBackward0"),
    ("mm", lambda x, v: x.mm(x.t()), "MmBackward0"),
    ("matmul_2d", lambda x, v: x @ x.t(), "MmBackward0"),
    ("mv", lambda x, v: x @ v, "MvBackward0"),
    ("dot", lambda x, v: v @ v, "DotBackward0"),
    ("view", lambda x, v: x.view(6), "ViewBackward0"),
    ("reshape", lambda x, v: x.reshape(3, 2), "ViewBackward0"),
    ("flatten", lambda x, v: x.flatten(), "ViewBackward0"),
    ("t", lambda x, v: x.t(), "TBackward0"),
    ("transpose", lambda x, v: x.transpose(0, 1), "TransposeBackward0"),
    ("permute", lambda x, v: x.permute(1, 0), "PermuteBackward0"),
    ("expand", lambda x, v: v.expand(2, 3), "ExpandBackward0"),
    ("unsqueeze", lambda x, v: x.unsqueeze(0), "UnsqueezeBackward0"),
    ("squeeze", lambda x, v: x.unsqueeze(0).squeeze(), "SqueezeBackward0"),
    ("squeeze_dim", lambda x, v: x.unsqueeze(0).squeeze(0), "SqueezeBackward1"),
    ("select", lambda x, v: x[0], "SelectBackward0"),
    ("select_col", lambda x, v: x[:, 1], "SelectBackward0"),
    ("slice", lambda x, v: x[1:], "SliceBackward0"),
    ("slice_after_select", lambda x, v: x[0, 1:], "SliceBackward0"),
    ("index_none", lambda x, v: x[None], "UnsqueezeBackward0"),
    ("narrow", lambda x, v: x.narrow(1, 0, 2), "SliceBackward0"),
    ("split", lambda x, v: x.split(1)[0], "SplitBackward0"),
    ("chunk", lambda x, v: x.chunk(2, 1)[0], "SplitBackward0"),
    ("split_sizes", lambda x, v: x.split([1, 2], 1)[0], "SplitWithSizesBackward0"),
    ("unbind", lambda x, v: x.unbind()[0], "UnbindBackward0"),
    ("index_tensor", lambda x, v: x[[0, 1]], "IndexBackward0"),
    ("index_mask", lambda x, v: x[x > 0], "IndexBackward0"),
    ("masked_select", lambda x, v: x.masked_select(x > 0), "MaskedSelectBackward0"),
    ("gather", lambda x, v: x.gather(1, fg.tensor([[0], [1]])), "GatherBackward0"),
    ("index_select", lambda x, v: x.index_select(1, fg.tensor([0])), "IndexSelectBackward0"),
    ("masked_fill", lambda x, v: x.masked_fill(x > 0, 0.0), "MaskedFillBackward0"),
    ("tril", lambda x, v: x.tril(), "TrilBackward0"),
    ("triu", lambda x, v: x.triu(), "TriuBackward0"),
    ("topk", lambda x, v: x.topk(1).values, "TopkBackward0"),
    ("sort", lambda x, v: x.sort().values, "SortBackward0"),
    ("cat", lambda x, v: fg.cat([x, x]), "CatBackward0"),
    ("stack", lambda x, v: fg.stack([x, x]), "StackBackward0"),
    ("repeat", lambda x, v: x.repeat(2, 1), "RepeatBackward0"),
    ("flip", lambda x, v: x.flip(0), "FlipBackward0"),
    ("roll", lambda x, v: x.roll(1, 0), "RollBackward0"),
    ("clone", lambda x, v: x.clone(), "CloneBackward0"),
    ("to_double", lambda x, v: x.double(), "ToCopyBackward0"),
    ("sum_to_size", lambda x, v: x.sum_to_size(1, 3), "SumBackward1"),
]


@pytest.mark.parametrize("name,fn,expected", GRAD_FN_NAMES, ids=[g[0] for g in GRAD_FN_NAMES])
def test_grad_fn_names(name, fn, expected):
    x = fg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    v = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out = fn(x, v)
    assert out.grad_fn.name() == expected
    assert repr(out.grad_fn).startswith(f"<{expected} object at 0x")
    assert x.grad_fn is None and v.grad_fn is None   # naming never touches the inputs


def test_naming_a_no_op_view_leaves_the_input_node_alone():
    x = fg.ones(2, 3, requires_grad=True)
    y = x * 2
    for out in (y[:], y[...], y.flip(()), y.chunk(1)[0], y.split(3, 1)[0]):
        assert y.grad_fn.name() == "MulBackward0"
        assert out.grad_fn is not None
    z = fg.tensor(1.0, requires_grad=True) * 2
    z.max(0), z.topk(1)
    assert z.grad_fn.name() == "MulBackward0"


def test_next_functions():
    a = fg.ones(2, requires_grad=True)
    b = fg.ones(2, requires_grad=True)
    c = a * b
    d = c + 1
    assert isinstance(d.grad_fn.next_functions, tuple)
    (node, idx), = d.grad_fn.next_functions[:1]
    assert node is c.grad_fn and idx == 0
    leaves = c.grad_fn.next_functions
    assert [n.name() for n, _ in leaves] == ["AccumulateGrad", "AccumulateGrad"]
    assert leaves[0][0].variable is a and leaves[1][0].variable is b
    # the same leaf always has the same AccumulateGrad node while the graph lives
    assert (a * 3).grad_fn.next_functions[0][0] is leaves[0][0]
    # an operand that needs no gradient has no edge
    e = a * fg.ones(2)
    assert e.grad_fn.next_functions[1][0] is None


def test_requires_grad_propagation():
    a = fg.ones(2, requires_grad=True)
    b = fg.ones(2)
    assert (a + b).requires_grad and (b + a).requires_grad
    assert not (b * 2).requires_grad
    assert (a > 0).requires_grad is False
    assert a.argmax().requires_grad is False
    assert fg.cat([a, b]).requires_grad
    assert fg.stack([b, b]).requires_grad is False


# --------------------------------------------------------------------------- devices


def test_device_parsing():
    d = fg.device("cuda:0")
    assert d.type == "cuda" and d.index == 0
    assert str(d) == "cuda:0" and repr(d) == "device(type='cuda', index=0)"
    assert fg.device("cpu").index is None and repr(fg.device("cpu")) == "device(type='cpu')"
    assert fg.device("cuda", 1) == fg.device("cuda:1")
    assert fg.device(fg.device("cuda:2")).index == 2
    assert len({fg.device("cpu"), fg.device("cpu")}) == 1
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda device type at start of "
                                           "device string: tpu"):
        fg.device("tpu")
    with pytest.raises(RuntimeError, match="Invalid device string: 'cuda:x'"):
        fg.device("cuda:x")
    with pytest.raises(RuntimeError, match="must not include an index"):
        fg.device("cuda:0", 1)
    with pytest.raises(TypeError):
        fg.device(1.5)


@pytest.mark.skipif(fg.cuda.is_available(), reason="checks the GPU-less behaviour")
def test_cuda_is_refused_clearly_without_a_gpu():
    assert fg.cuda.is_available() is False and fg.cuda.device_count() == 0
    x = fg.ones(2)
    for attempt in (lambda: x.to("cuda"), lambda: x.to("cuda:0"), lambda: x.cuda(),
                    lambda: x.to(fg.device("cuda")), lambda: fg.zeros(2, device="cuda"),
                    lambda: fg.tensor([1.0], device="cuda:0")):
        with pytest.raises(RuntimeError, match="Found no NVIDIA driver"):
            attempt()


def test_cpu_moves_are_no_ops():
    x = fg.ones(2)
    assert x.to("cpu") is x and x.cpu() is x and x.to(fg.device("cpu")) is x
    assert x.to("cpu", fg.float64).dtype is fg.float64
    assert fg.zeros(2, device="cpu").device == fg.device("cpu")


# --------------------------------------------------------------------------- conversion


def test_item_and_tolist():
    assert fg.tensor([2.5]).item() == 2.5 and isinstance(fg.tensor([2.5]).item(), float)
    assert isinstance(fg.tensor([[2]]).item(), int) and isinstance(fg.tensor(True).item(), bool)
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to "
                                           "Scalar"):
        fg.ones(2).item()
    assert fg.tensor(2.5).tolist() == 2.5
    assert fg.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert fg.zeros(0).tolist() == []


def test_python_number_conversions():
    assert float(fg.tensor([2.5])) == 2.5
    assert int(fg.tensor(2.7)) == 2 and int(fg.tensor(-2.7)) == -2
    assert bool(fg.tensor(0.0)) is False and bool(fg.tensor([3])) is True
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is "
                                           "ambiguous"):
        bool(fg.ones(2))
    assert [10, 20, 30][fg.tensor(1)] == 20
    with pytest.raises(TypeError, match="only integer tensors of a single element"):
        [10, 20][fg.tensor(1.0)]
    assert math.isclose(math.sqrt(fg.tensor(4.0)), 2.0)


def test_len_iteration_and_format():
    x = fg.arange(6.0).reshape(3, 2)
    assert len(x) == 3
    rows = list(x)
    assert len(rows) == 3 and rows[1].tolist() == [2.0, 3.0]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(fg.tensor(1.0))
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(fg.tensor(1.0))
    assert f"{fg.tensor(2.5):.3f}" == "2.500"
    assert f"{fg.tensor(7):03d}" == "007"
    assert f"{fg.ones(2)}" == "tensor([1., 1.])"


def test_numpy_shares_memory_and_refuses_grad():
    x = fg.zeros(3)
    a = x.numpy()
    a[0] = 7.0
    assert x[0].item() == 7.0
    y = fg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad. "
                                           r"Use tensor.detach\(\).numpy\(\) instead."):
        y.numpy()
    assert y.detach().numpy().tolist() == [1.0, 1.0]
    assert y.numpy(force=True).tolist() == [1.0, 1.0]
    assert np.asarray(y).tolist() == [1.0, 1.0]


def test_np_array_copies_and_np_asarray_shares():
    x = fg.zeros(3)
    np.array(x)[0] = 1.0                          # np.array copies (numpy passes copy=True)
    np.array(x, dtype=np.float32)[1] = 1.0
    assert x.tolist() == [0.0, 0.0, 0.0]
    np.asarray(x)[2] = 5.0                        # np.asarray shares
    assert x.tolist() == [0.0, 0.0, 5.0]
    assert np.asarray(x, dtype=np.float64).tolist() == [0.0, 0.0, 5.0]
    with pytest.raises(ValueError, match="avoid copy"):
        np.array(x, dtype=np.float64, copy=False)


def test_clone_and_detach():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    c = x.clone()
    assert c.requires_grad and c.grad_fn.name() == "CloneBackward0"
    with fg.no_grad():
        c[0] = 9.0
    assert x[0].item() == 1.0                     # clone owns its memory
    d = x.detach()
    assert not d.requires_grad and d.is_leaf
    d[1] = 5.0
    assert x[1].item() == 5.0                     # detach shares it
    assert d._version == x._version               # ... and the version counter


def test_dlpack_round_trip_with_numpy():
    x = fg.arange(6.0).reshape(2, 3)
    a = np.from_dlpack(x)
    np.testing.assert_array_equal(a, x.numpy())
    a[0, 0] = 42.0
    assert x[0, 0].item() == 42.0                 # zero copy
    b = np.arange(4, dtype=np.int32)
    t = fg.from_dlpack(b)
    assert t.dtype is fg.int32 and t.tolist() == [0, 1, 2, 3]
    b[0] = 9
    assert t[0].item() == 9
    assert fg.from_dlpack(x) is x
    assert x.__dlpack_device__() == b.__dlpack_device__()


def test_pickle_and_deepcopy():
    x = fg.tensor([[1.0, 2.0]], requires_grad=True)
    y = pickle.loads(pickle.dumps(x))
    assert y.tolist() == [[1.0, 2.0]] and y.requires_grad and y.dtype is fg.float32
    z = copy.deepcopy(x)
    assert z.tolist() == x.tolist() and z.requires_grad
    z.data[0, 0] = 5.0
    assert x[0, 0].item() == 1.0
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        copy.deepcopy(x * 2)


def test_python_number_conversions_refuse_like_torch():
    for convert in (int, float, complex):
        with pytest.raises(ValueError, match="only one element tensors can be converted"):
            convert(fg.tensor([1.0, 2.0]))
    assert complex(fg.tensor([2.5])) == 2.5 + 0j
    with pytest.raises(RuntimeError, match="with no values is ambiguous"):
        bool(fg.tensor([]))


def test_deepcopy_copies_grad_and_keeps_views_sharing():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    z = copy.deepcopy(x)
    assert z.grad.tolist() == [2.0, 4.0]
    z.grad[0] = 9.0
    assert x.grad.tolist() == [2.0, 4.0]                  # a copy of the gradient
    a = fg.arange(6.0).reshape(2, 3)
    a2, t2 = copy.deepcopy([a, a.t()])                    # one storage, copied once
    a2[1, 0] = 100.0
    assert t2[0, 1].item() == 100.0 and a[1, 0].item() == 3.0
    assert t2.stride() == (1, 3)
    p = fg.nn.Parameter(fg.ones(2))
    p.sum().backward()
    assert copy.deepcopy(p).grad is None                  # torch's Parameter leaves it behind


def test_copy_copy_shares_storage():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    c = copy.copy(x)
    assert c is not x and c.requires_grad and c.is_leaf
    with fg.no_grad():
        c[0] = 5.0
    assert x[0].item() == 5.0


def test_repr_smoke():
    assert repr(fg.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(fg.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(fg.tensor([1.0], dtype=fg.float64)) == "tensor([1.], dtype=fusegrad.float64)"
    assert repr(fg.ones(2, requires_grad=True)) == "tensor([1., 1.], requires_grad=True)"
    assert repr(fg.ones(2, requires_grad=True) * 2) == "tensor([2., 2.], grad_fn=<MulBackward0>)"
    assert repr(fg.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert str(fg.tensor(True)) == "tensor(True)"


def test_hash_is_identity_and_eq_is_elementwise():
    a, b = fg.ones(1), fg.ones(1)
    assert len({a: 1, b: 2}) == 2
    assert (a == b).tolist() == [True]


def test_grad_setter_checks():
    x = fg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = fg.ones(3)
    with pytest.raises(TypeError, match="assigned grad expected to be a Tensor"):
        x.grad = [1.0, 1.0]
    x.grad = fg.ones(2)
    x.grad = None
    assert x.grad is None


def test_keep_freed_heap_sets_glibcs_top_pad_unless_told_not_to(monkeypatch):
    import os

    from fusegrad import host_memory
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    assert host_memory.keep_freed_heap(0) is False
    monkeypatch.setenv("FUSEGRAD_MALLOC_TOP_PAD", "0")
    assert host_memory.keep_freed_heap() is False
    monkeypatch.setenv("MALLOC_TOP_PAD_", str(1 << 20))     # glibc's own setting wins
    monkeypatch.setenv("FUSEGRAD_MALLOC_TOP_PAD", str(1 << 24))
    assert host_memory.keep_freed_heap() is False
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    expected = bool(glibc and glibc.startswith("glibc"))
    assert host_memory.keep_freed_heap() is expected
    assert host_memory.keep_freed_heap(host_memory.DEFAULT_TOP_PAD) is expected


def test_an_environment_setting_that_is_not_a_number_is_reported(monkeypatch):
    from fusegrad import config
    monkeypatch.setenv("FUSEGRAD_NUM_THREADS", "four")
    with pytest.warns(RuntimeWarning, match="FUSEGRAD_NUM_THREADS='four' is not a number"):
        config.reload()
    monkeypatch.delenv("FUSEGRAD_NUM_THREADS")
    config.reload()
