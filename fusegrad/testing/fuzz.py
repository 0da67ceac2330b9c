"""A differential fuzzer: random programs run every way fusegrad can run them, compared.

Each program (see :mod:`fusegrad.testing.programs`) runs

- eagerly (the reference), with gradients through the tape for float inputs that require grad;
- traced and run by the IR interpreter after each pipeline of :data:`PIPELINES`;
- compiled by the LLVM backend after the default pipeline, with inputs requiring grad, so the
  compiled backward is checked too, and after one more pipeline of :data:`LLVM_PIPELINES`
  (which one turns with the program's number);
- compiled by the CUDA backend on the simulated driver (``cuda-sim``: the GPU lowering run
  by the kernel IR's interpreter; ``--no-cuda`` skips it), and with ``--nvcc sm_80,sm_90``
  the kernels it ran compiled to machine code by nvcc (:mod:`fusegrad.testing.nvcc`: warnings
  are errors, and a kernel that spills registers fails), many programs' kernels to one nvcc
  call;
- eagerly in float64 against central finite differences, when the program is smooth and its
  inputs are finite (this checks the VJP rules themselves);
- symbolic (``--no-symbolic`` skips it, ``--symbolic-only`` runs nothing else): compiled once
  with the input dims of one size marked dynamic, called at that size and at a smaller and a
  larger one (all >= 2; the same values' seeds), values and gradients compared with eager at
  each size. One compile must serve all three; a program that specialized is explained only
  by a reason of :data:`SPECIALIZATIONS` that the compiler recorded (a failed guard, or why
  it could not keep the size symbolic), and any other is a mismatch. The summary counts the
  programs, their compiles and the specializations by reason. ``--symbolic-cuda`` compiles
  it on the CUDA backend on the simulated driver instead of the LLVM backend (the GPU
  lowering's kernels reading their sizes at run time).

Values must agree within :func:`~fusegrad.testing.tolerance.tolerance`: exact for integers and
bools; NaN where eager has NaN and nowhere else; infinities of the same sign; floats within a
relative tolerance per dtype, grown with the number of ops and with the square root of the
elements summed, plus an absolute tolerance proportional to the largest finite magnitude the
output depends on (what cancellation can leave). A mismatch that a defect already reported
explains is filtered by :data:`KNOWN` (each entry names its item in issue 8); delete an entry
when its fix lands.

Command line (``make fuzz``)::

    python -m fusegrad.testing.fuzz --programs 10000 --budget 1800 --jobs 2

runs programs ``0..N-1`` of ``--seed`` in worker processes of ``--chunk`` programs each (a
crash or a hang, past ``--timeout`` seconds for one program, is reported as a failure and the
worker restarts after it), prints each unexplained mismatch with its program as fusegrad code,
reduced to a minimal program (``--no-shrink`` to skip), and a summary; it exits with status 1
when a mismatch is unexplained. ``--index I`` re-runs one program and prints its IR.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import queue
import random
import re
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import fusegrad as fg
from fusegrad.runtime import cuda as rt
from fusegrad.testing import nvcc
from fusegrad.testing.programs import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    NON_SMOOTH,
    Input,
    Op,
    Program,
    RandomChoices,
    ReplayChoices,
    describe,
    generate,
    namespace,
)
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.testing.tolerance import (
    CANCELLING,
    RTOL,
    _all_values,
    _ancestors,
    _finite_max,
    _flat,
    _np64,
    _Scale,
    _scales,
    compare,
    tolerance,
)

__all__ = ["PIPELINES", "LLVM_PIPELINES", "KNOWN", "Known", "Mismatch", "Result", "Settings",
           "check_program", "program_for", "shrink", "report", "main"]

# Interpreter pipelines; " " is no pass at all (an empty string means the default).
PIPELINES = (" ", "simplify,cse,dce", "fold,simplify,cse,dce", "fold", "cse,dce", "simplify")
# The default pipeline always runs on LLVM (with gradients); one of the others per program.
LLVM_PIPELINES = ("simplify,cse,dce", " ", "fold,simplify,cse,dce", "fold,cse")


# --------------------------------------------------------------------------- results


@dataclass
class Mismatch:
    """One disagreement: ``stage`` (``llvm[simplify,cse,dce]``, ``grad:llvm``, ``fd``, ...),
    where (``out[1]``, ``grad v0``), what, and the :data:`KNOWN` entry explaining it."""

    stage: str
    where: str
    message: str
    known: str | None = None

    def __str__(self) -> str:
        tag = f" (known: {self.known})" if self.known else ""
        return f"{self.stage} {self.where}: {self.message}{tag}"


@dataclass
class SymbolicRun:
    """What the symbolic stage did with a program: the symbol's sizes it was called at (the
    generated one first), how many compiles those calls took, and when they took more than
    one, the :data:`SPECIALIZATIONS` entry that explains why (``reason``) and the
    compiler's own words (``detail``); or why the stage could not run (``skipped``)."""

    sizes: tuple[int, ...] = ()
    compiles: int = 0
    reason: str | None = None
    detail: str | None = None
    skipped: str | None = None


@dataclass
class Result:
    """What one program did: its mismatches, whether eager rejected it, how long it took."""

    program: Program
    mismatches: list[Mismatch] = field(default_factory=list)
    invalid: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0     # CPU time of this process (LLVM compiles included)
    kernels: list = field(default_factory=list)    # the LoweredKernels cuda-sim ran
    symbolic: SymbolicRun | None = None            # what the symbolic stage did

    @property
    def unexplained(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.known is None]


@dataclass
class Settings:
    """Which ways to run each program."""

    pipelines: tuple[str, ...] = PIPELINES
    llvm_pipelines: tuple[str, ...] = LLVM_PIPELINES
    grads: bool = True
    finite_differences: bool = True
    extra_llvm: bool = True          # one more LLVM pipeline besides the default
    # The CUDA backend on the simulated driver: the GPU lowering run by the kernel IR's
    # interpreter (what can be checked of the GPU path without a GPU).
    cuda_sim: bool = True
    # The symbolic stage: compiled once with dynamic=True, called at three sizes.
    symbolic: bool = True
    # Only the symbolic stage (besides eager): ``--symbolic-only``.
    symbolic_only: bool = False
    # The backend the symbolic stage compiles on: "cuda" (``--symbolic-cuda``) is the CUDA
    # backend on the simulated driver.
    symbolic_backend: str = "llvm"


# --------------------------------------------------------------------------- running


def _tensors(arrays: list[np.ndarray], program: Program, grad: bool) -> list:
    out = []
    for a, spec in zip(arrays, program.inputs):
        t = fg.from_numpy(a.copy())
        if grad and spec.requires_grad:
            t.requires_grad_()
        out.append(t)
    return out


def _cotangents(outs: list, seed: int = 7) -> list:
    rng = np.random.default_rng(seed)
    return [fg.from_numpy(rng.standard_normal(tuple(o.shape)).astype(np.float64)).to(o.dtype)
            for o in outs]


