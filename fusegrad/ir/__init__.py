"""The IR: a typed SSA graph of primitives, and its tools.

- :mod:`~fusegrad.ir.graph`: :class:`Graph`, :class:`Node`, :class:`Value`, :class:`Literal`;
- :mod:`~fusegrad.ir.printer` / :mod:`~fusegrad.ir.parser`: the text form, round-tripping
  exactly (``print_graph``, ``parse``, ``parse_many``);
- :mod:`~fusegrad.ir.verifier`: ``verify`` (SSA, order, types against each primitive's rule);
- :mod:`~fusegrad.ir.interpreter`: ``interpret``, the numpy oracle;
- :mod:`~fusegrad.ir.nx`: a networkx view and the analyses passes use;
- :mod:`~fusegrad.ir.hashing`: ``structural_hash``, independent of names;
- :mod:`~fusegrad.ir.dot`: graphviz pictures, with kernels as clusters.
"""

from fusegrad.ir.dot import to_dot
from fusegrad.ir.graph import Graph, IRError, Literal, Node, Value
from fusegrad.ir.hashing import structural_hash
from fusegrad.ir.interpreter import interpret
from fusegrad.ir.nx import to_networkx
from fusegrad.ir.parser import IRParseError, parse, parse_many
from fusegrad.ir.printer import print_graph
from fusegrad.ir.verifier import VerificationError, verify
from fusegrad.ops import prims as _prims  # noqa: F401  (registers the primitives)
from fusegrad.ops.primitive import TensorType

# A graph's IR text (str) and Graphviz text (to_dot) are Graph methods installed here, in one
# place: the printer and the dot writer build on fusegrad.ir.graph, which cannot import them.
Graph.__str__ = print_graph
Graph.to_dot = to_dot

__all__ = ["Graph", "Node", "Value", "Literal", "TensorType", "print_graph", "parse", "parse_many",
           "verify", "interpret", "to_networkx", "structural_hash", "to_dot", "IRError",
           "IRParseError", "VerificationError"]
