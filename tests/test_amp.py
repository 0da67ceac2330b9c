"""fusegrad.autocast and fusegrad.amp.GradScaler: op dtypes under autocast, regions, threads,
backward dtypes, loss-scale arithmetic and skipped steps; against torch where installed."""

import threading
import warnings

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.ops import autocast as ac

BF16, F32, F64 = fg.bfloat16, fg.float32, fg.float64


def _t(*shape, dtype=F32, seed=0, requires_grad=False):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return fg.tensor(a, dtype=dtype, requires_grad=requires_grad)


# --- the state and the region ---------------------------------------------------------------

def test_defaults_and_region_state():
    assert fg.get_autocast_dtype("cpu") == BF16 and fg.get_autocast_dtype("cuda") == fg.float16
    assert not fg.is_autocast_enabled("cpu") and fg.is_autocast_cache_enabled()
    with fg.autocast("cpu") as region:
        assert fg.is_autocast_enabled("cpu") and not fg.is_autocast_enabled()   # None is cuda's
        assert region.fast_dtype == BF16
    assert not fg.is_autocast_enabled("cpu")
    assert fg.amp.autocast is fg.autocast and fg.amp.is_autocast_available("cpu")


def test_set_autocast_enabled_forms():
    fg.set_autocast_enabled("cpu", True)
    try:
        assert fg.is_autocast_enabled("cpu") and (_t(2, 2) @ _t(2, 2)).dtype == BF16
    finally:
        fg.set_autocast_enabled("cpu", False)
    fg.set_autocast_enabled(True)           # torch's older form: cuda's
    assert fg.is_autocast_enabled("cuda") and not fg.is_autocast_enabled("cpu")
    fg.set_autocast_enabled(False)
    with pytest.raises(TypeError, match=r"set_autocast_enabled\(\): argument 'enabled' \(position 2\) must "
                                        r"be bool, not int"):
        fg.set_autocast_enabled("cpu", 1)
    with pytest.raises(TypeError, match=r"argument 'enabled' \(position 1\) must be bool, not str"):
        fg.set_autocast_enabled("cpu")


def test_state_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with fg.autocast("cpu", dtype=fg.float16):
            raise ZeroDivisionError
    assert not fg.is_autocast_enabled("cpu") and fg.get_autocast_dtype("cpu") == BF16
    assert ac.STATE.nesting == 0 and not ac.STATE.cache