def _grads(outs: list, inputs: list) -> tuple[list, list[bool]]:
    """Gradients of sum(out * cotangent) for the inputs that require grad (None: unused)."""
    flags = [isinstance(o, fg.Tensor) and o.requires_grad for o in outs]
    diff = [o for o, f in zip(outs, flags) if f]
    wrt = [t for t in inputs if t.requires_grad]
    if not diff or not wrt:
        return [None] * len(wrt), flags
    grads = fg.autograd.grad(diff, wrt, _cotangents(diff), allow_unused=True)
    return [None if g is None else g.detach() for g in grads], flags


class _Fg16As32:
    """``fusegrad`` with float16 and bfloat16 read as a wider float: runs a program with its
    16-bit intermediates unrounded, or all in float64 (``wide=fg.float64``)."""

    def __init__(self, wide=fg.float32, all_floats: bool = False):
        self._wide = wide
        self._names = FLOAT_DTYPES if all_floats else HALF_DTYPES

    def __getattr__(self, name):
        return self._wide if name in self._names else getattr(fg, name)


def check_program(program: Program, settings: Settings | None = None, index: int = 0) -> Result:
    """Run ``program`` every way (see the module docstring) and list the mismatches, each
    marked with the :data:`KNOWN` entry that explains it, if any."""
    settings = settings or Settings()
    start, cpu = time.perf_counter(), time.process_time()
    result = Result(program)
    try:
        _check(program, settings, index, result)
    finally:
        result.seconds = time.perf_counter() - start
        result.cpu_seconds = time.process_time() - cpu
    for m in result.mismatches:
        m.known = explain(program, m)
    return result


def _check(program: Program, settings: Settings, index: int, result: Result) -> None:
    arrays = program.arrays()
    fn = program.function()
    want_grad = settings.grads and any(s.requires_grad for s in program.inputs)
    # Eager: the reference.
    try:
        with fg.enable_grad():
            eager_ins = _tensors(arrays, program, want_grad)
            eager_outs = _flat(fn(*eager_ins))      # their graph gives the eager gradients
            want = [o.detach() if isinstance(o, fg.Tensor) else o for o in eager_outs]
    except Exception as e:  # noqa: BLE001 - a program eager rejects is not a compiler bug
        result.invalid = f"eager raised {type(e).__name__}: {e}"
        return
    every_value = _all_values(program, arrays)
    scales = _scales(program, every_value)
    if settings.symbolic:
        result.symbolic = _check_symbolic(program, result, settings.grads,
                                          settings.symbolic_backend)
    if settings.symbolic_only:
        return

    def check_values(stage: str, got) -> None:
        _check_values(result, stage, got, want, scales)

    def run_compiled(stage: str, make: Callable, grad: bool):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cf = make()
                with fg.set_grad_enabled(grad):
                    ins = _tensors(arrays, program, grad)
                    return cf, ins, _flat(cf(*ins))
        except Exception as e:  # noqa: BLE001 - eager ran it: any error is a mismatch
            result.mismatches.append(Mismatch(stage, "call", _error(e)))
            return None

    for p in settings.pipelines:
        stage = f"interpreter[{p.strip()}]"
        run = run_compiled(stage, lambda p=p: fg.compile(fn, backend="interpreter", pipeline=p,
                                                         fullgraph=True), False)
        if run:
            check_values(stage, run[2])

    llvm = run_compiled("llvm", lambda: fg.compile(fn, fullgraph=True), want_grad)
    if llvm:
        check_values("llvm", llvm[2])
    if settings.cuda_sim:
        with _simulated_cuda() as drv:
            run = run_compiled("cuda-sim", lambda: fg.compile(fn, backend="cuda",
                                                              fullgraph=True), False)
        result.kernels = drv.kernels
        if run:
            check_values("cuda-sim", run[2])
    if settings.extra_llvm and len(settings.llvm_pipelines) > 1:
        p = settings.llvm_pipelines[1 + index % (len(settings.llvm_pipelines) - 1)]
        stage = f"llvm[{p.strip()}]"
        run = run_compiled(stage, lambda: fg.compile(fn, pipeline=p, fullgraph=True), False)
        if run:
            check_values(stage, run[2])

    if not want_grad:
        return
    # Gradients: eager tape against the compiled backward.
    try:
        with fg.enable_grad():
            eager_grads, eager_flags = _grads(eager_outs, eager_ins)
    except Exception as e:  # noqa: BLE001 - eager autograd rejects it: no reference
        result.invalid = f"eager backward raised {type(e).__name__}: {e}"
        return
    if llvm:
        _, ins, outs = llvm
        try:
            with fg.enable_grad():
                got_grads, flags = _grads(outs, ins)
        except Exception as e:  # noqa: BLE001
            result.mismatches.append(Mismatch("grad:llvm", "backward", _error(e)))
            got_grads, flags = None, eager_flags
        if flags != eager_flags:
            result.mismatches.append(Mismatch("grad:llvm", "requires_grad",
                                              f"outputs requiring grad {flags}, eager "
                                              f"{eager_flags}"))
        elif got_grads is not None:
            _check_grads(program, "grad:llvm", got_grads, eager_grads, result, scales,
                         every_value, arrays)
    if settings.finite_differences:
        _check_finite_differences(program, arrays, result)



def _check_values(result: Result, stage: str, got, want: list, scales: list[_Scale]) -> None:
    """Record in ``result`` where outputs ``got`` differ from eager's ``want`` beyond the
    tolerance of their :func:`~fusegrad.testing.tolerance._scales`."""
    got = _flat(got)
    if len(got) != len(want):
        result.mismatches.append(Mismatch(stage, "outputs", f"{len(got)} outputs, "
                                          f"expected {len(want)}"))
        return
    for k, (g, w) in enumerate(zip(got, want)):
        # A float64 result of float32 math is as accurate as float32.
        dt = max((w.dtype.name, scales[k].dtype or w.dtype.name), key=RTOL.get) \
            if w.dtype.is_floating_point else None
        rtol, atol = (tolerance(dt, scales[k].n_ops, scales[k].n_summed, scales[k].magnitude)
                      if w.dtype.is_floating_point else (0.0, 0.0))
        msg = compare(g, w, rtol, atol, scales[k].unordered)
        if msg and scales[k].jump and "differ" in msg:
            msg = None      # a float-to-integer step of a value within tolerance of it
        if msg:
            result.mismatches.append(Mismatch(stage, f"out[{k}]", msg))


# --------------------------------------------------------------------------- symbolic stage


