"""Convolution, transposed convolution, unfold and fold: values against direct numpy loops,
gradients against finite differences, traced and compiled runs against eager, and torch as an
optional oracle."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(7)


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def f64(*shape, requires_grad=True) -> fusegrad.Tensor:
    return fusegrad.tensor(RNG.standard_normal(shape), requires_grad=requires_grad)


# --------------------------------------------------------------------------- numpy references


def conv_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Direct convolution, one output position at a time; any number of spatial dims."""
    nd = x.ndim - 2
    s, d = (np.broadcast_to(stride, nd), np.broadcast_to(dilation, nd))
    if isinstance(padding, str):
        total = [d[a] * (w.shape[2 + a] - 1) for a in range(nd)] if padding == "same" else [0] * nd
        pads = [(t // 2, t - t // 2) for t in total]
    else:
        pads = [(p, p) for p in np.broadcast_to(padding, nd)]
    xp = np.pad(x, [(0, 0), (0, 0)] + pads)
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    k = w.shape[2:]
    out = [(xp.shape[2 + a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(nd)]
    y = np.zeros((n, o) + tuple(out))
    og = o // groups
    for pos in np.ndindex(*out):
        idx = tuple(slice(pos[a] * s[a], pos[a] * s[a] + d[a] * (k[a] - 1) + 1, d[a])
                    for a in range(nd))
        for g in range(groups):
            win = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + idx]      # (n, cg, *k)
            wg = w[g * og:(g + 1) * og]                                     # (og, cg, *k)
            y[(slice(None), slice(g * og, (g + 1) * og)) + pos] = np.tensordot(
                win, wg, axes=(list(range(1, 2 + nd)), list(range(1, 2 + nd))))
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y


def conv_transpose_ref(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Direct transposed convolution: each input element scatters weight * value."""
    nd = x.ndim - 2
    s, p, op, d = (np.broadcast_to(v, nd) for v in (stride, padding, output_padding, dilation))
    n, c = x.shape[:2]
    cg, og = c // groups, w.shape[1]
    k = w.shape[2:]
    out = [(x.shape[2 + a] - 1) * s[a] - 2 * p[a] + d[a] * (k[a] - 1) + op[a] + 1 for a in range(nd)]
    y = np.zeros((n, og * groups) + tuple(out))
    for ci in range(c):
        g = ci // cg
        for pos in np.ndindex(*x.shape[2:]):
            for kk in np.ndindex(*k):
                at = [pos[a] * s[a] - p[a] + kk[a] * d[a] for a in range(nd)]
                if all(0 <= at[a] < out[a] for a in range(nd)):
                    y[(slice(None), slice(g * og, (g + 1) * og)) + tuple(at)] += \
                        x[(slice(None), ci) + pos][:, None] * w[(ci, slice(None)) + kk][None]
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y


def unfold_ref(x, k, d=1, p=0, s=1):
    n, c, h, w = x.shape
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)])
    oh, ow = (xp.shape[2] - d * (k - 1) - 1) // s + 1, (xp.shape[3] - d * (k - 1) - 1) // s + 1
    cols = np.zeros((n, c, k, k, oh, ow))
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i * d:i * d + s * (oh - 1) + 1:s, j * d:j * d + s * (ow - 1) + 1:s]
    return cols.reshape(n, c * k * k, oh * ow)


# --------------------------------------------------------------------------- values


CONV2D_CASES = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(padding="same", dilation=2),
    dict(padding="valid"),
    dict(groups=2, padding=1),
]


@pytest.mark.parametrize("kw", CONV2D_CASES, ids=str)
def test_conv2d_matches_direct_loop(kw):
    x, w, b = f32(2, 4, 7, 6), f32(6, 4 // kw.get("groups", 1), 3, 2), f32(6)
    y = NF.conv2d(fusegrad.tensor(x), fusegrad.tensor(w), fusegrad.tensor(b), **kw)
    np.testing.assert_allclose(y.numpy(), conv_ref(x, w, b, **kw), rtol=1e-5, atol=1e-5)
    assert y.dtype is fusegrad.float32


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=2, dilation=2), dict(groups=3),
                                dict(padding="same")], ids=str)
def test_conv1d_matches_direct_loop(kw):
    x, w = f32(2, 3, 9), f32(6, 3 // kw.get("groups", 1), 3)
    y = fusegrad.conv1d(fusegrad.tensor(x), fusegrad.tensor(w), **kw)
    np.testing.assert_allclose(y.numpy(), conv_ref(x, w, **kw), rtol=1e-5, atol=1e-5)


def test_unbatched_input_gives_unbatched_output():
    x, w = f32(3, 5, 5), f32(2, 3, 3, 3)
    y = NF.conv2d(fusegrad.tensor(x), fusegrad.tensor(w), padding=1)
    np.testing.assert_allclose(y.numpy(), conv_ref(x[None], w, padding=1)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, output_padding=1),
                                dict(stride=(2, 3), dilation=(2, 1), groups=2),
                                dict(padding=2, stride=2)], ids=str)
def test_conv_transpose2d_matches_scatter_loop(kw):
    x, w, b = f32(2, 4, 3, 4), f32(4, 3, 3, 2), f32(3 * kw.get("groups", 1))
    y = NF.conv_transpose2d(fusegrad.tensor(x), fusegrad.tensor(w), fusegrad.tensor(b), **kw)
    np.testing.assert_allclose(y.numpy(), conv_transpose_ref(x, w, b, **kw), rtol=1e-5, atol=1e-5)


def test_conv_transpose1d_matches_scatter_loop():
    x, w = f32(2, 2, 5), f32(2, 3, 4)
    y = fusegrad.conv_transpose1d(fusegrad.tensor(x), fusegrad.tensor(w), stride=3, padding=1)
    np.testing.assert_allclose(y.numpy(), conv_transpose_ref(x, w, stride=3, padding=1),
                               rtol=1e-5, atol=1e-5)


def test_unfold_and_fold():
    x = f32(2, 3, 6, 5)
    u = NF.unfold(fusegrad.tensor(x), 3, dilation=1, padding=1, stride=2)
    np.testing.assert_allclose(u.numpy(), unfold_ref(x, 3, 1, 1, 2), rtol=0, atol=0)
    # fold is unfold's adjoint: <unfold(x), c> == <x, fold(c)>
    c = f32(*u.shape)
    f = NF.fold(fusegrad.tensor(c), (6, 5), 3, padding=1, stride=2)
    assert f.shape == (2, 3, 6, 5)
    np.testing.assert_allclose(np.sum(u.numpy() * c), np.sum(x * f.numpy()), rtol=1e-4)
    # with non-overlapping blocks fold inverts unfold
    u2 = NF.unfold(fusegrad.tensor(x[:, :, :6, :4]), 2, stride=2)
    np.testing.assert_array_equal(NF.fold(u2, (6, 4), 2, stride=2).numpy(), x[:, :, :6, :4])


def test_conv_errors_name_the_shapes():
    with pytest.raises(RuntimeError, match="expected input.*to have 4 channels, but got 3"):
        NF.conv2d(fusegrad.zeros(1, 3, 5, 5), fusegrad.zeros(2, 4, 3, 3))
    with pytest.raises(RuntimeError, match="padding='same' is not supported for strided"):
        NF.conv2d(fusegrad.zeros(1, 3, 5, 5), fusegrad.zeros(2, 3, 3, 3), stride=2, padding="same")
    with pytest.raises(RuntimeError, match="too small"):
        NF.conv2d(fusegrad.zeros(1, 3, 2, 2), fusegrad.zeros(2, 3, 3, 3))


# --------------------------------------------------------------------------- gradients


def test_conv2d_gradcheck_and_node_name():
    x, w, b = f64(2, 4, 5, 4), f64(4, 2, 3, 2), f64(4)
    assert gradcheck(lambda x, w, b: NF.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2),
                                               groups=2), (x, w, b))
    y = NF.conv2d(x, w, b, groups=2)
    assert type(y.grad_fn).__name__ == "CompositeNode" and y.grad_fn.name() == "ConvolutionBackward0"


def test_conv_transpose2d_gradcheck():
    x, w, b = f64(1, 2, 3, 3), f64(2, 2, 2, 3), f64(2)
    assert gradcheck(lambda x, w, b: NF.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                         output_padding=1), (x, w, b))


def test_conv1d_and_fold_gradcheck():
    x, w = f64(2, 2, 6), f64(3, 2, 2)
    assert gradcheck(lambda x, w: NF.conv1d(x, w, stride=2, padding="valid"), (x, w))
    c = f64(1, 2 * 4, 25)
    assert gradcheck(lambda c: NF.fold(c, (4, 4), 2, padding=1, stride=1), (c,))


# --------------------------------------------------------------------------- traced and compiled


def _lenet(seed=0):
    fusegrad.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))


def test_compiled_conv_forward_and_gradients_match_eager():
    x, w, b = f32(2, 4, 6, 5), f32(6, 2, 3, 3), f32(6)

    def f(x, w, b):
        y = NF.conv2d(x, w, b, stride=(1, 2), padding=1, groups=2).relu()
        z = NF.conv_transpose2d(y, w, stride=2, groups=2)
        return (y.sum(), z)

    def loss(x, w, b):
        y, z = f(x, w, b)
        return y + (z * z).mean()
    tx, tw, tb = (fusegrad.tensor(a) for a in (x, w, b))
    eager = f(tx, tw, tb)
    compiled = fusegrad.compile(f)(tx, tw, tb)
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    g_eager = fusegrad.grad(loss, argnums=(0, 1, 2))(tx, tw, tb)
    g_comp = fusegrad.compile(fusegrad.grad(loss, argnums=(0, 1, 2)))(tx, tw, tb)
    for e, c in zip(g_eager, g_comp):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


def _training_step(model):
    opt = fusegrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = NF.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_compiled_conv_input_gradient_is_one_col2im_kernel():
    # each window's gradient is one pad of the output gradient (not a pad per axis, which
    # would copy), so all of them sum in one elementwise kernel
    w, g = fusegrad.tensor(f32(4, 3, 3, 3)), fusegrad.tensor(f32(2, 4, 5, 5))
    x = fusegrad.tensor(f32(2, 3, 5, 5))
    f = fusegrad.compile(fusegrad.grad(lambda x: (NF.conv2d(x, w, padding=1) * g).sum()))
    kernels = f.lower(x).kernels
    assert len([k for k in kernels if "pad" in k]) == 1, kernels
    np.testing.assert_allclose(f(x).numpy(), fusegrad.grad(
        lambda x: (NF.conv2d(x, w, padding=1) * g).sum())(x).numpy(), rtol=1e-5, atol=1e-5)


def _strided_block(lib, x, w1, b1, w2, w3, gamma, beta, g):
    """A downsampling residual block: a 3x3 stride-2 conv with bias, batch norm (training)
    and ReLU, a 3x3 conv, and a 1x1 stride-2 shortcut; the loss weights the output by g."""
    F = lib.nn.functional
    y = F.conv2d(x, w1, b1, stride=2, padding=1)
    y = F.batch_norm(y, None, None, gamma, beta, training=True).relu()
    y = F.conv2d(y, w2, padding=1) + F.conv2d(x, w3, stride=2)
    return (y.relu() * g).sum()


def _strided_block_args(lib, dtype, h=9):
    rng = np.random.default_rng(3)
    shapes = [(2, 3, h, h + 1), (4, 3, 3, 3), (4,), (4, 4, 3, 3), (4, 3, 1, 1), (4,), (4,),
              (2, 4, (h + 1) // 2, (h + 2) // 2)]
    return [lib.tensor(rng.standard_normal(s).astype(dtype)) for s in shapes]


@pytest.mark.parametrize("h", [8, 9])
def test_compiled_strided_conv_block_matches_eager_and_float64(h):
    # The compiled backward sums the strided windows' gradients on the phase grid (one
    # kernel, cropped or padded back to the input): forward and every gradient against eager
    # float32 and a float64 reference. Each value is a chain of two products of at most
    # K = 9 * 4 terms (and a batch-norm reduction over N * H * W): float32 rounding bounds
    # the error by a few eps * K relative to the terms' magnitudes.
    grad = fusegrad.grad(lambda *a: _strided_block(fusegrad, *a), argnums=tuple(range(7)))
    args = _strided_block_args(fusegrad, np.float32, h)
    ref = fusegrad.grad(lambda *a: _strided_block(fusegrad, *a), argnums=tuple(range(7)))(
        *_strided_block_args(fusegrad, np.float64, h))
    compiled = fusegrad.compile(grad)(*args)
    eager = grad(*args)
    tol = 4 * np.finfo(np.float32).eps * 9 * 4 * 2 * (h + 1) ** 2
    scale = max(np.abs(r.numpy()).max() for r in ref)
    for c, e, r in zip(compiled, eager, ref):
        np.testing.assert_allclose(c.numpy(), r.numpy(), rtol=0, atol=tol * scale)
        np.testing.assert_allclose(e.numpy(), r.numpy(), rtol=0, atol=tol * scale)
    kernels = fusegrad.compile(grad).lower(*args).kernels
    # the stride-2 convolutions' input gradients: one kernel each over the phase grid
    # (N, C, H / 2, 2, W / 2, 2), the 3x3 one a sum of 9 pads, the 1x1 one a pad
    grids = [k for k in kernels if re.match(r"k\d+\[elementwise 2x3x\d+x2x\d+x2\]", k)]
    assert [k.split("](")[1].count("pad") for k in grids] == [1, 9], kernels


def test_compiled_strided_conv_block_against_torch():
    torch = pytest.importorskip("torch")
    args = _strided_block_args(fusegrad, np.float32)
    ours = fusegrad.compile(fusegrad.grad(lambda *a: _strided_block(fusegrad, *a),
                                          argnums=tuple(range(7))))(*args)
    targs = [torch.tensor(a.numpy(), requires_grad=True) for a in args]
    _strided_block(torch, *targs).backward()
    for o, t in zip(ours, targs[:7]):
        np.testing.assert_allclose(o.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_compiled_lenet_training_step_matches_eager():
    rng = np.random.default_rng(0)
    x = fusegrad.tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
    y = fusegrad.tensor(rng.integers(0, 10, 8))
    losses = {}
    for mode in ("eager", "compiled"):
        step = _training_step(_lenet())
        run = fusegrad.compile(step) if mode == "compiled" else step
        losses[mode] = [run(x, y).item() for _ in range(3)]
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-5)
    assert losses["eager"][2] < losses["eager"][0]


# --------------------------------------------------------------------------- modules


def test_conv_modules_shapes_init_and_repr():
    conv = nn.Conv2d(4, 8, (3, 2), stride=2, padding=1, groups=2)
    assert conv.weight.shape == (8, 2, 3, 2) and conv.bias.shape == (8,)
    bound = 1 / math.sqrt(2 * 3 * 2)
    assert np.abs(conv.weight.detach().numpy()).max() <= bound
    assert np.abs(conv.bias.detach().numpy()).max() <= bound
    assert repr(conv) == ("Conv2d(4, 8, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), "
                          "groups=2)")
    x = fusegrad.randn(2, 4, 7, 6)
    np.testing.assert_allclose(conv(x).detach().numpy(), conv_ref(x.numpy(), conv.weight.detach().numpy(),
                                                         conv.bias.detach().numpy(), 2, 1, 1, 2),
                               rtol=1e-5, atol=1e-5)
    c1 = nn.Conv1d(3, 5, 3, padding="same", bias=False)
    assert c1.bias is None and c1(fusegrad.randn(2, 3, 7)).shape == (2, 5, 7)
    ct = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)
    assert ct.weight.shape == (4, 3, 3, 3)
    assert ct(fusegrad.randn(1, 4, 5, 5)).shape == (1, 6, 9, 9)
    assert ct(fusegrad.randn(1, 4, 5, 5), output_size=(10, 10)).shape == (1, 6, 10, 10)
    assert nn.ConvTranspose1d(2, 3, 4, stride=2)(fusegrad.randn(1, 2, 5)).shape == (1, 3, 12)
    u = nn.Unfold(2, stride=2)(fusegrad.randn(1, 3, 4, 4))
    assert u.shape == (1, 12, 4)
    assert nn.Fold((4, 4), 2, stride=2)(u).shape == (1, 3, 4, 4)
    circ = nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular")
    x = fusegrad.randn(1, 2, 5, 4)
    wrapped = np.pad(x.numpy(), [(0, 0), (0, 0), (1, 1), (1, 1)], mode="wrap")
    np.testing.assert_allclose(circ(x).detach().numpy(),
                               conv_ref(wrapped, circ.weight.detach().numpy(),
                                        circ.bias.detach().numpy()), rtol=1e-5, atol=1e-5)
    refl = nn.Conv1d(2, 2, 4, padding="same", padding_mode="reflect")
    assert refl(fusegrad.randn(1, 2, 6)).shape == (1, 2, 6)
    with pytest.raises(ValueError, match="Only \"zeros\" padding mode"):
        nn.ConvTranspose2d(1, 1, 3, padding_mode="reflect")


# --------------------------------------------------------------------------- torch (optional)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x, w, b = f32(2, 4, 7, 6), f32(6, 2, 3, 2), f32(6)
    for kw in CONV2D_CASES[:4]:
        kw = dict(kw, groups=2)
        ours = NF.conv2d(fusegrad.tensor(x), fusegrad.tensor(w), fusegrad.tensor(b), **kw)
        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), **kw)
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
    wt = f32(4, 3, 3, 2)
    ours = NF.conv_transpose2d(fusegrad.tensor(x), fusegrad.tensor(wt), stride=2, padding=1,
                               output_padding=1, groups=2)
    ref = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(wt), stride=2,
                                               padding=1, output_padding=1, groups=2)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)


def test_conv3d_and_conv_transpose3d_match_loops():
    x, w, b = f32(2, 4, 4, 5, 3), f32(6, 2, 2, 3, 2), f32(6)
    kw = dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2)
    y = fusegrad.conv3d(fusegrad.tensor(x), fusegrad.tensor(w), fusegrad.tensor(b), **kw)
    np.testing.assert_allclose(y.numpy(), conv_ref(x, w, b, **kw), rtol=1e-5, atol=1e-5)
    wt = f32(4, 2, 2, 2, 3)
    kt = dict(stride=2, padding=1, output_padding=1, groups=2)
    yt = NF.conv_transpose3d(fusegrad.tensor(x), fusegrad.tensor(wt), **kt)
    np.testing.assert_allclose(yt.numpy(), conv_transpose_ref(x, wt, **kt), rtol=1e-5, atol=1e-5)
    assert nn.Conv3d(4, 6, 3, padding="same")(fusegrad.tensor(x)).shape == (2, 6, 4, 5, 3)
    assert nn.ConvTranspose3d(4, 2, 2, stride=2)(fusegrad.tensor(x)).shape == (2, 2, 8, 10, 6)
    xs, ws = f64(1, 2, 3, 3, 2), f64(2, 2, 2, 2, 1)
    assert gradcheck(lambda x, w: NF.conv3d(x, w, padding=1), (xs, ws))


# --------------------------------------------------------------------------- windows primitives

WINDOW_GEOMETRIES = [
    # spatial, kernel, stride, dilation, positions
    ((7,), (3,), (2,), (1,), (3,)),
    ((6, 7), (3, 2), (1, 2), (2, 1), (2, 3)),
    ((5, 5), (1, 1), (2, 2), (1, 1), (3, 3)),
    ((4, 5, 6), (2, 2, 3), (1, 2, 1), (1, 1, 2), (3, 2, 1)),
    ((6, 6), (3, 3), (1, 1), (1, 1), (0, 4)),
]


@pytest.mark.parametrize("spatial,kernel,stride,dilation,positions", WINDOW_GEOMETRIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_window_primitives_equal_their_compositions(spatial, kernel, stride, dilation, positions,
                                                    dtype):
    # Eager CPU code binds the windows/overlap_add primitives; traced code records the slices
    # and pads they are defined by: both must give the same bits.
    from fusegrad.ops import windows as W
    x = fusegrad.tensor((RNG.standard_normal((2, 3) + spatial) * 4).astype(dtype))
    x = x.transpose(0, 1).contiguous().transpose(0, 1)       # a non-contiguous operand too
    got = W.windows(x, kernel, stride, dilation, positions)
    want = W.windows_by_slices(x, kernel, stride, dilation, positions)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not np.shares_memory(got.numpy(), x.numpy())
    values = (RNG.standard_normal(tuple(got.shape)) * 4).astype(dtype)
    if dtype is not np.int64:
        values[0] = -0.0               # signed zeros: the sums' signs must agree too
    blocks = fusegrad.tensor(values)
    got = W.overlap_add(blocks, spatial, kernel, stride, dilation)
    want = W.overlap_add_by_pads(blocks, spatial, kernel, stride, dilation)
    assert got.shape == want.shape == (2, 3) + spatial
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want.numpy()))


@pytest.mark.parametrize("spatial,kernel,stride,dilation,positions", WINDOW_GEOMETRIES[:4])
def test_window_primitives_gradients(spatial, kernel, stride, dilation, positions):
    # Each primitive's VJP is the other one: finite differences, twice (gradgradcheck through
    # the adjoint), and the adjoint identity <windows(x), b> = <x, overlap_add(b)>.
    from fusegrad.autograd.gradcheck import gradgradcheck
    from fusegrad.ops import windows as W

    def win(x):
        return W.windows(x, kernel, stride, dilation, positions)

    def add_back(b):
        return W.overlap_add(b, spatial, kernel, stride, dilation)
    x = f64(1, 2, *spatial)
    b = f64(1, 2, math.prod(kernel), *positions)
    assert gradcheck(win, (x,)) and gradcheck(add_back, (b,))
    assert gradgradcheck(win, (x,)) and gradgradcheck(add_back, (b,))
    with fusegrad.no_grad():
        lhs = float((win(x) * b).sum())
        rhs = float((x * add_back(b)).sum())
    assert math.isclose(lhs, rhs, rel_tol=1e-12)
    assert win(x).grad_fn.name() == "Im2ColBackward0"


def test_window_primitives_reject_windows_that_do_not_fit():
    from fusegrad.ops import windows as W
    with pytest.raises(RuntimeError, match="do not fit"):
        W.windows(fusegrad.zeros(1, 1, 5), (3,), (2,), (1,), (3,))
    with pytest.raises(RuntimeError, match="blocks"):
        W.overlap_add(fusegrad.zeros(1, 1, 2, 3), (5,), (3,), (1,), (1,))


def test_compiled_convolution_and_pooling_record_slices_not_window_primitives():
    # The compiler sees the compositions (views folded into index arithmetic), never the
    # primitives that eager code binds.
    x = fusegrad.tensor(f32(2, 3, 8, 8))
    w = fusegrad.tensor(f32(4, 3, 3, 3))

    def f(x, w):
        return NF.max_pool2d(NF.conv2d(x, w, padding=1), 2).sum()
    graph = fusegrad.trace(f, x, w)
    ops = {n.op for n in graph.nodes}
    assert "slice" in ops and not ops & {"windows", "overlap_add"}
    compiled = fusegrad.compile(f)
    np.testing.assert_allclose(compiled(x, w).item(), f(x, w).item(), rtol=1e-5)
