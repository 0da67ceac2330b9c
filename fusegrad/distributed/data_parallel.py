"""``DataParallel``: one model per rank, gradients averaged across ranks after backward.

Wrapping a module broadcasts its parameters and buffers from rank 0, so every rank starts
from the same weights (optimizers made afterwards start from the same state too). Each rank
then runs forward and backward on its shard of the batch; when a bucket's gradients are all
accumulated (a post-accumulate-grad hook per parameter), its all-reduce starts, and once the
last bucket has started the hook waits for all of them and writes the averages into
``.grad``: after ``loss.backward()`` every rank holds the gradient of the whole batch.

Buckets follow PyTorch's DDP: parameters in reverse order of ``parameters()`` (roughly the
order backward produces their gradients), grouped up to ``bucket_cap_mb`` megabytes, one
dtype per bucket.

- Eager: a bucket's gradients are copied into one flat buffer and reduced in place with a
  nonblocking ``MPI_Iallreduce`` while backward goes on.
- Compiled (the whole training step under ``fusegrad.compile``): the same hooks run while
  the backward is traced and record each bucket as graph nodes (concatenate, then
  ``allreduce_start`` and ``allreduce_wait``, then slices into ``.grad``); the
  ``overlap-collectives`` pass schedules them so that backward kernels run while buckets
  are reduced (:mod:`fusegrad.distributed.prims`).

When it wraps the module the ranks agree on the layout of the parameters, buffers and
buckets (one all-gather of a digest): ranks whose buckets have equal byte counts but other
dtypes, shapes or members would otherwise be summed silently wrong.

As in PyTorch's default (``find_unused_parameters=False``), every parameter that requires
grad must get a gradient in each backward; a backward that leaves a bucket unreduced is an
error at the next forward, not a silent divergence between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.distributed import comm
from fusegrad.distributed.collectives import broadcast
from fusegrad.distributed.prims import allreduce_start, allreduce_wait
from fusegrad.nn.modules.module import Module
from fusegrad.ops import functional as F
from fusegrad.ops.primitive import bind

__all__ = ["DataParallel", "DistributedDataParallel"]


@dataclass(eq=False)
class _Bucket:
    params: list
    offsets: list[int]             # where each parameter's gradient starts in the bucket
    numel: int
    dtype: object                  # numpy dtype
    buffer: np.ndarray | None = None
    ready: int = 0
    request: object = None         # eager: the MPI request in flight
    handle: object = None          # traced: the allreduce_start value
    grads: list = field(default_factory=list)


class DataParallel(Module):
    """Data-parallel training of ``module`` over the ranks of the job (``mpiexec -n N``).

    >>> model = fg.distributed.DataParallel(model)        # doctest: +SKIP
    >>> loss = loss_fn(model(x_shard), y_shard); loss.backward()   # grads averaged here

    The wrapped module is ``self.module`` (its ``state_dict`` keys get a ``module.`` prefix,
    as torch's). ``broadcast_buffers`` broadcasts buffers (running statistics) from rank 0
    at each forward, as torch does; ``bucket_cap_mb`` sizes the buckets.
    """

    def __init__(self, module: Module, bucket_cap_mb: float = 25.0,
                 broadcast_buffers: bool = True):
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        group = comm.group()
        self.world_size = group.size
        params = [p for p in module.parameters() if p.requires_grad]
        self._buckets = _make_buckets(params, int(bucket_cap_mb * 2 ** 20))
        if group.size > 1:
            _agree_on_layout(module, self._buckets)
        with no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                broadcast(t, 0)
        self._bucket_of = {}
        self._launched = 0
        self._check_queued = False
        self._hook_handles = []
        if self.world_size > 1:
            for b in self._buckets:
                for p in b.params:
                    self._bucket_of[id(p)] = b
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    @property
    def buckets(self) -> list[list[str]]:
        """The buckets, as lists of parameter names, in the order they are reduced."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [[names[id(p)] for p in b.params] for b in self._buckets]

    def forward(self, *args, **kwargs):
        if any(b.ready for b in self._buckets):
            traced = any(b.handle is not None for b in self._buckets)
            # A trace that failed midway (the step then runs eagerly) leaves only Python
            # state behind; an eager backward that skipped parameters leaves ranks diverged.
            if traced:
                self._reset()
            else:
                self._raise_unreduced("previous backward")
        if self.broadcast_buffers and self.world_size > 1:
            with no_grad():
                for t in self.module.buffers():
                    if t._trace is None:
                        broadcast(t, 0)
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------ gradient hooks

    def _grad_ready(self, p) -> None:
        # MPI moves a nonblocking all-reduce forward only inside MPI calls: test the buckets
        # in flight at each gradient, so that they progress while backward runs.
        for other in self._buckets:
            if other.request is not None and comm.poll(other.request):
                other.request = None
        if p.grad._trace is not None and not self._check_queued:
            # A compiled step replays its graph without reaching forward's check: check at
            # the end of the traced backward instead.
            p.grad._trace.capture.after_backward.append(self._check_traced_backward)
            self._check_queued = True
        b = self._bucket_of[id(p)]
        b.ready += 1
        if b.ready < len(b.params):
            return
        grads = [q.grad for q in b.params]
        if any(g._trace is not None for g in grads):
            self._launch_traced(b, grads)
        else:
            self._launch_eager(b, grads)
        self._launched += 1
        if self._launched == len(self._buckets):
            self._finish()

    def _launch_eager(self, b: _Bucket, grads: list) -> None:
        if b.buffer is None:
            b.buffer = np.empty(b.numel, b.dtype)
        for g, start in zip(grads, b.offsets):
            n = g._data.size
            b.buffer[start:start + n] = g._data.reshape(-1)
        b.request = comm.start_allreduce(b.buffer, "sum")

    def _launch_traced(self, b: _Bucket, grads: list) -> None:
        flat = F.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
        b.handle = bind(allreduce_start, flat, op="sum")

    def _finish(self) -> None:
        n = self.world_size
        for b in self._buckets:
            if b.handle is not None:
                mean = bind(allreduce_wait, b.handle) / n
                for p, start in zip(b.params, b.offsets):
                    p.grad = mean[start:start + p.numel()].reshape(tuple(p.shape))
                continue
            if b.request is not None:
                comm.wait(b.request, f"the gradient all-reduce of a bucket of {b.numel} elements")
                b.request = None
            np.divide(b.buffer, n, out=b.buffer)
            for p, start in zip(b.params, b.offsets):
                g = p.grad
                g._data[...] = b.buffer[start:start + g._data.size].reshape(g._data.shape)
                g._version_counter.value += 1
        self._reset()

    def _check_traced_backward(self) -> None:
        self._check_queued = False
        if any(b.ready for b in self._buckets):
            self._raise_unreduced("traced backward")

    def _raise_unreduced(self, which: str) -> None:
        unreduced = [names for b, names in zip(self._buckets, self.buckets)
                     if b.ready < len(b.params)]
        self._reset()
        raise RuntimeError(
            f"DataParallel: the {which} gave no gradient to some parameters, so their "
            f"buckets were never all-reduced ({unreduced}); every parameter that requires "
            "grad must take part in the loss")

    def _reset(self) -> None:
        self._launched = 0
        self._check_queued = False
        for b in self._buckets:
            b.ready, b.request, b.handle = 0, None, None


DistributedDataParallel = DataParallel


def _agree_on_layout(module: Module, buckets: list[_Bucket]) -> None:
    """Raise on every rank unless all ranks hold the same parameters and buffers (names,
    dtypes, shapes) in the same buckets: the broadcast from rank 0 would otherwise fill a
    larger tensor only in part, and buckets of equal byte counts but other layouts (a
    parameter frozen on one rank only, another ``bucket_cap_mb``, f32[2,3] against
    f32[3,2]) would be summed silently wrong. One all-gather of a digest; the layouts
    themselves only when they differ."""
    bucket_of = {id(p): k for k, b in enumerate(buckets) for p in b.params}
    layout = []
    for kind, named in (("parameter", module.named_parameters()),
                        ("buffer", module.named_buffers())):
        for name, t in named:
            where = f", bucket {bucket_of[id(t)]}" if id(t) in bucket_of else \
                ", no gradient" if kind == "parameter" else ""
            layout.append((f"{kind} {name}", comm.layout_text(t._data) + where))
    layouts = comm.agree_on_layout(layout, "DataParallel")
    if layouts is not None:
        raise RuntimeError(f"DataParallel expects the same module on every rank, with the same "
                           f"parameters requiring grad and the same bucket_cap_mb: "
                           f"{comm.layout_disagreement(layouts)}")


def _make_buckets(params: list, cap_bytes: int) -> list[_Bucket]:
    """Parameters in reverse order, grouped up to ``cap_bytes`` per bucket, one dtype each."""
    buckets: list[_Bucket] = []
    current: _Bucket | None = None
    for p in reversed(params):
        dt = p._data.dtype
        size = p._data.size
        if current is None or current.dtype != dt or \
                (current.numel + size) * dt.itemsize > cap_bytes and current.params:
            current = _Bucket([], [], 0, dt)
            buckets.append(current)
        current.params.append(p)
        current.offsets.append(current.numel)
        current.numel += size
    return buckets
