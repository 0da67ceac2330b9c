"""``RNN``, ``LSTM``, ``GRU`` and their cells, with torch's parameters, shapes and init.

A recurrent layer is a Python loop over time steps of ordinary ops, so it differentiates as
written and the tracer unrolls it into straight-line code for the compiler. The input
projection of every time step is one matmul over the whole sequence (``x @ W_ih^T + b_ih``
for (T, N, I) at once); only ``h @ W_hh^T`` and the gate arithmetic are per step.

A :class:`~fusegrad.nn.utils.rnn.PackedSequence` input runs as torch's packed layers do:
the time loop walks ``batch_sizes``, and a step runs only the sequences still going (the
first ``batch_sizes[t]`` rows of the state). Forward, a sequence's final state is set aside
at its last step; backward, a sequence joins with its initial state at its own last step.
So each sequence gets the output and final state it would get alone, unpadded.

Gate layouts are torch's: LSTM rows of ``weight_ih``/``weight_hh`` are (input, forget, cell,
output), GRU rows are (reset, update, new), with the GRU's ``b_hn`` inside the reset product:
``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``.
"""

from __future__ import annotations

import math
import warnings

from fusegrad.nn import functional as NF
from fusegrad.nn import init
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.nn.utils.rnn import PackedSequence, _batch_sizes
from fusegrad.ops import functional as F
from fusegrad.ops.creation import empty, zeros
from fusegrad.tensor import Tensor

__all__ = ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


# --------------------------------------------------------------------------- one time step


def _rnn_step(xi: Tensor, h: Tensor, w_hh: Tensor, b_hh, relu: bool) -> Tensor:
    pre = F.add(xi, NF.linear(h, w_hh, b_hh))
    return NF.relu(pre) if relu else F.tanh(pre)


def _lstm_step(xi: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, b_hh, w_hr):
    i, f, g, o = F.chunk(F.add(xi, NF.linear(h, w_hh, b_hh)), 4, -1)
    c = F.add(F.mul(F.sigmoid(f), c), F.mul(F.sigmoid(i), F.tanh(g)))
    h = F.mul(F.sigmoid(o), F.tanh(c))
    return (h if w_hr is None else NF.linear(h, w_hr)), c


def _gru_step(xi: Tensor, h: Tensor, w_hh: Tensor, b_hh) -> Tensor:
    xr, xz, xn = F.chunk(xi, 3, -1)
    hr, hz, hn = F.chunk(NF.linear(h, w_hh, b_hh), 3, -1)
    r = F.sigmoid(F.add(xr, hr))
    z = F.sigmoid(F.add(xz, hz))
    n = F.tanh(F.add(xn, F.mul(r, hn)))
    return F.add(n, F.mul(z, F.sub(h, n)))        # (1 - z) * n + z * h


def _init_uniform(module: Module, hidden_size: int) -> None:
    """torch's init for recurrent layers: every parameter U(-1/sqrt(hidden), 1/sqrt(hidden))."""
    stdv = 1.0 / math.sqrt(hidden_size) if hidden_size > 0 else 0.0
    for w in module.parameters():
        init.uniform_(w, -stdv, stdv)


# --------------------------------------------------------------------------- layers


