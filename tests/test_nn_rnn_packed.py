"""fusegrad.nn.utils.rnn and packed input to RNN, LSTM and GRU: known values of the pack/pad
utilities and their errors, packed runs against each sequence run alone (unpadded), compiled
against eager (lengths guarded by value), and torch as an optional oracle for values, errors,
final states and every gradient."""

from __future__ import annotations

import functools
import itertools
import warnings

import numpy as np
import pytest

import fusegrad
from fusegrad import config as fusegrad_config
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn.utils.rnn import (
    PackedSequence,
    invert_permutation,
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
    pad_sequence,
    unpack_sequence,
    unpad_sequence,
)

RNG = np.random.default_rng(36)
MODES = ["tanh", "relu", "LSTM", "GRU"]
# float64 runs of a few steps: the same operations in another order differ by a few ulps.
TOL64 = dict(rtol=1e-10, atol=1e-12)


def t(a, grad=False) -> fusegrad.Tensor:
    return fusegrad.tensor(a, requires_grad=grad)


def make(mode, *args, **kw):
    if mode in ("tanh", "relu"):
        return nn.RNN(*args, nonlinearity=mode, **kw)
    return {"LSTM": nn.LSTM, "GRU": nn.GRU}[mode](*args, **kw)


def padded_batch(lengths, size, batch_first, fill=0.0) -> np.ndarray:
    """Random float64 sequences of ``lengths``, padded with ``fill``: (T, B, size) or (B, T, size)."""
    x = np.full((max(lengths), len(lengths), size), fill)
    for b, n in enumerate(lengths):
        x[:n, b] = RNG.standard_normal((n, size))
    return x.transpose(1, 0, 2).copy() if batch_first else x


def final_states(mode, state):
    return list(state) if mode == "LSTM" else [state]


# --------------------------------------------------------------------------- utilities


def test_pack_padded_sequence_known_values():
    seq = t(np.array([[1, 2, 0], [3, 0, 0], [4, 5, 6]]))
    packed = pack_padded_sequence(seq, [2, 1, 3], batch_first=True, enforce_sorted=False)
    assert isinstance(packed, PackedSequence) and isinstance(packed, tuple)
    assert packed.data.tolist() == [4, 1, 3, 5, 2, 6]
    assert packed.batch_sizes.tolist() == [3, 2, 1]
    assert packed.batch_sizes.dtype is fusegrad.int64 and packed.batch_sizes.device.type == "cpu"
    assert packed.sorted_indices.tolist() == [2, 0, 1]
    assert packed.unsorted_indices.tolist() == [1, 2, 0]
    data, batch_sizes, sorted_indices, unsorted_indices = packed        # a 4-tuple
    assert data is packed.data and unsorted_indices is packed.unsorted_indices
    padded, lengths = pad_packed_sequence(packed, batch_first=True)
    assert padded.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert lengths.tolist() == [2, 1, 3] and lengths.dtype is fusegrad.int64
    # time-major, sorted: no indices; lengths as a tensor (any integer dtype) or a list
    x = t(np.arange(12.0).reshape(4, 3, 1))
    p = pack_padded_sequence(x, fusegrad.tensor([4, 2, 1], dtype=fusegrad.int32))
    assert p.sorted_indices is None and p.unsorted_indices is None
    assert p.data[:, 0].tolist() == [0, 1, 2, 3, 4, 6, 9] and p.batch_sizes.tolist() == [3, 2, 1, 1]
    padded, lengths = pad_packed_sequence(p, padding_value=-1.0, total_length=5)
    assert padded.shape == (5, 3, 1) and lengths.tolist() == [4, 2, 1]
    assert padded[:, 2, 0].tolist() == [2, -1, -1, -1, -1]
    assert padded[:, 0, 0].tolist() == [0, 3, 6, 9, -1]
    # equal lengths keep their order when sorted
    p = pack_padded_sequence(x, [2, 3, 2], enforce_sorted=False)
    assert p.sorted_indices.tolist() == [1, 0, 2]


