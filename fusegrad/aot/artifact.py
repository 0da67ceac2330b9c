"""Build, save, load and run ahead-of-time artifacts (see :mod:`fusegrad.aot`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import llvmlite.binding as llvm
import numpy as np

from fusegrad import dtypes
from fusegrad.aot.dims import INT64_MAX, Dim, symbolic_dims, unchecked_assumptions
from fusegrad.aot.format import ArtifactError, decode, encode, read_file
from fusegrad.aot.plan_checks import NATIVE_PREFIX, check_dims, check_header, check_plan
from fusegrad.codegen.llvm.kernel import Unsupported
from fusegrad.files import atomic_write
from fusegrad.ir.graph import Graph, IRError
from fusegrad.ir.parser import parse, parse_many
from fusegrad.ir.printer import format_type, print_graph, value_names
from fusegrad.ops import creation
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.runtime import jit
from fusegrad.runtime.cpu import KernelCode, Program
from fusegrad.symint import SymbolicDecisionError, SymInt, hashable_sizes, record_assumptions
from fusegrad.tensor import Tensor
from fusegrad.tracer.compile import DEFAULT_PIPELINE, _symbol
from fusegrad.tracer.guards import code_reads
from fusegrad.tracer.trace import TreeDef, module_state, trace_with_state, tree_flatten, tree_unflatten
from fusegrad.version import __version__

__all__ = ["Artifact", "LoadedArtifact", "Dim", "compile", "load", "loads", "X86_64_LEVELS"]

# The CPU features each x86-64 microarchitecture level guarantees (the psABI's levels), by
# LLVM's feature names. A build for such a level asks for exactly these at load.
_V1 = ("cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_V2 = _V1 + ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = _V3 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
X86_64_LEVELS = {"x86-64": _V1, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}


# --------------------------------------------------------------------------- the artifact


@dataclass
class Artifact:
    """A compiled function or training step: graph text, plan, object code, initial state.

    ``save(path)`` writes it as one file (:mod:`fusegrad.aot.format`); :func:`load` reads
    it back as a callable. ``plan`` is plain JSON data (the signature, the state, the
    kernels and the memory plan); ``objects`` the object code by kernel symbol; ``state``
    the initial state tensors by name (None when not carried)."""

    graph_text: str
    plan: dict
    objects: dict[str, bytes]
    state: dict[str, np.ndarray] | None
    target: dict

    def to_bytes(self) -> bytes:
        """The file's bytes."""
        code, ranges = bytearray(), {}
        for symbol in sorted(self.objects):
            ranges[symbol] = [len(code), len(self.objects[symbol])]
            code += self.objects[symbol]
        blob, state_plan = bytearray(), []
        for spec in self.plan["state"]:
            arr = None if self.state is None else self.state.get(spec["name"])
            entry = {"name": spec["name"], "offset": None, "length": 0}
            if arr is not None:
                raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"),
                                                       copy=False).tobytes()
                entry.update(offset=len(blob), length=len(raw))
                blob += raw
            state_plan.append(entry)
        plan = dict(self.plan, code=ranges, state_data=state_plan)
        header = {"fusegrad": __version__, "codegen": jit.codegen_identity()[:16],
                  "llvm": self.target["llvm"],
                  "triple": self.target["triple"],
                  "cpu": self.target.get("host_cpu", self.target["cpu"]),
                  "host_build": self.target["cpu"] == "host",
                  "features": self.target["features"]}
        return encode(header, {"graph": self.graph_text.encode(),
                               "plan": json.dumps(plan, sort_keys=True).encode(),
                               "code": bytes(code), "state": bytes(blob)})

    def save(self, path: str | os.PathLike) -> None:
        """Write the artifact to ``path`` atomically (:func:`fusegrad.files.atomic_write`: a
        unique temporary file, flushed to disk, renamed over it)."""
        data = self.to_bytes()
        with atomic_write(path) as f:
            f.write(data)

    def describe(self) -> str:
        """What ``fusegrad-aot show`` prints: signature, state, graph, kernels, memory."""
        return describe(self.target, self.plan, self.graph_text)


def describe(target: dict, plan: dict, graph_text: str) -> str:
    """A readable report of an artifact: signature, state, graphs, kernels with their fused
    ops, memory plan and peak scratch bytes."""
    lines = [f"artifact {plan['name']}: target {target['triple']}, cpu {target['cpu']} "
             f"({len(target['features'])} features{', AVX-512' if _has_avx512(target) else ''})",
             "", "signature:"]
    for spec in plan["args"]:
        lines.append(f"  in  arg{spec['arg']} {spec['name']}: {spec['type']}")
    for d in plan.get("dims", []):
        hi = "inf" if d["max"] == INT64_MAX else d["max"]
        lines.append(f"  dim {d['name']}: sizes {d['min']}..{hi} (first {d['where']}; "
                     f"compiled at {d['hint']})")
    for k, o in enumerate(plan["outputs"]):
        lines.append(f"  out {k}: {o}")
    lines.append("state (kept by the artifact; * carried in the file, <- written by a call):")
    written = {w["state"] for p in plan["programs"] for w in p["writes"] if "state" in w}
    written |= {n for p in plan["programs"] for n in p.get("sets", {})}
    for spec in plan["state"]:
        mark = "*" if spec.get("carried") else " "
        arrow = " <-" if spec["name"] in written else ""
        lines.append(f"  {mark} {spec['name']}: {spec['type']}{arrow}")
    lines += ["", "graphs:", graph_text.rstrip()]
    for p in plan["programs"]:
        summary = p["program"]
        when = "the first call" if p["role"] == "first" else "every call" \
            if len(plan["programs"]) == 1 else "the calls after the first"
        lines += ["", f"program {p['name']} ({p['role']}, runs {when}): "
                  f"{len(summary['kernels'])} kernels"]
        lines.append("  inputs: " + ", ".join(
            f"{f['value']} = " + (f"arg{f['arg']}" if "arg" in f else f["state"])
            for f in p["inputs"]))
        if p.get("sets"):
            lines.append("  then sets: " + ", ".join(
                f"{n} = {e['value']}" for n, e in p["sets"].items()))
        for k in summary["kernels"]:
            lines.append(f"  {k['step']:<9} {k['describe']}")
        lines.append("  memory plan (intermediate buffers; values whose lives do not overlap "
                     "share one):")
        for m in summary["memory"]:
            lines.append(f"    slot {m['slot']}: {m['type']} {m['bytes']} B")
        lines.append(f"  peak scratch bytes: {summary['scratch_bytes']}")
        lines.append(f"  output bytes per call: {summary['output_bytes']}")
    return "\n".join(lines)


