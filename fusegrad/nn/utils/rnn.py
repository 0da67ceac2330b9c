"""``fusegrad.nn.utils.rnn``: packed batches of variable-length sequences, as torch.nn.utils.rnn.

A :class:`PackedSequence` holds the time steps of a batch of sequences sorted by decreasing
length, step by step: ``data`` is (sum of lengths, *), and ``batch_sizes[t]`` is how many
sequences are still running at step ``t``. Sequences ``abc`` and ``x`` pack to ``axbc`` with
``batch_sizes = [2, 1, 1]``. RNN, LSTM and GRU accept one and run each sequence to its own end.

>>> packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
>>> out, (h_n, c_n) = lstm(packed)               # h_n: each sequence's state at its last step
>>> padded_out, lengths = pad_packed_sequence(out, batch_first=True)

Lengths and batch sizes are host data (torch keeps them on the CPU): they decide shapes, so
they are read as Python ints. Packing and padding are gathers with index tensors built from
them, so gradients reach the padded input. Under ``fusegrad.compile`` a lengths or batch-sizes
tensor given as an argument is read at trace time and guarded by value: each new pattern of
lengths traces again (up to ``fusegrad.config.recompile_limit``); a list of ints is part of
the call signature already.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ir import symbolic
from fusegrad.ops import creation
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence",
           "pad_sequence", "unpad_sequence", "pack_sequence", "unpack_sequence"]


class PackedSequence_(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


def bind(optional, fn):
    """``fn(optional)``, or None when ``optional`` is None."""
    return None if optional is None else fn(optional)


class PackedSequence(PackedSequence_):
    """A packed batch: ``data`` (sum of lengths, *), ``batch_sizes`` (a CPU int64 tensor,
    sequences running at each step), ``sorted_indices`` (batch entry of each packed column,
    None when the batch was sorted) and ``unsorted_indices`` (its inverse).

    Made by :func:`pack_padded_sequence` and :func:`pack_sequence`, not by hand.
    ``PackedSequence(data, batch_sizes, sorted_indices)`` fills ``unsorted_indices`` in.
    """

    def __new__(cls, data, batch_sizes: Tensor | None = None,
                sorted_indices: Tensor | None = None, unsorted_indices: Tensor | None = None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:         # PackedSequence((data, batch_sizes), ...)
            if not (isinstance(data, (list, tuple)) and len(data) == 2):
                raise AssertionError("Expected data to be a list or tuple of length 2")
            data, batch_sizes = data
        elif batch_sizes.device.type != "cpu":
            raise ValueError(
                "batch_sizes should always be on CPU. Instances of PackedSequence should never "
                "be created manually. They should be instantiated by functions like "
                "pack_sequence and pack_padded_sequences in nn.utils.rnn. "
                "https://pytorch.org/docs/stable/nn.html#torch.nn.utils.rnn.pack_sequence")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def _with_data(self, data: Tensor) -> "PackedSequence":
        """``self`` with ``data`` moved or cast: the indices follow its device."""
        if data is self.data:
            return self
        indices = [None if t is None else t.to(data.device)
                   for t in (self.sorted_indices, self.unsorted_indices)]
        return type(self)(data, self.batch_sizes, *indices)

    def to(self, *args, **kwargs) -> "PackedSequence":
        """``data.to(*args, **kwargs)``, with the indices on its device (``batch_sizes`` stays
        on the CPU); ``self`` when ``data`` is unchanged."""
        return self._with_data(self.data.to(*args, **kwargs))

    def cuda(self, *args, **kwargs) -> "PackedSequence":
        """A copy on a cuda device (``data.cuda(...)``); ``self`` when it is there already."""
        return self._with_data(self.data.cuda(*args, **kwargs))

    def cpu(self, *args, **kwargs) -> "PackedSequence":
        """A copy on the CPU; ``self`` when it is there already."""
        return self._with_data(self.data.cpu(*args, **kwargs))

    def pin_memory(self) -> "PackedSequence":
        """``self``: there is no pinned memory in fusegrad (as DataLoader's ``pin_memory``)."""
        return self

    def double(self) -> "PackedSequence":
        return self.to(dtype=dtypes.float64)

    def float(self) -> "PackedSequence":
        return self.to(dtype=dtypes.float32)

    def half(self) -> "PackedSequence":
        return self.to(dtype=dtypes.float16)

    def long(self) -> "PackedSequence":
        return self.to(dtype=dtypes.int64)

    def int(self) -> "PackedSequence":
        return self.to(dtype=dtypes.int32)

    def short(self) -> "PackedSequence":
        return self.to(dtype=dtypes.int16)

    def char(self) -> "PackedSequence":
        return self.to(dtype=dtypes.int8)

    def byte(self) -> "PackedSequence":
        return self.to(dtype=dtypes.uint8)

    @property
    def is_cuda(self) -> bool:
        """Whether ``data`` is on a cuda device."""
        return self.data.is_cuda

    def is_pinned(self) -> bool:
        """False: there is no pinned memory in fusegrad."""
        return False


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The inverse of a 1-D permutation (``out[permutation[i]] = i``); None for None."""
    if permutation is None:
        return None
    return F.argsort(permutation)


def _index(values, device) -> Tensor:
    return creation.tensor(np.asarray(values, dtype=np.int64).reshape(-1), dtype=dtypes.int64,
                           device=device)


def _lengths_array(lengths) -> np.ndarray:
    """``lengths`` (a list or a tensor) as int64 host values, with torch's checks."""
    if not isinstance(lengths, Tensor):
        lengths = creation.as_tensor(lengths, dtype=dtypes.int64)
    if lengths.ndim != 1 or lengths.device.type != "cpu":
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{lengths.ndim}D {lengths.device} Long tensor")
    values = symbolic.host_values(lengths, "pack_padded_sequence's lengths")
    return np.asarray(values).astype(np.int64)


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,  # noqa: A002
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch (T, B, *) (or (B, T, *) with ``batch_first``) of sequences of
    ``lengths`` (a list, or a CPU tensor) into a :class:`PackedSequence`.

    With ``enforce_sorted`` the lengths must be decreasing; without, the batch is sorted
    (stably: equal lengths keep their order) and ``sorted_indices`` says how.

    >>> pack_padded_sequence(fusegrad.tensor([[1, 2, 0], [3, 0, 0], [4, 5, 6]]), [2, 1, 3],
    ...                      batch_first=True, enforce_sorted=False).data
    tensor([4, 1, 3, 5, 2, 6])
    """
    lengths = _lengths_array(lengths)
    if input.ndim < 2:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[-{max(input.ndim, 1)}, {max(input.ndim, 1) - 1}], but got 1)")
    if input.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    batch, steps = (input.shape[0], input.shape[1]) if batch_first else \
        (input.shape[1], input.shape[0])
    if len(lengths) != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{len(lengths)} (batch_size={batch})")
    sorted_indices = None
    order = np.arange(batch)
    if not enforce_sorted:
        order = np.argsort(-lengths, kind="stable")
        lengths = lengths[order]
        sorted_indices = _index(order, input.device)
    if lengths[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element "
                           "in 'lengths' that is <= 0")
    if np.any(lengths[:-1] < lengths[1:]):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when "
                           "`enforce_sorted` is True. You can pass `enforce_sorted=False` to "
                           "pack_padded_sequence and/or pack_sequence to sidestep this requirement "
                           "if you do not need ONNX exportability.")
    if lengths[0] > steps:
        raise RuntimeError(f"pack_padded_sequence: a sequence of length {lengths[0]} does not fit "
                           f"the padded input of {steps} time steps (shape {list(input.shape)}, "
                           f"batch_first={batch_first})")
    # Packed row k is (step t, sorted column b) for the b < batch_sizes[t], in step order: one
    # gather from the input with its (step, batch) dims flattened.
    t = np.arange(lengths[0])[:, None]
    rows = t * batch + order[None, :] if not batch_first else order[None, :] * steps + t
    rows = rows[t < lengths[None, :]]
    flat = F.reshape(input, (batch * steps,) + tuple(input.shape[2:]))
    data = F.index_select(flat, 0, _index(rows, input.device))
    batch_sizes = (lengths[None, :] > t).sum(1)
    return PackedSequence(data, _index(batch_sizes, "cpu"), sorted_indices, None)


def _batch_sizes(sequence: PackedSequence) -> list[int]:
    """A PackedSequence's batch sizes as Python ints (host data: they decide shapes)."""
    values = symbolic.host_values(sequence.batch_sizes, "a PackedSequence's batch_sizes")
    return [int(b) for b in values]


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None):
    """Pad a :class:`PackedSequence` back to (T, B, *) (or (B, T, *) with ``batch_first``),
    ``T`` the longest length (or ``total_length``), in the batch's original order. Returns
    ``(padded, lengths)``, ``lengths`` an int64 CPU tensor."""
    batch_sizes = _batch_sizes(sequence)
    data = sequence.data
    steps = len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ValueError("Expected total_length to be at least the length of the longest "
                             "sequence in input, but got total_length="
                             f"{total_length} and max sequence length being {steps}")
        steps = total_length
    batch = batch_sizes[0]
    sizes = np.array(batch_sizes + [0] * (steps - len(batch_sizes)), dtype=np.int64)
    # Row of (step t, column b) in data, or the padding row appended after the data.
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    b = np.arange(batch)[None, :]
    rows = np.where(b < sizes[:, None], starts[:, None] + b, data.shape[0])
    if batch_first:
        rows = rows.T
    rest = tuple(data.shape[1:])
    pad = creation.full((1,) + rest, padding_value, dtype=data.dtype, device=data.device)
    padded = F.index_select(F.cat([data, pad], 0), 0, _index(rows, data.device))
    padded = F.reshape(padded, rows.shape + rest)
    lengths = _index((sizes[None, :] > np.arange(batch)[:, None]).sum(1), "cpu")
    if sequence.unsorted_indices is not None:
        padded = F.index_select(padded, 0 if batch_first else 1, sequence.unsorted_indices)
        lengths = F.index_select(lengths, 0, F.to(sequence.unsorted_indices, "cpu"))
    return padded, lengths


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack sequences of shapes (L_i, *) into (T, B, *) (or (B, T, *) with ``batch_first``),
    ``T`` the longest ``L_i``, padding each with ``padding_value`` on ``padding_side``
    ('right' or 'left'). The result has the first sequence's dtype.

    >>> pad_sequence([fusegrad.ones(2), fusegrad.ones(1)], batch_first=True)
    tensor([[1., 1.],
            [1., 0.]])
    """
    if not isinstance(sequences, Iterable):
        raise RuntimeError(f"pad_sequence: Expected iterable for input sequences, but got arg "
                           f"of type: {type(sequences)}")
    sequences = list(F.unbind(sequences, 0)) if isinstance(sequences, Tensor) else list(sequences)
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got "
                           f"{padding_side}.")
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    first = sequences[0]
    for i, s in enumerate(sequences):
        if s.ndim == 0:
            raise RuntimeError(f"pad_sequence: sequence {i} is a 0-d tensor; each sequence "
                               "needs a first (length) dimension")
        if tuple(s.shape[1:]) != tuple(first.shape[1:]):
            raise RuntimeError(f"pad_sequence: sequence {i} has shape {list(s.shape)} and "
                               f"sequence 0 has shape {list(first.shape)}: all must have the "
                               "same trailing dimensions")
    steps = max(s.shape[0] for s in sequences)
    rest = tuple(first.shape[1:])
    rows = []
    for s in sequences:
        s = s if s.dtype is first.dtype else F.to(s, first.dtype)
        if s.shape[0] < steps:
            pad = creation.full((steps - s.shape[0],) + rest, padding_value, dtype=first.dtype,
                                device=first.device)
            s = F.cat([s, pad] if padding_side == "right" else [pad, s], 0)
        rows.append(s)
    return F.stack(rows, 0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths, batch_first: bool = False) -> list[Tensor]:
    """The sequences of a padded batch: entry ``b`` cut to ``lengths[b]`` steps (copies).

    Unlike torch's, it does not transpose ``padded_sequences`` in place when
    ``batch_first`` is False: the argument is left as it was."""
    lens = lengths if not isinstance(lengths, Tensor) else \
        symbolic.host_values(lengths, "unpad_sequence's lengths")
    lens = [int(n) for n in lens]
    seqs = padded_sequences if batch_first else F.transpose(padded_sequences, 0, 1)
    if len(lens) != seqs.shape[0]:
        raise ValueError(f"unpad_sequence: {len(lens)} lengths for a batch of {seqs.shape[0]} "
                         f"sequences (padded shape {list(padded_sequences.shape)}, "
                         f"batch_first={batch_first})")
    return [F.clone(F.narrow(seq, 0, 0, n)) for seq, n in zip(F.unbind(seqs, 0), lens)]


def pack_sequence(sequences: list[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences (L_i, *): ``pad_sequence`` then ``pack_padded_sequence``.

    >>> pack_sequence([fusegrad.tensor([1, 2, 3]), fusegrad.tensor([4, 5]),
    ...                fusegrad.tensor([6])]).data
    tensor([1, 4, 6, 2, 5, 3])
    """
    lengths = [v.size(0) for v in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of sequences a :class:`PackedSequence` holds, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


def __getattr__(name: str):
    raise _missing_attribute("torch.nn.utils.rnn", "fusegrad.nn.utils.rnn", name)