def test_bad_devices_and_dtypes_raise_or_warn_as_torch():
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda device type at start of device "
                                           "string: foo"):
        fg.autocast("foo")
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`"):
        fg.autocast(fg.device("cpu"))
    with pytest.warns(UserWarning, match="In CPU autocast, but the target dtype is not supported. "
                                         "Disabling autocast."):
        region = fg.autocast("cpu", dtype=F32)
    with region:
        assert not fg.is_autocast_enabled("cpu")
        assert (_t(2, 2) @ _t(2, 2)).dtype == F32
    with pytest.raises(TypeError, match="autocast\\(\\)\\(func\\) requires a callable, but got int"):
        fg.autocast("cpu")(3)


def test_decorator_form():
    @fg.autocast("cpu")
    def f(a):
        assert fg.is_autocast_enabled("cpu")
        return a @ a
    assert f(_t(3, 3)).dtype == BF16 and f.__name__ == "f"
    assert not fg.is_autocast_enabled("cpu")


def test_nested_and_disabled_regions():
    a = _t(4, 4)
    with fg.autocast("cpu"):
        assert (a @ a).dtype == BF16
        with fg.autocast("cpu", enabled=False):
            assert (a @ a).dtype == F32
            with fg.autocast("cpu", dtype=fg.float16):
                assert (a @ a).dtype == fg.float16
            assert (a @ a).dtype == F32
        assert (a @ a).dtype == BF16
        assert ac.STATE.nesting == 1
    assert (a @ a).dtype == F32 and ac.STATE.nesting == 0


def test_state_is_per_thread():
    seen = {}

    def other():
        seen["enabled"] = fg.is_autocast_enabled("cpu")
        seen["dtype"] = (_t(2, 2) @ _t(2, 2)).dtype
        with fg.autocast("cpu"):
            seen["inner"] = (_t(2, 2) @ _t(2, 2)).dtype

    with fg.autocast("cpu"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert (_t(2, 2) @ _t(2, 2)).dtype == BF16
    assert seen == {"enabled": False, "dtype": F32, "inner": BF16}
    assert (_t(2, 2) @ _t(2, 2)).dtype == F32


def test_deprecated_device_spellings_warn_as_torch():
    with pytest.warns(FutureWarning, match=r"`torch.cpu.amp.autocast\(args...\)` is deprecated. Please "
                                           r"use `torch.amp.autocast\('cpu', args...\)` instead."):
        region = fg.cpu.amp.autocast()
    with region:
        assert (_t(2, 2) @ _t(2, 2)).dtype == BF16
    with pytest.warns(FutureWarning, match=r"`torch.cpu.amp.GradScaler\(args...\)` is deprecated"):
        scaler = fg.cpu.amp.GradScaler(init_scale=8.0)
    assert scaler.get_scale() == 8.0 and scaler.is_enabled()
    with pytest.warns(DeprecationWarning, match=r"torch.get_autocast_cpu_dtype\(\) is deprecated. Please "
                                                r"use torch.get_autocast_dtype\('cpu'\) instead."):
        assert fg.get_autocast_cpu_dtype() == BF16
    if not fg.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            region = fg.cuda.amp.autocast()
            scaler = fg.cuda.amp.GradScaler()
        messages = [str(w.message) for w in caught]
        assert "CUDA is not available or torch_xla is imported. Disabling autocast." in messages
        assert "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling." in messages
        assert not region._enabled and not scaler.is_enabled()


# --- the op lists ---------------------------------------------------------------------------

def _lower_ops():
    x, w, img, k = _t(4, 6), _t(3, 6, seed=1), _t(1, 2, 5, 5), _t(3, 2, 3, 3, seed=2)
    b = _t(2, 4, 4)
    return {
        "linear": lambda: F.linear(x, w), "matmul": lambda: x @ w.T, "mm": lambda: fg.mm(x, w.T),
        "mm method": lambda: x.mm(w.T), "bmm": lambda: fg.bmm(b, b), "addmm": lambda: fg.addmm(
            _t(4, 3), x, w.T), "baddbmm": lambda: fg.baddbmm(b, b, b), "conv2d": lambda: F.conv2d(img, k),
        "nn.Linear": lambda: nn.Linear(6, 3)(x), "conv1d": lambda: F.conv1d(img[:, :, 0], k[:, :, 0]),
        "sdpa": lambda: F.scaled_dot_product_attention(b, b, b),
        "einsum": lambda: fg.einsum("ij,kj->ik", x, w),
    }


@pytest.mark.parametrize("name", list(_lower_ops()))
def test_lower_precision_ops(name):
    fn = _lower_ops()[name]
    assert fn().dtype == F32
    with fg.autocast("cpu"):
        assert fn().dtype == BF16
    with fg.autocast("cpu", dtype=fg.float16):
        assert fn().dtype == fg.float16


def test_inplace_variants_of_listed_ops_are_not_cast():
    a, b = _t(4, 4), _t(4, 4, seed=1)
    want = a.clone().addmm_(a, b)
    with fg.autocast("cpu"):
        got = a.clone().addmm_(a, b)
    assert got.dtype == F32
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_float64_stays_float64_and_integers_are_not_cast():
    a = _t(3, 3, dtype=F64)
    with fg.autocast("cpu"):
        assert (a @ a).dtype == F64
        assert (fg.arange(4).reshape(2, 2) @ fg.arange(4).reshape(2, 2)).dtype == fg.int64


def test_float32_ops_upcast_lower_precision_inputs():
    logits, target = _t(4, 5, dtype=BF16), fg.tensor([0, 1, 2, 3])
    with fg.autocast("cpu"):
        assert F.cross_entropy(logits, target).dtype == F32
        assert F.mse_loss(logits, logits).dtype == F32
        assert F.nll_loss(logits, target).dtype == F32
        assert F.binary_cross_entropy_with_logits(logits, logits).dtype == F32
        assert fg.prod(logits).dtype == F32 and logits.prod().dtype == F32
        # Ops in no list run in their input's dtype.
        assert F.softmax(logits, -1).dtype == BF16 and F.relu(logits).dtype == BF16
        assert logits.sum().dtype == BF16


def test_promote_ops_take_the_widest_type():
    lo, hi = _t(2, 3, dtype=BF16), _t(2, 3)
    with fg.autocast("cpu"):
        assert fg.cat([lo, hi]).dtype == F32 and fg.stack([lo, hi]).dtype == F32
        assert fg.cat([lo, lo]).dtype == BF16
        assert hi.index_copy(0, fg.tensor([1]), lo[:1]).dtype == F32


def test_inside_a_listed_op_autocast_is_off():
    # cross_entropy (float32) contracts nothing, but its primitives and any public op it calls
    # see autocast off: a float32 loss of float32 logits is computed exactly as without it.
    logits, target = _t(6, 5), fg.tensor([0, 1, 2, 3, 4, 0])
    want = F.cross_entropy(logits, target)
    with fg.autocast("cpu"):
        got = F.cross_entropy(logits, target)
    assert got.dtype == F32 and got.item() == want.item()


# --- autograd -------------------------------------------------------------------------------

def test_backward_runs_in_each_ops_forward_dtype():
    x = _t(5, 6)
    w = _t(3, 6, seed=1, requires_grad=True)
    with fg.autocast("cpu"):
        y = F.linear(x, w)
        loss = F.mse_loss(y, fg.zeros(5, 3))
    assert y.dtype == BF16 and loss.dtype == F32
    loss.backward()
    assert w.grad.dtype == F32
    # The same casts written out by hand give the same gradient, bit for bit.
    w2 = fg.tensor(w.detach().numpy(), requires_grad=True)
    F.mse_loss(F.linear(x.to(BF16), w2.to(BF16)).float(), fg.zeros(5, 3)).backward()
    np.testing.assert_array_equal(w.grad.numpy(), w2.grad.numpy())


def test_cast_cache_reuses_a_parameters_cast_within_a_region():
    x = _t(2, 4)
    w = _t(3, 4, seed=1, requires_grad=True)
    with fg.autocast("cpu"):
        F.linear(x, w)
        (cached_src, cached) = ac.STATE.cache[id(w)]
        assert cached_src is w and cached.dtype == BF16
        out = F.linear(x, w) + F.linear(x, w)
        assert ac.STATE.cache[id(w)][1] is cached
        with fg.autocast("cpu", cache_enabled=False):
            F.linear(x, _t(3, 4, seed=2, requires_grad=True))
        assert len(ac.STATE.cache) == 1
    assert not ac.STATE.cache
    out.float().sum().backward()
    # As one cast of w written by hand, used twice.
    w2 = fg.tensor(w.detach().numpy(), requires_grad=True)
    wb = w2.to(BF16)
    (F.linear(x.to(BF16), wb) + F.linear(x.to(BF16), wb)).float().sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), w2.grad.numpy())


# --- compile ---------------------------------------------------------------------------------

def test_autocast_region_inside_a_trace_records_the_casts():
    w = _t(4, 8, seed=1)

    def f(x):
        with fg.autocast("cpu"):
            return F.linear(x, w).relu()
    g = fg.trace(f, _t(3, 8))
    text = str(g)
    assert "cast %x {dtype=bf16}" in text and "bf16[3,4]" in text


def test_compiled_autocast_matches_eager():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x, y = _t(16, 8), fg.tensor(np.arange(16) % 4)

    def loss_fn(x, y):
        with fg.autocast("cpu"):
            out = model(x)
            return F.cross_entropy(out, y), out
    (l_eager, o_eager), (l_comp, o_comp) = loss_fn(x, y), fg.compile(loss_fn, fullgraph=True)(x, y)
    assert o_comp.dtype == BF16 and l_comp.dtype == F32
    # bf16 rounding of the same float32 values: at most one bf16 ulp apart where the compiled
    # kernels round a product or a sum in another order before the final cast.
    np.testing.assert_allclose(o_comp.detach().float().numpy(), o_eager.detach().float().numpy(),
                               rtol=2 ** -7, atol=2 ** -7)
    assert abs(l_comp.item() - l_eager.item()) <= 2 ** -7 * abs(l_eager.item())


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 by integer arithmetic (to nearest even), as float32:
    the model of torch's rounding of a product's float32 sums."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


# (a's shape, b's shape, b given transposed): 2-D products, a weight read transposed as
# linear reads it, batched products of 3 and 4 dims, and a batch broadcast from one matrix.
_BF16_PRODUCTS = [((6, 40), (40, 9), False), ((6, 40), (9, 40), True), ((3, 5, 40), (3, 40, 7), False),
                  ((2, 3, 5, 40), (2, 3, 7, 40), True), ((4, 5, 40), (40, 7), False)]


def _bf16_operands(a_shape, b_shape, seed=0):
    """Small integers (exact in bf16, their products' sums exact in float32, so every
    product is the rounding of its exact value whatever the order of the sums)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-8, 9, a_shape).astype(np.float32),
            rng.integers(-8, 9, b_shape).astype(np.float32))


@pytest.mark.parametrize("a_shape,b_shape,transposed", _BF16_PRODUCTS)
def test_compiled_bf16_products_on_float32_blas_round_once(monkeypatch, a_shape, b_shape, transposed):
    # Where the generated GEMM is off (a CPU without AVX-512, numpy's BLAS doing float32
    # products), a compiled bf16 product widens its operands, multiplies in float32 and rounds
    # the sums once: the numpy model of bf16 products.
    from fusegrad.config import config
    monkeypatch.setattr(config, "native_gemm", "off")
    a, b = _bf16_operands(a_shape, b_shape)

    def f(x, w):
        with fg.autocast("cpu"):
            return x @ (w.mT if transposed else w)
    out = fg.compile(f, fullgraph=True)(fg.tensor(a), fg.tensor(b))
    want = _round_bf16(a @ (np.swapaxes(b, -1, -2) if transposed else b))
    assert out.dtype == BF16
    np.testing.assert_array_equal(out.float().numpy(), want)
    np.testing.assert_array_equal(f(fg.tensor(a), fg.tensor(b)).float().numpy(), want)   # eager


def test_compiled_bf16_products_of_normals_are_a_bf16_ulp_from_the_model(monkeypatch):
    from fusegrad.config import config
    monkeypatch.setattr(config, "native_gemm", "off")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 33, 70), (3, 70, 17)))
    out = fg.compile(lambda x, w: fg.bmm(x.bfloat16(), w.bfloat16()))(fg.tensor(a), fg.tensor(b))
    wide = [np.asarray(fg.tensor(v).bfloat16().float().numpy(), np.float64) for v in (a, b)]
    exact = wide[0] @ wide[1]
    # The float32 sums' error (K * eps32 * sum |a||b|), then one rounding to bf16 (2^-8 of it).
    bound = 70 * 2 ** -24 * (np.abs(wide[0]) @ np.abs(wide[1])) + 2 ** -8 * np.abs(exact)
    assert (np.abs(out.float().numpy() - exact) <= bound).all()


@pytest.mark.parametrize("a_shape,b_shape,transposed", _BF16_PRODUCTS)
def test_compiled_bf16_products_match_torch_autocast(monkeypatch, a_shape, b_shape, transposed):
    torch = pytest.importorskip("torch")
    from fusegrad.config import config
    monkeypatch.setattr(config, "native_gemm", "off")
    a, b = _bf16_operands(a_shape, b_shape, seed=2)

    def f(lib, x, w):
        with lib.autocast("cpu", dtype=lib.bfloat16):
            return x @ (w.mT if transposed else w)
    out = fg.compile(lambda x, w: f(fg, x, w), fullgraph=True)(fg.tensor(a), fg.tensor(b))
    want = f(torch, torch.from_numpy(a), torch.from_numpy(b))
    assert want.dtype == torch.bfloat16
    np.testing.assert_array_equal(out.float().numpy(), want.float().numpy())


def _conv2d_model(x: np.ndarray, w: np.ndarray, stride: int, pad: int, groups: int) -> np.ndarray:
    """conv2d in float64 by windows (the exact sums of small integers), rounded to bf16."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    out = [np.einsum("nchwij,ocij->nohw", win[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout])
           for g in range(groups)]
    return _round_bf16(np.concatenate(out, axis=1).astype(np.float32))


_CONVS = [(1, 1, 1), (2, 0, 1), (1, 1, 2)]       # (stride, padding, groups)


@pytest.mark.parametrize("stride,pad,groups", _CONVS)
def test_bf16_conv2d_rounds_its_float32_sums_once(stride, pad, groups):
    # A convolution under autocast runs in bf16: its operands cast, the float32 path's sums
    # (144 products of small integers here: exact), rounded once to bf16, eager and compiled.
    x, w = _bf16_operands((2, 16, 7, 7), (6, 16 // groups, 3, 3), seed=3)

    def f(x, w):
        with fg.autocast("cpu"):
            return F.conv2d(x, w, stride=stride, padding=pad, groups=groups)
    want = _conv2d_model(x, w, stride, pad, groups)
    xt, wt = fg.tensor(x, requires_grad=True), fg.tensor(w, requires_grad=True)
    for out in (f(xt, wt), fg.compile(f, fullgraph=True)(xt, wt)):
        assert out.dtype == BF16
        np.testing.assert_array_equal(out.detach().float().numpy(), want)
    f(xt, wt).float().sum().backward()
    assert xt.grad.dtype == F32 and wt.grad.dtype == F32
    # d(sum)/dw[o, c, i, j] is the sum of x over the windows' (i, j) elements of channel c's
    # group: integers summed exactly, rounded once to bf16 by the bf16 backward.
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::stride, ::stride]
    sums = _round_bf16(win.sum(axis=(0, 2, 3)))                    # (channels, 3, 3)
    cin, cout = 16 // groups, 6 // groups
    want_w = np.concatenate([np.broadcast_to(sums[g * cin:(g + 1) * cin], (cout, cin, 3, 3))
                             for g in range(groups)])
    np.testing.assert_array_equal(wt.grad.numpy(), want_w)


@pytest.mark.parametrize("stride,pad,groups", _CONVS)
def test_bf16_conv2d_matches_torch_autocast(stride, pad, groups):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 16, 7, 7)).astype(np.float32) * 3
    w = rng.standard_normal((6, 16 // groups, 3, 3)).astype(np.float32)

    def f(lib, x, w):
        with lib.autocast("cpu", dtype=lib.bfloat16):
            return lib.nn.functional.conv2d(x, w, stride=stride, padding=pad, groups=groups)
    tx, tw = (torch.tensor(v, requires_grad=True) for v in (x, w))
    want = f(torch, tx, tw)
    (want.float() ** 2).sum().backward()
    xt, wt = fg.tensor(x, requires_grad=True), fg.tensor(w, requires_grad=True)
    got = f(fg, xt, wt)
    compiled = fg.compile(lambda x, w: f(fg, x, w), fullgraph=True)(xt, wt)
    for out in (got, compiled):
        assert out.dtype == BF16
        np.testing.assert_array_equal(out.detach().float().numpy(), want.detach().float().numpy())
    (got.float() ** 2).sum().backward()
    for mine, theirs in ((xt.grad, tx.grad), (wt.grad, tw.grad)):
        # bf16 gradients of one rounding each, summed in another order: a few bf16 ulps of
        # the largest.
        assert np.abs(mine.numpy() - theirs.numpy()).max() <= 4 * 2 ** -8 * np.abs(theirs.numpy()).max()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("op", ["linear", "conv2d"])
def test_bf16_bias_is_added_before_the_one_rounding_as_torch(op, compiled):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 16, 5, 5) if op == "conv2d" else (64, 32)).astype(np.float32) * 3
    w = rng.standard_normal((6, 16, 3, 3) if op == "conv2d" else (48, 32)).astype(np.float32)
    b = rng.standard_normal(w.shape[0]).astype(np.float32) * 100

    def f(lib, *args):
        with lib.autocast("cpu", dtype=lib.bfloat16):
            return getattr(lib.nn.functional, op)(*args)
    want = f(torch, *map(torch.tensor, (x, w, b))).float().numpy()
    mine = fg.compile(lambda *a: f(fg, *a), fullgraph=True) if compiled else (lambda *a: f(fg, *a))
    np.testing.assert_array_equal(mine(*map(fg.tensor, (x, w, b))).float().numpy(), want)


def _bf16(a):
    """``a`` (float64) rounded once to bfloat16, to nearest even, as float64."""
    return np.asarray(a, np.float32).astype(fg.bfloat16.np_dtype).astype(np.float64)


def _small_ints(rng, shape):
    # Integers of at most 5 bits (bf16 holds them): every float32 sum of their products is
    # exact, in any order, so the one rounding of the model below is the only one.
    return rng.integers(-16, 17, shape).astype(np.float64)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("op", ["linear", "linear3d", "conv2d"])
def test_bf16_bias_is_rounded_once_with_the_sums(op, compiled):
    # round(x @ w.T + b), not round(round(x @ w.T) + b): sums above 256 need more than bf16's
    # 8 bits, and a bias with a half makes many of them round another way the second time.
    rng = np.random.default_rng(0)
    conv = op == "conv2d"
    x = _small_ints(rng, (2, 16, 5, 5) if conv else (2, 24, 32) if op == "linear3d" else (48, 32))
    w = _small_ints(rng, (6, 16, 3, 3) if conv else (40, 32))
    b = rng.integers(-100, 100, w.shape[0]) + 0.5
    if conv:
        cols = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))   # n c h w kh kw
        sums = np.einsum("nchwij,ocij->nohw", cols, w)
        bias = b[:, None, None]
    else:
        sums, bias = x @ w.T, b
    once, twice = _bf16(sums + bias), _bf16(_bf16(sums) + bias)
    assert (once != twice).mean() > 0.05

    def f(*args):
        return (F.conv2d if conv else F.linear)(*args)
    run = fg.compile(f, fullgraph=True) if compiled else f
    out = run(*(fg.tensor(v, dtype=BF16) for v in (x, w, b)))
    assert out.dtype == BF16
    np.testing.assert_array_equal(out.double().numpy(), once)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bf16_linear_with_bias_gradients_are_the_bf16_products(compiled):
    # The backward of the once-rounded linear: each gradient one bf16 product (or sum),
    # rounded once, read from the bf16 operands.
    rng = np.random.default_rng(1)
    x, w, g = _small_ints(rng, (24, 32)), _small_ints(rng, (20, 32)), _small_ints(rng, (24, 20))
    b = rng.integers(-100, 100, 20) + 0.5
    xt, wt, bt = (fg.tensor(v, dtype=BF16, requires_grad=True) for v in (x, w, b))

    def f(x, w, b, g):
        return (F.linear(x, w, b).float() * g).sum()
    (fg.compile(f, fullgraph=True) if compiled else f)(xt, wt, bt, fg.tensor(g, dtype=F32)).backward()
    for t, want in ((xt, g @ w), (wt, g.T @ x), (bt, g.sum(0))):
        assert t.grad.dtype == BF16
        np.testing.assert_array_equal(t.grad.double().numpy(), _bf16(want))


def test_compiled_module_called_inside_autocast_matches_eager():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = fg.compile(model)
    x, y = _t(32, 8), fg.tensor(np.arange(32) % 4)
    grads = []
    for run in (compiled, model):
        model.zero_grad()
        with fg.autocast("cpu"):
            out = run(x)
            loss = F.cross_entropy(out, y)
        assert out.dtype == BF16 and loss.dtype == F32
        loss.backward()
        grads.append(model[0].weight.grad.numpy().copy())
    assert grads[0].dtype == np.float32
    # bf16 products in another summation order: a few bf16 ulps of the largest gradient.
    np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=4 * 2 ** -8 * np.abs(grads[1]).max())


def test_a_compiled_function_is_retraced_inside_an_autocast_region():
    w = _t(4, 4, seed=1)
    f = fg.compile(lambda x: x @ w)
    x = _t(4, 4)
    assert f(x).dtype == F32 and f(x).dtype == F32
    with fg.autocast("cpu"):
        assert f(x).dtype == BF16 and f(x).dtype == BF16
        with fg.autocast("cpu", dtype=fg.float16):
            assert f(x).dtype == fg.float16
    assert f(x).dtype == F32 and f.compiles == 3


def _mlp_step_program(batch, amp):
    """The compiled program of an MLP training step (64-128-128-10, ReLU, SGD), float32 or
    under autocast."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        with fg.autocast("cpu", enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    x, y = _t(batch, 64), fg.tensor(np.arange(batch) % 10)
    return fg.compile(step, fullgraph=True).lower(x, y).program


def test_a_bf16_activation_is_stored_once_in_bf16():
    kg = _mlp_step_program(32, True).kg
    matmuls = [k for k in kg.kernels if k.kind == "matmul"]
    # The first layer's kernel: the bf16 product, the bias and the ReLU, written in bf16
    # (the cast folded into the kernel that produces the value, no float32 copy)...
    hidden = [v for v in matmuls[0].outputs if v.type.shape == (32, 128) and v.type.dtype == BF16]
    assert len(hidden) == 1
    # ...and, in the same pass, its float32 widening, which the second layer's product reads
    # (its bias is added to the float32 sums before the one rounding); no float32 copy is
    # kept for the backward, which reads the bf16 one.
    wide = [v for v in matmuls[1].inputs if v.type.shape == (32, 128)]
    assert len(wide) == 1 and wide[0] in matmuls[0].outputs and wide[0].type.dtype == F32
    assert wide[0].producer.op == "cast" and wide[0].producer.inputs[0] is hidden[0]
    # The kernels that only cast a batch-sized value: the input's cast to bf16 (and its
    # float32 widening) in the forward; in the backward, where its products are float32
    # ones (BLAS), the widenings of the saved bf16 operands of the weights' gradients (the
    # input, the two hidden activations), which the generated GEMM's bf16 products read as
    # they are.
    from fusegrad.ops.prims_reduce import gemm_enabled
    casts = [k for k in kg.kernels if {n.op for n in k.nodes} == {"cast"} and k.shape[0] == 32]
    widened = [] if gemm_enabled() else [(32, 64), (32, 128), (32, 128)]
    assert sorted(k.shape for k in casts) == sorted([(32, 64)] + widened)
    assert [n.output.type.dtype for n in casts[0].nodes] == [BF16, F32]


def _bf16_logits_gradient() -> int:
    """Bytes per sample of the 10 logits' bf16 gradient that a step computes before its
    backward where its gradient products are bf16 (the generated GEMM's)."""
    from fusegrad.ops.prims_reduce import gemm_enabled
    return 10 * 2 if gemm_enabled() else 0


def test_autocast_step_saves_activations_in_bf16():
    # Activation bytes per sample: the difference between two batch sizes (copies of the
    # parameters, the bf16 weights that the backward reads, cancel). The hidden activations
    # are saved in bf16; a ReLU's gradient reads its output (no byte mask beside it).
    from fusegrad.runtime.memory_plan import saved_between

    def saved(batch, amp):
        prog = _mlp_step_program(batch, amp)
        return sum(saved_between(prog.kg, prog.graph.outputs[0]).values())
    per_sample = {amp: (saved(64, amp) - saved(32, amp)) / 32 for amp in (False, True)}
    # float32: 2 x 128 activations (4 bytes), 10 logits' softmax (4 bytes).
    assert per_sample[False] == 2 * 128 * 4 + 10 * 4
    # bf16: the input's bf16 copy and the activations in 2 bytes; the loss's kernel computes
    # the logits' gradient, widened to float32 for the last layer's gradient products and
    # its bias's sum, before the backward (10 values of 4 bytes; and in bf16, 2 bytes more,
    # where the gradient products are the generated GEMM's bf16 ones).
    assert per_sample[True] == 64 * 2 + 2 * 128 * 2 + 10 * 4 + _bf16_logits_gradient()


# --- GradScaler ------------------------------------------------------------------------------

def _param(values):
    p = nn.Parameter(fg.tensor(values, dtype=F32))
    return p


def _scaled_step(scaler, opt, p, grad):
    """One iteration: backward of scale(loss) gives grad * scale, then step and update."""
    opt.zero_grad()
    scaler.scale((p * fg.tensor(grad, dtype=F32)).sum()).backward()
    out = scaler.step(opt)
    scaler.update()
    return out


def test_scale_growth_and_backoff_sequence():
    p = _param([1.0, 2.0])
    opt = fg.optim.SGD([p], lr=0.5)
    scaler = fg.amp.GradScaler("cpu", init_scale=4.0, growth_factor=2.0, backoff_factor=0.25,
                               growth_interval=2)
    assert scaler.get_scale() == 4.0
    inf = float("inf")
    # clean, clean (grow x2 -> 8), inf (x0.25 -> 2), clean, nan (-> 0.5), clean, clean (-> 1)
    grads = [[1, 1], [1, 1], [inf, 1], [1, 1], [float("nan"), 1], [1, 1], [1, 1]]
    scales, trackers = [], []
    for g in grads:
        _scaled_step(scaler, opt, p, g)
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
    assert scales == [4.0, 8.0, 2.0, 2.0, 0.5, 0.5, 1.0]
    assert trackers == [1, 0, 0, 1, 0, 1, 0]
    # Five clean steps of lr * grad = 0.5 each; the two overflowing steps were skipped.
    np.testing.assert_array_equal(p.detach().numpy(), [1.0 - 2.5, 2.0 - 2.5])


def test_unscale_divides_the_gradients_exactly_and_records_inf():
    p = _param([1.0, 2.0, 3.0])
    opt = fg.optim.SGD([p], lr=1.0)
    scaler = fg.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((p * fg.tensor([0.5, -3.0, 1e-3])).sum()).backward()
    np.testing.assert_array_equal(p.grad.numpy(), np.float32([0.5, -3.0, 1e-3]) * 1024)
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad.numpy(), np.float32([0.5, -3.0, 1e-3]))
    assert scaler._per_optimizer_states[id(opt)]["found_inf_per_device"][fg.device("cpu")].item() == 0.0


def test_grad_scaler_errors_as_torch():
    p = _param([1.0])
    opt = fg.optim.SGD([p], lr=1.0)
    with pytest.raises(AssertionError, match="The growth factor must be > 1.0."):
        fg.amp.GradScaler("cpu", growth_factor=1.0)
    with pytest.raises(AssertionError, match="The backoff factor must be < 1.0."):
        fg.amp.GradScaler("cpu", backoff_factor=1.0)
    scaler = fg.amp.GradScaler("cpu")
    with pytest.raises(AssertionError, match="Attempted unscale_ but _scale is None.  This may indicate"):
        scaler.unscale_(opt)
    with pytest.raises(AssertionError, match="Attempted update but _scale is None"):
        scaler.update()
    scaler.scale((p * 2).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called on this optimizer since "
                                           r"the last update\(\)."):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported if GradScaler is "
                                           "enabled."):
        scaler.step(opt, closure=lambda: 0)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update\(\)."):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)."):
        scaler.unscale_(opt)
    scaler.update()
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update."):
        scaler.update()
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        scaler.scale(3.0)


def test_unscale_refuses_float16_gradients():
    p = nn.Parameter(fg.tensor([1.0], dtype=fg.float16))
    opt = fg.optim.SGD([p], lr=1.0)
    scaler = fg.amp.GradScaler("cpu")
    scaler.scale((p * 2).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        scaler.unscale_(opt)


def test_state_dict_round_trip_and_explicit_new_scale():
    p = _param([1.0])
    opt = fg.optim.SGD([p], lr=1.0)
    scaler = fg.amp.GradScaler("cpu", init_scale=16.0, growth_interval=3)
    _scaled_step(scaler, opt, p, [1.0])
    state = scaler.state_dict()
    assert state == {"scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                     "_growth_tracker": 1}
    other = fg.amp.GradScaler("cpu")
    other.load_state_dict(state)
    assert other.state_dict() == state
    scaler.scale(fg.tensor(1.0))
    scaler.update(new_scale=0.25)
    assert scaler.get_scale() == 0.25
    with pytest.raises(RuntimeError, match="The source state dict is empty"):
        other.load_state_dict({})
    disabled = fg.amp.GradScaler("cpu", enabled=False)
    loss = fg.tensor(3.0)
    assert disabled.scale(loss) is loss and disabled.state_dict() == {} and disabled.get_scale() == 1.0


_OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.1)), ("AdamW", dict(lr=0.1)),
               ("RMSprop", dict(lr=0.1)), ("Adagrad", dict(lr=0.1)), ("Adadelta", dict(lr=1.0)),
               ("Adamax", dict(lr=0.1)), ("NAdam", dict(lr=0.1)), ("RAdam", dict(lr=0.1)),
               ("ASGD", dict(lr=0.1)), ("Rprop", dict(lr=0.1))]


@pytest.mark.parametrize("name,kwargs", _OPTIMIZERS, ids=[n for n, _ in _OPTIMIZERS])
def test_every_optimizer_steps_as_unscaled_and_skips_on_inf(name, kwargs):
    cls = getattr(fg.optim, name)
    grads = [[0.5, -1.0], [0.25, 2.0], [float("inf"), 1.0], [-1.0, 0.5]]
    ref, p = _param([1.0, -2.0]), _param([1.0, -2.0])
    ref_opt, opt = cls([ref], **kwargs), cls([p], **kwargs)
    scaler = fg.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for g in grads:
        if not np.isfinite(g).all():
            before = p.detach().numpy().copy()
            _scaled_step(scaler, opt, p, g)
            np.testing.assert_array_equal(p.detach().numpy(), before)
            continue
        ref_opt.zero_grad()
        (ref * fg.tensor(g)).sum().backward()
        ref_opt.step()
        _scaled_step(scaler, opt, p, g)
        # A power-of-two scale unscales exactly: the same steps, bit for bit.
        np.testing.assert_array_equal(p.detach().numpy(), ref.detach().numpy())
    assert scaler.get_scale() == 2.0 ** 9


def test_clip_grad_norm_after_unscale_sees_the_true_gradients():
    p = _param([3.0, 4.0])
    opt = fg.optim.SGD([p], lr=1.0)
    scaler = fg.amp.GradScaler("cpu", init_scale=256.0)
    scaler.scale((p * fg.tensor([3.0, 4.0])).sum()).backward()
    scaler.unscale_(opt)
    total = nn.utils.clip_grad_norm_([p], max_norm=1.0)
    assert total.item() == pytest.approx(5.0, rel=1e-6)
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8], rtol=1e-6)
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(p.detach().numpy(), [2.4, 3.2], rtol=1e-6)


def _scaler_step(opt_name):
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = getattr(fg.optim, opt_name)(model.parameters(), **dict(_OPTIMIZERS)[opt_name])
    scaler = fg.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)

    def step(x, y, boost):
        opt.zero_grad()
        with fg.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss * boost).backward()
        scaler.step(opt)
        scaler.update()
        return loss
    return model, opt, scaler, step


# An overflow on the first step (the optimizer's state is made by a step that is skipped),
# clean steps that grow the scale, and an overflow later on.
_BOOSTS = [1e38, 1.0, 1.0, 1e38, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "Rprop", "ASGD"])
def test_compiled_step_with_a_scaler_is_one_graph_and_skips_as_eager(opt_name):
    x, y = _t(12, 6), fg.tensor(np.arange(12) % 3)
    m_eager, opt_eager, s_eager, step_eager = _scaler_step(opt_name)
    m_comp, opt_comp, s_comp, step_comp = _scaler_step(opt_name)
    step_comp = fg.compile(step_comp, fullgraph=True)      # no graph break: found_inf stays a tensor
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow", RuntimeWarning)
        want = [step_eager(x, y, fg.tensor(b)).item() for b in _BOOSTS]
        got = [step_comp(x, y, fg.tensor(b)).item() for b in _BOOSTS]
    # The same updates, bit for bit: the skipped ones selected away on every parameter and
    # state tensor (step counts included); the losses as the compiled forward rounds them.
    for a, b in zip(m_eager.parameters(), m_comp.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    for sa, sb in zip(opt_eager.state.values(), opt_comp.state.values()):
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(np.asarray(sa[k].numpy()), np.asarray(sb[k].numpy()))
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(np.float32).eps)
    assert s_comp.state_dict() == s_eager.state_dict() == {
        "scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2,
        "_growth_tracker": 1}
    # A first-step graph (the state made in it) and the steady-state one.
    assert step_comp.compiles == 2


def test_a_skipped_first_step_leaves_zero_state_and_no_step_count():
    x, y = _t(12, 6), fg.tensor(np.arange(12) % 3)
    model, opt, scaler, step = _scaler_step("Adam")
    before = [p.detach().numpy().copy() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow", RuntimeWarning)
        fg.compile(step, fullgraph=True)(x, y, fg.tensor(1e38))
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.detach().numpy(), b)
        state = opt.state[p]
        assert state["step"].item() == 0.0
        assert not state["exp_avg"].numpy().any() and not state["exp_avg_sq"].numpy().any()
    assert scaler.get_scale() == 128.0 and scaler._get_growth_tracker() == 0


def test_update_outside_the_compiled_step_raises():
    model, opt, scaler, _ = _scaler_step("SGD")
    x, y = _t(12, 6), fg.tensor(np.arange(12) % 3)

    def step(x, y):
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
    fg.compile(step, fullgraph=True)(x, y)
    with pytest.raises(RuntimeError, match=r"update\(\) in the same compiled function as step\(\)"):
        scaler.update()


# --- against torch ---------------------------------------------------------------------------

# Each: a function of (module, functional, float input a (4, 4)) run in both libraries.
_TORCH_OPS = {
    "mm": lambda m, Fn, a: m.mm(a, a), "matmul": lambda m, Fn, a: a @ a,
    "linear": lambda m, Fn, a: Fn.linear(a, a), "bmm": lambda m, Fn, a: m.bmm(a[None], a[None]),
    "addmm": lambda m, Fn, a: m.addmm(a, a, a),
    "baddbmm": lambda m, Fn, a: m.baddbmm(a[None], a[None], a[None]),
    "addbmm": lambda m, Fn, a: m.addbmm(a, a[None], a[None]),
    "conv1d": lambda m, Fn, a: Fn.conv1d(a[None], a[:, :, None]),
    "conv2d": lambda m, Fn, a: Fn.conv2d(a[None, None], a[None, None, :2, :2]),
    "conv_transpose2d": lambda m, Fn, a: Fn.conv_transpose2d(a[None, None], a[None, None, :2, :2]),
    "prelu": lambda m, Fn, a: Fn.prelu(a, a[0, :1]),
    "sdpa": lambda m, Fn, a: Fn.scaled_dot_product_attention(a[None], a[None], a[None]),
    "einsum": lambda m, Fn, a: m.einsum("ij,jk->ik", a, a),
    "tensordot": lambda m, Fn, a: m.tensordot(a, a, 1),
    "mv": lambda m, Fn, a: m.mv(a, a[0]), "dot": lambda m, Fn, a: m.dot(a[0], a[0]),
    "addmv": lambda m, Fn, a: m.addmv(a[0], a, a[0]), "addr": lambda m, Fn, a: m.addr(a, a[0], a[0]),
    "outer": lambda m, Fn, a: m.outer(a[0], a[0]), "inner": lambda m, Fn, a: m.inner(a, a),
    "vdot": lambda m, Fn, a: m.vdot(a[0], a[0]), "vecdot": lambda m, Fn, a: m.linalg.vecdot(a, a),
    "bilinear": lambda m, Fn, a: Fn.bilinear(a, a, a[None]), "kron": lambda m, Fn, a: m.kron(a, a),
    "chain_matmul": lambda m, Fn, a: m.linalg.multi_dot([a, a, a]),
    "pairwise_distance": lambda m, Fn, a: Fn.pairwise_distance(a, a),
    "linalg.inv": lambda m, Fn, a: m.linalg.inv(a + 8 * m.eye(4)),
    "linalg.norm": lambda m, Fn, a: m.linalg.norm(a), "std": lambda m, Fn, a: a.std(),
    "var": lambda m, Fn, a: a.var(), "logsumexp": lambda m, Fn, a: m.logsumexp(a, 0),
    "cumprod": lambda m, Fn, a: a.cumprod(0), "softplus": lambda m, Fn, a: Fn.softplus(a),
    "dropout": lambda m, Fn, a: Fn.dropout(a, 0.0), "embedding": lambda m, Fn, a: Fn.embedding(
        m.tensor([0, 2]), a), "interpolate": lambda m, Fn, a: Fn.interpolate(a[None], scale_factor=2.0),
    "conv3d": lambda m, Fn, a: Fn.conv3d(a[None, None, None], a[None, None, None, :2, :2]),
    "avg_pool3d": lambda m, Fn, a: Fn.avg_pool3d(a[None, None, None].expand(1, 1, 2, 4, 4), 2),
    "max_pool3d": lambda m, Fn, a: Fn.max_pool3d(a[None, None, None].expand(1, 1, 2, 4, 4), 2),
    "adaptive_avg_pool3d": lambda m, Fn, a: Fn.adaptive_avg_pool3d(a[None, None, None], 1),
    "poisson_nll_loss": lambda m, Fn, a: Fn.poisson_nll_loss(a, a.abs()),
    "hinge_embedding_loss": lambda m, Fn, a: Fn.hinge_embedding_loss(a, a.sign()),
    "margin_ranking_loss": lambda m, Fn, a: Fn.margin_ranking_loss(a, a, a.sign()),
    "multi_margin_loss": lambda m, Fn, a: Fn.multi_margin_loss(a, m.tensor([0, 1, 2, 3])),
    "triplet_margin_loss": lambda m, Fn, a: Fn.triplet_margin_loss(a, a, a),
    "cosine_embedding_loss": lambda m, Fn, a: Fn.cosine_embedding_loss(a, a, m.tensor([1, -1, 1, -1])),
    "fft": lambda m, Fn, a: m.fft.rfft(a), "polar": lambda m, Fn, a: m.polar(a.abs(), a),
    "quantile": lambda m, Fn, a: m.quantile(a, 0.5), "pinverse": lambda m, Fn, a: m.pinverse(a),
    "softmax": lambda m, Fn, a: Fn.softmax(a, -1), "log_softmax": lambda m, Fn, a: Fn.log_softmax(a, -1),
    "layer_norm": lambda m, Fn, a: Fn.layer_norm(a, (4,)),
    "group_norm": lambda m, Fn, a: Fn.group_norm(a[None], 2),
    "cross_entropy": lambda m, Fn, a: Fn.cross_entropy(a, m.tensor([0, 1, 2, 3])),
    "nll_loss": lambda m, Fn, a: Fn.nll_loss(a, m.tensor([0, 1, 2, 3])),
    "mse_loss": lambda m, Fn, a: Fn.mse_loss(a, a), "l1_loss": lambda m, Fn, a: Fn.l1_loss(a, a),
    "smooth_l1_loss": lambda m, Fn, a: Fn.smooth_l1_loss(a, a),
    "huber_loss": lambda m, Fn, a: Fn.huber_loss(a, a),
    "kl_div": lambda m, Fn, a: Fn.kl_div(a, a, reduction="batchmean"),
    "binary_cross_entropy": lambda m, Fn, a: Fn.binary_cross_entropy(m.sigmoid(a), m.sigmoid(a)),
    "bce_with_logits": lambda m, Fn, a: Fn.binary_cross_entropy_with_logits(a, a),
    "soft_margin_loss": lambda m, Fn, a: Fn.soft_margin_loss(a, a),
    "sum": lambda m, Fn, a: a.sum(),
    "prod": lambda m, Fn, a: a.prod(),
    "cumsum": lambda m, Fn, a: a.cumsum(0),
    "mean": lambda m, Fn, a: a.mean(),
    "exp": lambda m, Fn, a: m.exp(a),
    "log": lambda m, Fn, a: m.log(a.abs()),
    "pow": lambda m, Fn, a: m.pow(a, 2), "norm": lambda m, Fn, a: m.norm(a),
    "cat": lambda m, Fn, a: m.cat([a, a.float()]), "stack": lambda m, Fn, a: m.stack([a, a.float()]),
    "where": lambda m, Fn, a: m.where(a > 0, a, a.float()), "add": lambda m, Fn, a: a + a.float(),
    "index_copy": lambda m, Fn, a: a.float().index_copy(0, m.tensor([0]), a[:1]),
    "cdist": lambda m, Fn, a: m.cdist(a, a), "trace": lambda m, Fn, a: a.trace(),
    "inverse": lambda m, Fn, a: m.inverse(a + 8 * m.eye(4)),
    "relu": lambda m, Fn, a: Fn.relu(a),
    "gelu": lambda m, Fn, a: Fn.gelu(a),
    "tanh": lambda m, Fn, a: m.tanh(a),
    "max_pool2d": lambda m, Fn, a: Fn.max_pool2d(a[None], 2),
    "avg_pool2d": lambda m, Fn, a: Fn.avg_pool2d(a[None], 2),
    "batch_norm": lambda m, Fn, a: Fn.batch_norm(a, None, None, training=True),
    "cosine_similarity": lambda m, Fn, a: Fn.cosine_similarity(a, a),
    "normalize": lambda m, Fn, a: Fn.normalize(a),
    "addcmul": lambda m, Fn, a: m.addcmul(a, a, a.float()), "atan2": lambda m, Fn, a: m.atan2(a, a.float()),
}


@pytest.mark.parametrize("name", sorted(_TORCH_OPS))
def test_op_dtypes_match_torch_autocast(name):
    torch = pytest.importorskip("torch")
    fn = _TORCH_OPS[name]
    a = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    for dtype in ("float32", "bfloat16", "float64"):
        if name == "index_copy" and dtype == "float64":
            continue        # fusegrad's index_copy casts its source to self's dtype; torch's raises
        ta = torch.tensor(a).to(getattr(torch, dtype))
        fa = fg.tensor(a).to(getattr(fg, dtype))
        with torch.autocast("cpu"):
            try:
                want = str(fn(torch, torch.nn.functional, ta).dtype).replace("torch.", "")
            except RuntimeError:
                want = "RuntimeError"
        with fg.autocast("cpu"):
            try:
                got = fn(fg, F, fa).dtype.name
            except RuntimeError:
                got = "RuntimeError"
        assert got == want, f"{name} on {dtype}: fusegrad {got}, torch {want}"


def _torch_training_run(torch, x, y, weights, steps):
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 5))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.tensor(w))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.tensor(x), torch.tensor(y)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


def _fusegrad_training_run(x, y, weights, steps, compiled):
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    with fg.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(fg.tensor(w))
    opt = fg.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = fg.amp.GradScaler("cpu")

    def forward_backward(x, y):
        with fg.autocast("cpu", dtype=fg.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        return loss

    def step(x, y):
        opt.zero_grad()
        loss = forward_backward(x, y)
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(opt)
        scaler.update()
        return loss
    if compiled == "forward and backward":
        forward_backward = fg.compile(forward_backward, fullgraph=True)
    elif compiled == "whole step":
        step = fg.compile(step, fullgraph=True)
    x, y = fg.tensor(x), fg.tensor(y)
    return [step(x, y).item() for _ in range(steps)]


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [None, "forward and backward", "whole step"])
def test_training_script_follows_torch_autocast(compiled):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 5))
    weights = [p.detach().numpy().copy() for p in ref.parameters()]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    y = (x[:, :5].argmax(1)).astype(np.int64)
    want = _torch_training_run(torch, x, y, weights, 50)
    got = _fusegrad_training_run(x, y, weights, 50, compiled)
    assert want[-1] < 0.5 * want[0]        # it trains
    assert abs(got[-1] - want[-1]) <= 0.01 * want[-1], (got[-1], want[-1])


def _user_script(torch, x, y, weights, compiled=False):
    """A training script written against torch's API, run on real torch or on
    ``import fusegrad as torch``: an MLP, Adam, autocast around the forward, a GradScaler."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.tensor(w))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    scaler = torch.amp.GradScaler("cpu")

    def step(x, y):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss
    if compiled:
        step = torch.compile(step, fullgraph=True)
    x, y = torch.tensor(x), torch.tensor(y)
    return [step(x, y).item() for _ in range(50)], scaler.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_user_script_on_fusegrad_as_torch_follows_torch(compiled):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    weights = [rng.uniform(-0.25, 0.25, s).astype(np.float32) for s in [(64, 16), (64,), (5, 64), (5,)]]
    x = rng.standard_normal((64, 16)).astype(np.float32)
    y = x[:, :5].argmax(1).astype(np.int64)
    want, want_state = _user_script(torch, x, y, weights)
    got, got_state = _user_script(fg, x, y, weights, compiled)
    assert want[-1] < 0.5 * want[0]        # it trains
    assert abs(got[-1] - want[-1]) <= 0.01 * want[-1], (got[-1], want[-1])
    assert got_state == want_state


def test_scale_read_by_a_compiled_backward_follows_update():
    # The scale is state made with the scaler, so a compiled function that calls scale()
    # reads its current value at each call (made while tracing, it was frozen in the graph).
    def run(compiled):
        fg.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = fg.optim.SGD(model.parameters(), lr=0.1)
        scaler = fg.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)

        def forward_backward(x):
            loss = model(x).sum()
            scaler.scale(loss).backward()
            return loss
        if compiled:
            forward_backward = fg.compile(forward_backward, fullgraph=True)
        grads = []
        for _ in range(4):
            opt.zero_grad()
            forward_backward(fg.ones(3, 4))
            scaler.unscale_(opt)
            grads.append(model.weight.grad.numpy().copy())
            scaler.step(opt)
            scaler.update()
        return grads, scaler.get_scale()
    eager, compiled = run(False), run(True)
    assert eager[1] == compiled[1] == 64.0
    for a, b in zip(eager[0], compiled[0]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, np.full((2, 4), 3.0, np.float32))


def test_pickled_scaler_keeps_its_scale():
    import pickle
    p = _param([1.0])
    opt = fg.optim.SGD([p], lr=1.0)
    scaler = fg.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    _scaled_step(scaler, opt, p, [1.0])
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.get_scale() == 16.0 and copy.state_dict() == scaler.state_dict()
    _scaled_step(copy, fg.optim.SGD([p], lr=1.0), p, [1.0])
    assert copy.get_scale() == 32.0


def test_custom_fwd_casts_inputs_and_custom_bwd_replays_the_forwards_state():
    seen = {}

    class MyMM(fg.autograd.Function):
        @staticmethod
        @fg.amp.custom_fwd(device_type="cpu", cast_inputs=F32)
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a.mm(b)

        @staticmethod
        @fg.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            seen["enabled"] = fg.is_autocast_enabled("cpu")
            a, b = ctx.saved_tensors
            return g.mm(b.t()), a.t().mm(g)

    a = _t(3, 3, dtype=BF16, requires_grad=True)
    b = _t(3, 3, seed=1, dtype=BF16)
    with fg.autocast("cpu"):
        out = MyMM.apply(a, b)
    assert out.dtype == F32           # inputs cast to float32, autocast off inside
    out.sum().backward()
    assert seen["enabled"] is False and a.grad.dtype == BF16
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`"):
        fg.amp.custom_fwd(device_type=None)


