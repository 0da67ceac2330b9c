"""The checks a loaded artifact's plan passes before anything is linked (see
:mod:`fusegrad.aot.artifact`): its version and target, and every field of the plan against
the graphs it describes.

The runtime trusts the plan: argument and state types decide what a call accepts and which
buffers a program reads and writes, kernel slots which buffers its object code addresses,
code and state ranges what is sliced from the file. A plan that disagrees with its graph (a
hand edit, a bug, a file resealed after a change) would read or write out of bounds, so every
such field is checked against the graph before anything is linked.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numpy as np

from fusegrad import dtypes
from fusegrad.aot.format import ArtifactError
from fusegrad.ir.graph import Graph
from fusegrad.ir.printer import format_type, value_names
from fusegrad.runtime import jit
from fusegrad.version import __version__

__all__ = ["check_plan", "check_dims", "check_version", "check_header", "NATIVE_PREFIX"]

NATIVE_PREFIX = "native_"     # objects of native helper modules, by jit.module_key


def _plan_error(what: str, field: str, message: str) -> ArtifactError:
    return ArtifactError("plan", f"{what}: its plan's {field} {message}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_of(shape, dtype, what: str, field: str, symbols=frozenset()) -> str:
    """The type text of a plan entry's shape and dtype, checked; ``symbols``: the names
    a dim may be (the artifact's symbolic dims)."""
    if not isinstance(shape, list) or not all(
            _is_int(d) and d >= 0 or isinstance(d, str) and d in symbols for d in shape):
        raise _plan_error(what, field, f"has an invalid shape {str(shape)[:80]}")
    try:
        dt = dtypes.as_dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.name != dtype:
        raise _plan_error(what, field, f"has an unknown dtype {str(dtype)[:40]!r}")
    return f"{dt.short}[{','.join(map(str, shape))}]"


def _check_entry_type(entry, what: str, field: str, symbols=frozenset()) -> str:
    """An argument's or a state's entry: an object whose shape, dtype and type agree."""
    if not isinstance(entry, dict):
        raise _plan_error(what, field, "is not an object")
    text = _type_of(entry.get("shape"), entry.get("dtype"), what, field, symbols)
    if entry.get("type") != text:
        raise _plan_error(what, field, f"says type {str(entry.get('type'))[:80]} but shape "
                          f"{entry['shape']} and dtype {entry['dtype']}")
    return text


def _expect(cond: bool, what: str, field: str, message: str) -> None:
    if not cond:
        raise _plan_error(what, field, message)


def _leaves(tree, what: str, field: str, depth: int = 0) -> int:
    """How many tensors a JSON tree (``in_tree``, ``out_tree``) holds, checking its form."""
    if depth > 100:
        raise _plan_error(what, field, "nests too deeply")
    if tree == "leaf":
        return 1
    if not isinstance(tree, dict) or len(tree) != 1:
        raise _plan_error(what, field, f"has a malformed node {str(tree)[:80]}")
    (kind, body), = tree.items()
    if kind == "static":
        _expect(body is None or isinstance(body, (bool, int, float, str)), what, field,
                f"has a static value {str(body)[:40]} of no portable form")
        return 0
    if kind in ("tuple", "list") and isinstance(body, list):
        return sum(_leaves(c, what, field, depth + 1) for c in body)
    if kind == "dict" and isinstance(body, list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in body):
        return sum(_leaves(c, what, field, depth + 1) for _, c in body)
    raise _plan_error(what, field, f"has a malformed node {str(tree)[:80]}")


def _check_range(entry, limit: int, what: str, field: str) -> None:
    _expect(isinstance(entry, list) and len(entry) == 2 and all(_is_int(v) for v in entry)
            and entry[0] >= 0 and entry[1] >= 0 and entry[0] + entry[1] <= limit, what, field,
            f"{str(entry)[:80]} is not a range within the {limit} bytes of its section")


def check_plan(plan, graphs: list[Graph], code_len: int, state_len: int, what: str) -> None:
    """Raise :class:`ArtifactError` (reason ``"plan"``, naming the field) unless every field
    of ``plan`` that the runtime trusts agrees with ``graphs`` and the file's sections:
    arguments, outputs, state, each program's inputs, write-backs and set values, the code
    and state ranges, the trees of arguments and results. Kernel buffers are checked when
    the programs are linked (:meth:`LoadedArtifact._link`)."""
    _expect(isinstance(plan, dict), what, "top level", "is not an object")
    for key, kind in (("name", str), ("args", list), ("outputs", list), ("state", list),
                      ("programs", list), ("code", dict), ("state_data", list)):
        _expect(isinstance(plan.get(key), kind), what, key, f"is not a {kind.__name__}")
    n_user = plan.get("n_user_outputs")
    _expect(_is_int(n_user) and 0 <= n_user == len(plan["outputs"]), what, "n_user_outputs",
            f"{str(n_user)[:20]} does not count its {len(plan['outputs'])} outputs")
    programs = plan["programs"]
    _expect(len(programs) in (1, 2) and len(programs) == len(graphs), what, "programs",
            f"lists {len(programs)} programs for {len(graphs)} graphs")
    # Arguments: numbered in order, each consistent, their count that of in_tree's leaves.
    args = plan["args"]
    symbols = {d["name"] for d in check_dims(plan, what)}
    arg_types = [_check_entry_type(f, what, f"args[{k}]", symbols) for k, f in enumerate(args)]
    used = {d for f in args for d in f["shape"] if isinstance(d, str)}
    _expect(used == symbols, what, "dims", f"names {sorted(symbols)} but the arguments' "
            f"symbolic dims are {sorted(used)}")
    for k, f in enumerate(args):
        _expect(f.get("arg") == k and isinstance(f.get("name"), str), what, f"args[{k}]",
                f"is numbered {str(f.get('arg'))[:20]} (or unnamed)")
    n_in = _leaves(plan.get("in_tree"), what, "in_tree")
    _expect(n_in == len(args), what, "in_tree", f"holds {n_in} tensors for {len(args)} arguments")
    n_out = _leaves(plan.get("out_tree"), what, "out_tree")
    _expect(n_out == n_user, what, "out_tree", f"holds {n_out} tensors for {n_user} outputs")
    # State: unique names, consistent types, data in range of the state section.
    state_types = {}
    for j, spec in enumerate(plan["state"]):
        field = f"state[{j}]"
        text = _check_entry_type(spec, what, field)
        name = spec.get("name")
        _expect(isinstance(name, str) and name not in state_types, what, field,
                f"has a missing or repeated name {str(name)[:80]!r}")
        state_types[name] = text
    data_names = set()
    for j, entry in enumerate(plan["state_data"]):
        field = f"state_data[{j}]"
        _expect(isinstance(entry, dict) and entry.get("name") in state_types, what, field,
                "names no state")
        data_names.add(entry["name"])
        if entry.get("offset") is not None:
            _check_range([entry.get("offset"), entry.get("length")], state_len, what, field)
    _expect(data_names == set(state_types), what, "state_data",
            "does not cover the state")
    for symbol, entry in plan["code"].items():
        _check_range(entry, code_len, what, f"code[{symbol!r}]")
    if len(programs) == 2:
        _expect(state_types.get("aot.calls") == "i64[]", what, "state",
                "lacks the call counter aot.calls (i64[]) that chooses between its programs")
    # Each program against its graph.
    for index, (p, graph) in enumerate(zip(programs, graphs)):
        _check_program(p, graph, index, len(programs), plan, arg_types, state_types, what)


def check_dims(plan: dict, what: str) -> list[dict]:
    """The plan's symbolic dims (absent: none), each a name with its bounds and the size it
    was traced at, checked."""
    dims = plan.get("dims", [])
    _expect(isinstance(dims, list), what, "dims", "is not a list")
    seen = set()
    for j, d in enumerate(dims):
        _expect(isinstance(d, dict) and isinstance(d.get("name"), str) and
                d["name"].isidentifier() and d["name"] not in seen and
                isinstance(d.get("where"), str) and
                all(_is_int(d.get(k)) for k in ("min", "max", "hint")) and
                2 <= d["min"] <= d["hint"] <= d["max"], what, f"dims[{j}]",
                f"is not a symbol with bounds min <= hint <= max ({str(d)[:80]})")
        seen.add(d["name"])
    return dims


def _check_program(p, graph: Graph, index: int, n_programs: int, plan: dict, arg_types: list,
                   state_types: dict, what: str) -> None:
    here = f"programs[{index}]"
    _expect(isinstance(p, dict), what, here, "is not an object")
    role = "first" if index == 0 and n_programs == 2 else "steady"
    _expect(p.get("role") == role, what, f"{here}.role", f"is {str(p.get('role'))[:20]!r}, "
            f"expected {role!r}")
    for key, kind in (("name", str), ("inputs", list), ("writes", list), ("kernels", list),
                      ("gemms", list), ("native", list), ("fallbacks", dict),
                      ("donations", list), ("donated", dict), ("program", dict)):
        _expect(isinstance(p.get(key, [] if key in ("gemms", "native") else None), kind), what,
                f"{here}.{key}", f"is not a {kind.__name__}")
    inputs, outputs = graph.inputs, graph.outputs
    _expect(len(p["inputs"]) == len(inputs), what, f"{here}.inputs",
            f"lists {len(p['inputs'])} inputs; the graph @{graph.name} has {len(inputs)}")
    names = value_names(graph)
    for i, (feed, v) in enumerate(zip(p["inputs"], inputs)):
        field, want = f"{here}.inputs[{i}]", format_type(v.type)
        if isinstance(feed, dict) and "arg" in feed:
            k = feed["arg"]
            _expect(_is_int(k) and 0 <= k < len(arg_types), what, field,
                    f"names argument {str(k)[:20]}, of {len(arg_types)}")
            _expect(arg_types[k] == want, what, f"args[{k}]",
                    f"says {arg_types[k]} but the graph's input {names[v]} is {want}")
            _expect(feed.get("type", want) == want, what, field,
                    f"says {str(feed.get('type'))[:80]} but the graph's input {names[v]} is {want}")
        elif isinstance(feed, dict) and "state" in feed:
            name = feed["state"]
            _expect(name in state_types, what, field, f"names no state ({str(name)[:80]})")
            _expect(state_types[name] == want, what, f"state {name}",
                    f"says {state_types[name]} but the graph's input {names[v]} is {want}")
        else:
            raise _plan_error(what, field, "feeds neither an argument nor a state")
    n_user = plan["n_user_outputs"]
    _expect(n_user <= len(outputs), what, "n_user_outputs",
            f"{n_user} exceeds the {len(outputs)} outputs of the graph @{graph.name}")
    for k in range(n_user):
        want = format_type(outputs[k].type)
        _expect(plan["outputs"][k] == want, what, f"outputs[{k}]",
                f"says {str(plan['outputs'][k])[:80]} but the graph's output {k} is {want}")
    for i, w in enumerate(p["writes"]):
        field = f"{here}.writes[{i}]"
        j = w.get("output") if isinstance(w, dict) else None
        _expect(_is_int(j) and 0 <= j < len(outputs), what, field,
                f"writes output {str(j)[:20]}, of {len(outputs)}")
        want = format_type(outputs[j].type)
        if "arg" in w:
            k = w["arg"]
            _expect(_is_int(k) and 0 <= k < len(arg_types), what, field,
                    f"names argument {str(k)[:20]}, of {len(arg_types)}")
            _expect(arg_types[k] == want, what, field,
                    f"writes output {j} ({want}) into argument {k} ({arg_types[k]})")
        else:
            name = w.get("state")
            _expect(name in state_types, what, field, f"names no state ({str(name)[:80]})")
            _expect(state_types[name] == want, what, field,
                    f"writes output {j} ({want}) into state {name} ({state_types[name]})")
    for name, e in (p.get("sets") or {}).items():
        field = f"{here}.sets[{name!r}]"
        _expect(name in state_types and isinstance(e, dict), what, field, "names no state")
        try:
            value = np.array(e.get("value"), dtype=np.dtype(e.get("dtype")))
        except (TypeError, ValueError):
            raise _plan_error(what, field, "is no array of its dtype") from None
        got = _type_of(list(value.shape), e.get("dtype"), what, field)
        _expect(got == state_types[name], what, field,
                f"sets {got} into state {name} ({state_types[name]})")
    counters = p.get("rng_counters")
    _expect(_is_int(counters) and counters >= 0, what, f"{here}.rng_counters",
            f"is {str(counters)[:20]}")
    if counters:
        _expect(state_types.get("rng") == "i64[2]", what, "state",
                "lacks the generator state rng (i64[2]) its random numbers advance")
    ranges = plan["code"]
    for kind in ("kernels", "gemms"):
        for i, k in enumerate(p.get(kind, [])):
            field = f"{here}.{kind}[{i}]"
            _expect(isinstance(k, dict) and _is_int(k.get("index")) and
                    k.get("symbol") in ranges, what, field,
                    "lacks a kernel index or names code the file does not hold")
            if kind == "kernels":
                slots = k.get("slots")
                _expect(isinstance(slots, list) and all(_is_int(v) and v >= 0 for v in slots),
                        what, f"{field}.slots", f"{str(slots)[:80]} are not buffer numbers")
    for key in p.get("native", []):
        _expect(isinstance(key, str) and NATIVE_PREFIX + key in ranges, what,
                f"{here}.native", f"names code the file does not hold ({str(key)[:80]})")
    for key, reason in p["fallbacks"].items():
        _expect(key.isdigit() and isinstance(reason, str), what, f"{here}.fallbacks",
                f"has a malformed entry {key[:20]!r}")
    for pair in p["donations"]:
        _expect(isinstance(pair, list) and len(pair) == 2 and all(_is_int(v) for v in pair)
                and 0 <= pair[0] < len(inputs) and 0 <= pair[1] < len(outputs), what,
                f"{here}.donations", f"has a malformed pair {str(pair)[:40]}")

def check_version(header: dict, what: str) -> None:
    if header.get("fusegrad") != __version__:
        raise ArtifactError("version", f"{what} was built by fusegrad {header.get('fusegrad')}; "
                            f"this is fusegrad {__version__}, which runs only artifacts of its "
                            "own version: rebuild it with fusegrad.aot.compile")
    # The object code's loops and the plan's launch extents come from one code generator:
    # another build of the same version may loop differently (its extents would not match).
    if header.get("codegen") != jit.codegen_identity()[:16]:
        raise ArtifactError("version", f"{what} was built by a fusegrad {__version__} whose "
                            "kernel code generator differs from this one's (another build of "
                            "the same version): rebuild it with fusegrad.aot.compile")


def check_header(header: dict, what: str) -> None:
    check_version(header, what)
    jit._init()
    triple = llvm.get_process_triple()
    if str(header.get("triple", "")).split("-")[0] != triple.split("-")[0]:
        raise ArtifactError("target", f"{what} holds code for {header.get('triple')}; this "
                            f"machine is {triple}")
    missing = sorted(set(header.get("features", ())) - set(_host_features()))
    if missing:
        raise ArtifactError("target", f"{what} was built for cpu {header.get('cpu')} and its code "
                            f"uses CPU features this machine lacks: {', '.join(missing)}. Build "
                            "it for a smaller CPU (fusegrad.aot.compile(..., cpu='x86-64-v3'))")


@functools.lru_cache(maxsize=1)
def _host_features() -> tuple[str, ...]:
    jit._init()
    return tuple(sorted(k for k, v in llvm.get_host_cpu_features().items() if v))