def symbol_candidates(program: Program) -> list[tuple[int, tuple[int, int]]]:
    """The sizes the symbolic stage may vary, best first, each with the two other sizes to
    call at: ``(n, (smaller, larger))``, or two larger ones when no smaller size is left.
    Every input dim of size ``n`` is marked dynamic, and they share one symbol (duck
    sizing), so they change together, to sizes >= 2 that no other input dim has (the
    program's broadcasts stay as drawn). The leading dim of the first input comes first,
    then the sizes most dims have."""
    dims = [d for s in program.inputs for d in s.shape]
    counts = {n: dims.count(n) for n in dims if n >= 2}
    lead = next((s.shape[0] for s in program.inputs if s.shape), None)
    order = sorted(counts, key=lambda n: (n != lead, -counts[n], n))
    out = []
    for n in order:
        avoid = set(dims) - {n}
        smaller = [m for m in range(n - 1, 1, -1) if m not in avoid][:1]
        larger = [m for m in range(n + 1, n + 8) if m not in avoid][:2 - len(smaller)]
        out.append((n, tuple(smaller + larger)))
    return out


def resized(program: Program, n: int, m: int) -> Program:
    """``program`` with every input dim of size ``n`` of size ``m`` (same values' seeds)."""
    nodes = [dataclasses.replace(node, shape=tuple(m if d == n else d for d in node.shape))
             if isinstance(node, Input) else node for node in program.nodes]
    return Program(nodes, list(program.outputs))


# Why a program may legitimately take more than one compile for its three sizes: each entry
# names the reason and recognises the compiler's words for it (a recompile reason or a
# FUSEGRAD_DEBUG line). A specialization no entry recognises is a failure of the stage.
_TOOK = r"is not valid at this call's sizes \(the trace took .* at size (\d+)\)"
SPECIALIZATIONS: dict[str, tuple[str, Callable[[str], bool]]] = {
    # x.expand(2, -1, 4), x.reshape(6, -1), F.pad to a literal width: the trace answered
    # `s0 == 6` False (a symbol is no particular size) and guards that; a call of that size
    # compiles for it.
    "literal-size": ("a size equal to a literal size the program names",
                     lambda d: bool(re.search(r"assumed [^;]* != ([2-9]|\d\d+), but .* is \d+ "
                                              r"in this call", d)
                                    or (m := re.search(_TOOK, d)) and int(m.group(1)) >= 2)),
    # A size or an expression of it that is 0 or 1 at the traced size (x[2:] at size 2, a
    # broadcast of floor(s0/3)): emptiness and broadcasting change there, as torch's 0/1
    # specialization says.
    "zero-one": ("an expression of the size is 0 or 1 at the traced size",
                 lambda d: bool((m := re.search(_TOOK, d)) and int(m.group(1)) <= 1
                                or re.search(r"assumed [^;]* != [01], but .* is [01] in this call",
                                             d))),
    # x[2:3], x.narrow(0, 6, 0), x[:, 1:3]: a literal bound is clamped to the size, so the
    # result's length depends on which side of the bound the size is.
    "literal-bound": ("a literal slice bound on one side of the size",
                      lambda d: bool(re.search(r"assumed [^;]* (<|<=|>|>=) -?\d+, but .* is \d+ "
                                               r"in this call", d))),
    # x.reshape(6, -1) of [s0, 3]: 3*s0 divisible by 6, guarded as the remainder's value.
    "divisibility": ("a literal reshape needs the size to divide",
                     lambda d: bool(re.search(r"assumed .*floor\(.* == 0", d))),
}


def _reason_of(detail: str) -> str | None:
    for name, (_, applies) in SPECIALIZATIONS.items():
        if applies(detail):
            return name
    return None


@dataclass
class _At:
    """Eager at one size of the symbol: the arrays, outputs, tolerance scales, every value,
    and the gradients of the inputs that require grad (None: no gradient check)."""

    program: Program
    arrays: list
    want: list
    scales: list
    values: list
    grads: list | None = None
    flags: list | None = None


def _eager_at(program: Program, grad: bool) -> _At | None:
    """Eager on ``program``'s own arrays; None when eager rejects it (the program's literal
    sizes fix the varied dim)."""
    arrays = program.arrays()
    try:
        with fg.enable_grad():
            ins = _tensors(arrays, program, grad)
            outs = _flat(program.function()(*ins))
        values = _all_values(program, arrays)
        at = _At(program, arrays, [o.detach() if isinstance(o, fg.Tensor) else o for o in outs],
                 _scales(program, values), values)
    except Exception:  # noqa: BLE001 - not a program at this size
        return None
    if grad:
        try:
            at.grads, at.flags = _grads(outs, ins)
        except Exception:  # noqa: BLE001 - eager autograd rejects it: no reference
            pass
    return at


def _marked(tensors: list, n: int, program: Program) -> list:
    """``tensors`` with the dims that have size ``n`` in ``program`` marked dynamic."""
    for t, spec in zip(tensors, program.inputs):
        dims = [d for d, k in enumerate(spec.shape) if k == n]
        if dims:
            fg.mark_dynamic(t, dims)
    return tensors


def _check_symbolic(program: Program, result: Result, grads: bool = True,
                    backend: str = "llvm") -> SymbolicRun:
    """The symbolic stage: ``program`` compiled once (on ``backend``; "cuda" on the
    simulated driver), the input dims of one size marked dynamic
    (:func:`fusegrad.mark_dynamic`), and called at three sizes of that symbol (see
    :func:`symbol_candidates`), values and gradients each compared with eager at that size;
    more than one compile is a mismatch unless :data:`SPECIALIZATIONS` explains it."""
    grad = grads and any(s.requires_grad for s in program.inputs)
    runs = None
    for n, others in symbol_candidates(program):
        if len(others) < 2:
            continue
        refs = [_eager_at(p, grad) for p in [program] + [resized(program, n, m) for m in others]]
        if all(r is not None for r in refs):
            runs = list(zip((n,) + others, refs))
            break
    if runs is None:
        why = "no input dim of size >= 2" if not symbol_candidates(program) else \
            "eager rejects every other size of each dim (literal sizes in the program)"
        return SymbolicRun(skipped=why)
    sym = SymbolicRun(sizes=tuple(m for m, _ in runs))
    fn = program.function()
    log = io.StringIO()
    debug = fg.config.debug
    device = _simulated_cuda() if backend == "cuda" else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log), device:
            warnings.simplefilter("ignore")
            fg.config.debug = max(debug, 1)
            cf = fg.compile(fn, fullgraph=True, backend=backend)
            for m, at in runs:
                stage = f"symbolic[{sym.sizes[0]}->{m}]"
                try:
                    with fg.set_grad_enabled(grad):
                        ins = _marked(_tensors(at.arrays, at.program, grad), n, program)
                        outs = _flat(cf(*ins))
                except Exception as e:  # noqa: BLE001 - eager ran it: any error is a mismatch
                    result.mismatches.append(Mismatch(stage, "call", _error(e)))
                    continue
                _check_values(result, stage, outs, at.want, at.scales)
                if at.grads is None:
                    continue
                try:
                    with fg.enable_grad():
                        got, flags = _grads(outs, ins)
                except Exception as e:  # noqa: BLE001
                    result.mismatches.append(Mismatch("grad:" + stage, "backward", _error(e)))
                    continue
                if flags != at.flags:
                    result.mismatches.append(Mismatch("grad:" + stage, "requires_grad",
                                                      f"outputs requiring grad {flags}, eager "
                                                      f"{at.flags}"))
                else:
                    _check_grads(at.program, "grad:" + stage, got, at.grads, result, at.scales,
                                 at.values, at.arrays)
    finally:
        fg.config.debug = debug
    sym.compiles = cf.compiles
    if cf.compiles > 1:
        said = [line.removeprefix("[fusegrad] ") for line in log.getvalue().splitlines()
                if "symbolic" in line and ("not supported" in line or "not valid" in line)]
        # The causes: what the compiler said it could not keep symbolic, and the guards that
        # failed (a recompile for a changed shape or by automatic dynamic follows a static
        # compile whose cause is said).
        causes = said + [r for r in cf.recompile_reasons
                         if r.startswith("the symbolic trace assumed")]
        sym.detail = "; ".join(said + list(cf.recompile_reasons)) or "no reason recorded"
        reasons = {_reason_of(d) for d in causes} if causes else {None}
        sym.reason = ",".join(sorted(reasons)) if None not in reasons else None
        if sym.reason is None:
            result.mismatches.append(Mismatch(
                "symbolic", "compiles", f"{cf.compiles} compiles for sizes {list(sym.sizes)}: "
                f"{sym.detail}"))
    return sym