class RNNBase(Module):
    """The shared multi-layer, optionally bidirectional recurrence of RNN, LSTM and GRU."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        if not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", UserWarning,
                          stacklevel=3)
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size and proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        kw = dict(device=device, dtype=dtype)
        gate_size = _GATES[mode] * hidden_size
        out_size = proj_size or hidden_size
        directions = 2 if bidirectional else 1
        for layer in range(num_layers):
            for d in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                in_size = input_size if layer == 0 else out_size * directions
                setattr(self, "weight_ih" + suffix, Parameter(empty((gate_size, in_size), **kw)))
                setattr(self, "weight_hh" + suffix,
                        Parameter(empty((gate_size, out_size), **kw)))
                if bias:
                    setattr(self, "bias_ih" + suffix, Parameter(empty(gate_size, **kw)))
                    setattr(self, "bias_hh" + suffix, Parameter(empty(gate_size, **kw)))
                if proj_size:
                    setattr(self, "weight_hr" + suffix,
                            Parameter(empty((proj_size, hidden_size), **kw)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh weights with torch's default initialization."""
        _init_uniform(self, self.hidden_size)

    def flatten_parameters(self) -> None:
        """A no-op (torch packs weights for cuDNN here; fusegrad needs no packing)."""

    def _weights(self, layer: int, d: int):
        suffix = f"_l{layer}" + ("_reverse" if d else "")
        get = self._parameters.get
        return (get("weight_ih" + suffix), get("weight_hh" + suffix), get("bias_ih" + suffix),
                get("bias_hh" + suffix), get("weight_hr" + suffix))

    def _check_input(self, x: Tensor) -> None:
        if x.ndim not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                             f"{x.ndim}D tensor instead")
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {x.shape[-1]}")

    def _check_hidden(self, h: Tensor, expected: tuple, what: str = "hidden") -> None:
        if tuple(h.shape) != expected:
            raise RuntimeError(f"Expected {what} size {expected}, got {list(h.shape)}")

    def forward(self, input: Tensor, hx=None):  # noqa: A002
        """Run over the sequence: ``(output, h_n)``, or ``(output, (h_n, c_n))`` for LSTM.

        ``input``: (T, N, I), (N, T, I) with ``batch_first``, or unbatched (T, I), or a
        :class:`~fusegrad.nn.utils.rnn.PackedSequence` (then ``output`` is one too).
        ``hx``: (num_layers * directions, N, H) (a pair (h0, c0) for LSTM), zeros if None.
        """
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        self._check_input(input)
        batched = input.ndim == 3
        lstm = self.mode == "LSTM"
        if not batched:
            input = F.unsqueeze(input, 1)
            if hx is not None:
                hx = tuple(F.unsqueeze(h, 1) for h in hx) if lstm else F.unsqueeze(hx, 1)
        elif self.batch_first:
            input = F.transpose(input, 0, 1)
        directions = 2 if self.bidirectional else 1
        n = input.shape[1]
        out_size = self.proj_size or self.hidden_size
        h_shape = (self.num_layers * directions, n, out_size)
        c_shape = (self.num_layers * directions, n, self.hidden_size)
        if hx is None:
            h0 = zeros(h_shape, dtype=input.dtype)
            c0 = zeros(c_shape, dtype=input.dtype) if lstm else None
        elif lstm:
            h0, c0 = hx
            self._check_hidden(h0, h_shape)
            self._check_hidden(c0, c_shape, "cell")
        else:
            h0, c0 = hx, None
            self._check_hidden(h0, h_shape)
        x, h_n, c_n = self._run_layers(input, h0, c0, self._run_direction)
        if not batched:
            x, h_n = F.squeeze(x, 1), F.squeeze(h_n, 1)
            c_n = F.squeeze(c_n, 1) if lstm else None
        elif self.batch_first:
            x = F.transpose(x, 0, 1)
        return x, ((h_n, c_n) if lstm else h_n)

    def _step(self, xi: Tensor, h: Tensor, c, w_hh: Tensor, b_hh, w_hr):
        """One time step of this layer's cell: the new ``(h, c)`` (``c`` None but for LSTM)."""
        if self.mode == "LSTM":
            return _lstm_step(xi, h, c, w_hh, b_hh, w_hr)
        if self.mode == "GRU":
            return _gru_step(xi, h, w_hh, b_hh), None
        return _rnn_step(xi, h, w_hh, b_hh, self.mode == "RNN_RELU"), None

    def _run_layers(self, x: Tensor, h0: Tensor, c0: Tensor | None, run_direction):
        """``x`` through every layer and direction, with dropout between layers:
        ``run_direction(x, layer, d, h, c)`` gives one direction's outputs and final states
        (padded or packed). Returns the last layer's output, ``h_n`` and ``c_n`` (None
        without a cell state)."""
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                ys, h, c = run_direction(x, layer, d, h0[k], None if c0 is None else c0[k])
                outs.append(ys)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else F.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = NF.dropout(x, self.dropout)
        return x, F.stack(h_n, 0), F.stack(c_n, 0) if c0 is not None else None

    def _run_direction(self, x: Tensor, layer: int, d: int, h: Tensor, c):
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, d)
        xi = F.unbind(NF.linear(x, w_ih, b_ih), 0)      # the whole sequence's projection at once
        steps = range(len(xi) - 1, -1, -1) if d else range(len(xi))
        ys = [None] * len(xi)
        for t in steps:
            h, c = self._step(xi[t], h, c, w_hh, b_hh, w_hr)
            ys[t] = h
        return F.stack(ys, 0), h, c

    def _forward_packed(self, packed: PackedSequence, hx):
        """``forward`` of a PackedSequence: a packed output, and final states in the batch's
        original order (each sequence's own last step)."""
        data, batch_sizes_t, sorted_indices, unsorted_indices = packed
        batch_sizes = _batch_sizes(packed)
        lstm = self.mode == "LSTM"
        directions = 2 if self.bidirectional else 1
        n = batch_sizes[0]
        out_size = self.proj_size or self.hidden_size
        h_shape = (self.num_layers * directions, n, out_size)
        c_shape = (self.num_layers * directions, n, self.hidden_size)

        def sort(state: Tensor) -> Tensor:
            # hx is given in the batch's order; the packed columns are sorted by length.
            return state if sorted_indices is None else F.index_select(state, 1, sorted_indices)
        if hx is None:
            h0 = zeros(h_shape, dtype=data.dtype, device=data.device)
            c0 = zeros(c_shape, dtype=data.dtype, device=data.device) if lstm else None
        elif lstm:
            h0, c0 = sort(hx[0]), sort(hx[1])
        else:
            h0, c0 = sort(hx), None
        if data.ndim != 2:
            raise RuntimeError(f"input must have 2 dimensions, got {data.ndim}")
        if data.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {data.shape[-1]}")
        self._check_hidden(h0, h_shape)
        if lstm:
            self._check_hidden(c0, c_shape, "cell")
        x, h_n, c_n = self._run_layers(
            data, h0, c0, lambda x, layer, d, h, c: self._run_packed_direction(
                x, batch_sizes, layer, d, h, c))
        if unsorted_indices is not None:
            h_n = F.index_select(h_n, 1, unsorted_indices)
            c_n = F.index_select(c_n, 1, unsorted_indices) if lstm else None
        out = PackedSequence(x, batch_sizes_t, sorted_indices, unsorted_indices)
        return out, ((h_n, c_n) if lstm else h_n)

    def _run_packed_direction(self, x: Tensor, batch_sizes: list[int], layer: int, d: int,
                              h: Tensor, c):
        """One direction of one layer over packed ``x`` (sum of lengths, I): its packed
        output and the final ``(h, c)`` of every sequence, sorted by length."""
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, d)
        xi = F.split(NF.linear(x, w_ih, b_ih), batch_sizes, 0)
        ys = [None] * len(batch_sizes)
        if d == 0:
            # Sequences end from the last row up: when the batch shrinks, the rows that
            # stop hold their final state.
            finished = []
            for t, size in enumerate(batch_sizes):
                if size < h.shape[0]:
                    finished.append((h[size:], None if c is None else c[size:]))
                    h, c = h[:size], (None if c is None else c[:size])
                h, c = self._step(xi[t], h, c, w_hh, b_hh, w_hr)
                ys[t] = h
            finished.append((h, c))
            finished.reverse()
            h = F.cat([f[0] for f in finished], 0)
            c = None if c is None else F.cat([f[1] for f in finished], 0)
        else:
            # Backward in time, a sequence starts at its own last step: rows join the batch
            # with their initial state as it grows.
            h0, c0 = h, c
            size = batch_sizes[-1]
            h, c = h0[:size], (None if c0 is None else c0[:size])
            for t in range(len(batch_sizes) - 1, -1, -1):
                grown = batch_sizes[t]
                if grown > size:
                    h = F.cat([h, h0[size:grown]], 0)
                    c = None if c is None else F.cat([c, c0[size:grown]], 0)
                    size = grown
                h, c = self._step(xi[t], h, c, w_hh, b_hh, w_hr)
                ys[t] = h
        return F.cat(ys, 0), h, c

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu).

    Arguments in torch's order: input_size, hidden_size, num_layers=1, nonlinearity='tanh',
    bias=True, batch_first=False, dropout=0.0, bidirectional=False.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             "'relu'.")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Long short-term memory; ``forward`` returns ``(output, (h_n, c_n))``.

    Arguments in torch's order: input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device=device, dtype=dtype)