def _has_avx512(target: dict) -> bool:
    return any(f.startswith("avx512") for f in target["features"])


# --------------------------------------------------------------------------- compile


def compile(fn: Callable, *example_args, cpu: str | None = None,  # noqa: A001
            features: str | None = None, carry_state: bool = True,
            pipeline: str | None = None, dynamic_shapes=None) -> Artifact:
    """Compile ``fn`` for arguments shaped like ``example_args`` without running it.

    ``fn`` is anything ``fusegrad.compile`` accepts: a function, a module, or a whole
    training step (``opt.zero_grad(); loss.backward(); opt.step()`` inside). Parameters,
    buffers, optimizer state, learning rates and ``.grad`` slots it touches become the
    artifact's *state*: inputs the loaded artifact keeps and updates in place, named after
    the modules and optimizers the function refers to (``model.0.weight``,
    ``opt.state.model.0.weight.exp_avg``). With ``carry_state`` their current values are
    stored in the file; otherwise they are given to :func:`load`.

    A step whose first call creates state (Adam's moments) holds two programs, as
    ``fusegrad.compile`` builds two: the first step, which creates that state, and the
    step that runs from then on; the state ``aot.calls`` counts the calls and chooses.

    ``cpu`` names the CPU to generate code for (an LLVM name: ``"x86-64-v3"`` for any AVX2
    machine; default the host), ``features`` adds LLVM feature flags (``"+avx2,+fma"``).
    The artifact records the features its code may use, and loading refuses on a machine
    without them.

    ``dynamic_shapes`` (torch.export's argument) makes dims of the arguments symbolic: by
    argument name or position, ``{dim: fusegrad.aot.Dim(name, min=..., max=...)}`` (or a
    list of a Dim or None per dim); one Dim given to several dims means equal sizes. The
    artifact then holds one program for every size within the bounds: its kernels read the
    sizes at run time and its memory plan is sized per call, so loading and new sizes
    compile nothing. A call outside the bounds is refused, naming the argument, the dim and
    the Dim. A step whose code would depend on the size beyond that (a decision that is not
    the same for every size within the bounds, such as a sequence length past the 128 keys
    the fused attention's kernels take) is refused here, saying what (and why, where the
    code that assumed it said).

    >>> art = fusegrad.aot.compile(step, x, y)      # doctest: +SKIP
    >>> art.save("step.fgaot"); run = fusegrad.aot.load("step.fgaot"); loss = run(x, y)
    """

    args = tuple(Tensor._wrap(np.ascontiguousarray(a), dtypes.from_numpy_dtype(a.dtype))
                 if isinstance(a, np.ndarray) else a for a in example_args)
    target = _target(cpu, features)
    table = _StateTable()
    symbols, dims, where = symbolic_dims(fn, args, dynamic_shapes) \
        if dynamic_shapes is not None else ({}, {}, {})
    with record_assumptions() as assumed:
        artifact = _compile(fn, args, target, table, carry_state, pipeline, symbols)
    if dims:
        bad = unchecked_assumptions(assumed, dims)
        if bad:
            raise ValueError(
                "fusegrad.aot.compile: the program assumes of its symbolic sizes what does not "
                f"hold for every size within the bounds: {'; '.join(bad)} (with "
                + ", ".join(f"{n} = {where[n]}, {d!r}" for n, d in sorted(dims.items()))
                + "); an artifact holds one program for every size: declare bounds within "
                "which it holds, or leave the dim static")
        artifact.plan["dims"] = [
            {"name": n, "min": d.min, "max": d.max, "hint": _hint(symbols, n),
             "where": where[n]} for n, d in sorted(dims.items())]
    return artifact


def _hint(symbols: dict, name: str) -> int:
    """The example size of the symbol ``name`` among ``symbols`` ({leaf: {dim: symbol}})."""
    return next(s.hint() for dims in symbols.values() for s in dims.values() if s.name == name)


