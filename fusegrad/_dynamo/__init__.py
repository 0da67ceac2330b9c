"""torch._dynamo's names that programs written for torch use with ``torch.compile``:
``OptimizedModule`` (what compiling a module returns), ``utils.counters`` and
``mark_dynamic`` (a dim a compiled function traces as a symbol)."""

from fusegrad._dynamo import utils
from fusegrad._dynamo.eval_frame import OptimizedModule
from fusegrad.tracer.dynamic_shapes import mark_dynamic

__all__ = ["OptimizedModule", "utils", "mark_dynamic"]