def test_pack_sequence_unpack_sequence_and_pad_sequence():
    a, b, c = t(np.array([1, 2, 3])), t(np.array([4, 5])), t(np.array([6]))
    packed = pack_sequence([a, b, c])
    assert packed.data.tolist() == [1, 4, 6, 2, 5, 3] and packed.batch_sizes.tolist() == [3, 2, 1]
    assert packed.sorted_indices is None
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        pack_sequence([b, a])
    unpacked = unpack_sequence(pack_sequence([b, c, a], enforce_sorted=False))
    assert [u.tolist() for u in unpacked] == [[4, 5], [6], [1, 2, 3]]
    assert pad_sequence([a, b, c]).tolist() == [[1, 4, 6], [2, 5, 0], [3, 0, 0]]
    assert pad_sequence([a, b, c], batch_first=True, padding_value=-1).tolist() == \
        [[1, 2, 3], [4, 5, -1], [6, -1, -1]]
    assert pad_sequence([a, b, c], batch_first=True, padding_side="left").tolist() == \
        [[1, 2, 3], [0, 4, 5], [0, 0, 6]]
    # trailing dims, the first sequence's dtype, and a tensor as a sequence of rows
    two = pad_sequence([fusegrad.ones(2, 3), fusegrad.ones(1, 3, dtype=fusegrad.float64) * 2])
    assert two.shape == (2, 2, 3) and two.dtype is fusegrad.float32
    assert two[:, 1, 0].tolist() == [2, 0]
    assert pad_sequence(fusegrad.ones(2, 3)).shape == (3, 2)
    padded = pad_sequence([a, b, c], batch_first=False)
    unpadded = unpad_sequence(padded, fusegrad.tensor([3, 2, 1]))
    assert [u.tolist() for u in unpadded] == [[1, 2, 3], [4, 5], [6]]
    assert padded.shape == (3, 3)                       # not transposed in place
    assert [u.tolist() for u in unpad_sequence(padded.T, [3, 2, 1], batch_first=True)] == \
        [[1, 2, 3], [4, 5], [6]]


def test_packed_sequence_methods():
    packed = pack_padded_sequence(t(np.ones((3, 2, 2), np.float32)), [3, 1],
                                  enforce_sorted=False)
    assert packed.to(fusegrad.float32) is packed and packed.float() is packed
    assert packed.cpu() is packed and packed.pin_memory() is packed and packed.to("cpu") is packed
    d = packed.double()
    assert type(d) is PackedSequence and d.data.dtype is fusegrad.float64
    assert d.batch_sizes is packed.batch_sizes and d.sorted_indices.tolist() == [0, 1]
    casts = dict(long=fusegrad.int64, int=fusegrad.int32, short=fusegrad.int16,
                 char=fusegrad.int8, byte=fusegrad.uint8, half=fusegrad.float16)
    for name, dtype in casts.items():
        assert getattr(packed, name)().data.dtype is dtype
    assert packed.to(dtype=fusegrad.float64).data.dtype is fusegrad.float64
    assert packed.is_cuda is False and packed.is_pinned() is False
    # PackedSequence(data, batch_sizes[, sorted_indices]) and ((data, batch_sizes))
    p = PackedSequence(fusegrad.ones(3), fusegrad.tensor([2, 1]))
    assert p.sorted_indices is None and p.unsorted_indices is None
    p = PackedSequence((fusegrad.ones(3), fusegrad.tensor([2, 1])), None, fusegrad.tensor([1, 0]))
    assert p.batch_sizes.tolist() == [2, 1] and p.unsorted_indices.tolist() == [1, 0]
    with pytest.raises(AssertionError, match="Expected data to be a list or tuple of length 2"):
        PackedSequence(fusegrad.ones(3))
    assert invert_permutation(fusegrad.tensor([2, 0, 3, 1])).tolist() == [1, 3, 0, 2]
    assert invert_permutation(None) is None
    assert "PackedSequence(data=tensor(" in repr(p)


