"""``torch._dynamo.eval_frame``'s name that programs use: :class:`OptimizedModule`, what
``fusegrad.compile(module)`` returns (defined with the compiler, in
:mod:`fusegrad.tracer.optimized_module`)."""

from fusegrad.tracer.optimized_module import OptimizedModule

__all__ = ["OptimizedModule"]
