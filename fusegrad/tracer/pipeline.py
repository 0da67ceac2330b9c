"""The pass pipelines of a compiled function: each graph it compiles goes through one
pipeline string, run by the :class:`~fusegrad.passes.manager.PassManager`.

- A traced call: the function's passes (``fusegrad.compile(pipeline=...)``, by default
  :data:`DEFAULT_PIPELINE`), then ``fuse``, which partitions the graph into kernels
  (``graph.kernels``) for the backends that run kernels (:func:`program_pipeline`).
- The forward and backward halves of a call that autograd records: ``fuse-attention``,
  then ``partition`` of the traced graph (:func:`split_pipeline`); each half then goes
  through the program pipeline.
- The VJP of the outputs that received a gradient (when some did not, under
  ``create_graph=True``, or on the interpreter backend): ``vjp`` and ``dce``
  (:func:`vjp_pipeline`), then the program pipeline for the backends that run kernels.

``FUSEGRAD_DEBUG=1`` prints each pipeline as it runs (:func:`run_passes`): once per
compile, and once per program that a call's backward builds.
"""

from __future__ import annotations

import sys

from fusegrad.config import config
from fusegrad.ir.graph import Graph
from fusegrad.passes.manager import PassManager, format_positions

__all__ = ["DEFAULT_PIPELINE", "KERNEL_BACKENDS", "program_pipeline", "split_pipeline",
           "vjp_pipeline", "run_passes"]

DEFAULT_PIPELINE = "simplify,strip-barriers,cse,dce,matmul-layout,overlap-collectives"
KERNEL_BACKENDS = ("llvm", "cuda")      # the interpreter runs the graph itself


def program_pipeline(passes: str, backend: str) -> str:
    """The pipeline of a program's graph: ``passes``, then fusion into kernels."""
    return f"{passes},fuse" if backend in KERNEL_BACKENDS else passes


def split_pipeline(wrt: tuple, free: list[int]) -> str:
    """The pipeline that splits a traced graph into the forward and backward of its
    gradients with respect to inputs ``wrt``, saving the inputs ``free`` (parameters and
    captured tensors, alive anyway) at no cost. Attention chains fuse before the graph is
    differentiated, as in a traced ``backward()`` (passes/attention.py)."""
    options = f"wrt={format_positions(wrt)}" + (f",free={format_positions(free)}" if free else "")
    return f"fuse-attention,partition{{{options}}}"


def vjp_pipeline(wrt: tuple, seeded: tuple) -> str:
    """The pipeline of the VJP of the outputs ``seeded`` with respect to inputs ``wrt``,
    dead code removed."""
    return f"vjp{{wrt={format_positions(wrt)},outputs={format_positions(seeded)}}},dce"


def run_passes(graph: Graph, pipeline: str) -> Graph:
    """``graph`` through ``pipeline`` (printed under ``FUSEGRAD_DEBUG=1``)."""
    if config.debug >= 1:
        print(f"[fusegrad] pipeline of {graph.name}: {pipeline}", file=sys.stderr)
    return PassManager(pipeline).run(graph)
