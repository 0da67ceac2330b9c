"""CUDA kernels compiled to machine code by nvcc, and what ptxas says of them.

The simulated driver (:mod:`fusegrad.testing.simulated_cuda`) runs the GPU lowering's
kernels through the kernel IR's interpreter and never compiles their CUDA C; this module
does: :func:`compile_kernels` prints a batch of kernels as one translation unit, has nvcc
build a cubin for each of :data:`ARCHS` (``-Werror all-warnings``, ``-Xptxas -v``) and
reads back, per kernel and architecture, the registers it uses and the bytes it spills.
The fuzzer's ``--nvcc`` stage and the suite's cubin tests both use it::

    report = compile_kernels(kernels)          # {name: LoweredKernel}
    assert not report.errors and not report.spilled()
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.kernel_ir import LoweredKernel

__all__ = ["ARCHS", "KernelReport", "NvccReport", "compile_kernels", "compile_source", "find_nvcc",
           "named_apart", "parse_ptxas"]

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