@contextlib.contextmanager
def _simulated_cuda():
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        yield drv
    finally:
        rt.set_driver(None)


def _descendants(program: Program, source: int) -> set[int]:
    """Node ``source`` and every node computed from it (the dual of :func:`_ancestors`)."""
    below = {source}
    for i, node in enumerate(program.nodes):
        if i > source and isinstance(node, Op) and below.intersection(node.args):
            below.add(i)
    return below


def _path_dtype(program: Program, values: list, source: int) -> str | None:
    """The least precise float dtype among the values on the paths from node ``source`` to
    the outputs: the precision of ``source``'s gradient (a float64 input cast to float16
    gets a gradient as accurate as float16 math, and one summed in float16 where the paths
    of several outputs meet, as eager autograd does)."""
    above = set().union(*(_ancestors(program, o) for o in program.outputs))
    path = _descendants(program, source) & above
    # The VJPs along the path read the other operands of its ops too (the gradient of
    # `x * y` is `y`): a float32 `y` makes a float64 `x`'s gradient as accurate as float32.
    read = set(path).union(*(program.nodes[j].args for j in path
                             if isinstance(program.nodes[j], Op)))
    floats = [values[j].dtype.name for j in read
              if isinstance(values[j], fg.Tensor) and values[j].dtype.is_floating_point]
    return max(floats, key=RTOL.__getitem__, default=None)


def _grad_tolerance(program: Program, g, scales: list[_Scale],
                    dtype: str | None = None) -> tuple[float, float]:
    n_ops = len(program.ops)
    n_summed = max(s.n_summed for s in scales) * max(1, max(o.numel() for o in [g]))
    dt = max((g.dtype.name, dtype or g.dtype.name), key=RTOL.__getitem__)
    rtol = RTOL[dt] * (2 + n_ops) * math.sqrt(max(n_summed, 1))
    # A VJP through a cancelling op (layer_norm over 2 elements: a gradient of 5e-6 from
    # terms of the cotangents' size, about 1) can cancel to far below its terms; their
    # size, not the gradient's, sets the absolute error.
    terms = 1.0 if program.op_kinds() & CANCELLING else 1e-30
    return rtol, rtol * max(_finite_max(g), terms) + 1e-30


def _check_grads(program: Program, stage: str, got: list, want: list, result: Result,
                 scales: list[_Scale], values: list | None = None,
                 arrays: list[np.ndarray] | None = None) -> None:
    ids = [i for i, s in zip(program.input_ids, program.inputs) if s.requires_grad]
    for i, g, w in zip(ids, got, want):
        name = f"v{i}"
        if (g is None) != (w is None):
            # An unused input: None from one side, zeros from the other is the same thing.
            t = g if g is not None else w
            if not np.all(_np64(t) == 0):
                result.mismatches.append(Mismatch(stage, f"grad {name}",
                                                  f"{'got' if g is not None else 'missing'} "
                                                  "a gradient where the other has none"))
            continue
        if g is None:
            continue
        path = _path_dtype(program, values, i) if values is not None else None
        rtol, atol = _grad_tolerance(program, w, scales, path)
        # A product that overflows on the way leaves its gradient (out / x) order-dependent.
        unordered = any(sc.unordered for sc in scales)
        msg = compare(g, w, rtol, atol, unordered)
        if msg and "differ" in msg and _reaches_a_jump(program, i, scales):
            # An output it reaches is at a jump (a comparison at rounding noise, which side
            # the order of a sum falls on): the gradient jumps with it, as its value does.
            msg = None
        if msg and "differ" in msg and arrays is not None:
            msg = _ill_conditioned(program, arrays, i, g, w, rtol, atol, unordered, msg)
        if msg:
            result.mismatches.append(Mismatch(stage, f"grad {name}", msg))


def _reaches_a_jump(program: Program, i: int, scales: list[_Scale]) -> bool:
    """Whether input ``i`` reaches an output whose value is at a jump (``_Scale.jump``)."""
    below = _descendants(program, i)
    return any(scales[k].jump for k, o in enumerate(program.outputs) if o in below)


def _ill_conditioned(program: Program, arrays: list[np.ndarray], i: int, got, want,
                     rtol: float, atol: float, unordered: bool, msg: str) -> str | None:
    """``msg``, or None when the gradient of input ``i`` is too ill-conditioned for eager
    and compiled to agree within ``atol`` (only asked after a mismatch: it runs the
    program twice more):

    - its terms are far larger than it: a cotangent of an intermediate value (eager's,
      of the same loss) sets the absolute error of the cancelling VJPs after it
      (``log2`` of a value near 0 makes a cotangent of 1e17, a ``layer_norm``'s VJP then
      cancels it to 22, which one ulp of 1e17 moves by 16);
    - eager's own gradient is as far from the gradient computed with every float widened
      to float64 (``cos`` of a float32 matmul result of 1e5: one ulp of the product moves
      the gradient by 1%): compiled is then no less accurate than eager."""
    terms = _cotangent_sizes(program, arrays).get(i)
    if terms is not None and compare(got, want, rtol, rtol * terms + atol, unordered) is None:
        return None
    exact = _wide_gradient(program, arrays, i)
    if exact is None or tuple(exact.shape) != tuple(want.shape):
        return msg
    g, w = _np64(got).astype(np.float64), _np64(want).astype(np.float64)
    finite = np.isfinite(g) & np.isfinite(w) & np.isfinite(exact)
    with np.errstate(invalid="ignore", over="ignore"):
        slack = 2 * np.abs(w - exact) + atol + rtol * np.abs(exact)
        worse = finite & (np.abs(g - exact) > slack)
    same_rest = np.array_equal(np.where(finite, 0, g), np.where(finite, 0, w), equal_nan=True)
    return msg if worse.any() or not same_rest else None