def test_utility_errors():
    x = fusegrad.zeros(4, 3, 2)
    with pytest.raises(RuntimeError, match=r"^`lengths` array must be sorted in decreasing order "
                       "when `enforce_sorted` is True. You can pass `enforce_sorted=False`"):
        pack_padded_sequence(x, [2, 3, 1])
    zero = "^Length of all samples has to be greater than 0, but found an element in 'lengths' " \
        "that is <= 0$"
    with pytest.raises(RuntimeError, match=zero):
        pack_padded_sequence(x, [3, 2, 0])
    with pytest.raises(RuntimeError, match=zero):
        pack_padded_sequence(x, [0, 3, 2], enforce_sorted=False)
    with pytest.raises(RuntimeError, match=r"^Expected `len\(lengths\)` to be equal to batch_size, "
                       r"but got 2 \(batch_size=3\)$"):
        pack_padded_sequence(x, [3, 2])
    with pytest.raises(RuntimeError, match="^'lengths' argument should be a 1D CPU int64 tensor, "
                       "but got 2D cpu Long tensor$"):
        pack_padded_sequence(x, fusegrad.tensor([[3, 2, 1]]))
    with pytest.raises(RuntimeError, match="a sequence of length 5 does not fit the padded input "
                       "of 4 time steps"):
        pack_padded_sequence(x, [5, 2, 1])
    with pytest.raises(RuntimeError, match="^Cannot pack empty tensors.$"):
        pack_padded_sequence(fusegrad.zeros(0, 3), [])
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of "
                       r"\[-1, 0\], but got 1\)"):
        pack_padded_sequence(fusegrad.zeros(3), [3])
    packed = pack_padded_sequence(x, [3, 2, 1])
    with pytest.raises(ValueError, match="^Expected total_length to be at least the length of the "
                       "longest sequence in input, but got total_length=2 and max sequence "
                       "length being 3$"):
        pad_packed_sequence(packed, total_length=2)
    with pytest.raises(RuntimeError, match="^Expected padding_side to be one of left or right, "
                       "but got middle.$"):
        pad_sequence([fusegrad.ones(2)], padding_side="middle")
    with pytest.raises(RuntimeError, match="^received an empty list of sequences$"):
        pad_sequence([])
    with pytest.raises(RuntimeError, match="^pad_sequence: Expected iterable for input sequences, "
                       "but got arg of type: <class 'int'>$"):
        pad_sequence(5)
    with pytest.raises(RuntimeError, match=r"sequence 1 has shape \[3, 2\] and sequence 0 has "
                       r"shape \[2, 3\]"):
        pad_sequence([fusegrad.ones(2, 3), fusegrad.ones(3, 2)])
    with pytest.raises(RuntimeError, match="sequence 0 is a 0-d tensor"):
        pad_sequence([fusegrad.tensor(1.0), fusegrad.ones(3)])
    with pytest.raises(ValueError, match="2 lengths for a batch of 3 sequences"):
        unpad_sequence(fusegrad.zeros(4, 3), [2, 1])


@pytest.mark.skipif(not fusegrad.cuda.is_available(), reason="needs a cuda device")
def test_lengths_on_cuda_are_refused():
    x = fusegrad.zeros(4, 3, 2, device="cuda")
    with pytest.raises(RuntimeError, match="^'lengths' argument should be a 1D CPU int64 tensor, "
                       "but got 1D cuda:0 Long tensor$"):
        pack_padded_sequence(x, fusegrad.tensor([3, 2, 1], device="cuda"))
    with pytest.raises(ValueError, match="batch_sizes should always be on CPU"):
        PackedSequence(x, fusegrad.tensor([3, 2, 1], device="cuda"))
    packed = pack_padded_sequence(x, [3, 1, 2], enforce_sorted=False)
    assert packed.is_cuda and packed.sorted_indices.is_cuda
    assert packed.batch_sizes.device.type == "cpu" and not packed.cpu().is_cuda


def test_pack_and_pad_are_differentiable():
    x = t(RNG.standard_normal((4, 3, 2)), grad=True)

    def round_trip(x):
        packed = pack_padded_sequence(x, [2, 4, 1], enforce_sorted=False)
        return pad_packed_sequence(packed, padding_value=0.5, total_length=5)[0] * 1.5
    out = round_trip(x)
    out.sum().backward()
    mask = np.zeros((4, 3, 2))
    for b, n in enumerate([2, 4, 1]):
        mask[:n, b] = 1.5
    np.testing.assert_array_equal(x.grad.numpy(), mask)
    assert gradcheck(round_trip, (x,))
    seqs = [t(RNG.standard_normal((n, 2)), grad=True) for n in (3, 1, 2)]
    assert gradcheck(lambda *s: pad_sequence(list(s), padding_side="left"), tuple(seqs))
    assert gradcheck(lambda *s: pack_sequence(list(s), enforce_sorted=False).data, tuple(seqs))