class GRU(RNNBase):
    """Gated recurrent unit; ``forward`` returns ``(output, h_n)``.

    Arguments in torch's order: input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device=device, dtype=dtype)


# --------------------------------------------------------------------------- cells


class RNNCellBase(Module):
    """One time step: parameters ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, gates: int, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        kw = dict(device=device, dtype=dtype)
        self.weight_ih = Parameter(empty((gates * hidden_size, input_size), **kw))
        self.weight_hh = Parameter(empty((gates * hidden_size, hidden_size), **kw))
        if bias:
            self.bias_ih = Parameter(empty(gates * hidden_size, **kw))
            self.bias_hh = Parameter(empty(gates * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh weights with torch's default initialization."""
        _init_uniform(self, self.hidden_size)

    def _prepare(self, input: Tensor, hx):  # noqa: A002
        """Check shapes; make an unbatched (I,) input a batch of one. Returns the input, the
        state (a tuple of tensors) and whether the input was batched."""
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} "
                               f"expected {self.input_size}")
        batched = input.ndim == 2
        states = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
        if not batched:
            input = F.unsqueeze(input, 0)
            states = tuple(None if s is None else F.unsqueeze(s, 0) for s in states)
        n = input.shape[0]
        for s in states:
            if s is not None and tuple(s.shape) != (n, self.hidden_size):
                raise RuntimeError(f"{name}: Expected hidden to be of size "
                                   f"{(n, self.hidden_size)}, got {list(s.shape)}")
        return input, states, batched

    def _zeros(self, input: Tensor) -> Tensor:
        return zeros((input.shape[0], self.hidden_size), dtype=input.dtype)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        return s + (f", nonlinearity={nonlinearity}" if nonlinearity != "tanh" else "")