def _compile(fn, args, target, table, carry_state, pipeline, symbols) -> Artifact:
    """:func:`compile` once the arguments, target and symbolic dims are known."""
    graphs = [trace_with_state(fn, args, {}, symbolic_dims=symbols)]
    first = graphs[0].meta.capture
    try:
        optimizers = first.optimizers if first is not None else []
        names = _state_names(fn, optimizers)
        if first is not None and first.internal_writes:
            # The first call creates state (an optimizer's moments): the calls after it run
            # a graph that reads that state, traced now with the state the first left.
            graphs.append(trace_with_state(fn, args, {}, symbolic_dims=symbols))
            if graphs[1].meta.capture.internal_writes:
                raise ValueError("fusegrad.aot.compile: the function creates new state at every "
                                 "call; an artifact needs a fixed set of state tensors")
            names = _state_names(fn, optimizers)
        ios = [_io(fn, g, args, names, table) for g in graphs]
    finally:
        if first is not None:
            first.rollback()
    hints = {s.name: s.hint() for dims in symbols.values() for s in dims.values()}
    programs = [_build(g, io, target, pipeline, hints) for g, io in zip(graphs, ios)]
    needed, written = set(), set()
    if len(programs) == 2:
        first_plan, steady_plan = programs[0][0], programs[1][0]
        first_plan["role"] = "first"
        table.add("aot.calls", "i64[]", [], "int64", np.zeros((), np.int64))
        # State the first step makes from constants (Adam's step count: 1), which its
        # program therefore does not write: the first call sets it to those values (a fresh
        # start given step 0 trained with every bias correction one step behind).
        made = {f["state"] for f in steady_plan["inputs"] if "state" in f} - \
            {f["state"] for f in first_plan["inputs"] if "state" in f} - \
            {w["state"] for w in first_plan["writes"] if "state" in w}
        first_plan["sets"] = {n: {"dtype": table.initial[n].dtype.name,
                                  "value": table.initial[n].tolist()} for n in sorted(made)}
        written |= made
    for plan, _, _ in programs:
        needed |= {f["state"] for f in plan["inputs"] if "state" in f} - written
        written |= {w["state"] for w in plan["writes"] if "state" in w}
    for view, base in table.views.items():
        if {view, base} & written:
            # Kept as two arrays, a write to one would not be seen through the other.
            raise ValueError(f"fusegrad.aot.compile: the step reads {view} (a view of {base} "
                             f"of another shape) and writes {base if base in written else view}"
                             "; an artifact keeps them as separate arrays: read the tensor "
                             "itself inside the step")
    if len(programs) == 2:
        needed.add("aot.calls")
    for spec in table.specs.values():
        spec["needed"] = spec["name"] in needed
        spec["carried"] = carry_state and spec["needed"]
    leaves, in_tree = tree_flatten((args, {}))
    g = graphs[-1]
    plan = {
        "name": programs[-1][0]["name"],
        "args": [f for f in ios[-1]["inputs"] if "arg" in f],
        "in_tree": _tree_json(in_tree), "out_tree": _tree_json(g.meta.out_tree),
        "n_user_outputs": g.meta.n_user_outputs,
        "outputs": [format_type(o.type) for o in g.outputs[:g.meta.n_user_outputs]],
        "state": list(table.specs.values()),
        "programs": [p for p, _, _ in programs],
    }
    plan["args"] = sorted(({k: f[k] for k in ("arg", "name", "type", "shape", "dtype")}
                           for f in plan["args"]), key=lambda f: f["arg"])
    objects = {sym: obj for _, _, objs in programs for sym, obj in objs.items()}
    state = {n: a for n, a in table.initial.items() if n in needed} if carry_state else None
    text = "\n".join(text for _, text, _ in programs)
    return Artifact(text, plan, objects, state, target)




def _build(graph: Graph, io: dict, target: dict, pipeline: str | None, hints: dict):
    """Passes, fusion and machine code for one traced graph: its plan, text, objects."""
    optimized = PassManager(pipeline or DEFAULT_PIPELINE).run(graph)
    text = print_graph(optimized)
    # The program is built from the parsed text, exactly as loading will build it.
    try:
        reparsed = parse(text, hints)
    except IRError as e:
        raise ValueError(f"fusegrad.aot.compile: the graph's text form does not parse back "
                         f"({e})") from e
    name = _symbol(graph.name)
    donations = [tuple(p) for p in io["donations"]]
    what = "kernels"
    try:
        with _sized(hints), contextlib.nullcontext() if target["cpu"] == "host" else \
                jit.compile_target(target["cpu"], target["llvm_features"]):
            kg = fuse(reparsed)
            program = Program(kg, name, donate=donations)
            # The native loops of its extern steps, which a fresh process would compile.
            what = "native loops of its extern steps"
            native = {jit.module_key(text, level): jit.module_object(text, level)
                      for text, level in program.native_modules()}
    except SymbolicDecisionError as e:
        raise ValueError(f"fusegrad.aot.compile: {graph.name}'s {what} would depend on the "
                         f"value of a symbolic size ({str(e).splitlines()[0]}); an artifact "
                         "holds one program for every size and compiles nothing at load: "
                         f"leave static the dim it depends on (symbolic here: "
                         f"{', '.join(sorted(hints))})") from None
    accepted = program.donated
    printed = value_names(reparsed)
    inputs = [dict(f, value=printed[v]) for f, v in zip(io["inputs"], reparsed.inputs)]
    plan = {"role": "steady", "name": name, "inputs": inputs, "writes": io["writes"],
            "rng_counters": io["rng_counters"],
            "kernels": [{"index": i, "symbol": c.record.symbol, "slots": list(c.slots)}
                        for i, c in sorted(program.kernel_code.items())],
            "gemms": [{"index": i, "symbol": c.record.symbol}
                      for i, c in sorted(program.gemm_code.items())],
            "native": sorted(native),
            "fallbacks": {str(i): r for i, r in sorted(program.fallbacks.items())},
            "donations": [list(p) for p in io["donations"]],
            "donated": {str(s): i for s, i in sorted(accepted.items())},
            "program": _program_summary(program)}
    objects = {c.record.symbol: c.record.obj
               for c in [*program.kernel_code.values(), *program.gemm_code.values()]}
    objects.update({NATIVE_PREFIX + key: obj for key, obj in native.items()})
    return plan, text, objects