# --------------------------------------------------------------------------- layers, torch-free


GRID = list(itertools.product(MODES, (1, 2), (False, True), (False, True)))


@pytest.mark.parametrize("mode,num_layers,bidirectional,batch_first", GRID)
def test_packed_run_equals_each_sequence_alone(mode, num_layers, bidirectional, batch_first):
    """A sequence in a packed batch gets the output and final state it gets run alone."""
    fusegrad.manual_seed(1)
    m = make(mode, 3, 4, num_layers, bidirectional=bidirectional, batch_first=batch_first,
             dtype=fusegrad.float64)
    lengths = [2, 5, 1, 4]
    x = padded_batch(lengths, 3, batch_first)
    out, state = m(pack_padded_sequence(t(x), lengths, batch_first, enforce_sorted=False))
    assert isinstance(out, PackedSequence)
    padded, out_lengths = pad_packed_sequence(out, batch_first, padding_value=7.0)
    assert out_lengths.tolist() == lengths
    padded = padded.detach().numpy()
    states = [s.detach().numpy() for s in final_states(mode, state)]
    for b, n in enumerate(lengths):
        seq = x[b, :n] if batch_first else x[:n, b]
        alone, alone_state = m(t(seq))                  # unbatched (n, I)
        got = padded[b] if batch_first else padded[:, b]
        np.testing.assert_allclose(got[:n], alone.detach().numpy(), **TOL64)
        assert (got[n:] == 7.0).all()
        for s, a in zip(states, final_states(mode, alone_state)):
            np.testing.assert_allclose(s[:, b], a.detach().numpy(), **TOL64)


@pytest.mark.parametrize("mode", MODES)
def test_packed_initial_state_is_in_batch_order(mode):
    """hx is given in the batch's own order, whatever the sorting; h_n comes back in it."""
    fusegrad.manual_seed(2)
    m = make(mode, 2, 3, 2, bidirectional=True, dtype=fusegrad.float64)
    lengths = [1, 3, 2]
    x = padded_batch(lengths, 2, False)
    h0 = RNG.standard_normal((4, 3, 3))
    c0 = RNG.standard_normal((4, 3, 3))
    hx = (t(h0), t(c0)) if mode == "LSTM" else t(h0)
    out, state = m(pack_padded_sequence(t(x), lengths, enforce_sorted=False), hx)
    padded = pad_packed_sequence(out)[0].detach().numpy()
    for b, n in enumerate(lengths):
        hx_b = (t(h0[:, b]), t(c0[:, b])) if mode == "LSTM" else t(h0[:, b])
        alone, alone_state = m(t(x[:n, b]), hx_b)
        np.testing.assert_allclose(padded[:n, b], alone.detach().numpy(), **TOL64)
        for s, a in zip(final_states(mode, state), final_states(mode, alone_state)):
            np.testing.assert_allclose(s[:, b].detach().numpy(), a.detach().numpy(), **TOL64)


def test_packed_lstm_with_projection_equals_each_sequence_alone():
    m = nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2, dtype=fusegrad.float64)
    lengths = [3, 1, 2]
    x = padded_batch(lengths, 3, False)
    out, (h, c) = m(pack_sequence([t(x[:n, b]) for b, n in enumerate(lengths)],
                                  enforce_sorted=False))
    assert out.data.shape == (6, 4) and h.shape == (4, 3, 2) and c.shape == (4, 3, 5)
    for b, seq in enumerate(unpack_sequence(out)):
        alone, (ha, ca) = m(t(x[:lengths[b], b]))
        np.testing.assert_allclose(seq.detach().numpy(), alone.detach().numpy(), **TOL64)
        np.testing.assert_allclose(h[:, b].detach().numpy(), ha.detach().numpy(), **TOL64)
        np.testing.assert_allclose(c[:, b].detach().numpy(), ca.detach().numpy(), **TOL64)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_packed_gradients_equal_per_sequence_gradients(mode):
    """The gradient of a loss over the packed batch is the sum of each sequence's alone."""
    fusegrad.manual_seed(3)
    m = make(mode, 2, 3, 2, bidirectional=True, batch_first=True, dtype=fusegrad.float64)
    lengths = [2, 4, 3]
    x = padded_batch(lengths, 2, True)

    def loss_of(out, state):
        return (out ** 2).sum() + sum((s * 0.5).sum() for s in final_states(mode, state))
    xp = t(x, grad=True)
    out, state = m(pack_padded_sequence(xp, lengths, batch_first=True, enforce_sorted=False))
    loss_of(out.data, state).backward()
    packed_grads = {n: p.grad.numpy().copy() for n, p in m.named_parameters()}
    m.zero_grad()
    seq_grads = np.zeros_like(x)
    for b, n in enumerate(lengths):
        xs = t(x[b, :n], grad=True)
        loss_of(*m(xs)).backward()
        seq_grads[b, :n] = xs.grad.numpy()
    np.testing.assert_allclose(xp.grad.numpy(), seq_grads, **TOL64)
    for name, p in m.named_parameters():
        np.testing.assert_allclose(packed_grads[name], p.grad.numpy(), **TOL64)