class RNNCell(RNNCellBase):
    """``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu), for (N, I) or (I,) input."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device=device, dtype=dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        """The next hidden state."""
        x, (h,), batched = self._prepare(input, hx)
        h = self._zeros(x) if h is None else h
        xi = NF.linear(x, self.weight_ih, self.bias_ih)
        out = _rnn_step(xi, h, self.weight_hh, self.bias_hh, self.nonlinearity == "relu")
        return out if batched else F.squeeze(out, 0)


class LSTMCell(RNNCellBase):
    """One LSTM step: ``(h', c')`` from input (N, I) or (I,) and ``hx = (h, c)``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):  # noqa: A002
        """The next hidden and cell states."""
        x, states, batched = self._prepare(input, hx)
        h, c = (self._zeros(x), self._zeros(x)) if hx is None else states
        xi = NF.linear(x, self.weight_ih, self.bias_ih)
        h, c = _lstm_step(xi, h, c, self.weight_hh, self.bias_hh, None)
        return (h, c) if batched else (F.squeeze(h, 0), F.squeeze(c, 0))


class GRUCell(RNNCellBase):
    """One GRU step: ``h'`` from input (N, I) or (I,) and ``hx``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        """The next hidden state."""
        x, (h,), batched = self._prepare(input, hx)
        h = self._zeros(x) if h is None else h
        out = _gru_step(NF.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                        self.bias_hh)
        return out if batched else F.squeeze(out, 0)
