"""The program build stage of a compiled function: a graph through its pass pipeline, and
its kernels (``graph.kernels``, from the ``fuse`` pass) with their memory plan, to a runnable
program for the backend.

:func:`entry_program` builds the program of a traced call; :func:`split_programs` and
:func:`vjp_program` build, on first use, the programs a call's backward runs (the forward and
backward halves of the min-cut partition, or the VJP of the outputs that got a gradient).
Each is kept in the entry's ``backward`` table.
"""

from __future__ import annotations

import sys

from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.config import config
from fusegrad.ir.graph import Graph
from fusegrad.runtime.cpu import Program
from fusegrad.tracer.call_cache import _Entry, _SplitPrograms
from fusegrad.tracer.compiled_autograd import _reaching
from fusegrad.tracer.pipeline import (
    KERNEL_BACKENDS,
    program_pipeline,
    run_passes,
    split_pipeline,
    vjp_pipeline,
)
from fusegrad.tracer.trace import arg_input_ranges, tree_flatten

__all__ = ["build_program", "entry_program", "split_programs", "vjp_program"]


def _symbol(name: str) -> str:
    """A graph's name as a symbol of its program (letters, digits and underscores)."""
    return "".join(c if c.isalnum() else "_" for c in name) or "graph"


def build_program(graph: Graph, backend: str, name: str, donate=(), cuda_graphs: bool = False):
    """The program of ``graph``'s kernels (the program pipeline ran ``fuse`` on it) for
    ``backend``: LLVM kernels on the CPU, CUDA kernels (numpy arrays in and out, each copied
    to the device and back; replayed as one CUDA graph with ``cuda_graphs``), or None for
    the interpreter, which runs the graph itself."""
    if backend == "cuda":
        from fusegrad.runtime.cuda import HostCudaProgram  # optional: CUDA loads when asked for
        return HostCudaProgram(graph.kernels, name=name, cuda_graphs=cuda_graphs)
    if backend == "llvm":
        return Program(graph.kernels, name=name, donate=donate)
    return None


def entry_program(graph: Graph, optimized: Graph, backend: str, args, kwargs,
                  donate_argnums: tuple, cuda_graphs: bool = False):
    """The program of a traced call (``graph``; ``optimized``: after its pipeline);
    ``cuda_graphs`` (``mode="reduce-overhead"``): a CUDA program replays as one graph."""
    pairs = _donations(graph, args, kwargs, donate_argnums) if backend == "llvm" else ()
    program = build_program(optimized, backend, _symbol(graph.name), donate=pairs,
                            cuda_graphs=cuda_graphs)
    if backend == "llvm" and config.debug >= 4:
        print(f"[fusegrad] LLVM IR of {graph.name}:\n{program.llvm_ir}", file=sys.stderr)
    return program


def _donations(graph: Graph, args, kwargs, donate_argnums: tuple) -> list[tuple[int, int]]:
    """The (input, output) pairs whose buffers an output may take. Outputs may take input
    buffers: in-place updates (an optimizer step) are then written where they belong, and
    donated arguments are reused; not when a compiled backward may need the inputs as they
    were."""
    info = graph.meta
    leaves, _ = tree_flatten((args, kwargs))
    if not info.capture.did_backward and (
            is_grad_enabled() and any(t._requires_grad for t in leaves) or
            any(t._requires_grad for t, _ in info.lifted)):
        return []
    grads = [(gi, out) for leaf, out, in_place in info.capture.grad_writes
             if in_place for leaf2, gi in info.capture.grad_inputs if leaf2 == leaf]
    return list(info.mutations) + grads + _donated(graph, args, donate_argnums)


def _donated(graph: Graph, args, donate_argnums: tuple) -> list[tuple[int, int]]:
    """(input, output) pairs offered by ``donate_argnums``: each donated tensor may give
    its buffer to any output of its type."""
    if not donate_argnums:
        return []
    ranges = arg_input_ranges(graph, args)
    outputs = range(graph.meta.n_user_outputs)
    return [(i, j) for n in donate_argnums if n < len(args)
            for i in ranges[n] for j in outputs]


def split_programs(entry: _Entry, wrt: tuple, passes: str, backend: str) -> _SplitPrograms:
    """The forward and backward programs of the min-cut partition of ``entry``'s graph
    for gradients with respect to inputs ``wrt`` (built on first use)."""
    key = ("split", wrt)
    hit = entry.backward.get(key)
    if hit is None:
        info = entry.info
        # Parameters and captured tensors stay alive anyway: saving them costs nothing.
        free = list(range(info.n_state)) + [i for _, i in info.lifted]
        # On the entry's graph: the fuse-attention pass rewrites a copy.
        part = run_passes(entry.graph, split_pipeline(wrt, free)).partition
        name = _symbol(entry.graph.name)
        pipeline = program_pipeline(passes, backend)
        hit = entry.backward[key] = _SplitPrograms(
            part, build_program(run_passes(part.forward, pipeline), backend, name + "_fwd"),
            build_program(run_passes(part.backward, pipeline), backend, name + "_bwd"))
    return hit


def vjp_program(entry: _Entry, wrt: tuple, seeded: tuple, passes: str, backend: str) -> tuple:
    """The VJP of the outputs ``seeded`` (their indices), ``(*inputs, *their cotangents)
    -> grads of inputs[wrt]``: a compiled program (None for the interpreter), its graph,
    and the inputs of ``wrt`` those outputs reach (the others get no gradient)."""
    hit = entry.backward.get((wrt, seeded))
    if hit is None:
        # Only the outputs that received a gradient are seeded: a zero cotangent for the
        # others would go down their paths, where 0 * inf is NaN, and eager autograd
        # never visits a path without a gradient.
        g = run_passes(entry.graph, vjp_pipeline(wrt, seeded))
        program = build_program(run_passes(g, program_pipeline(passes, backend)), backend,
                                _symbol(g.name)) if backend in KERNEL_BACKENDS else None
        reached = _reaching(entry.graph, wrt,
                            [k in seeded for k in range(len(entry.graph.outputs))])
        hit = entry.backward[(wrt, seeded)] = (program, g, frozenset(reached))
    return hit