@pytest.mark.slow
def test_packed_gradcheck():
    m = nn.GRU(2, 2, bidirectional=True, dtype=fusegrad.float64)
    x = t(padded_batch([3, 1, 2], 2, False), grad=True)
    h0 = t(RNG.standard_normal((2, 3, 2)), grad=True)

    def f(x, h0):
        out, h = m(pack_padded_sequence(x, [3, 1, 2], enforce_sorted=False), h0)
        return pad_packed_sequence(out)[0], h
    assert gradcheck(f, (x, h0))


def test_packed_input_errors():
    lstm = nn.LSTM(3, 4, num_layers=2)
    packed = pack_padded_sequence(fusegrad.zeros(3, 2, 3), [3, 2])
    with pytest.raises(RuntimeError, match=r"^Expected hidden size \(2, 2, 4\), got \[2, 3, 4\]$"):
        lstm(packed, (fusegrad.zeros(2, 3, 4), fusegrad.zeros(2, 2, 4)))
    with pytest.raises(RuntimeError, match=r"^Expected cell size \(2, 2, 4\), got \[2, 2, 5\]$"):
        lstm(packed, (fusegrad.zeros(2, 2, 4), fusegrad.zeros(2, 2, 5)))
    with pytest.raises(RuntimeError, match=r"^input.size\(-1\) must be equal to input_size. "
                       "Expected 3, got 2$"):
        lstm(pack_padded_sequence(fusegrad.zeros(3, 2, 2), [3, 2]))
    with pytest.raises(RuntimeError, match="^input must have 2 dimensions, got 3$"):
        nn.GRU(3, 4)(PackedSequence(fusegrad.zeros(5, 1, 3), fusegrad.tensor([3, 2])))


# --------------------------------------------------------------------------- compiled


@pytest.mark.slow
def test_compiled_forward_with_packed_input_matches_eager():
    fusegrad.manual_seed(4)
    gru = nn.GRU(3, 4, bidirectional=True, batch_first=True)

    @fusegrad.no_grad()
    def f(x, lengths):
        out, h = gru(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=True)[0], h
    compiled = fusegrad.compile(f, fullgraph=True)
    x = t(padded_batch([2, 3, 1], 3, True).astype(np.float32))
    for lengths in ([2, 3, 1], [3, 3, 1], [2, 3, 1]):
        lengths = fusegrad.tensor(lengths)
        for e, c in zip(f(x, lengths), compiled(x, lengths)):
            np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-6)
    # a trace is reused for equal lengths only: a lengths tensor is guarded by value
    assert compiled.compiles == 2
    # lengths as a list are part of the signature
    for e, c in zip(f(x, [1, 3, 2]), compiled(x, [1, 3, 2])):
        np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert compiled.compiles == 3