def _cotangent_sizes(program: Program, arrays: list[np.ndarray]) -> dict[int, float]:
    """Per input that requires grad: the largest finite cotangent (eager, of the fuzzer's
    loss) of any intermediate float value it reaches the outputs through."""
    rg = {i for i, s in zip(program.input_ids, program.inputs) if s.requires_grad}
    every = Program(program.nodes, list(range(len(program.nodes))))
    scope = dict(namespace())
    exec(compile(every.source().replace("def program(", "def program_all("),  # noqa: S102
                 "<fuzz program>", "exec"), scope)
    try:
        with fg.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ins = _tensors(arrays, program, True)
            vals = list(scope["program_all"](*ins))
            outs = [o for o in _flat([vals[k] for k in program.outputs])
                    if isinstance(o, fg.Tensor) and o.requires_grad]
            mids = [k for k, v in enumerate(vals) if k not in rg and isinstance(v, fg.Tensor)
                    and v.requires_grad]
            if not outs or not mids:
                return {}
            cots = fg.autograd.grad(outs, [vals[k] for k in mids], _cotangents(outs),
                                    allow_unused=True)
    except Exception:  # noqa: BLE001 - in-place ops can leave no gradient per value
        return {}
    size = {k: _finite_max(c) for k, c in zip(mids, cots)}
    return {i: max((size.get(j, 0.0) for j in _descendants(program, i)), default=0.0)
            for i in rg}


def _widened(program: Program, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], Callable]:
    """``arrays`` with every float one as float64, and the program reading every float
    dtype as float64 (call it with float64 the default dtype)."""
    wide = [a.astype(np.float64) if (a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16)
            else a for a in arrays]
    return wide, program.function(namespace(_Fg16As32(fg.float64, all_floats=True)))


def _wide_gradient(program: Program, arrays: list[np.ndarray], i: int) -> np.ndarray | None:
    """Eager gradient of input ``i`` with every float read as float64, as float64."""
    rg = [k for k, s in enumerate(program.inputs) if s.requires_grad]
    k = program.input_ids.index(i)
    wide, fn = _widened(program, arrays)
    default = fg.get_default_dtype()
    fg.set_default_dtype(fg.float64)
    try:
        with fg.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ins = [fg.from_numpy(a.copy()) for a in wide]
            for r in rg:
                ins[r].requires_grad_()
            outs = [o for o in _flat(fn(*ins)) if isinstance(o, fg.Tensor) and o.requires_grad]
            if not outs:
                return None
            g, = fg.autograd.grad(outs, [ins[k]], _cotangents(outs), allow_unused=True)
    except Exception:  # noqa: BLE001 - valid at its own dtypes only: no reference
        return None
    finally:
        fg.set_default_dtype(default)
    return None if g is None else _np64(g).astype(np.float64)


def smooth(program: Program) -> bool:
    """No op with a kink or a jump, and no 16-bit or integer float conversion."""
    return not (program.op_kinds() & NON_SMOOTH)


def _check_finite_differences(program: Program, arrays: list[np.ndarray], result: Result,
                              max_points: int = 8) -> None:
    """Eager gradients in float64 against central differences, on a few elements: every
    float dtype of the program read as float64, and float64 the default dtype (an integer's
    sigmoid is float64 too). A program that is invalid so widened has no reference."""
    default = fg.get_default_dtype()
    fg.set_default_dtype(fg.float64)
    try:
        _check_finite_differences_wide(program, arrays, result, max_points)
    except Exception:  # noqa: BLE001 - valid at its own dtypes only: nothing to check
        pass
    finally:
        fg.set_default_dtype(default)


def _check_finite_differences_wide(program: Program, arrays: list[np.ndarray], result: Result,
                              max_points: int = 8) -> None:
    """Eager gradients in float64 against central differences, on a few elements."""
    rg = [k for k, s in enumerate(program.inputs) if s.requires_grad]
    # Every float input plain: a step of 1e-6 vanishes next to a huge operand (x - y with
    # |x| ~ 1e300 does not move when y does), so a wide-range input makes no estimate.
    if not smooth(program) or any(s.values not in ("normal", "positive")
                                  for s in program.inputs if s.dtype in FLOAT_DTYPES):
        return
    if any(not np.all(np.isfinite(a.astype(np.float64))) for a in arrays
           if a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16):
        return
    # So must the integers that enter the float math: next to 2**31 one ulp of a float64 is
    # 5e-7, and a step of 1e-6 moves `n - x` by two ulps or none (seed 9, program 642).
    if any(a.size and np.max(np.abs(a.astype(np.float64))) > 2.0 ** 20 for a in arrays
           if a.dtype.kind in "iu"):
        return
    wide, fn = _widened(program, arrays)

    def loss(ins) -> tuple:
        outs = [o for o in _flat(fn(*ins)) if isinstance(o, fg.Tensor)
                and o.dtype.is_floating_point]
        return outs

    with fg.enable_grad():
        ins = [fg.from_numpy(a.copy()) for a in wide]
        for k in rg:
            ins[k].requires_grad_()
        outs = [o for o in loss(ins) if o.requires_grad]
        if not outs:
            return
        cts = _cotangents(outs)
        grads = fg.autograd.grad(outs, [ins[k] for k in rg], cts, allow_unused=True)
    flags = [o.requires_grad for o in loss([fg.from_numpy(a.copy()).requires_grad_()
                                            if k in rg else fg.from_numpy(a.copy())
                                            for k, a in enumerate(wide)])]

    def value(arrs) -> float:
        with fg.no_grad():
            outs = [o for o, f in zip(loss([fg.from_numpy(a) for a in arrs]), flags) if f]
            return float(sum(np.sum(_np64(o) * _np64(c)) for o, c in zip(outs, cts)))

    rng = random.Random(0)
    for k, g in zip(rg, grads):
        a = wide[k]
        if a.size == 0:
            continue
        gk = np.zeros(a.shape) if g is None else _np64(g)
        for flat in rng.sample(range(a.size), min(a.size, max_points)):
            idx = np.unravel_index(flat, a.shape) if a.ndim else ()
            x = float(a[idx])
            h = 1e-6 * max(1.0, abs(x))
            est = []
            for step in (h, h / 8):
                plus, minus = [w.copy() for w in wide], [w.copy() for w in wide]
                plus[k][idx] = x + step
                minus[k][idx] = x - step
                est.append((value(plus) - value(minus)) / (2 * step))
            scale = max(1.0, abs(est[0]), float(np.max(np.abs(gk))) if gk.size else 1.0)
            # Both steps must disagree with the gradient: one can straddle a rounding jump.
            if all(abs(e - gk[idx]) > 1e-4 * scale for e in est):
                result.mismatches.append(Mismatch(
                    "fd", f"grad v{program.input_ids[k]}{list(idx)}",
                    f"eager float64 gradient {gk[idx]!r}, central differences {est[0]!r}"))
                return


