"""RNN, LSTM, GRU and their cells: values against numpy loops, gradients against finite
differences, compiled against eager (a training step included), torch as an optional oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(11)


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def t(a, grad=False) -> fusegrad.Tensor:
    return fusegrad.tensor(a, requires_grad=grad)


def sigmoid(a):
    return 1 / (1 + np.exp(-a))


def cell_ref(mode, x, h, c, p, sfx):
    """One time step of ``mode`` on (N, I) with the parameters named ``..._{sfx}``."""
    w_ih, w_hh = p["weight_ih" + sfx], p["weight_hh" + sfx]
    b_ih = p.get("bias_ih" + sfx, 0.0)
    b_hh = p.get("bias_hh" + sfx, 0.0)
    gi, gh = x @ w_ih.T + b_ih, h @ w_hh.T + b_hh
    if mode == "tanh":
        return np.tanh(gi + gh), None
    if mode == "relu":
        return np.maximum(gi + gh, 0), None
    if mode == "LSTM":
        i, f, g, o = np.split(gi + gh, 4, -1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        return sigmoid(o) * np.tanh(c), c
    r, z, n = (np.split(gi, 3, -1)[j] for j in range(3))
    hr, hz, hn = np.split(gh, 3, -1)
    r, z = sigmoid(r + hr), sigmoid(z + hz)
    n = np.tanh(n + r * hn)
    return (1 - z) * n + z * h, None


def rnn_ref(mode, x, p, num_layers, bidirectional, h0=None, c0=None):
    """(T, N, I) through the layers, step by step; returns output, h_n, c_n."""
    D = 2 if bidirectional else 1
    T, N = x.shape[:2]
    H = p["weight_hh_l0"].shape[1]
    h0 = np.zeros((num_layers * D, N, H)) if h0 is None else h0
    c0 = np.zeros((num_layers * D, N, H)) if c0 is None else c0
    hn, cn = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            h, c = h0[layer * D + d], c0[layer * D + d]
            ys = [None] * T
            for step in (range(T - 1, -1, -1) if d else range(T)):
                h, c = cell_ref(mode, x[step], h, c, p, sfx)
                ys[step] = h
            outs.append(np.stack(ys))
            hn.append(h)
            cn.append(c)
        x = np.concatenate(outs, -1)
    return x, np.stack(hn), (np.stack(cn) if mode == "LSTM" else None)


def params_of(module) -> dict[str, np.ndarray]:
    return {n: q.detach().numpy().astype(np.float64) for n, q in module.named_parameters()}


def make(mode, *args, **kw):
    if mode in ("tanh", "relu"):
        return nn.RNN(*args, nonlinearity=mode, **kw)
    return {"LSTM": nn.LSTM, "GRU": nn.GRU}[mode](*args, **kw)


# --------------------------------------------------------------------------- layers


def test_parameter_names_shapes_and_init():
    m = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    shapes = {n: tuple(q.shape) for n, q in m.named_parameters()}
    assert list(shapes)[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                "weight_ih_l0_reverse"]
    assert shapes["weight_ih_l0"] == (16, 3) and shapes["weight_ih_l1_reverse"] == (16, 8)
    assert shapes["weight_hh_l1"] == (16, 4) and len(shapes) == 16
    bound = 1 / math.sqrt(4)
    assert all(np.abs(q.detach().numpy()).max() <= bound for q in m.parameters())
    g = nn.GRU(3, 5, bias=False)
    assert [n for n, _ in g.named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]
    assert g.weight_ih_l0.shape == (15, 3)
    # torch 2.13 prints no nonlinearity for RNN (its cells do)
    assert repr(nn.RNN(3, 4, 2, "relu", batch_first=True)) == \
        "RNN(3, 4, num_layers=2, batch_first=True)"
    assert repr(nn.GRUCell(3, 4, bias=False)) == "GRUCell(3, 4, bias=False)"
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.warns(UserWarning, match="dropout option adds dropout after all but last"):
        nn.GRU(3, 4, dropout=0.5)


@pytest.mark.parametrize("mode", ["tanh", "relu", "LSTM", "GRU"])
def test_layers_match_loop(mode):
    m = make(mode, 3, 4, 2, bidirectional=True)
    x = f32(5, 2, 3)
    h0 = f32(4, 2, 4)
    hx = (t(h0), t(f32(4, 2, 4))) if mode == "LSTM" else t(h0)
    out, state = m(t(x), hx)
    c0 = hx[1].numpy() if mode == "LSTM" else None
    ref, hn, cn = rnn_ref(mode, x, params_of(m), 2, True, h0, c0)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    h = state[0] if mode == "LSTM" else state
    np.testing.assert_allclose(h.detach().numpy(), hn, rtol=1e-5, atol=1e-5)
    if mode == "LSTM":
        np.testing.assert_allclose(state[1].detach().numpy(), cn, rtol=1e-5, atol=1e-5)


def test_batch_first_unbatched_and_default_state():
    m = nn.GRU(3, 4, batch_first=True)
    x = f32(2, 6, 3)
    out, h = m(t(x))
    ref, hn, _ = rnn_ref("GRU", x.transpose(1, 0, 2), params_of(m), 1, False)
    np.testing.assert_allclose(out.detach().numpy(), ref.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h.detach().numpy(), hn, rtol=1e-5, atol=1e-5)
    lstm = nn.LSTM(3, 4)
    out, (h, c) = lstm(t(x[0]))                     # unbatched (T, I)
    assert out.shape == (6, 4) and h.shape == (1, 4) and c.shape == (1, 4)
    ref, hn, cn = rnn_ref("LSTM", x[0][:, None], params_of(lstm), 1, False)
    np.testing.assert_allclose(out.detach().numpy(), ref[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c.detach().numpy(), cn[:, 0], rtol=1e-5, atol=1e-5)


def test_dropout_between_layers_only_in_training():
    m = nn.LSTM(3, 4, num_layers=2, dropout=0.5)
    x = t(f32(4, 2, 3))
    fusegrad.manual_seed(1)
    a = m(x)[0]
    fusegrad.manual_seed(1)
    b = m(x)[0]
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    m.eval()
    ref = rnn_ref("LSTM", x.numpy(), params_of(m), 2, False)[0]
    np.testing.assert_allclose(m(x)[0].detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(a.detach().numpy(), ref, atol=1e-3)


def test_errors_name_the_shapes():
    m = nn.LSTM(3, 4, num_layers=2)
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size. "
                                           "Expected 3, got 5"):
        m(fusegrad.randn(4, 2, 5))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(2, 2, 4\), got \[1, 2, 4\]"):
        m(fusegrad.randn(4, 2, 3), (fusegrad.zeros(1, 2, 4), fusegrad.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D, got 4D"):
        m(fusegrad.randn(1, 4, 2, 3))


# --------------------------------------------------------------------------- cells


def test_cells_match_one_step():
    x, h, c = f32(2, 3), f32(2, 4), f32(2, 4)
    for mode, cell in (("tanh", nn.RNNCell(3, 4)), ("relu", nn.RNNCell(3, 4, nonlinearity="relu")),
                       ("LSTM", nn.LSTMCell(3, 4)), ("GRU", nn.GRUCell(3, 4))):
        p = params_of(cell)
        ref_h, ref_c = cell_ref(mode, x, h, c, p, "")
        got = cell(t(x), (t(h), t(c)) if mode == "LSTM" else t(h))
        got_h = got[0] if mode == "LSTM" else got
        np.testing.assert_allclose(got_h.detach().numpy(), ref_h, rtol=1e-5, atol=1e-5)
        if mode == "LSTM":
            np.testing.assert_allclose(got[1].detach().numpy(), ref_c, rtol=1e-5, atol=1e-5)
        if mode == "LSTM":                         # the state may be a list, as in torch
            np.testing.assert_array_equal(cell(t(x), [t(h), t(c)])[1].detach().numpy(),
                                          got[1].detach().numpy())
        unbatched = cell(t(x[0]))                  # default zero state, (I,) input
        unbatched = unbatched[0] if mode == "LSTM" else unbatched
        np.testing.assert_allclose(unbatched.detach().numpy(),
                                   cell_ref(mode, x[:1], 0 * h[:1], 0 * c[:1], p, "")[0][0],
                                   rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", ["tanh", "LSTM", "GRU"])
def test_gradcheck(mode):
    m = make(mode, 2, 3, 2, bidirectional=True, dtype=fusegrad.float64)
    x = fusegrad.tensor(RNG.standard_normal((2, 1, 2)), requires_grad=True)
    h0 = fusegrad.tensor(RNG.standard_normal((4, 1, 3)), requires_grad=True)

    def f(x, h0):
        out, state = m(x, (h0, h0 * 0.5) if mode == "LSTM" else h0)
        return out, state[0] if mode == "LSTM" else state
    assert gradcheck(f, (x, h0))
    # a parameter's gradient too (through the second layer's reverse direction)
    b = m.bias_hh_l1_reverse.detach().requires_grad_()
    assert gradcheck(lambda b: _with_param(m, "bias_hh_l1_reverse", b, x), (b,))


def _with_param(m, name, value, x):
    old = m._parameters[name]
    m._parameters[name] = value
    try:
        return m(x)[0]
    finally:
        m._parameters[name] = old


# --------------------------------------------------------------------------- compiled


def test_compiled_layers_match_eager():
    lstm = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    gru = nn.GRU(3, 4)
    x = t(f32(2, 3, 3))

    def f(x):
        out, (h, c) = lstm(x)
        return out, h, c, gru(x.transpose(0, 1))[0]
    for e, c in zip(f(x), fusegrad.compile(f)(x)):
        np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-6)


class TinyLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 7)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


def _training_step(model):
    opt = fusegrad.optim.Adam(model.parameters(), lr=1e-2)

    def step(ids, target):
        opt.zero_grad()
        loss = NF.cross_entropy(model(ids).reshape(-1, 7), target)
        loss.backward()
        opt.step()
        return loss
    return step


def test_compiled_lstm_training_step_matches_eager():
    ids = fusegrad.tensor(RNG.integers(0, 7, (3, 5)))
    target = fusegrad.tensor(RNG.integers(0, 7, (15,)))
    losses = {}
    for mode in ("eager", "compiled"):
        fusegrad.manual_seed(0)
        step = _training_step(TinyLSTM())
        run = fusegrad.compile(step) if mode == "compiled" else step
        losses[mode] = [run(ids, target).item() for _ in range(3)]
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-5)
    assert losses["eager"][2] < losses["eager"][0]


# --------------------------------------------------------------------------- torch (optional)


def _copy_from_torch(ours, theirs):
    ours.load_state_dict({n: fusegrad.tensor(v.detach().numpy())
                          for n, v in theirs.state_dict().items()})


def test_against_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layers = [(nn.RNN, torch.nn.RNN, dict(nonlinearity="relu", num_layers=2)),
              (nn.LSTM, torch.nn.LSTM, dict(num_layers=2, bidirectional=True, batch_first=True)),
              (nn.LSTM, torch.nn.LSTM, dict(proj_size=2, bidirectional=True)),
              (nn.GRU, torch.nn.GRU, dict(bidirectional=True, bias=False))]
    for ours_cls, torch_cls, kw in layers:
        tm, m = torch_cls(3, 4, **kw), ours_cls(3, 4, **kw)
        _copy_from_torch(m, tm)
        x = f32(2, 5, 3)
        ox, tx = t(x, grad=True), torch.tensor(x, requires_grad=True)
        o, r = m(ox)[0], tm(tx)[0]
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-5)
        (o * o).sum().backward()
        (r * r).sum().backward()
        np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
        ours = dict(m.named_parameters())
        for n, p in tm.named_parameters():
            np.testing.assert_allclose(ours[n].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5)
    for ours_cls, torch_cls in ((nn.RNNCell, torch.nn.RNNCell), (nn.LSTMCell, torch.nn.LSTMCell),
                                (nn.GRUCell, torch.nn.GRUCell)):
        tc, c = torch_cls(3, 4), ours_cls(3, 4)
        _copy_from_torch(c, tc)
        x = f32(2, 3)
        o, r = c(t(x)), tc(torch.tensor(x))
        o, r = (o[1], r[1]) if isinstance(o, tuple) else (o, r)
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-5)
