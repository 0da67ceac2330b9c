"""Passes and the pass manager.

A pass is a small named class with a ``run(graph) -> graph`` method; its dataclass fields
are its options. :func:`register_pass` makes it available to pipelines by name, and a
pipeline is a string as xDSL and MLIR write them::

    PassManager("simplify,cse,dce").run(graph)
    PassManager("fuse{max_inputs=8},dce")

The manager verifies the graph after every pass when asked (``verify=True``, or
``FUSEGRAD_VERIFY=1``, which the test suite sets), prints the IR after each pass
(``print_after_all`` or ``FUSEGRAD_DEBUG>=3``), dumps it to a folder (``dump_dir`` or
``FUSEGRAD_DUMP_DIR``), and times each pass (``manager.timings``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, ClassVar, TextIO

from fusegrad.config import config
from fusegrad.ir.graph import Graph
from fusegrad.ir.printer import print_graph
from fusegrad.ir.verifier import verify

__all__ = ["Pass", "register_pass", "PASSES", "parse_pipeline", "PassManager", "PipelineError",
           "run_pipeline", "parse_positions", "format_positions"]


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or a bad option."""


class Pass:
    """Base of all passes: subclasses are dataclasses (fields = options) with a ``name``."""

    name: ClassVar[str] = ""
    # A pass whose result has other outputs than its input (autodiff, partition).
    changes_signature: ClassVar[bool] = False

    def run(self, graph: Graph) -> Graph:
        raise NotImplementedError

    def __str__(self) -> str:
        # Only options that differ from their defaults, so dumps and timings stay readable.
        opts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default] if dataclasses.is_dataclass(self) else []
        return self.name + (f"{{{','.join(opts)}}}" if opts else "")


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make ``cls`` available to pipelines under ``cls.name``."""
    if not dataclasses.is_dataclass(cls):
        cls = dataclasses.dataclass(cls)
    if not cls.name:
        raise ValueError(f"pass {cls.__name__} has no name")
    PASSES[cls.name] = cls
    return cls


def _convert(value: str, kind, pass_name: str, key: str):
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kind, kind)
    try:
        if kind is bool:
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError):
        raise PipelineError(f"pass '{pass_name}': option {key}={value!r} is not a valid "
                            f"{getattr(kind, '__name__', kind)}") from None


def parse_positions(text: str, pass_name: str, key: str, what: str = "input") -> list[int] | None:
    """A pass option that lists positions: ``all`` (None), or indices joined by ``+``
    (``wrt=0+2``); an empty value lists none."""
    if text == "all":
        return None
    try:
        return [int(i) for i in text.split("+")] if text else []
    except ValueError:
        raise PipelineError(f"pass '{pass_name}': {key}={text!r} must be 'all' or {what} "
                            "positions joined by '+'") from None


def format_positions(positions) -> str:
    """The option text :func:`parse_positions` reads back as ``positions``."""
    return "+".join(str(i) for i in positions)


def parse_pipeline(text: str) -> list[Pass]:
    """``"a,b{k=v,k2=v2},c"`` -> pass instances."""
    passes, i, n = [], 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] not in ",{":
            j += 1
        name = text[i:j].strip()
        opts: dict[str, str] = {}
        if j < n and text[j] == "{":
            k = text.find("}", j)
            if k < 0:
                raise PipelineError(f"unclosed '{{' in pipeline {text!r}")
            for item in filter(None, (s.strip() for s in text[j + 1:k].split(","))):
                key, eq, value = item.partition("=")
                if not eq:
                    raise PipelineError(f"pass '{name}': option {item!r} must be key=value")
                opts[key.strip()] = value.strip()
            j = k + 1
        if name:
            passes.append(_instantiate(name, opts))
        while j < n and text[j] in " ,":
            j += 1
        i = j
    return passes


def _instantiate(name: str, opts: dict[str, str]) -> Pass:
    cls = PASSES.get(name)
    if cls is None:
        known = ", ".join(sorted(PASSES))
        raise PipelineError(f"unknown pass '{name}' (known passes: {known})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in opts.items():
        if key not in fields:
            raise PipelineError(f"pass '{name}' has no option '{key}' (options: "
                                f"{', '.join(fields) or 'none'})")
        kwargs[key] = _convert(value, fields[key].type, name, key)
    return cls(**kwargs)


class PassManager:
    """Runs a pipeline of passes over graphs, with verification, printing and timing."""

    def __init__(self, pipeline: str | list[Pass], *, verify: bool | None = None,
                 print_after_all: bool | None = None, dump_dir: str | None = None,
                 out: TextIO | None = None):
        self.passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
        self.verify = config.verify if verify is None else verify
        self.print_after_all = config.debug >= 3 if print_after_all is None else print_after_all
        self.dump_dir = dump_dir if dump_dir is not None else config.dump_dir
        self.out = out
        self.timings: dict[str, float] = {}

    def run(self, graph: Graph) -> Graph:
        if self.verify:
            verify(graph)
        signature = [o.type for o in graph.outputs]
        for index, p in enumerate(self.passes):
            start = time.perf_counter()
            graph = p.run(graph)
            self.timings[str(p)] = self.timings.get(str(p), 0.0) + time.perf_counter() - start
            if self.verify:
                try:
                    verify(graph)
                except Exception as e:
                    raise type(e)(f"after pass '{p}': {e}") from e
                same = [o.type for o in graph.outputs] == signature
                if not same and not p.changes_signature and p.name != "autodiff":
                    raise PipelineError(f"pass '{p}' changed the graph's output types from "
                                        f"{signature} to {[o.type for o in graph.outputs]}")
                # The passes after one that changes the signature keep the new one.
                signature = [o.type for o in graph.outputs]
            if self.print_after_all:
                out = self.out or sys.stderr
                print(f"// -----// IR Dump After {p} //----- //", file=out)
                print(print_graph(graph), file=out)
            if self.dump_dir:
                os.makedirs(self.dump_dir, exist_ok=True)
                path = os.path.join(self.dump_dir, f"{graph.name}.{index:02d}.{p.name}.fg")
                with open(path, "w") as f:
                    f.write(print_graph(graph) + "\n")
        return graph

    def timing_report(self) -> str:
        total = sum(self.timings.values()) or 1e-12
        lines = [f"{'pass':<24}{'ms':>10}{'%':>8}"]
        for name, t in self.timings.items():
            lines.append(f"{name:<24}{t * 1e3:>10.3f}{100 * t / total:>8.1f}")
        return "\n".join(lines)


def run_pipeline(graph: Graph, pipeline: str, **kwargs) -> Graph:
    """Shorthand for ``PassManager(pipeline, **kwargs).run(graph)``."""
    return PassManager(pipeline, **kwargs).run(graph)


def pass_function(name: str) -> Callable:
    """Register a plain function ``graph -> graph`` as an option-less pass."""
    def decorate(fn):
        cls = type(fn.__name__.title().replace("_", ""), (Pass,),
                   {"name": name, "run": lambda self, g: fn(g), "__doc__": fn.__doc__})
        register_pass(cls)
        return fn
    return decorate