def _error(e: BaseException) -> str:
    text = f"raised {type(e).__name__}: {e}"
    return text if len(text) < 400 else text[:400] + "..."


# --------------------------------------------------------------------------- known defects


@dataclass(frozen=True)
class Known:
    """A defect already reported (``item`` in issue 8) and how to recognise its mismatches."""

    item: str
    description: str
    applies: Callable[[Program, Mismatch], bool]


def _uses(program: Program, *names: str) -> bool:
    return bool(program.op_kinds() & set(names))


def _has_values(program: Program, *kinds: str) -> bool:
    return any(s.values in kinds for s in program.inputs)


def _is_value(m: Mismatch) -> bool:
    return not m.stage.startswith(("grad", "fd")) and m.where != "call"


# Every defect of issue 8 that this list named (items 1, 2, 3, 4, 5, 7, 9 and 10) is fixed;
# the fuzzer now checks each fix on every program. An entry looks like
#     "sin-cos-huge": Known("2", "compiled sin/cos lose their range reduction above 1e6",
#                           lambda p, m: m.stage.startswith("llvm") and _uses(p, "sin", "cos")
#                           and _has_values(p, "special", "wide")),
KNOWN: dict[str, Known] = {}


def explain(program: Program, m: Mismatch) -> str | None:
    """The :data:`KNOWN` entry that explains ``m``, or None."""
    for name, known in KNOWN.items():
        try:
            if known.applies(program, m):
                return name
        except Exception:  # noqa: BLE001 - a filter that fails explains nothing
            continue
    return None


# --------------------------------------------------------------------------- programs


def program_for(seed: int, index: int, max_ops: int = 8) -> tuple[Program, list[int]]:
    """Program ``index`` of the run with ``seed`` (and the draws it was made from)."""
    choices = RandomChoices(seed * 1_000_003 + index)
    return generate(choices, max_ops=max_ops), choices.drawn


def shrink(drawn: list[int], fails: Callable[[Program], bool], budget_s: float = 60.0,
           max_ops: int = 8) -> Program:
    """The smallest program found, replaying reduced draws, that still ``fails``.

    A greedy reduction of the choice sequence, as hypothesis does it: delete the draws of
    whole ops (one op fewer), then lower each draw to zero, by one or by half, then delete
    small blocks of draws; keep a change when the program made from it still fails.
    """
    best = list(drawn)
    deadline = time.monotonic() + budget_s
    layout = ReplayChoices(best)
    generate(layout, max_ops=max_ops)
    spans, count_at = layout.spans, layout.count_at

    def attempt(candidate: list[int]) -> bool:
        nonlocal best, spans, count_at
        if time.monotonic() > deadline or candidate == best:
            return False
        choices = ReplayChoices(candidate)
        program = generate(choices, max_ops=max_ops)
        used = choices.used
        # Only a shortlex-smaller sequence is progress (clamped draws can replay the same).
        if (len(used), used) >= (len(best), best):
            return False
        try:
            ok = fails(program)
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            best, spans, count_at = used, choices.spans, choices.count_at
        return ok

    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        k = len(spans) - 1
        while k >= 0:
            if k < len(spans) and count_at >= 0 and best[count_at] > 0:
                a, b = spans[k]
                cand = best[:a] + best[b:]
                cand[count_at] -= 1
                improved |= attempt(cand)
            k -= 1
        i = 0
        while i < len(best):
            for smaller in (0, best[i] - 1, best[i] // 2):
                if 0 <= smaller < best[i] and attempt(best[:i] + [smaller] + best[i + 1:]):
                    improved = True
                    break
            i += 1
        for size in (4, 2, 1):
            i = 0
            while i < len(best):
                if attempt(best[:i] + best[i + size:]):
                    improved = True
                else:
                    i += size
    return generate(ReplayChoices(best), max_ops=max_ops)


def ir_text(program: Program) -> str:
    """The traced graph of ``program`` on its inputs (or why tracing failed)."""
    try:
        ins = [fg.from_numpy(a) for a in program.arrays()]
        return str(fg.trace(program.function(), *ins))
    except Exception as e:  # noqa: BLE001
        return f"(tracing raised {type(e).__name__}: {e})"


def report(result: Result, with_ir: bool = True) -> str:
    """A failing program as fusegrad code (with its inputs), its IR and its mismatches."""
    lines = [str(m) for m in result.mismatches]
    text = "\n".join(lines) + "\n\n" + describe(result.program)
    if with_ir:
        text += "\n# IR:\n" + "\n".join("# " + line for line in ir_text(result.program).splitlines())
    return text


# --------------------------------------------------------------------------- command line


def _signature(m: Mismatch) -> str:
    return m.stage.split("[")[0] + ":" + ("call" if m.where == "call" else m.where.split("[")[0][:4])


def nvcc_check(programs: list[tuple[int, list]], archs: tuple[str, ...]) -> dict:
    """The kernels of ``programs`` (``(index, kernels)`` pairs) compiled by nvcc for
    ``archs`` in one call; when it fails, each half again, down to the programs that fail.
    Returns the ``nvcc`` event: the programs and kernels compiled, the largest register
    count, and per failing program its errors or spilled kernels."""
    event = {"event": "nvcc", "indices": [i for i, _ in programs], "kernels": 0,
             "max_registers": 0, "failures": {}}

    def check(part: list[tuple[int, list]]) -> None:
        kernels: dict = {}
        for index, ks in part:
            kernels.update(nvcc.named_apart(ks, f"p{index}_"))
        if not kernels:
            return
        report = nvcc.compile_kernels(kernels, archs)
        if report.errors and len(part) > 1:
            half = len(part) // 2
            check(part[:half])
            check(part[half:])
            return
        event["kernels"] += len(kernels)
        event["max_registers"] = max(event["max_registers"], report.max_registers)
        if report.errors:
            event["failures"][str(part[0][0])] = report.errors[-3000:]
        for index, _ in part:
            spilled = [f"{k.name} ({k.arch}): {k.spill_stores} B stored, {k.spill_loads} B "
                       f"loaded" for k in report.spilled() if k.name.startswith(f"p{index}_")]
            if spilled:
                event["failures"][str(index)] = "spills: " + "; ".join(spilled)
    check(programs)
    return event


def _archs(text: str | None) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip()) if text else ()


def _settings(args) -> Settings:
    return Settings(finite_differences=not args.no_fd, cuda_sim=not args.no_cuda,
                    symbolic=not args.no_symbolic, symbolic_only=args.symbolic_only,
                    symbolic_backend="cuda" if args.symbolic_cuda else "llvm")


