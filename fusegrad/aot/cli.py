"""``fusegrad-aot``: inspect and build ahead-of-time artifacts from the command line.

::

    fusegrad-aot show step.fgaot
    fusegrad-aot compile train:step --example f32[128,784] --example i64[128]:10 -o step.fgaot
    fusegrad-aot compile train:step --example x.npy --example y.npy --cpu x86-64-v3 -o step.fgaot
    fusegrad-aot compile train:step --example f32[128,784] --example i64[128]:10 \
        --dim batch=2..512:0.0,1.0 -o step.fgaot
    python -m fusegrad.aot show step.fgaot

``show`` verifies the file (checksum, format and fusegrad version) and prints its signature,
its state, its graphs, the kernels with their fused ops, the memory plan and the peak scratch
bytes; it runs nothing and links nothing, so it works on any machine.

``compile`` imports ``module`` (from the current directory or ``sys.path``) and compiles its
attribute ``function`` (a function, a module or a training step that refers to its model and
optimizer) for example arguments: ``DTYPE[SHAPE]`` (random normal floats; integers in
``[0, HIGH)`` with ``:HIGH``, default 2) or a ``.npy`` file. ``--dim NAME=MIN..MAX:A.D,...``
makes dim ``D`` of example argument ``A`` (each listed) the symbolic dim ``NAME`` with
those bounds (``fusegrad.aot.Dim``; ``MAX`` may be left out: unbounded).

Exit codes: 0 on success, 1 with a one-line ``fusegrad-aot: error: ...`` otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from typing import Sequence

import numpy as np

from fusegrad import dtypes
from fusegrad.aot import artifact, format
from fusegrad.aot.format import ArtifactError
from fusegrad.aot.plan_checks import check_version
from fusegrad.ops.creation import tensor

PROG = "fusegrad-aot"
_DIM = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<min>\d*)\.\.(?P<max>\d*):"
                  r"(?P<dims>\d+\.\d+(?:,\d+\.\d+)*)$")
_EXAMPLE = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<shape>[\d, ]*)\](?::(?P<high>\d+))?$")


def example_array(spec: str, rng: np.random.Generator) -> np.ndarray:
    """The example argument ``spec`` names: ``f32[4,8]``, ``i64[16]:10`` or a .npy path."""
    if spec.endswith(".npy"):
        return np.load(spec, allow_pickle=False)
    m = _EXAMPLE.match(spec.strip())
    if m is None:
        raise ValueError(f"example {spec!r} is not DTYPE[SHAPE] (f32[128,784], i64[128]:10) "
                         "or a .npy file")
    dt = dtypes.as_dtype(m["dtype"])
    shape = tuple(int(d) for d in m["shape"].replace(" ", "").split(",") if d)
    if dt.is_floating_point:
        return rng.standard_normal(shape).astype(dt.np_dtype)
    if dt.np_dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, int(m["high"] or 2), shape).astype(dt.np_dtype)


def dynamic_shapes(specs: Sequence[str], n_args: int) -> list | None:
    """``dynamic_shapes`` (by position) of ``--dim`` options ``NAME=MIN..MAX:A.D,...``."""
    if not specs:
        return None
    out: list = [None] * n_args
    for spec in specs:
        m = _DIM.match(spec.replace(" ", ""))
        if m is None:
            raise ValueError(f"--dim {spec!r} is not NAME=MIN..MAX:ARG.DIM[,ARG.DIM...] "
                             "(batch=2..512:0.0,1.0)")
        dim = artifact.Dim(m["name"], min=int(m["min"]) if m["min"] else None,
                           max=int(m["max"]) if m["max"] else None)
        for pair in m["dims"].split(","):
            a, d = map(int, pair.split("."))
            if a >= n_args:
                raise ValueError(f"--dim {spec!r} names argument {a}, of {n_args} examples")
            out[a] = out[a] or {}
            out[a][d] = dim
    return out


def _resolve(target: str):
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected module:function, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fusegrad-aot`` with ``argv``; returns the exit code."""
    parser = argparse.ArgumentParser(prog=PROG, description="fusegrad ahead-of-time artifacts")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print an artifact's signature, graph, kernels, memory")
    show.add_argument("file")
    build = sub.add_parser("compile", help="compile module:function into an artifact")
    build.add_argument("target", help="module:function")
    build.add_argument("--example", action="append", default=[],
                       help="an example argument: DTYPE[SHAPE][:HIGH] or a .npy file (repeat)")
    build.add_argument("-o", "--output", required=True, help="the artifact file to write")
    build.add_argument("--cpu", help="LLVM CPU name to build for (x86-64-v3, ...; default host)")
    build.add_argument("--features", help="LLVM feature flags, e.g. +avx2,+fma")
    build.add_argument("--no-state", action="store_true",
                       help="do not carry the state's values (give them at load)")
    build.add_argument("--seed", type=int, default=0, help="seed of the random examples")
    build.add_argument("--dim", action="append", default=[],
                       help="a symbolic dim: NAME=MIN..MAX:ARG.DIM[,ARG.DIM...] (repeat)")
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            with open(args.file, "rb") as f:
                decoded = format.decode(f.read(), args.file)
            check_version(decoded.header, args.file)
            plan = json.loads(decoded.sections["plan"])
            print(artifact.describe(decoded.header, plan, decoded.sections["graph"].decode()))
            return 0
        fn = _resolve(args.target)
        rng = np.random.default_rng(args.seed)
        examples = [tensor(example_array(s, rng)) for s in args.example]
        art = artifact.compile(fn, *examples, cpu=args.cpu, features=args.features,
                               carry_state=not args.no_state,
                               dynamic_shapes=dynamic_shapes(args.dim, len(examples)))
        art.save(args.output)
        size = os.path.getsize(args.output)
        kernels = sum(len(p["kernels"]) for p in art.plan["programs"])
        print(f"wrote {args.output}: {size} bytes, {len(art.plan['programs'])} program(s), "
              f"{kernels} compiled kernels, cpu {art.target['cpu']}")
        return 0
    except (ArtifactError, ValueError, TypeError, RuntimeError, OSError, ImportError,
            AttributeError, IndexError, AssertionError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
