"""The program build stage of a compiled function: a graph through its pass pipeline, and
its kernels (``graph.kernels``, from the ``fuse`` pass) with their memory plan, to a runnable
program for the backend.

:func:`entry_program` builds the program of a traced call; :func:`split_programs` and
:func:`vjp_program` build, on first use, the programs a call's backward runs (the forward and
backward halves of the min-cut partition, or the VJP of the outputs that got a gradient).
Each is kept in the entry's ``backward`` table.
"""

from __future__ import annotations

import collections
import sys
import traceback

from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.config import config
from fusegrad.ir.graph import Graph
from fusegrad.ir.interpreter import bind_symbols
from fusegrad.ir.specialize import specialize
from fusegrad.ir.verifier import VerificationError
from fusegrad.runtime.cpu import Program
from fusegrad.symint import SizesOutOfRange, SymbolicDecisionError, SymInt, hashable_sizes, size_hint
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

__all__ = ["build_program", "entry_program", "split_programs", "vjp_program",
           "SymbolicProgram", "symbolic_entry_program", "SPECIALIZED_PROGRAMS"]

# A symbolic program keeps the kernels of this many sizes (the most recently used); the
# kernels' machine code stays in the runtime's kernel cache beyond that.
SPECIALIZED_PROGRAMS = 16


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


class SymbolicProgram:
    """The program of a graph with symbolic sizes (traced and optimized once): called with
    arrays, it binds the symbols from their shapes and runs.

    The graph is fused and its kernels built once, reading their sizes at run time
    (:class:`~fusegrad.runtime.cpu.Program` and :class:`~fusegrad.runtime.cuda.CudaProgram`
    of symbolic sizes): every size runs the same kernels. Where some kernel's code would
    depend on the sizes (a decision that is not the same for every size, such as a stack
    array as long as a symbolic dim), the program falls back to kernels per size
    (:func:`~fusegrad.ir.specialize.specialize`, then fusion and the LLVM or CUDA kernels,
    built on the first call with those sizes); ``FUSEGRAD_DEBUG=1`` says which and why.
    With ``cuda_graphs`` a CUDA program replays a graph per size."""

    def __init__(self, graph: Graph, backend: str, name: str, donate=(),
                 cuda_graphs: bool = False):
        self.graph = graph              # after the passes, before fusion
        self.backend, self.name, self.donate_pairs = backend, name, donate
        self.cuda_graphs = cuda_graphs
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self.last: Program | None = None
        # The one program for every size, or None (kernels per size); ``fallback``: why.
        self.runtime_sized: Program | None = None
        self.fallback: str | None = None
        self.builds = 0                 # programs built: 1 when one serves every size
        if backend in ("llvm", "cuda"):
            self._build_runtime_sized()
        else:
            self.fallback = f"the {backend} backend"

    def _build_runtime_sized(self) -> None:
        try:
            # (What fusion assumes about the sizes, where it compares them, is recorded
            # for the entry's guards, as the trace's assumptions are; the kernels' code
            # assumes nothing: see Program.)
            with hashable_sizes():
                fused = run_passes(self.graph, "fuse")
                self.runtime_sized = build_program(fused, self.backend, self.name,
                                                   donate=self.donate_pairs,
                                                   cuda_graphs=self.cuda_graphs)
            self.builds += 1
        except (SymbolicDecisionError, VerificationError) as e:
            # (The verifier of a graph built outside the trace cannot decide what a shape
            # rule compares: the graph specialized to each size is verified instead.)
            self.fallback = str(e).splitlines()[0]
            if config.debug >= 3:
                traceback.print_exc()       # where a kernel's code needed a size's value
            if config.debug >= 1:
                print(f"[fusegrad] {self.name}: kernels per size ({e})", file=sys.stderr)

    def program_for(self, bindings: dict[str, int]) -> Program:
        """The program for the sizes ``bindings``: the one that serves every size, else
        the specialized one (built now if new)."""
        if self.runtime_sized is not None:
            self.last = self.runtime_sized
            return self.runtime_sized
        return self._specialized(bindings, self.fallback)

    def _specialized(self, bindings: dict[str, int], why: str) -> Program:
        """The program built for the sizes ``bindings`` (now, if new; ``why``: for the
        message)."""
        key = tuple(sorted(bindings.items()))
        prog = self._programs.get(key)
        if prog is None:
            if config.debug >= 1:
                sizes = ", ".join(f"{k}={v}" for k, v in key)
                print(f"[fusegrad] {self.name}: kernels for {sizes} (each new size builds its "
                      f"kernels once: {why})", file=sys.stderr)
            concrete = run_passes(specialize(self.graph, bindings), "fuse")
            prog = build_program(concrete, self.backend, self.name, donate=self.donate_pairs,
                                 cuda_graphs=self.cuda_graphs)
            self.builds += 1
            self._programs[key] = prog
            if len(self._programs) > SPECIALIZED_PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        self.last = prog
        return prog

    def __call__(self, *arrays):
        if self.runtime_sized is not None:
            self.last = self.runtime_sized
            try:
                return self.runtime_sized(*arrays)
            except SizesOutOfRange as e:    # (raised before the program ran anything)
                bindings = bind_symbols(self.graph, [a.shape for a in arrays])
                return self._specialized(bindings, str(e))(*arrays)
        return self.program_for(bind_symbols(self.graph, [a.shape for a in arrays]))(*arrays)

    def fast_runner(self):
        if self.runtime_sized is not None:
            self.last = self.runtime_sized
            return self.runtime_sized.fast_runner()
        return None                     # each call picks its sizes' program first

    @property
    def kg(self):
        return self.last.kg if self.last is not None else None

    @property
    def llvm_ir(self) -> str:
        return self.last.llvm_ir if self.last is not None else ""

    def kernels(self) -> list[str]:
        return self.last.kernels() if self.last is not None else []

    def programs(self) -> int:
        """How many programs are kept now (1 when one serves every size)."""
        return 1 if self.runtime_sized is not None else len(self._programs)


def symbolic_entry_program(graph: Graph, optimized: Graph, backend: str, args, kwargs,
                           donate_argnums: tuple, cuda_graphs: bool = False) -> SymbolicProgram:
    """:func:`entry_program` for a graph with symbolic sizes (``optimized``: after the
    passes before fusion); its program for this call's sizes is built now, so that a
    lowering that fails does so while compiling."""
    pairs = _donations(graph, args, kwargs, donate_argnums)
    program = SymbolicProgram(optimized, backend, _symbol(graph.name), donate=pairs,
                              cuda_graphs=cuda_graphs)
    hints = {}
    for v in optimized.inputs:
        for d in v.type.shape:
            if isinstance(d, SymInt) and d.name is not None:
                hints[d.name] = size_hint(d)
    program.program_for(hints)
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
        if entry.symbolic is not None:
            # Both halves symbolic: kernels per size, as the entry's own program.
            hit = entry.backward[key] = _SplitPrograms(
                part, SymbolicProgram(run_passes(part.forward, passes), backend, name + "_fwd"),
                SymbolicProgram(run_passes(part.backward, passes), backend, name + "_bwd"))
            return hit
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
        if entry.symbolic is not None:
            program = SymbolicProgram(run_passes(g, passes), backend, _symbol(g.name))
        else:
            program = build_program(run_passes(g, program_pipeline(passes, backend)), backend,
                                    _symbol(g.name)) if backend in KERNEL_BACKENDS else None
        reached = _reaching(entry.graph, wrt,
                            [k in seeded for k in range(len(entry.graph.outputs))])
        hit = entry.backward[(wrt, seeded)] = (program, g, frozenset(reached))
    return hit
