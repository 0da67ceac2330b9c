"""``fusegrad.compile``: trace on first call, compile to fused kernels, cache by guards.

A call computes a guard key from what the trace depends on: each tensor argument's shape,
dtype, device, layout and requires_grad, the grad mode, the values of static arguments, and
for a module its parameters' types and ``training`` flag; and, for the few tensors whose
values the trace read as host data (a packed sequence's lengths), those values. A miss
traces the function, runs the pass pipeline, partitions the graph into kernels and builds a
runtime program; a hit goes straight to the program. Parameters are graph inputs, so
training a compiled module does not recompile it.

Differentiability: when an input requires grad under grad mode, each differentiable
output gets an autograd node; they feed one node of the call, which runs a compiled VJP
program once (the autodiff pass's reverse graph of the outputs that received a gradient,
dead code removed); with ``create_graph=True`` that reverse graph is replayed eagerly
instead, so higher-order gradients still work.

``fullgraph=False`` (the default, as in torch) runs a function whose tracing fails on
data-dependent Python eagerly, with one warning; ``fullgraph=True`` raises the tracer's
error. ``FUSEGRAD_DEBUG=1`` prints one line per compile, the reason for each recompile and
each eager fallback. A compiled function counts its compiles (``compiled.compiles``) and
keeps the reason of each recompile (``compiled.recompile_reasons``); :data:`counters` counts
over all of them, in the shape of torch's ``torch._dynamo.utils.counters``. As torch's
``recompile_limit``, a function compiles for at most ``fusegrad.config.recompile_limit``
(default 8) signatures; calls with further ones run eagerly, with one warning naming the
guards that kept changing. Symbolic dims (``dynamic``; :mod:`fusegrad.tracer.dynamic_shapes`)
make one signature of every size of a dim.
"""

from __future__ import annotations

from typing import Callable

from fusegrad.tracer.compiled_function import (
    RECOMPILE_WARNING_LIMIT,
    CompiledFunction,
    Lowered,
    counters,
)
from fusegrad.tracer.optimized_module import OptimizedModule
from fusegrad.tracer.pipeline import DEFAULT_PIPELINE
from fusegrad.tracer.programs import _symbol  # noqa: F401  (aot names its programs so)

__all__ = ["compile", "CompiledFunction", "Lowered", "counters", "RECOMPILE_WARNING_LIMIT",
           "DEFAULT_PIPELINE"]


TORCH_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile(fn: Callable | None = None, *, backend: str = "llvm", static_argnums=(),  # noqa: A001
            static_argnames=(), donate_argnums=(), fullgraph: bool = False,
            pipeline: str | None = None, dynamic: bool | None = None, mode: str | None = None,
            options: dict | None = None, disable: bool = False):
    """Compile ``fn`` (a function or an ``nn.Module``) to fused kernels.

    Usable as ``@fusegrad.compile``, ``@fusegrad.compile(fullgraph=True)`` or
    ``fusegrad.compile(model)``, which returns an ``OptimizedModule`` as torch's does (the
    model is its ``_orig_mod``; state-dict keys carry the ``_orig_mod.`` prefix). A whole
    training step compiles to one graph:
    ``opt.zero_grad(); loss.backward(); opt.step()`` inside the function are captured, and
    parameters, ``.grad`` and optimizer state are updated in place after each call.

    Options: ``backend`` ("llvm", "cuda" for CUDA kernels on the GPU, with numpy arrays
    copied in and out, or "interpreter" to run the graph on numpy; torch's
    "inductor" means "llvm"), ``static_argnums``/``static_argnames`` (Python values baked into
    the trace), ``donate_argnums`` (outputs may reuse those inputs' buffers), ``fullgraph``
    (raise instead of running eagerly what cannot be traced), ``pipeline`` (the passes before
    fusion). torch.compile's ``mode`` names are accepted; ``"reduce-overhead"`` replays a
    compiled call on CUDA (``backend="cuda"``, or cuda tensors) as one CUDA graph (its
    inputs copied into static buffers, no host synchronization inside the call; a program
    with host steps launches kernel by kernel and warns), and the others run the fused
    kernels with no per-call compilation; ``disable=True`` returns ``fn`` unchanged;
    ``options`` has no keys that fusegrad reads, so any key raises.

    Symbolic shapes (``dynamic``, as torch's): ``True`` traces every dim of the tensor
    arguments as a symbol (falling back to their leading dims, then to static shapes, where
    the trace needs a concrete size), so one compile serves every size; ``None`` (the
    default) does so for a dim once a second size of it is seen (one recompile), and for
    dims marked with ``fusegrad.mark_dynamic(x, dim)``; ``False`` keeps every shape static.
    Sizes 0 and 1 specialize, and what the trace assumed of a symbol (``s0 != 4``) is
    guarded per call. The graph is traced and optimized once (and a call that autograd
    records, partitioned once into its forward and backward); the CPU kernels are built per
    size from it (each size once), and what is not symbolic-ready yet (the CUDA and
    interpreter backends, a function returning a size) compiles static shapes, said under
    ``FUSEGRAD_DEBUG=1``.

    Recompiles: a compiled entry is reused while the arguments' shapes, dtypes and flags and
    what the function reads (the globals and closure variables its code loads, the attributes
    and items it reads of them, the modules and optimizers it calls) are as they were. The
    compiled function counts its compiles in ``compiles`` and keeps why each recompile
    happened in ``recompile_reasons``; ``FUSEGRAD_DEBUG=1`` prints each reason, and
    ``fusegrad._dynamo.utils.counters`` counts over all functions, as torch's does.
    """
    if mode not in TORCH_MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: "
                           f"{', '.join(m for m in TORCH_MODES if m)}")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be "
                           "specified at the same time.")
    if options:
        raise RuntimeError(f"fusegrad.compile: unsupported options {sorted(options)}: fusegrad "
                           "has no such settings (see the docstring for what it supports)")
    if disable:
        return fn if fn is not None else (lambda f: f)

    def wrap(f):
        compiled = CompiledFunction(f, backend=backend, static_argnums=static_argnums,
                                    static_argnames=static_argnames,
                                    donate_argnums=donate_argnums, fullgraph=fullgraph,
                                    pipeline=pipeline, mode=mode, dynamic=dynamic)
        if compiled.module is None:
            return compiled
        return OptimizedModule(f, compiled)
    return wrap if fn is None else wrap(fn)
