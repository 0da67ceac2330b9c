"""CUDA kernels compiled to machine code by nvcc, and what ptxas says of them.

The simulated driver (:mod:`fusegrad.testing.simulated_cuda`) runs the GPU lowering's
kernels through the kernel IR's interpreter and never compiles their CUDA C; this module
does: :func:`compile_kernels` prints a batch of kernels as one translation unit, has nvcc
build a cubin for each of :data:`ARCHS` (``-Werror all-warnings``, ``-Xptxas -v``) and
reads back, per kernel and architecture, the registers it uses and the bytes it spills.
The fuzzer's ``--nvcc`` stage and the suite's cubin tests both use it::

    report = compile_kernels(kernels)          # {name: LoweredKernel}
    assert not report.errors and not report.spilled()

``python -m fusegrad.testing.nvcc FOLDER`` compiles every kernel the lowering recorded in
``FOLDER`` (``FUSEGRAD_CUDA_COLLECT``, :mod:`fusegrad.codegen.cuda.collect`: ``make test``
records the suite's) in batches of ``--batch`` kernels, an nvcc call a batch and a call per
core at a time, and prints the kernels, failures, spills and the most registers any used; it
exits 1 on a failure or a spill.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fusegrad.codegen.cuda import collect
from fusegrad.codegen.cuda.printer import cuda_source, join_parts
from fusegrad.codegen.kernel_ir import LoweredKernel

__all__ = ["ARCHS", "KernelReport", "NvccReport", "compile_kernels", "compile_source", "find_nvcc",
           "compile_collected", "named_apart", "parse_ptxas"]

ARCHS = ("sm_80", "sm_90")      # A100 and H100: the cards the project runs on

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_PTXAS = "-v,--warn-on-spills"


def find_nvcc() -> str | None:
    """nvcc's path: on ``PATH``, else the default CUDA install, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


@dataclass
class KernelReport:
    """One kernel built for one architecture: ptxas's registers, stack and spill bytes."""

    name: str
    arch: str
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


@dataclass
class NvccReport:
    """A batch compiled: every entry's :class:`KernelReport`, and nvcc's errors (its
    stderr when it failed or warned; empty when it built every architecture cleanly)."""

    kernels: list[KernelReport] = field(default_factory=list)
    errors: str = ""

    def spilled(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.spills]

    @property
    def max_registers(self) -> int:
        return max((k.registers for k in self.kernels), default=0)


def parse_ptxas(text: str) -> list[KernelReport]:
    """The entries of a ``ptxas -v`` report, in order. A function's properties follow its
    ``Compiling entry function`` line; device functions that were not inlined report
    properties of their own, which count toward the entry before them."""
    out: list[KernelReport] = []
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            out.append(KernelReport(m.group(1), m.group(2)))
        elif out and (m := _SPILL.search(line)):
            k = out[-1]
            k.stack = max(k.stack, int(m.group(1)))
            k.spill_stores += int(m.group(2))
            k.spill_loads += int(m.group(3))
        elif out and (m := _REGS.search(line)):
            out[-1].registers = max(out[-1].registers, int(m.group(1)))
    return out