class _SymbolicTally:
    """The symbolic stage over a run: programs it ran and skipped (by why), their compiles,
    and the specializations by :data:`SPECIALIZATIONS` reason."""

    def __init__(self):
        self.ran = 0
        self.skipped: dict[str, int] = {}
        self.compiles: dict[int, int] = {}
        self.reasons: dict[str, int] = {}
        self.unexplained = 0

    def add(self, sym: dict) -> None:
        if sym["skipped"]:
            self.skipped[sym["skipped"]] = self.skipped.get(sym["skipped"], 0) + 1
            return
        self.ran += 1
        self.compiles[sym["compiles"]] = self.compiles.get(sym["compiles"], 0) + 1
        if sym["compiles"] > 1:
            if sym["reason"]:
                for r in sym["reason"].split(","):
                    self.reasons[r] = self.reasons.get(r, 0) + 1
            else:
                self.unexplained += 1

    def summary(self) -> str:
        compiles = ", ".join(f"{n} with {k} compile{'s' * (k > 1)}"
                             for k, n in sorted(self.compiles.items()))
        lines = [f"symbolic stage: {self.ran} programs called at three sizes ({compiles or 'none'}); "
                 f"{self.unexplained} unexplained specializations"]
        lines += [f"  specialized ({r}: {SPECIALIZATIONS[r][0]}): {n} programs"
                  for r, n in sorted(self.reasons.items())]
        lines += [f"  not run ({why}): {n} programs" for why, n in sorted(self.skipped.items())]
        return "\n".join(lines)


def _run_worker(args) -> int:
    """Run programs ``start .. start+count-1``, one JSON line each, on stdout; with
    ``--nvcc``, an ``nvcc`` line after each ``--nvcc-batch`` programs."""
    out = sys.stdout
    settings = _settings(args)
    archs = _archs(args.nvcc)
    batch: list[tuple[int, list]] = []

    def flush() -> None:
        if batch:
            print(json.dumps(nvcc_check(batch, archs)), file=out, flush=True)
            batch.clear()
    for index in range(args.start, args.start + args.count):
        print(json.dumps({"event": "start", "index": index}), file=out, flush=True)
        program, drawn = program_for(args.seed, index, args.max_ops)
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                result = check_program(program, settings, index)
            except Exception:  # noqa: BLE001 - the fuzzer's own failure: report, go on
                result = Result(program, [Mismatch("fuzzer", "check", traceback.format_exc(
                    limit=4))])
        record = {"event": "done", "index": index, "seconds": round(result.seconds, 4),
                  "cpu_seconds": round(result.cpu_seconds, 4),
                  "invalid": result.invalid, "ops": len(program.ops),
                  "mismatches": [asdict(m) for m in result.mismatches],
                  "symbolic": asdict(result.symbolic) if result.symbolic else None}
        bad = result.unexplained
        if bad:
            record["source"] = report(result)
            if not args.no_shrink:
                sigs = {_signature(m) for m in bad}

                def fails(p: Program, sigs=sigs, index=index) -> bool:
                    r = check_program(p, settings, index)
                    return bool({_signature(m) for m in r.unexplained} & sigs)
                with contextlib.redirect_stdout(io.StringIO()):
                    small = shrink(drawn, fails, args.shrink_budget, args.max_ops)
                    record["shrunk"] = report(check_program(small, settings, index))
        print(json.dumps(record), file=out, flush=True)
        if archs:
            batch.append((index, result.kernels))
            if len(batch) >= args.nvcc_batch:
                flush()
    flush()
    return 0


def _reader(proc, q: queue.Queue, tag) -> None:
    for line in proc.stdout:
        q.put((tag, line))
    q.put((tag, None))


