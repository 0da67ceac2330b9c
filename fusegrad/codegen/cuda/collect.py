"""A record of every CUDA kernel the lowering makes (``FUSEGRAD_CUDA_COLLECT=FOLDER``).

The simulated driver the suite runs CUDA programs on interprets the kernel IR and never
compiles its CUDA C; with the setting, :func:`fusegrad.codegen.gpu_lowering.lower_kernel`
writes each kernel it makes to ``FOLDER`` as printed (:func:`record`): one JSON file per
distinct kernel, named by the hash of its text, so that a kernel made by many tests (or by
test processes running side by side) is one file. ``python -m fusegrad.testing.nvcc FOLDER``
then compiles them all to machine code (:func:`read` gives them back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

from fusegrad.codegen.cuda.printer import cuda_parts
from fusegrad.codegen.kernel_ir import LoweredKernel

__all__ = ["record", "read"]


def record(kernel: LoweredKernel, folder: str) -> Path:
    """Write ``kernel``'s CUDA C (its device functions and its text, renamed ``k_<hash>``
    after the hash of the text) to ``folder``, unless a file holds it already."""
    helpers, body = cuda_parts(dataclasses.replace(kernel, name="k"))
    digest = hashlib.sha256(json.dumps([helpers, body], sort_keys=True).encode()).hexdigest()[:20]
    path = Path(folder) / f"{digest}.json"
    if path.exists():
        return path
    name = f"k_{digest}"
    helpers, body = cuda_parts(dataclasses.replace(kernel, name=name))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all: test processes may record the same kernel at once.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"name": name, "family": kernel.family, "helpers": helpers, "body": body}, f)
    os.replace(tmp, path)
    return path


def read(folder: str) -> list[dict]:
    """The kernels :func:`record` wrote to ``folder`` (``name``, ``family``, ``helpers``,
    ``body``), in the order of their names."""
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