def _sized(hints: dict):
    """Symbolic sizes are compared as fusion and the kernels' code compare them, once for
    every size (see :class:`~fusegrad.tracer.programs.SymbolicProgram`); a static graph
    needs nothing."""
    return hashable_sizes() if hints else contextlib.nullcontext()


def _slots_digest(program: Program) -> str:
    names = value_names(program.graph)
    # (A program of symbolic sizes also has the buffer of the sizes, keyed by a name.)
    slots = sorted((v if isinstance(v, str) else names[v], s) for v, s in program.slots.items())
    return hashlib.sha256(json.dumps(slots).encode()).hexdigest()


def _program_summary(program: Program) -> dict:
    """What loading checks the rebuilt program against, and what ``show`` prints."""
    memory = [{"slot": s, "type": f"{np.dtype(dt).name}[{', '.join(map(str, shape))}]",
               "bytes": _total([_bytes(shape, dt)])}
              for s, (shape, dt) in sorted(program.intermediate_specs.items())]
    kernels = []
    for i, k in enumerate(program.kg.kernels):
        if k.kind == "matmul" and i not in program.fallbacks:
            product = "gemm" if i in program.gemm_code else "blas"
            step = f"{product}+llvm" if i in program.kernel_code else product
        else:
            step = "llvm" if i in program.kernel_code else "numpy"
        kernels.append({"describe": k.describe(), "step": step})
    return {"kernels": kernels, "n_slots": program.n_slots,
            "slots_sha256": _slots_digest(program), "memory": memory,
            "scratch_bytes": _total([_bytes(shape, dt) for shape, dt
                                     in program.intermediate_specs.values()]),
            "output_bytes": _total([_bytes(shape, dt) for _, shape, dt in program.output_specs])}


def _bytes(shape, dt):
    """A buffer's bytes: an int, or for symbolic sizes an expression (``1024*batch``)."""
    n = np.dtype(dt).itemsize
    for d in shape:
        n = n * d
    return n


def _total(sizes: list):
    """The sum of buffer sizes, as JSON: an int, or an expression's text."""
    total = 0
    for n in sizes:
        total = total + n
    return str(total) if isinstance(total, SymInt) else int(total)

def _target(cpu: str | None, features: str | None) -> dict:
    jit._init()
    info = {"triple": llvm.get_process_triple(),
            "llvm": ".".join(map(str, llvm.llvm_version_info))}
    extra = [f.strip() for f in (features or "").split(",") if f.strip()]
    if any(f[0] not in "+-" for f in extra):
        raise ValueError(f"fusegrad.aot.compile: features are LLVM feature flags such as "
                         f"'+avx2,-avx512f', got {features!r}")
    if cpu is None or cpu == "host":
        host = llvm.get_host_cpu_features()
        if extra:
            raise ValueError("fusegrad.aot.compile: features= needs cpu= (the host build uses "
                             "the host's features)")
        return dict(info, cpu="host", host_cpu=llvm.get_host_cpu_name(), llvm_features="",
                    features=sorted(k for k, v in host.items() if v))
    base = X86_64_LEVELS.get(cpu)
    if base is None and not any(f.startswith("+") for f in extra):
        raise ValueError(f"fusegrad.aot.compile: cpu={cpu!r} is not one of the x86-64 levels "
                         f"{sorted(X86_64_LEVELS)}; for another LLVM CPU name also list the "
                         "features its code may use, e.g. features='+avx2,+fma'")
    required = set(base or ()) | {f[1:] for f in extra if f[0] == "+"}
    required -= {f[1:] for f in extra if f[0] == "-"}
    return dict(info, cpu=cpu, llvm_features=",".join(extra), features=sorted(required))


# --------------------------------------------------------------------------- signature


def _tree_json(tree) -> Any:
    if tree.kind == "leaf":
        return "leaf"
    if tree.kind == "static":
        if tree.meta is not None and not isinstance(tree.meta, (bool, int, float, str)):
            raise ValueError(f"fusegrad.aot.compile: a non-tensor argument or result "
                             f"{tree.meta!r} has no portable form (numbers, strings, None only)")
        return {"static": tree.meta}
    if tree.kind in ("tuple", "list"):
        return {tree.kind: [_tree_json(c) for c in tree.children]}
    if tree.kind == "dict":
        if not all(isinstance(k, str) for k in tree.meta):
            raise ValueError("fusegrad.aot.compile: dict keys of arguments and results must be "
                             "strings")
        return {"dict": [[k, _tree_json(c)] for k, c in zip(tree.meta, tree.children)]}
    raise ValueError(f"fusegrad.aot.compile: {tree.kind} arguments or results are not "
                     "supported (use tuples, lists or dicts)")