def _run_parent(args) -> int:
    start_time = time.monotonic()
    indices = list(range(args.first, args.first + args.programs))
    chunks = [indices[i:i + args.chunk] for i in range(0, len(indices), args.chunk)]
    pending = [(c[0], len(c)) for c in chunks]
    running: dict = {}          # tag -> [proc, current index, started at, end]
    q: queue.Queue = queue.Queue()
    done = invalid = 0
    compiled = {"programs": 0, "kernels": 0, "max_registers": 0, "failures": 0, "spills": 0}
    seconds = cpu_seconds = 0.0
    known: dict[str, int] = {}
    symbolic = _SymbolicTally()
    failures: list[dict] = []
    tag_counter = 0
    report_file = open(args.report, "w") if args.report else None  # noqa: SIM115

    def launch(first: int, count: int) -> None:
        nonlocal tag_counter
        cmd = [sys.executable, "-m", "fusegrad.testing.fuzz", "--worker", "--seed",
               str(args.seed), "--start", str(first), "--count", str(count), "--max-ops",
               str(args.max_ops), "--shrink-budget", str(args.shrink_budget)]
        cmd += ["--no-shrink"] if args.no_shrink else []
        cmd += ["--no-fd"] if args.no_fd else []
        cmd += ["--no-cuda"] if args.no_cuda else []
        cmd += ["--no-symbolic"] if args.no_symbolic else []
        cmd += ["--symbolic-only"] if args.symbolic_only else []
        cmd += ["--symbolic-cuda"] if args.symbolic_cuda else []
        cmd += ["--nvcc", args.nvcc, "--nvcc-batch", str(args.nvcc_batch)] if args.nvcc else []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        tag_counter += 1
        running[tag_counter] = [proc, None, time.monotonic(), first + count]
        threading.Thread(target=_reader, args=(proc, q, tag_counter), daemon=True).start()

    def out_of_time() -> bool:
        return args.budget is not None and time.monotonic() - start_time > args.budget

    while (pending or running) and not (out_of_time() and not running):
        while pending and len(running) < args.jobs and not out_of_time():
            launch(*pending.pop(0))
        try:
            tag, line = q.get(timeout=1.0)
        except queue.Empty:
            tag, line = None, None
        now = time.monotonic()
        if tag is not None and tag in running:
            state = running[tag]
            if line is None:
                state[0].wait()
                if state[1] is not None:
                    # The worker died inside a program: a crash of that program.
                    failures.append({"index": state[1], "mismatches": [
                        {"stage": "crash", "where": "process", "known": None,
                         "message": f"worker exited with status {state[0].returncode}"}]})
                    print(f"[{state[1]}] crash: worker exited with {state[0].returncode}",
                          flush=True)
                    if state[1] + 1 < state[3]:
                        pending.insert(0, (state[1] + 1, state[3] - state[1] - 1))
                del running[tag]
                continue
            rec = json.loads(line)
            if rec["event"] == "nvcc":
                compiled["programs"] += len(rec["indices"])
                compiled["kernels"] += rec["kernels"]
                compiled["max_registers"] = max(compiled["max_registers"], rec["max_registers"])
                for index, message in rec["failures"].items():
                    compiled["spills" if "spill" in message else "failures"] += 1
                    failures.append({"index": int(index), "mismatches": [
                        {"stage": "nvcc", "where": "compile", "known": None, "message": message}]})
                    print(f"\n=== program {index} (seed {args.seed}): nvcc ===\n{message}\n"
                          f"{program_for(args.seed, int(index), args.max_ops)[0].source()}",
                          flush=True)
                continue
            if rec["event"] == "start":
                state[1], state[2] = rec["index"], now
                continue
            state[1] = None
            done += 1
            seconds += rec["seconds"]
            cpu_seconds += rec.get("cpu_seconds", 0.0)
            if report_file:
                report_file.write(line)
                report_file.flush()
            if rec["invalid"]:
                invalid += 1
            elif rec.get("symbolic"):
                symbolic.add(rec["symbolic"])
            for m in rec["mismatches"]:
                if m["known"]:
                    known[m["known"]] = known.get(m["known"], 0) + 1
            if any(m["known"] is None for m in rec["mismatches"]):
                failures.append(rec)
                print(f"\n=== program {rec['index']} (seed {args.seed}) ===\n{rec['source']}",
                      flush=True)
                if rec.get("shrunk"):
                    print(f"--- reduced ---\n{rec['shrunk']}", flush=True)
            if done % 100 == 0:
                el = time.monotonic() - start_time
                print(f"[{done} programs, {el:.0f} s, {done / el:.2f} programs/s, "
                      f"{len(failures)} unexplained]", flush=True)
        for state in list(running.values()):
            if state[1] is not None and now - state[2] > args.timeout:
                state[0].kill()
                failures.append({"index": state[1], "mismatches": [
                    {"stage": "timeout", "where": "program", "known": None,
                     "message": f"no result after {args.timeout} s"}]})
                print(f"[{state[1]}] timeout after {args.timeout} s:\n"
                      f"{program_for(args.seed, state[1], args.max_ops)[0].source()}", flush=True)
                if state[1] + 1 < state[3]:
                    pending.insert(0, (state[1] + 1, state[3] - state[1] - 1))
                state[1] = None
        if out_of_time() and running and not pending:
            for state in running.values():
                if now - start_time > args.budget + args.timeout:
                    state[0].kill()
    for state in running.values():
        state[0].kill()
    if report_file:
        report_file.close()
    elapsed = time.monotonic() - start_time
    # Timeouts of a known slow compile are explained like any other mismatch.
    unexplained = []
    for f in failures:
        if f["mismatches"][0]["stage"] == "timeout":
            program = program_for(args.seed, f["index"], args.max_ops)[0]
            name = explain(program, Mismatch("timeout", "program", ""))
            if name:
                known[name] = known.get(name, 0) + 1
                continue
        unexplained.append(f)
    cpu = cpu_seconds / max(done, 1)
    # CPU time says what the machine gives when shared: jobs / cpu is the rate on idle cores.
    print(f"\nsummary: {done} programs run ({invalid} rejected by eager) in {elapsed:.0f} s, "
          f"{done / max(elapsed, 1e-9):.2f} programs/s ({seconds / max(done, 1):.3f} s of checks "
          f"and {cpu:.3f} s of CPU per program: {args.jobs / max(cpu, 1e-9):.1f} programs/s "
          f"on {args.jobs} idle cores); {len(unexplained)} with unexplained mismatches")
    if args.nvcc:
        print(f"nvcc ({args.nvcc}): {compiled['programs']} programs, {compiled['kernels']} kernels "
              f"compiled; {compiled['failures']} programs failed to compile, {compiled['spills']} "
              f"spilled; at most {compiled['max_registers']} registers a thread")
    if not args.no_symbolic:
        print(symbolic.summary())
    for name, count in sorted(known.items()):
        print(f"  known {name} (issue 8 item {KNOWN[name].item}): {count} mismatches")
    for f in unexplained:
        sigs = sorted({f"{m['stage']} {m['where']}" for m in f["mismatches"] if not m["known"]})
        print(f"  program {f['index']}: {', '.join(sigs)}")
    return 1 if unexplained else 0


def _run_one(args) -> int:
    program, _ = program_for(args.seed, args.index, args.max_ops)
    result = check_program(program, _settings(args), args.index)
    print(report(result))
    if result.symbolic:
        sym = result.symbolic
        print(f"# symbolic: {sym.skipped}" if sym.skipped else
              f"# symbolic: sizes {list(sym.sizes)}, {sym.compiles} compiles"
              + (f" ({sym.reason or 'unexplained'}: {sym.detail})" if sym.detail else ""))
    archs = _archs(args.nvcc)
    if archs:
        event = nvcc_check([(args.index, result.kernels)], archs)
        print(f"# nvcc ({args.nvcc}): {event['kernels']} kernels, at most "
              f"{event['max_registers']} registers" + "".join(
                  f"\n# nvcc failed: {m}" for m in event["failures"].values()))
        if event["failures"]:
            result.mismatches.append(Mismatch("nvcc", "compile", "failed"))
    print(f"# {len(result.mismatches)} mismatches ({len(result.unexplained)} unexplained), "
          f"{result.seconds:.2f} s" + (f"; eager rejected it: {result.invalid}"
                                       if result.invalid else ""))
    return 1 if result.unexplained else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m fusegrad.testing.fuzz``: see the module docstring."""
    ap = argparse.ArgumentParser(prog="python -m fusegrad.testing.fuzz",
                                 description="Differential fuzzer of fusegrad: eager, IR "
                                 "interpreter and LLVM backend, values and gradients.")
    ap.add_argument("--programs", type=int, default=1000, help="programs to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="number of the first program")
    ap.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                    help="worker processes")
    ap.add_argument("--chunk", type=int, default=200, help="programs per worker process")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per program")
    ap.add_argument("--max-ops", type=int, default=8)
    ap.add_argument("--no-shrink", action="store_true", help="report failures unreduced")
    ap.add_argument("--shrink-budget", type=float, default=60.0, help="seconds per reduction")
    ap.add_argument("--no-fd", action="store_true", help="skip finite differences")
    ap.add_argument("--no-cuda", action="store_true",
                    help="skip the CUDA backend on the simulated driver")
    ap.add_argument("--no-symbolic", action="store_true",
                    help="skip the symbolic stage (one compile called at three sizes)")
    ap.add_argument("--symbolic-only", action="store_true",
                    help="run only eager and the symbolic stage")
    ap.add_argument("--symbolic-cuda", action="store_true",
                    help="the symbolic stage compiles on the CUDA backend on the simulated "
                    "driver")
    ap.add_argument("--nvcc", metavar="ARCHS", help="also compile the cuda-sim stage's kernels "
                    "with nvcc for these architectures (sm_80,sm_90): failures and spills "
                    "are unexplained")
    ap.add_argument("--nvcc-batch", type=int, default=100,
                    help="programs whose kernels one nvcc call compiles")
    ap.add_argument("--report", help="write one JSON line per program to this file")
    ap.add_argument("--index", type=int, help="run this one program and print it")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    if args.worker:
        return _run_worker(args)
    if args.index is not None:
        return _run_one(args)
    return _run_parent(args)


if __name__ == "__main__":
    sys.exit(main())