# --- what a 16-bit backward reads -----------------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bf16_softmax_gradient_reads_the_rounded_output(compiled):
    # torch's softmax_backward_data of a bf16 output: out * (g - sum(g * out)) in float32 on
    # the bf16 output, rounded once (the float32 output before its rounding is not kept).
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 37)).astype(np.float32) * 3
    g = rng.standard_normal((8, 37)).astype(np.float32)
    xt = fg.tensor(x, dtype=BF16, requires_grad=True)
    def f(a):
        return F.softmax(a, -1)
    out = (fg.compile(f) if compiled else f)(xt)
    out.backward(fg.tensor(g, dtype=BF16))
    o, gb = out.detach().double().numpy(), fg.tensor(g, dtype=BF16).double().numpy()
    want = o * (gb - (gb * o).sum(-1, keepdims=True))
    assert xt.grad.dtype == BF16
    # One rounding of a float32 computation: within a bf16 ulp of the float64 model.
    np.testing.assert_allclose(xt.grad.double().numpy(), want, rtol=2 ** -8, atol=2 ** -8 * 2 ** -126)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bf16_softmax_gradient_as_torch(compiled):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 37)).astype(np.float32) * 3
    g = rng.standard_normal((16, 37)).astype(np.float32)
    tx = torch.tensor(x).bfloat16().requires_grad_()
    torch.nn.functional.softmax(tx, -1).backward(torch.tensor(g).bfloat16())
    xt = fg.tensor(x, dtype=BF16, requires_grad=True)
    def f(a):
        return F.softmax(a, -1)
    (fg.compile(f) if compiled else f)(xt).backward(fg.tensor(g, dtype=BF16))
    np.testing.assert_array_equal(xt.grad.float().numpy(), tx.grad.float().numpy())