def _tree_from_json(obj) -> Any:
    if obj == "leaf":
        return TreeDef("leaf")
    (kind, body), = obj.items()
    if kind == "static":
        return TreeDef("static", (), body)
    if kind in ("tuple", "list"):
        return TreeDef(kind, tuple(_tree_from_json(c) for c in body))
    return TreeDef("dict", tuple(_tree_from_json(c) for _, c in body), tuple(k for k, _ in body))


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _referenced(fn) -> list[tuple[str, Any]]:
    """(name, object) for what ``fn`` refers to: itself if a module, its closure's cells
    and the globals its code loads (depth one: a step's model and optimizer; not a global
    named like an attribute it reads, as ``step`` in ``opt.step()``)."""
    out = []
    if hasattr(fn, "named_parameters"):
        out.append(("", fn))
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                out.append((name, cell.cell_contents))
            except ValueError:          # an empty cell
                pass
        glob = getattr(fn, "__globals__", {})
        loaded = code_reads(code).globals
        out += [(name, glob[name]) for name in code.co_names if name in loaded and name in glob]
    return out


def _state_names(fn, optimizers) -> dict[int, str]:
    """Storage (id of the root array) -> a readable name, for the tensors ``fn`` reaches."""
    names: dict[int, str] = {}
    params: dict[int, str] = {}
    opts = []
    for prefix, obj in _referenced(fn):
        if hasattr(obj, "named_parameters") and hasattr(obj, "named_buffers"):
            for n, t in list(obj.named_parameters()) + list(obj.named_buffers()):
                full = f"{prefix}.{n}" if prefix else n
                names.setdefault(id(_root(t._data)), full)
                params.setdefault(id(t), full)
        elif hasattr(obj, "param_groups") and hasattr(obj, "state"):
            opts.append((prefix, obj))
    for j, opt in enumerate(optimizers):
        if not any(o is opt for _, o in opts):
            opts.append((f"optimizer{j}", opt))
    for prefix, opt in opts:
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                pname = params.get(id(p), f"{gi}.{pi}")
                for k, v in (opt.state.get(p) or {}).items():
                    if hasattr(v, "_data"):
                        names.setdefault(id(_root(v._data)), f"{prefix}.state.{pname}.{k}")
    return names


@dataclass
class _StateTable:
    """The artifact's state: a spec per name, and the initial values known at compile."""

    specs: dict[str, dict] = field(default_factory=dict)
    initial: dict[str, np.ndarray] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)     # a view's state -> its base's

    def add(self, name: str, type_text: str, shape: list, dtype: str, value=None) -> None:
        if any(isinstance(d, SymInt) for d in shape):
            raise ValueError(f"fusegrad.aot.compile: state {name} would be {type_text}: state "
                             "kept across calls of an artifact has static shapes, and its "
                             "symbolic dims are the arguments' only")
        spec = self.specs.get(name)
        if spec is None:
            self.specs[name] = {"name": name, "type": type_text, "shape": shape, "dtype": dtype}
        elif spec["type"] != type_text:
            raise ValueError(f"fusegrad.aot.compile: state {name} is used as {spec['type']} "
                             f"and as {type_text}")
        if value is not None and name not in self.initial:
            self.initial[name] = np.array(value, dtype=dtypes.as_dtype(dtype).np_dtype,
                                          copy=True)


