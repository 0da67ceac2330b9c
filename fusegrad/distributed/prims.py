"""The all-reduce as two primitives of the graph: ``allreduce_start`` and ``allreduce_wait``.

A compiled training step holds its gradient all-reduce as graph nodes, so that the graph's
scheduler (the ``overlap-collectives`` pass) can start each bucket's reduction as soon as
its gradients exist and wait for it only where the optimizer reads them; the backward
kernels in between run while MPI moves the bytes, as PyTorch's DDP and Horovod overlap.

- ``%h = allreduce_start %x {op="sum"}`` has ``x``'s type. Its numpy reference is the whole
  (blocking) all-reduce, so the IR interpreter and any numpy fallback compute the right
  values; the CPU runtime instead copies ``x`` into ``h``'s buffer and starts a nonblocking
  in-place ``MPI_Iallreduce`` on it (:class:`AllreduceStartStep`).
- ``%r = allreduce_wait %h``: identity in numpy; the runtime waits for the request (with the
  group's timeout) and copies the result (:class:`AllreduceWaitStep`).

Between the two, the runtime calls the start step's ``poll()`` after every kernel: most MPI
libraries move a nonblocking collective forward only inside MPI calls.

Both are EXTERN primitives registered when ``fusegrad.distributed`` is imported, with
``extra["collective"]`` naming their role (passes read it: constant folding leaves them
alone, the scheduler moves them) and ``extra["runtime_step"]`` building their runtime step.
"""

from __future__ import annotations

import numpy as np

from fusegrad.distributed import comm
from fusegrad.ops.composite import CustomVJP
from fusegrad.ops.dual import missing_rule_message
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    register,
)

__all__ = ["allreduce_start", "allreduce_wait", "traced_all_reduce", "AllreduceStartStep",
           "AllreduceWaitStep"]


def _start_infer(x: TensorType, *, op: str) -> TensorType:
    if op not in ("sum", "max"):
        raise ShapeError(f"allreduce_start: op must be 'sum' or 'max', got {op!r}")
    if x.dtype.np_dtype.kind not in "fiu" or (x.dtype.is_floating_point and x.dtype.itemsize < 4):
        raise ShapeError(f"allreduce_start: MPI has no datatype for {x}")
    return x


def _start_impl(x, *, op):
    return comm.allreduce_array(x, op)


def _start_vjp(g, out, x, *, op):
    # Each rank's input reaches every rank's output: the cotangent is the sum of the
    # cotangents of all ranks.
    return traced_all_reduce(g, "sum")


# ``dist.all_reduce(t)`` in a compiled function: ``t``'s history goes on through the result
all_reduce_in_place = CustomVJP("all_reduce_in_place", reads_operands=False)


@all_reduce_in_place.defvjp
def _in_place_vjp(g, out, operands: tuple, params: tuple) -> tuple:
    """``dist.all_reduce(t)``'s gradient: none of its own, as eager's, which autograd does
    not record (the identity on ``t``'s history)."""
    return (g,)


class AllreduceStartStep:
    """Runtime step of ``allreduce_start``: copy the operand into the node's buffer and start
    a nonblocking in-place all-reduce there (the buffer stays reserved until the wait)."""

    def __init__(self, kernel, node, steps):
        self.kernel, self.node = kernel, node
        self.request = None

    def run(self, prog) -> None:
        out = prog.arrays[prog.slots[self.node.output]]
        np.copyto(out, prog.array(self.node.inputs[0]))
        if comm.group().size > 1:
            self.request = comm.start_allreduce(out, self.node.attrs["op"])

    def poll(self) -> None:
        """Let MPI move the reduction forward (called between kernels)."""
        if self.request is not None and comm.poll(self.request):
            self.request = None


class AllreduceWaitStep:
    """Runtime step of ``allreduce_wait``: finish the start's request, copy its result."""

    def __init__(self, kernel, node, steps):
        self.kernel, self.node = kernel, node
        source = node.inputs[0]
        self.start = next((s for s in steps if isinstance(s, AllreduceStartStep) and
                           s.node.output is source), None)

    def run(self, prog) -> None:
        start = self.start
        if start is not None and start.request is not None:
            node = start.node
            comm.wait(start.request, f"allreduce_start {{op={node.attrs['op']!r}}} on "
                                     f"{node.output.type} in compiled program {prog.name}")
            start.request = None
        out = prog.arrays[prog.slots[self.node.output]]
        np.copyto(out, prog.array(self.node.inputs[0]))


allreduce_start = register(Primitive(
    "allreduce_start", Kind.EXTERN, _start_infer, _start_impl, (Rule(_start_vjp),),
    "AllreduceBackward0", attrs=("op",),
    doc="Start an all-reduce of the operand over the process group (sum or max).",
    extra={"collective": "start", "runtime_step": AllreduceStartStep}))

allreduce_wait = register(Primitive(
    "allreduce_wait", Kind.EXTERN, lambda h: h, lambda h: np.asarray(h),
    (Rule(lambda g, out, h: g),), "AllreduceWaitBackward0",
    doc="The result of an allreduce_start, once it has arrived.",
    extra={"collective": "wait", "runtime_step": AllreduceWaitStep}))


def traced_all_reduce(x, op: str):
    """The all-reduce of ``x`` as graph nodes (start, wait; a division for the mean)."""
    reduced = bind(allreduce_wait, bind(allreduce_start, x, op="max" if op == "max" else "sum"))
    if op == "mean":
        reduced = reduced / comm.world_size()
    return reduced


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): a sum over the ranks is linear, so the tangent is reduced
# as the value is (a max is not, and has no rule); the wait passes its start's result on.


@jvp_rule(allreduce_start)
def _start_jvp(ts, out, x, *, op):
    if op != "sum":
        raise NotImplementedError(missing_rule_message(allreduce_start) +
                                  f" (op={op!r}; only a sum is linear)")
    return bind(allreduce_start, ts[0], op=op)


jvp_rule(allreduce_wait)(lambda ts, out, h: bind(allreduce_wait, ts[0]))


# --------------------------------------------------------------------------- batching rules
# A collective exchanges whole tensors between processes: under vmap each example's tensor
# is reduced on its own, as the program without vmap would.

from fusegrad.ops.batching import fallback  # noqa: E402

fallback(allreduce_start, "a collective: one exchange per example")
fallback(allreduce_wait, "waits on one exchange per example")