def _block_step_program(batch):
    """A compiled autocast training step of Linear-GELU-LayerNorm-Linear (bias everywhere),
    cross-entropy, SGD."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        with fg.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    x, y = _t(batch, 64), fg.tensor(np.arange(batch) % 10)
    return fg.compile(step, fullgraph=True).lower(x, y).program


def test_autocast_step_saves_what_torch_saves_for_gelu_and_layer_norm():
    # Per sample (the difference of two batch sizes): the GELU keeps its bf16 input (no
    # float32 derivative), the layer norm its bf16 input (its centered and normalized values
    # are recomputed in the backward, with the row statistics), as torch's saved tensors.
    from fusegrad.runtime.memory_plan import saved_between

    def saved(batch):
        prog = _block_step_program(batch)
        return sum(saved_between(prog.kg, prog.graph.outputs[0]).values())
    per_sample = (saved(64) - saved(32)) / 32
    # x in bf16 (64), the GELU's input (128), the layer norm's input (the GELU's output,
    # 128), its output (the last product's operand, 128), all 2 bytes; the logits'
    # gradient, as in the MLP above.
    assert per_sample == (64 + 3 * 128) * 2 + 10 * 4 + _bf16_logits_gradient()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bf16_gelu_gradient_as_torch(compiled):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 37)).astype(np.float32) * 3
    g = rng.standard_normal((16, 37)).astype(np.float32)
    tx = torch.tensor(x).bfloat16().requires_grad_()
    torch.nn.functional.gelu(tx).backward(torch.tensor(g).bfloat16())
    xt = fg.tensor(x, dtype=BF16, requires_grad=True)
    (fg.compile(F.gelu) if compiled else F.gelu)(xt).backward(fg.tensor(g, dtype=BF16))
    np.testing.assert_array_equal(xt.grad.float().numpy(), tx.grad.float().numpy())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_layer_norm_gradients_from_its_input(compiled):
    # NativeLayerNormBackward's formula, recomputed from the input, against float64.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 32)) * 3 + 1
    w, b, g = rng.standard_normal(32), rng.standard_normal(32), rng.standard_normal((3, 5, 32))
    ts = [fg.tensor(v, dtype=F32, requires_grad=True) for v in (x, w, b)]

    def f(x, w, b, g):
        return (F.layer_norm(x, (32,), w, b) * g).sum()
    (fg.compile(f) if compiled else f)(*ts, fg.tensor(g, dtype=F32)).backward()
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + 1e-5)
    gx = g * w
    want_x = (gx - gx.mean(-1, keepdims=True) - xhat * (gx * xhat).mean(-1, keepdims=True)) \
        / np.sqrt(var + 1e-5)
    for t, want in zip(ts, (want_x, (g * xhat).sum((0, 1)), g.sum((0, 1)))):
        # float32 arithmetic over rows of 32 and sums of 15: a few hundred ulps at most.
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=0, atol=256 * 2 ** -24 * np.abs(want).max())


def _addmm_case(alpha, beta, compiled):
    rng = np.random.default_rng(8)
    args = (rng.integers(-100, 100, (24, 20)) + 0.5, _small_ints(rng, (24, 32)),
            _small_ints(rng, (32, 20)))

    def f(x, m1, m2):
        return fg.addmm(x, m1, m2, alpha=alpha, beta=beta)
    out = (fg.compile(f) if compiled else f)(*(fg.tensor(v, dtype=BF16) for v in args))
    assert out.dtype == BF16
    return args, out.double().numpy()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("alpha,beta", [(1, 1), (0.5, 2), (1, 0)])
def test_bf16_addmm_adds_the_input_before_the_one_rounding(alpha, beta, compiled):
    (x, m1, m2), out = _addmm_case(alpha, beta, compiled)
    np.testing.assert_array_equal(out, _bf16(beta * x + alpha * (m1 @ m2) if beta else alpha * (m1 @ m2)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("alpha,beta", [(1, 1), (0.5, 2), (1, 0)])
def test_bf16_addmm_as_torch(alpha, beta, compiled):
    torch = pytest.importorskip("torch")
    args, out = _addmm_case(alpha, beta, compiled)
    want = torch.addmm(*(torch.tensor(v).bfloat16() for v in args), alpha=alpha, beta=beta)
    np.testing.assert_array_equal(out, want.double().numpy())