def _io(fn, graph: Graph, args: tuple, names: dict[int, str], table: _StateTable) -> dict:
    """How each input of ``graph`` is fed (``{"arg": k}`` or ``{"state": name}``), where
    each output beyond the returned ones is written, and which buffers may be donated."""
    info, cap = graph.meta, graph.meta.capture
    feeds: list = [None] * len(graph.inputs)
    leaf_names: dict[int, str] = {}          # graph input -> its state or argument name
    concrete: dict[int, Any] = {}            # graph input -> the tensor it stands for

    def state(i: int, name: str, value) -> None:
        v = graph.inputs[i]
        table.add(name, format_type(v.type), list(v.type.shape), v.type.dtype.name, value)
        feeds[i] = {"state": name}
        leaf_names[i] = name

    for i, (n, t) in enumerate(module_state(fn) if info.n_state else []):
        state(i, n, t._data)
        concrete[i] = t
    for k, t in enumerate(tree_flatten((args, {}))[0]):
        i = info.n_state + k
        v = graph.inputs[i]
        feeds[i] = {"arg": k, "name": v.name, "type": format_type(v.type),
                    "shape": [d.name if isinstance(d, SymInt) else d for d in v.type.shape],
                    "dtype": v.type.dtype.name}
        leaf_names[i], concrete[i] = f"arg{k}", t
    for t, i in info.lifted:
        name = names.get(id(_root(t._data)), graph.inputs[i].name)
        spec = table.specs.get(name)
        if spec is not None and spec["type"] != format_type(graph.inputs[i].type):
            # Another view of a named tensor's memory (a square mask and its [1,1,T,T]
            # view): a state of its own, named after it.
            base = name
            name = _unique(f"{name}.view", [n for n, sp in table.specs.items()
                                             if sp["type"] != format_type(graph.inputs[i].type)])
            table.views[name] = base
        state(i, name, t._data)
        concrete[i] = t
    if cap is not None:
        for leaf, i in cap.grad_inputs:
            g = concrete[leaf]._grad
            state(i, leaf_names[leaf] + ".grad",
                  g._data if g is not None else np.zeros(graph.inputs[i].type.shape))
        for getter, i, _ in cap.scalar_inputs:
            name = graph.inputs[i].name
            taken = [f["state"] for f in feeds if f is not None and "state" in f]
            state(i, _unique(name, taken), np.asarray(float(getter())))
    if info.rng_input is not None:
        gen = creation.default_generator
        state(info.rng_input, "rng", np.array([gen._seed, gen._offset]))
    missing = [graph.inputs[i].name for i, f in enumerate(feeds) if f is None]
    if missing:
        raise ValueError(f"fusegrad.aot.compile: no source for graph inputs {missing}")

    writes = []

    def write(j: int, name: str) -> None:
        o = graph.outputs[j]
        table.add(name, format_type(o.type), list(o.type.shape), o.type.dtype.name)
        writes.append({"output": j, "state": name})

    for i, j in info.mutations:
        if "arg" in feeds[i]:
            writes.append({"output": j, "arg": feeds[i]["arg"]})
        else:
            write(j, feeds[i]["state"])
    grads = []
    if cap is not None:
        read_grads = {leaf for leaf, _ in cap.grad_inputs}
        for leaf, j, _ in cap.grad_writes:
            if leaf not in read_grads and leaf not in cap.grad_drops:
                raise ValueError(
                    "fusegrad.aot.compile: the step accumulates into .grad across calls "
                    "(backward() without zero_grad() before it); an artifact holds a step "
                    "that clears .grad first")
            write(j, leaf_names[leaf] + ".grad")
        for t, j in cap.internal_writes:
            write(j, names.get(id(_root(t._data)), f"state{j}"))
        grads = [(gi, out) for leaf, out, in_place in cap.grad_writes if in_place
                 for leaf2, gi in cap.grad_inputs if leaf2 == leaf]
    return {"inputs": feeds, "writes": writes, "rng_counters": info.rng_counters,
            "donations": list(info.mutations) + grads}

def _unique(name: str, taken) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    return out


# --------------------------------------------------------------------------- load


def load(path: str | os.PathLike, state: dict | None = None) -> "LoadedArtifact":
    """Load the artifact at ``path`` and link its kernels; return a callable with the
    original signature (tensors in, tensors out; state updated in place).

    ``state`` gives state tensors by name (fusegrad tensors are used in place, so a model's
    parameters can be trained by the artifact; numpy arrays are copied); state not given
    comes from the file. Raises :class:`ArtifactError` (nothing else) for a path that is no
    regular file (a FIFO, ``/dev/zero``: refused unread), a file that is truncated, corrupt,
    of another format or fusegrad version, built for CPU features this machine lacks, or
    whose plan disagrees with its graph (the error names the plan's field). Nothing is
    traced or compiled: the object code is only linked."""
    return loads(read_file(path), state, what=os.fspath(path))


def loads(blob: bytes, state: dict | None = None, what: str = "artifact") -> "LoadedArtifact":
    """:func:`load` from the file's bytes."""
    decoded = decode(blob, what)
    header, sections = decoded.header, decoded.sections
    check_header(header, what)
    try:
        plan = json.loads(sections["plan"])
        text = sections["graph"].decode()
        if not isinstance(plan, dict):
            raise ValueError("the plan is not an object")
        dims = check_dims(plan, what)
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError("corrupt", f"{what}: unreadable plan or graph ({e})") from None
    except RecursionError:
        raise ArtifactError("corrupt", f"{what}: its plan nests too deeply") from None
    # Symbolic sizes at the sizes they were traced at: the decisions made there (at
    # compile, every one checked over the bounds) are made again as they were.
    hints = {d["name"]: d["hint"] for d in dims}
    with record_assumptions() as assumed:
        try:
            graphs = parse_many(text, hints)
        except IRError as e:
            raise ArtifactError("corrupt", f"{what}: unreadable plan or graph ({e})") from None
        except RecursionError:
            raise ArtifactError("corrupt", f"{what}: its graph nests too deeply") from None
        try:
            check_plan(plan, graphs, len(sections["code"]), len(sections["state"]), what)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError,
                RecursionError) as e:
            # A safety net: the checks name the field of every malformation they know.
            raise ArtifactError("plan", f"{what}: its plan is malformed ({e!r})") from None
        with _sized(hints):
            loaded = LoadedArtifact(header, plan, graphs, text, sections["code"],
                                    sections["state"], state, what)
    bad = unchecked_assumptions(assumed, {d["name"]: Dim(d["name"], min=d["min"], max=d["max"])
                                          for d in dims})
    if bad:
        raise ArtifactError("plan", f"{what}: its program assumes of its symbolic sizes what "
                            f"does not hold within their bounds: {'; '.join(bad)}")
    return loaded


@dataclass
class _Linked:
    """One program of a loaded artifact, with its feeds and write-backs."""

    role: str
    program: Program
    feeds: list[tuple[bool, Any]]         # (is an argument, argument index or state name)
    writes: list[tuple[int, bool, Any]]   # (output, to an argument, argument or state name)
    rng_counters: int
    sets: dict = field(default_factory=dict)   # state name -> the value the call sets


