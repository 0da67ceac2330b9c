"""``OptimizedModule`` under torch's name for its module (``torch._dynamo.eval_frame``); it
is defined beside the compile front that returns it, :mod:`fusegrad.tracer.optimized_module`."""

from fusegrad.tracer.optimized_module import OptimizedModule

__all__ = ["OptimizedModule"]