@pytest.mark.slow
def test_compiled_packed_sequence_argument():
    """A PackedSequence given to a compiled function: its batch_sizes are guarded by value."""
    lstm = nn.LSTM(2, 3, bidirectional=True)
    compiled = fusegrad.compile(fusegrad.no_grad()(lambda p: lstm(p)[1][0]), fullgraph=True)
    for lengths in ([1, 3], [2, 2], [1, 3]):
        packed = pack_padded_sequence(t(RNG.standard_normal((3, 2, 2)).astype(np.float32)),
                                      lengths, enforce_sorted=False)
        np.testing.assert_allclose(compiled(packed).detach().numpy(), lstm(packed)[1][0].detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
    assert compiled.compiles == 2


def test_compiled_new_lengths_past_the_recompile_limit_run_eagerly(monkeypatch):
    monkeypatch.setattr(fusegrad_config.config, "recompile_limit", 1)
    rnn = nn.RNN(2, 2)

    @fusegrad.no_grad()
    def f(x, lengths):
        return rnn(pack_padded_sequence(x, lengths, enforce_sorted=False))[1]
    compiled = fusegrad.compile(f)
    x = t(RNG.standard_normal((3, 2, 2)).astype(np.float32))
    compiled(x, fusegrad.tensor([3, 1]))
    with pytest.warns(UserWarning, match=r"hit the recompile limit.*\(last: the values of a "
                      "tensor the function read as host data"):
        out = compiled(x, fusegrad.tensor([2, 3]))
    np.testing.assert_allclose(out.numpy(), f(x, fusegrad.tensor([2, 3])).numpy(), rtol=1e-6)
    assert compiled.compiles == 1


def test_compiled_lengths_computed_in_the_function_are_refused():
    """Lengths computed inside a compiled function have no value at trace time."""
    def f(tokens):
        lengths = (tokens != 0).sum(1)
        return pack_padded_sequence(tokens, lengths, batch_first=True, enforce_sorted=False).data
    tokens = t(np.array([[1, 2, 0], [3, 0, 0]]))
    with pytest.raises(fusegrad.ConcretizationError, match="pack_padded_sequence's lengths "
                       "needs the value of a traced tensor"):
        fusegrad.compile(f, fullgraph=True)(tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fusegrad.compile(f)(tokens).tolist() == [1, 3, 2]     # runs eagerly


# --------------------------------------------------------------------------- a classifier


def classifier(nn_, cell="LSTM", vocab=11, classes=3):
    """The ordinary program: embed, pack, a 2-layer bidirectional LSTM (or GRU), classify h_n;
    written once for fusegrad and for torch (``nn_`` is either's nn)."""

    class Classifier(nn_.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn_.Embedding(vocab, 4, padding_idx=0)
            self.rnn = getattr(nn_, cell)(4, 3, num_layers=2, bidirectional=True,
                                          batch_first=True)
            self.head = nn_.Linear(6, classes)

        def forward(self, tokens, lengths, pack, cat):
            packed = pack(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
            _, state = self.rnn(packed)
            h = state[0] if cell == "LSTM" else state
            return self.head(cat([h[-2], h[-1]], -1))
    return Classifier()


def _batches(batch=4, vocab=11, classes=3):
    """Three padded batches of 4 sequences of 1 to 4 tokens; the third has the second's lengths
    (a compiled step traces its first step, then its steady step, which the third reuses)."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(3):
        lengths = rng.integers(1, 5, batch) if i < 2 else out[1][1]
        tokens = np.zeros((batch, 4), np.int64)
        for b, n in enumerate(lengths):
            tokens[b, :n] = rng.integers(1, vocab, n)
        out.append((tokens, lengths, rng.integers(0, classes, batch)))
    return out


def _train(lib, nn_, pack, model, batches, compiled=False):
    opt = lib.optim.Adam(model.parameters(), lr=0.05)

    def step(tokens, lengths, labels):
        opt.zero_grad()
        loss = nn_.functional.cross_entropy(model(tokens, lengths, pack, lib.cat), labels)
        loss.backward()
        opt.step()
        return loss.detach()
    run = fusegrad.compile(step, fullgraph=True) if compiled else step
    losses = [float(run(*(lib.tensor(a) for a in b))) for b in batches]
    if compiled:
        assert run.compiles == 2                    # the third step reused the second's trace
    return losses


@functools.cache
def _classifier_runs(cell):
    """The initial weights and the losses of three Adam steps, eager and compiled."""
    fusegrad.manual_seed(6)
    initial = {n: v.detach().numpy().copy() for n, v in classifier(nn, cell).state_dict().items()}
    losses = {}
    for compiled in (False, True):
        model = classifier(nn, cell)
        model.load_state_dict({n: fusegrad.tensor(v) for n, v in initial.items()})
        losses[compiled] = _train(fusegrad, nn, pack_padded_sequence, model, _batches(), compiled)
    return initial, losses


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_classifier_compiled_matches_eager(cell):
    _, losses = _classifier_runs(cell)
    # float32 through ~20 dependent steps and Adam: a few hundred ulps
    np.testing.assert_allclose(losses[True], losses[False], rtol=2e-5)
    assert all(np.isfinite(losses[False]))


# --------------------------------------------------------------------------- torch


def _copy_from_torch(ours, theirs):
    ours.load_state_dict({n: fusegrad.tensor(v.detach().numpy())
                          for n, v in theirs.state_dict().items()})


def _torch_module(torch, mode, *args, **kw):
    if mode in ("tanh", "relu"):
        return torch.nn.RNN(*args, nonlinearity=mode, **kw)
    return getattr(torch.nn, mode)(*args, **kw)


def test_utilities_against_torch():
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as trnn
    for lengths, batch_first, enforce_sorted in [([4, 2, 1], False, True), ([1, 4, 2], True, False),
                                                 ([3, 3, 1, 2], False, False)]:
        x = padded_batch(lengths, 2, batch_first, fill=9.0)
        ours = pack_padded_sequence(t(x), lengths, batch_first, enforce_sorted)
        theirs = trnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths), batch_first,
                                           enforce_sorted)
        np.testing.assert_array_equal(ours.data.numpy(), theirs.data.numpy())
        assert ours.batch_sizes.tolist() == theirs.batch_sizes.tolist()
        for a, b in [(ours.sorted_indices, theirs.sorted_indices),
                     (ours.unsorted_indices, theirs.unsorted_indices)]:
            assert (a is None) == (b is None) and (a is None or a.tolist() == b.tolist())
        for kw in (dict(), dict(batch_first=True, padding_value=-3.0, total_length=6)):
            pa, la = pad_packed_sequence(ours, **kw)
            pb, lb = trnn.pad_packed_sequence(theirs, **kw)
            np.testing.assert_array_equal(pa.numpy(), pb.numpy())
            assert la.tolist() == lb.tolist()
        assert [u.tolist() for u in unpack_sequence(ours)] == \
            [u.tolist() for u in trnn.unpack_sequence(theirs)]
    seqs = [RNG.standard_normal((n, 2)) for n in (2, 5, 3)]
    for kw in (dict(), dict(batch_first=True, padding_value=1.5, padding_side="left")):
        np.testing.assert_array_equal(pad_sequence([t(s) for s in seqs], **kw).numpy(),
                                      trnn.pad_sequence([torch.tensor(s) for s in seqs], **kw))
    ours = pack_sequence([t(s) for s in seqs], enforce_sorted=False)
    theirs = trnn.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted=False)
    np.testing.assert_array_equal(ours.data.numpy(), theirs.data.numpy())
    perm = [3, 0, 2, 1]
    assert invert_permutation(t(np.array(perm))).tolist() == \
        trnn.invert_permutation(torch.tensor(perm)).tolist()


def test_utility_errors_match_torch():
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as trnn
    cases = [
        lambda m, lib: m.pack_padded_sequence(lib.zeros(4, 3, 2), [2, 3, 1]),
        lambda m, lib: m.pack_padded_sequence(lib.zeros(4, 3, 2), [3, 2, 0]),
        lambda m, lib: m.pack_padded_sequence(lib.zeros(4, 3, 2), [3, 2]),
        lambda m, lib: m.pack_padded_sequence(lib.zeros(4, 3, 2), lib.tensor([[3, 2, 1]])),
        lambda m, lib: m.pack_padded_sequence(lib.zeros(3), [3]),
        lambda m, lib: m.pad_packed_sequence(m.pack_padded_sequence(lib.zeros(4, 3, 2),
                                                                    [3, 2, 1]), total_length=2),
        lambda m, lib: m.pad_sequence([lib.ones(2)], padding_side="middle"),
        lambda m, lib: m.pad_sequence([]),
        lambda m, lib: m.pad_sequence(5),
        lambda m, lib: m.PackedSequence(lib.ones(3)),
    ]
    for case in cases:
        with pytest.raises(Exception) as theirs:
            case(trnn, torch)
        with pytest.raises(type(theirs.value)) as ours:
            case(fusegrad.nn.utils.rnn, fusegrad)
        assert str(ours.value) == str(theirs.value)


TORCH_GRID = list(itertools.product(["tanh", "LSTM", "GRU"], (1, 2), (False, True), (False, True),
                                    (False, True)))


@pytest.mark.parametrize("mode,num_layers,bidirectional,batch_first,enforce_sorted", TORCH_GRID)
def test_packed_layers_against_torch(mode, num_layers, bidirectional, batch_first,
                                     enforce_sorted):
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as trnn
    torch.manual_seed(7)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    theirs = _torch_module(torch, mode, 3, 4, **kw).double()
    ours = make(mode, 3, 4, dtype=fusegrad.float64, **kw)
    _copy_from_torch(ours, theirs)
    lengths = [5, 3, 2, 2, 1] if enforce_sorted else [2, 5, 1, 3, 2]
    x = padded_batch(lengths, 3, batch_first)
    D = 2 if bidirectional else 1
    h0 = RNG.standard_normal((num_layers * D, 5, 4))
    c0 = RNG.standard_normal((num_layers * D, 5, 4))
    results = []
    for lib, m, pack, pad in [(fusegrad, ours, pack_padded_sequence, pad_packed_sequence),
                              (torch, theirs, trnn.pack_padded_sequence,
                               trnn.pad_packed_sequence)]:
        xi = lib.tensor(x, requires_grad=True)
        hx = lib.tensor(h0, requires_grad=True)
        cx = lib.tensor(c0, requires_grad=True)
        out, state = m(pack(xi, lengths, batch_first, enforce_sorted),
                       (hx, cx) if mode == "LSTM" else hx)
        padded, _ = pad(out, batch_first)
        states = final_states(mode, state)
        w = lib.tensor(np.linspace(-1, 1, padded.numel()).reshape(tuple(padded.shape)))
        loss = (padded * w).sum() + sum((s * s).sum() for s in states)
        loss.backward()
        grads = {n: p.grad.numpy() for n, p in m.named_parameters()}
        grads.update(x=xi.grad.numpy(), h0=hx.grad.numpy())
        if mode == "LSTM":
            grads["c0"] = cx.grad.numpy()
        results.append((out.data.detach().numpy(), padded.detach().numpy(),
                        [s.detach().numpy() for s in states], grads))
    (od, op, os_, og), (td, tp, ts, tg) = results
    np.testing.assert_allclose(od, td, **TOL64)
    np.testing.assert_allclose(op, tp, **TOL64)
    for a, b in zip(os_, ts):
        np.testing.assert_allclose(a, b, **TOL64)
    assert og.keys() == tg.keys()
    for name in og:
        np.testing.assert_allclose(og[name], tg[name], err_msg=name, **TOL64)


def test_packed_lstm_projection_and_relu_against_torch():
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as trnn
    torch.manual_seed(8)
    for mode, kw in [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=2)),
                     ("relu", dict(num_layers=2, bidirectional=True, bias=False))]:
        theirs = _torch_module(torch, mode, 3, 4, **kw).double()
        ours = make(mode, 3, 4, dtype=fusegrad.float64, **kw)
        _copy_from_torch(ours, theirs)
        seqs = [RNG.standard_normal((n, 3)) for n in (2, 4, 1)]
        outs = []
        for lib, m, pack in [(fusegrad, ours, pack_sequence), (torch, theirs, trnn.pack_sequence)]:
            xs = [lib.tensor(s, requires_grad=True) for s in seqs]
            out, state = m(pack(xs, enforce_sorted=False))
            states = final_states(mode, state)
            (out.data.sum() + sum((s * s).sum() for s in states)).backward()
            outs.append([out.data.detach().numpy()] + [s.detach().numpy() for s in states] +
                        [x.grad.numpy() for x in xs] + [p.grad.numpy() for p in m.parameters()])
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, **TOL64)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_classifier_matches_torch_eager_and_compiled(cell):
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as trnn
    initial, losses = _classifier_runs(cell)
    theirs = classifier(torch.nn, cell)
    theirs.load_state_dict({n: torch.tensor(v) for n, v in initial.items()})
    expected = _train(torch, torch.nn, trnn.pack_padded_sequence, theirs, _batches())
    for compiled, got in losses.items():
        # float32 through ~20 dependent steps and Adam: a few hundred ulps
        np.testing.assert_allclose(got, expected, rtol=2e-5, err_msg=f"compiled={compiled}")
