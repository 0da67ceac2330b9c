"""The tracer: capture Python functions into IR graphs, and functional transforms."""

from fusegrad.ir.symbolic import ConcretizationError, SymbolicTensor
from fusegrad.nn.modules.module import register_compiler
from fusegrad.tracer.compile import CompiledFunction, Lowered, compile
from fusegrad.tracer.dynamic_shapes import mark_dynamic
from fusegrad.tracer.eager_kernels import EagerKernel  # noqa: F401  (fills the composites' eager-kernel slot)
from fusegrad.tracer.trace import TraceInfo, trace, tree_flatten, tree_unflatten
from fusegrad.tracer.transforms import grad, value_and_grad, vjp

__all__ = ["compile", "CompiledFunction", "Lowered", "trace", "TraceInfo", "tree_flatten",
           "tree_unflatten", "grad", "value_and_grad", "vjp", "ConcretizationError",
           "SymbolicTensor", "mark_dynamic"]

register_compiler(compile)   # Module.compile