class LoadedArtifact:
    """A loaded artifact: call it like the original function. ``state`` holds its state
    arrays by name (updated in place by each call); :meth:`state_dict` gives them as
    tensors sharing that memory."""

    def __init__(self, header: dict, plan: dict, graphs: list[Graph], graph_text: str,
                 code: bytes, state_blob: bytes, state: dict | None, what: str):
        self.header, self.plan, self.graph_text, self.name = header, plan, graph_text, what
        self._lock = threading.Lock()
        try:
            if len(graphs) != len(plan["programs"]):
                raise ArtifactError("plan", f"{what}: {len(graphs)} graphs for "
                                    f"{len(plan['programs'])} programs")
            self.programs = [self._link(p, g, plan["code"], code)
                             for p, g in zip(plan["programs"], graphs)]
            self.state = self._state(plan, state_blob, state or {})
            self._in_tree = _tree_from_json(plan["in_tree"])
            self._out_tree = _tree_from_json(plan["out_tree"])
            self._args = plan["args"]
            self._dims = {d["name"]: d for d in plan.get("dims", [])}
            self._arg_dtypes = [dtypes.as_dtype(f["dtype"]) for f in self._args]
            self._out_dtypes = [o.type.dtype for o in graphs[-1].outputs]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError) as e:
            # A safety net: check_plan and _link refuse what they know, by field.
            raise ArtifactError("plan", f"{what}: its plan does not fit its graph ({e!r})") \
                from None

    def _link(self, plan: dict, graph: Graph, ranges: dict, code: bytes) -> _Linked:
        kg = fuse(graph)
        expected = plan["program"]["kernels"]
        if [k.describe() for k in kg.kernels] != [k["describe"] for k in expected]:
            raise ArtifactError("plan", f"{self.name}: its graph partitions into other kernels "
                                "than its plan lists")
        prebuilt = {}
        for k in plan["kernels"]:
            start, length = ranges[k["symbol"]]
            if start < 0 or start + length > len(code):
                raise ArtifactError("plan", f"{self.name}: kernel code out of range")
            record = jit.KernelRecord(k["symbol"], (), code[start:start + length])
            prebuilt[int(k["index"])] = KernelCode(record, [int(s) for s in k["slots"]])
        carried = {}
        for key in plan.get("native", []):
            start, length = ranges[NATIVE_PREFIX + key]
            if start < 0 or start + length > len(code):
                raise ArtifactError("plan", f"{self.name}: native code out of range")
            carried[key] = code[start:start + length]
        jit.carry_modules(carried)
        # The generated GEMMs' buffers follow from the graph, as their shapes do.
        gemms = {}
        for k in plan.get("gemms", []):
            start, length = ranges[k["symbol"]]
            if start < 0 or start + length > len(code):
                raise ArtifactError("plan", f"{self.name}: kernel code out of range")
            record = jit.KernelRecord(k["symbol"], (), code[start:start + length])
            gemms[int(k["index"])] = KernelCode(record, [])
        fallbacks = {int(i): r for i, r in plan["fallbacks"].items()}
        program = Program(kg, plan["name"], prebuilt=prebuilt, fallbacks=fallbacks,
                          prebuilt_gemms=gemms)
        if set(program.gemm_code) != set(gemms):
            raise ArtifactError("plan", f"{self.name}: its GEMMs do not fit its graph's products")
        if program.n_slots != plan["program"]["n_slots"] or \
                _slots_digest(program) != plan["program"]["slots_sha256"]:
            raise ArtifactError("plan", f"{self.name}: its memory plan differs from the one "
                                "its kernels were built for")
        if any(s >= program.n_slots for c in prebuilt.values() for s in c.slots):
            raise ArtifactError("plan", f"{self.name}: a kernel names a buffer out of range")
        accepted = program.donate([tuple(p) for p in plan["donations"]])
        if {str(s): i for s, i in accepted.items()} != plan["donated"]:
            raise ArtifactError("plan", f"{self.name}: buffer donation differs from its plan")
        self._check_kernels(plan, program, prebuilt)
        if len(plan["inputs"]) != len(graph.inputs):
            raise ArtifactError("plan", f"{self.name}: inputs differ from its graph's")
        feeds = [(True, f["arg"]) if "arg" in f else (False, f["state"]) for f in plan["inputs"]]
        writes = [(w["output"], "arg" in w, w["arg"] if "arg" in w else w["state"])
                  for w in plan["writes"]]
        sets = {n: np.array(e["value"], dtype=np.dtype(e["dtype"]))
                for n, e in plan.get("sets", {}).items()}
        return _Linked(plan["role"], program, feeds, writes, int(plan["rng_counters"]), sets)

    def _check_kernels(self, plan: dict, program: Program, prebuilt: dict) -> None:
        """Each kernel of the plan is one the graph lowers to LLVM, and its buffers are the
        ones its code numbers (a wrong list would hand the code buffers of other sizes)."""
        lowered = program.llvm_kernels()
        if set(prebuilt) != lowered:
            raise ArtifactError("plan", f"{self.name}: its plan's kernels "
                                f"{sorted(set(prebuilt) ^ lowered)} differ from the graph's "
                                "LLVM kernels")
        for i, code in sorted(prebuilt.items()):
            try:
                want = program.kernel_slots(i)
            except Unsupported:
                want = None
            if code.slots != want:
                raise ArtifactError("plan", f"{self.name}: its plan's kernels (index {i}, "
                                    f"{program.kg.kernels[i].describe()}) slots {code.slots} "
                                    f"are not the buffers its code addresses ({want})")

    def _state(self, plan: dict, blob: bytes, given: dict) -> dict[str, np.ndarray]:
        data = {e["name"]: e for e in plan["state_data"]}
        unknown = sorted(set(given) - {s["name"] for s in plan["state"]})
        if unknown:
            raise ArtifactError("signature", f"{self.name} has no state named {unknown}; its "
                                f"state: {[s['name'] for s in plan['state']]}")
        out = {}
        for spec in plan["state"]:
            name, dt = spec["name"], dtypes.as_dtype(spec["dtype"])
            shape = tuple(spec["shape"])
            if name in given:
                out[name] = _state_array(given[name], shape, dt, name, self.name)
                continue
            entry = data[name]
            if entry["offset"] is None:
                if spec["needed"]:
                    raise ArtifactError("signature", f"{self.name} does not carry its state "
                                        f"{name} ({spec['type']}): pass it to load(state=...)")
                out[name] = np.zeros(shape, dt.np_dtype)
                continue
            start, length = entry["offset"], entry["length"]
            np_dtype = np.dtype(dt.np_dtype).newbyteorder("<")
            if start < 0 or start + length > len(blob) or \
                    length != np_dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
                raise ArtifactError("plan", f"{self.name}: state {name} out of range")
            out[name] = np.frombuffer(blob, np_dtype, count=length // np_dtype.itemsize,
                                      offset=start).reshape(shape).astype(dt.np_dtype)
        return out

    def state_dict(self) -> dict:
        """The state as tensors that share the artifact's arrays."""
        return {n: Tensor._wrap(a, dtypes.from_numpy_dtype(a.dtype)) for n, a in self.state.items()}

    def __call__(self, *args):
        leaves, tree = tree_flatten((args, {}))
        if tree != self._in_tree:
            raise ArtifactError("signature", f"{self.name} takes {len(self._args)} tensor "
                                f"arguments structured as {self.plan['in_tree']}; got "
                                f"{len(leaves)} tensors in another structure")
        arrays = []
        sizes: dict[str, tuple] = {}        # symbol -> (its size, the dim that gave it)
        for f, dt, t in zip(self._args, self._arg_dtypes, leaves):
            a = t._data
            if len(a.shape) != len(f["shape"]) or t._dtype is not dt or any(
                    a.shape[d] != n for d, n in enumerate(f["shape"]) if not isinstance(n, str)):
                raise ArtifactError("signature", f"{self.name}: argument {f['arg']} "
                                    f"({f['name']}) must be {f['type']}, got "
                                    f"{t._dtype.short}[{','.join(map(str, a.shape))}]")
            for d, n in enumerate(f["shape"]):
                if isinstance(n, str):
                    self._check_size(f, d, n, a.shape[d], sizes)
            arrays.append(a)
        state = self.state
        with self._lock:
            linked = self.programs[-1]
            if len(self.programs) > 1 and state["aot.calls"] == 0:
                linked = self.programs[0]
            outs = linked.program(*[arrays[key] if is_arg else state[key]
                                    for is_arg, key in linked.feeds])
            for j, to_arg, key in linked.writes:
                target = leaves[key]._data if to_arg else state[key]
                if outs[j] is not target:
                    np.copyto(target, outs[j])
            for key, value in linked.sets.items():
                np.copyto(state[key], value)
            if linked.rng_counters:
                state["rng"][1] += linked.rng_counters
            if "aot.calls" in state:
                state["aot.calls"] += 1
        n = self.plan["n_user_outputs"]
        user = [Tensor._wrap(o, d) for o, d in zip(outs[:n], self._out_dtypes)]
        return tree_unflatten(self._out_tree, user)

    def _check_size(self, f: dict, d: int, name: str, n: int, sizes: dict) -> None:
        """Dim ``d`` of argument ``f``, of size ``n``, is the symbol ``name``: within its
        bounds and equal to the other dims of that symbol (torch.export's guards)."""
        spec, said = self._dims[name], f"{f['name']}.size()[{d}]"
        dim = Dim(name, min=spec["min"], max=spec["max"])
        if n < spec["min"] or n > spec["max"]:
            op, bound = (">=", spec["min"]) if n < spec["min"] else ("<=", spec["max"])
            raise ArtifactError("signature", f"{self.name}: Guard failed: {said} {op} {bound} "
                                f"({f['name']}.size({d}) is {dim!r}; got {n})")
        if name in sizes and sizes[name][0] != n:
            first, where = sizes[name]
            raise ArtifactError("signature", f"{self.name}: Guard failed: {said} == {where} "
                                f"({f['name']}.size({d}) = {n} and {where} = {first} are both "
                                f"{dim!r}, which means equal sizes)")
        sizes.setdefault(name, (n, said))

    def describe(self) -> str:
        """The report ``fusegrad-aot show`` prints."""
        return describe(self.header, self.plan, self.graph_text)

def _state_array(value, shape: tuple, dt, name: str, what: str) -> np.ndarray:
    arr = value._data if hasattr(value, "_data") else np.array(value)
    if arr.shape != shape or arr.dtype != np.dtype(dt.np_dtype) or not arr.flags.c_contiguous:
        raise ArtifactError("signature", f"{what}: state {name} must be a contiguous "
                            f"{dt.short}[{','.join(map(str, shape))}], got {arr.dtype} "
                            f"{list(arr.shape)}")
    return arr