def compile_source(source: str, archs: tuple[str, ...] = ARCHS, nvcc: str | None = None,
                   timeout: float = 600.0) -> NvccReport:
    """Build ``source`` for each of ``archs`` with one nvcc call (a fatbin of one cubin per
    architecture), warnings as errors, and parse ptxas's report."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernels.cu"
        src.write_text(source)
        cmd = [nvcc, "-fatbin", str(src), "-o", str(Path(tmp) / "kernels.fatbin"),
               "-Werror", "all-warnings", "-Xptxas", _PTXAS]
        for arch in archs:
            cmd += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = run.stdout + run.stderr
    warned = [line for line in text.splitlines() if "warning" in line.lower() or
              "error" in line.lower()]
    errors = text[-8000:] if run.returncode or warned else ""
    return NvccReport(parse_ptxas(text), errors)


def compile_kernels(kernels: dict[str, LoweredKernel], archs: tuple[str, ...] = ARCHS,
                    nvcc: str | None = None) -> NvccReport:
    """:func:`compile_source` of ``kernels`` printed as one translation unit; every
    kernel must be an entry of the report for every architecture (else ``errors`` says
    which are missing)."""
    report = compile_source(cuda_source(list(kernels.values())), archs, nvcc)
    seen = {(k.name, k.arch) for k in report.kernels}
    missing = sorted(f"{name} ({arch})" for name in kernels for arch in archs
                     if (name, arch) not in seen)
    if missing and not report.errors:
        report.errors = "no ptxas report for " + ", ".join(missing)
    return report


def named_apart(kernels: list[LoweredKernel], prefix: str = "") -> dict[str, LoweredKernel]:
    """``kernels`` by distinct names for one translation unit: each renamed
    ``{prefix}{name}`` and, when that name is taken (a forward and a backward program both
    have a ``k0_...``), ``{prefix}{name}_{n}``."""
    out: dict[str, LoweredKernel] = {}
    for k in kernels:
        name, n = prefix + k.name, 1
        while name in out:
            name, n = f"{prefix}{k.name}_{n}", n + 1
        out[name] = dataclasses.replace(k, name=name)
    return out


def _compile_recorded(kernels: list[dict], archs: tuple[str, ...], nvcc: str) -> NvccReport:
    """Recorded kernels (:func:`fusegrad.codegen.cuda.collect.read`) as one nvcc call."""
    report = compile_source(join_parts([(k["helpers"], k["body"]) for k in kernels]), archs, nvcc)
    seen = {(k.name, k.arch) for k in report.kernels}
    missing = [f"{k['name']} ({arch})" for k in kernels for arch in archs
               if (k["name"], arch) not in seen]
    if missing and not report.errors:
        report.errors = "no ptxas report for " + ", ".join(missing)
    return report


def compile_collected(folder: str, archs: tuple[str, ...] = ARCHS, batch: int = 400,
                      nvcc: str | None = None, jobs: int | None = None,
                      ) -> tuple[int, NvccReport, dict[str, str]]:
    """Every kernel recorded in ``folder``, compiled ``batch`` kernels to an nvcc call,
    ``jobs`` calls at a time (default: one per core). Returns how many kernels there were,
    the merged report, and the failures: the kernels of a batch that failed are compiled one
    by one, and each that fails maps to nvcc's errors and its source."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not installed")
    kernels = collect.read(folder)
    jobs = max(1, jobs or os.cpu_count() or 1)
    # Batches of at most ``batch`` kernels, at least one per job.
    size = max(1, min(batch, -(-len(kernels) // jobs)))
    parts = [kernels[i:i + size] for i in range(0, len(kernels), size)]
    with ThreadPoolExecutor(jobs) as pool:
        reports = list(pool.map(lambda part: _compile_recorded(part, archs, nvcc), parts))
    merged, failures = NvccReport(), {}
    for part, report in zip(parts, reports):
        merged.kernels += report.kernels
        if report.errors:
            found = False
            for k in part:
                one = _compile_recorded([k], archs, nvcc)
                if one.errors:
                    found = True
                    failures[k["name"]] = f"{one.errors}\n--- {k['family']} kernel:\n{k['body']}"
            if not found:
                failures[f"batch of {part[0]['name']}"] = report.errors
    return len(kernels), merged, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegrad.testing.nvcc",
                                 description="Compile the CUDA kernels recorded in a folder "
                                 "(FUSEGRAD_CUDA_COLLECT) with nvcc: warnings are errors, and a "
                                 "kernel that spills registers fails.")
    ap.add_argument("folder")
    ap.add_argument("--archs", default=",".join(ARCHS), help="architectures (default %(default)s)")
    ap.add_argument("--batch", type=int, default=400, help="kernels one nvcc call compiles")
    ap.add_argument("--jobs", type=int, default=None, help="nvcc calls at a time (default: one "
                    "per core)")
    args = ap.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc is not installed: the recorded CUDA kernels were not compiled")
        return 0
    archs = tuple(a.strip() for a in args.archs.split(",") if a.strip())
    t0 = time.perf_counter()
    count, report, failures = compile_collected(args.folder, archs, args.batch, nvcc, args.jobs)
    spilled = report.spilled()
    for name, message in failures.items():
        print(f"=== {name}: nvcc failed ===\n{message}\n", file=sys.stderr)
    for k in spilled:
        print(f"=== {k.name} ({k.arch}): {k.spill_stores} bytes spill stores, {k.spill_loads} "
              f"bytes spill loads ===", file=sys.stderr)
    print(f"nvcc ({','.join(archs)}): {count} kernels recorded in {args.folder}, "
          f"{len(failures)} failed, {len(spilled)} spilled, at most {report.max_registers} "
          f"registers ({time.perf_counter() - t0:.1f} s)")
    return 1 if failures or spilled else 0


if __name__ == "__main__":
    sys.exit(main())
