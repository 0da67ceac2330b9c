"""Run the torch lambdas of tinygrad's op tests against fusegrad, eager and compiled.

tinygrad's ``test/backend/test_ops.py`` (``test/test_ops.py`` in older versions) checks each op
with ``helper_test_op(shapes, torch_fxn, tinygrad_fxn, ...)``: the same inputs go through torch
and through tinygrad, and forward values and the gradients of ``fn(*inputs).sum()`` with respect
to every input are compared. This tool keeps the torch side of every such call and runs it a
second time with fusegrad in torch's place: a public, independent suite of about 1,900 small
torch programs (1,941 cases from 1,240 calls in the version of August 2026).

    python tools/op_suite.py path/to/test_ops.py                 # counts and failures by cause
    python tools/op_suite.py path/to/test_ops.py -k fancy        # test methods matching a regex
    python tools/op_suite.py path/to/test_ops.py --mode eager    # eager only (faster)
    python tools/op_suite.py path/to/test_ops.py -v              # every case with its outcome

It needs torch (the reference) and is not part of the test suite.

How a case runs. The file is parsed with :mod:`ast` and rewritten before it runs:

- every ``helper_test_op(...)`` call becomes a call of this tool's recorder, with the tinygrad
  function (the third positional argument or ``tinygrad_fxn=``) dropped; the torch function is
  the second argument (a lambda almost always; sometimes a torch function such as
  ``torch.copysign``);
- tinygrad's imports become inert stand-ins (``getenv`` returns its default; ``dtypes.int.max``
  and the like, which some tests put in their values, are numpy's limits), decorators of the
  test classes and methods are dropped (they skip by tinygrad device, or as slow or redundant
  for tinygrad: those tests run here too), and every statement of a test method that holds no
  ``helper_test_op`` call runs under ``try`` (they are tinygrad checks: ``assertRaises`` on
  tinygrad tensors and the like).

Each test method then runs once, with real torch; at each recorded call the inputs are made as
``prepare_test_op`` makes them (``np.random.seed(0)``, uniform in ``[low, high)``, float32; or
``torch.tensor(vals)`` with int64 made int32), and the torch function runs as the test runs it.
The fusegrad version of the function is the same code with ``torch`` bound to ``fusegrad``:
a lambda of the test file is rebuilt with fusegrad globals, and what it closes over is
converted (torch tensors to fusegrad tensors of the same values, dtype and requires_grad,
torch dtypes and functions to fusegrad's of the same name, the test's own functions rebuilt
alike). So tensors a test makes at random (its index tensors) are the same on both sides.
It runs eagerly, then under ``fusegrad.compile`` on fresh inputs; both are compared with torch.

Comparison. Shape and dtype exactly; bool and integer values exactly; floating values with
``rtol = sqrt(eps(dtype))`` (3.5e-4 for float32, 0.031 for float16, 0.088 for bfloat16) and
``atol = rtol * max(1, max|torch's value|)``, so a value that cancels to near zero is judged
on the scale of the tensor it belongs to; where the test itself loosened a tolerance
(``atol=``, ``rtol=``, ``grad_atol=``, ``grad_rtol=`` given in the call) the looser one holds.
NaN equals NaN. Gradients are compared as ``torch.autograd.grad(fn(*inputs).sum(), inputs)``,
unless the call says ``forward_only=True``.

Excluded (not counted, listed under "excluded" with the reason):

- cases torch itself rejects: torch raises making the inputs, in the forward or in the
  backward (integer ``vals`` with ``requires_grad``, an op torch lacks for a dtype, tests
  marked ``@unittest.skip`` because torch differs); tinygrad's own helper would fail on them
  too;
- cases with complex values (an input, a closed-over tensor or torch's output is complex):
  fusegrad has no complex dtypes yet;
- cases whose function closes over a torch object with no fusegrad counterpart to convert
  (a generator, a module class fusegrad.nn lacks; a module fusegrad has is rebuilt from its
  constructor's arguments and state);
- ``helper_test_exception`` calls and the tinygrad-only checks of a test body: they test
  tinygrad's behaviour and exceptions, not a torch program's values (they are not cases).

In the August 2026 file no case falls in the first three classes: every recorded call counts.
It has no complex-valued case (those would be excluded until fusegrad has complex dtypes).

Compiled runs use ``fusegrad.compile`` as a user would (``fullgraph=False``): a function whose
trace is data-dependent runs eagerly with a warning; those are counted as compiled passes
when their values match, and their number is printed.
"""

from __future__ import annotations

import argparse
import ast
import collections
import inspect
import math
import re
import sys
import traceback
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fusegrad

RECORD = "__op_suite_record__"
STUB = "__op_suite_stub__"


# ----------------------------------------------------------------------------- the rewrite

class _Stub:
    """An inert stand-in for every tinygrad object: calls, attributes and operators give itself."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs) -> Any:
        return self

    def __getitem__(self, key) -> Any:
        return self

    def __setitem__(self, key, value) -> None:
        pass

    def __eq__(self, other) -> bool:
        return False

    def __ne__(self, other) -> bool:
        return True

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        return True

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __int__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def __index__(self) -> int:
        return 0


def _stub_binary(self, *args):
    return self


for _name in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow matmul "
              "rmatmul and rand or ror xor rxor lshift rlshift rshift rrshift lt le gt ge neg pos abs "
              "invert").split():
    setattr(_Stub, f"__{_name}__", _stub_binary)


def _getenv(key: str, default: Any = 0) -> Any:
    return default


class _DtypeLimits(_Stub):
    """A tinygrad dtype in a test's values (``dtypes.int.max``): its numpy limits."""

    def __init__(self, np_dtype):
        info = np.iinfo(np_dtype) if np.issubdtype(np_dtype, np.integer) else np.finfo(np_dtype)
        self.max, self.min = int(info.max), int(info.min)
        if isinstance(info, np.finfo):
            self.max, self.min = float(info.max), float(info.min)


class _Dtypes(_Stub):
    """tinygrad's ``dtypes``: the limits of the numeric ones, inert otherwise."""

    _ALIASES = {"int": "int32", "float": "float32", "half": "float16", "double": "float64",
                "long": "int64", "default_int": "int32", "default_float": "float32"}

    def __getattr__(self, name: str) -> Any:
        try:
            return _DtypeLimits(np.dtype(self._ALIASES.get(name, name)))
        except TypeError:
            return super().__getattr__(name)


@dataclass
class CallSite:
    """One ``helper_test_op`` call in the source."""

    lineno: int
    method: str
    fxn_source: str
    explicit: frozenset      # the tolerance keywords the call gives


def _contains_record(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == RECORD
               for n in ast.walk(node))


def _guard_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Each statement without a recorded call runs under try; those with one are kept, their
    nested bodies guarded alike."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Return,
                             ast.Break, ast.Continue, ast.Global, ast.Nonlocal, ast.Pass)):
            out.append(stmt)
        elif _contains_record(stmt):
            if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
                for attr in ("body", "orelse", "finalbody"):
                    if getattr(stmt, attr, None):
                        setattr(stmt, attr, _guard_statements(getattr(stmt, attr)))
            out.append(stmt)
        else:
            handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None,
                                        body=[ast.Pass()])
            out.append(ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[]))
    return out


class _Rewrite(ast.NodeTransformer):
    def __init__(self, source: str):
        self.source = source
        self.sites: list[CallSite] = []
        self.method = "<module>"

    def visit_Import(self, node: ast.Import):
        keep = [a for a in node.names if a.name != "torch" and not a.name.startswith("tinygrad")]
        if not keep:
            return ast.Pass()
        node.names = keep
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if not (node.module or "").startswith("tinygrad"):
            return node
        out = []
        for alias in node.names:
            name = alias.asname or alias.name
            value = {"getenv": "_getenv", "DEBUG": "0", "dtypes": "_Dtypes()"}.get(alias.name, STUB)
            out.append(ast.parse(f"{name} = {value}").body[0])
        return out

    def visit_ClassDef(self, node: ast.ClassDef):
        node.decorator_list = []
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef):
        outer = self.method
        self.method = node.name if outer == "<module>" or node.name.startswith("test") else outer
        if node.name.startswith("test"):
            node.decorator_list = []
        self.generic_visit(node)
        if node.name.startswith("test"):
            node.body = _guard_statements(node.body)
        self.method = outer
        return node

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name != "helper_test_op":
            return node
        args = list(node.args)
        keywords = [k for k in node.keywords if k.arg != "tinygrad_fxn"]
        if len(args) > 2:
            del args[2]
        fxn = args[1] if len(args) > 1 else next((k.value for k in keywords if k.arg == "torch_fxn"), None)
        explicit = frozenset(k.arg for k in keywords if k.arg in ("atol", "rtol", "grad_atol", "grad_rtol"))
        site = len(self.sites)
        self.sites.append(CallSite(node.lineno, self.method,
                                   ast.get_source_segment(self.source, fxn) if fxn else "?", explicit))
        return ast.Call(func=ast.Name(RECORD, ast.Load()), args=[ast.Constant(site), *args],
                        keywords=keywords)


def load_suite(path: str) -> tuple[types.CodeType, list[CallSite]]:
    """The rewritten module's code and its call sites."""
    source = open(path).read()
    tree = ast.parse(source, path)
    rewrite = _Rewrite(source)
    tree = rewrite.visit(tree)
    # Drop `if __name__ == "__main__":` and keep the rest.
    tree.body = [s for s in tree.body if not (isinstance(s, ast.If) and "__name__" in ast.unparse(s.test))]
    ast.fix_missing_locations(tree)
    return compile(tree, path, "exec"), rewrite.sites


# ----------------------------------------------------------------------------- torch to fusegrad

class Excluded(Exception):
    """A case that does not count, with the reason."""


class _Converter:
    """Turns what a torch function closes over into fusegrad's counterpart."""

    def __init__(self, torch, suite_file: str, fg_globals: dict):
        self.torch = torch
        self.suite_file = suite_file
        self.fg_globals = fg_globals
        self.by_id: dict[int, Any] = {}
        pairs = [(torch, fusegrad), (torch.nn.functional, fusegrad.nn.functional),
                 (torch.Tensor, fusegrad.Tensor), (torch.nn, fusegrad.nn),
                 (torch.special, getattr(fusegrad, "special", None)),
                 (torch.linalg, getattr(fusegrad, "linalg", None))]
        for mod_t, mod_f in pairs:
            for name in dir(mod_t):
                try:
                    obj = getattr(mod_t, name)
                except Exception:
                    continue
                if callable(obj) or isinstance(obj, types.ModuleType):
                    self.by_id.setdefault(id(obj), (mod_f, name))

    def dtype(self, dt) -> Any:
        name = str(dt).removeprefix("torch.")
        if name.startswith("complex"):
            raise Excluded("complex dtype (fusegrad has none yet)")
        return getattr(fusegrad, {"bool": "bool"}.get(name, name))

    def tensor(self, t) -> Any:
        torch = self.torch
        if t.is_complex():
            raise Excluded("complex tensor (fusegrad has no complex dtypes yet)")
        data = t.detach()
        if data.dtype == torch.bfloat16:
            arr = data.float().numpy()
        else:
            arr = data.numpy().copy()
        out = fusegrad.tensor(arr, dtype=self.dtype(t.dtype))
        return out.requires_grad_(True) if t.requires_grad else out

    def __call__(self, v, depth: int = 0) -> Any:
        torch = self.torch
        if depth > 20:
            return v
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, torch.dtype):
            return self.dtype(v)
        if isinstance(v, torch.Size):
            return tuple(v)
        if isinstance(v, (list, tuple)):
            return type(v)(self(x, depth + 1) for x in v)
        if isinstance(v, dict):
            return {k: self(x, depth + 1) for k, x in v.items()}
        if v is torch:
            return fusegrad
        if isinstance(v, types.FunctionType) and v.__code__.co_filename == self.suite_file:
            return self.function(v, depth)
        if isinstance(v, functools_partial):
            return functools_partial(self(v.func, depth + 1), *self(v.args, depth + 1),
                                     **self(v.keywords, depth + 1))
        if id(v) in self.by_id:
            mod_f, name = self.by_id[id(v)]
            if mod_f is None or not hasattr(mod_f, name):
                raise AttributeError(f"fusegrad has no {name} (torch's {v!r})")
            return getattr(mod_f, name)
        if isinstance(v, torch.nn.Module):
            return self.module(v)
        if isinstance(v, torch.Generator):
            raise Excluded(f"closes over a torch {type(v).__name__}")
        return v

    def module(self, m) -> Any:
        """fusegrad's module of the same class, built from the torch module's attributes of the
        same names as its constructor's arguments, with the same parameters and buffers."""
        cls = getattr(fusegrad.nn, type(m).__name__, None)
        if cls is None:
            raise Excluded(f"closes over a torch {type(m).__name__}, which fusegrad.nn lacks")
        params = inspect.signature(cls.__init__).parameters
        kwargs = {n: self(getattr(m, n)) for n in params if n != "self" and hasattr(m, n)
                  and not isinstance(getattr(m, n), self.torch.Tensor)}
        out = cls(**kwargs)
        state = {k: self.tensor(t) for k, t in m.state_dict().items()}
        if state:
            out.load_state_dict(state)
        return out.train(m.training)

    def function(self, fn: types.FunctionType, depth: int = 0) -> types.FunctionType:
        """The same code with fusegrad's globals and converted closure cells."""
        cells = None
        if fn.__closure__:
            cells = tuple(types.CellType(self(c.cell_contents, depth + 1)) if _filled(c) else c
                          for c in fn.__closure__)
        defaults = self(fn.__defaults__, depth + 1) if fn.__defaults__ else fn.__defaults__
        out = types.FunctionType(fn.__code__, self.fg_globals, fn.__name__, defaults, cells)
        out.__kwdefaults__ = self(fn.__kwdefaults__, depth + 1) if fn.__kwdefaults__ else None
        return out


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not _filled  # reading an empty cell raises
    except ValueError:
        return False


import functools  # noqa: E402  (named apart so that the converter's isinstance reads plainly)

functools_partial = functools.partial


# ----------------------------------------------------------------------------- comparison

class Mismatch(Exception):
    """fusegrad's value differs from torch's."""


def _tolerance(dtype_name: str, ref: np.ndarray, atol: float | None, rtol: float | None):
    eps = float(np.finfo({"bfloat16": np.float32}.get(dtype_name, dtype_name)).eps)
    if dtype_name == "bfloat16":
        eps = 2.0 ** -7
    r = math.sqrt(eps)
    finite = np.abs(ref[np.isfinite(ref)]) if ref.size else np.zeros(0)
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    a = r * scale
    return max(a, atol or 0.0), max(r, rtol or 0.0)


def _numpy_torch(t) -> np.ndarray:
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy()


def compare(what: str, got, ref, atol: float | None, rtol: float | None) -> None:
    """Raise Mismatch unless fusegrad's tensor ``got`` matches torch's ``ref``."""
    if not isinstance(got, fusegrad.Tensor):
        raise Mismatch(f"{what}: fusegrad gave {type(got).__name__}, torch a Tensor")
    ref_dtype = str(ref.dtype).removeprefix("torch.")
    got_dtype = got.dtype.name
    if tuple(got.shape) != tuple(ref.shape):
        raise Mismatch(f"{what}: shape {list(got.shape)} != torch's {list(ref.shape)}")
    if got_dtype != ref_dtype:
        raise Mismatch(f"{what}: dtype {got_dtype} != torch's {ref_dtype}")
    r = _numpy_torch(ref)
    g = got.detach().numpy()
    if got.dtype.is_floating_point:
        g, r = g.astype(np.float64), r.astype(np.float64)
        a, rt = _tolerance(ref_dtype, r, atol, rtol)
        bad = ~np.isclose(g, r, atol=a, rtol=rt, equal_nan=True)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.shape else ()
            raise Mismatch(f"{what}: {int(bad.sum())}/{bad.size} values differ (atol {a:.2g}, rtol "
                           f"{rt:.2g}); at {tuple(int(k) for k in i)}: {g[i]!r} vs torch's {r[i]!r}")
    elif not np.array_equal(g, r):
        bad = g != r
        raise Mismatch(f"{what}: {int(np.sum(bad))}/{bad.size} values differ")


# ----------------------------------------------------------------------------- running a case

@dataclass
class Outcome:
    """One recorded call: its id, whether it counts, and its eager and compiled results."""

    name: str
    source: str
    excluded: str | None = None
    eager: str | None = None          # None: passed; else the failure
    compiled: str | None = None
    ran_eagerly: bool = False         # the compiled call fell back to eager
    notes: list[str] = field(default_factory=list)


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:300]}"


class Suite:
    """Runs every test method of the rewritten module and records each call's outcome."""

    def __init__(self, path: str, modes: tuple[str, ...], pattern: str | None):
        import torch
        self.torch = torch
        self.path = path
        self.modes = modes
        self.code, self.sites = load_suite(path)
        self.outcomes: list[Outcome] = []
        self.occurrence: collections.Counter = collections.Counter()
        self.pattern = re.compile(pattern) if pattern else None
        self.body_errors: list[str] = []
        self.fg_globals: dict = {}
        self.torch_globals: dict = {}
        self.converter: _Converter | None = None

    def _namespace(self, torch_module) -> dict:
        ns = {"__name__": "op_suite_tests", "__file__": self.path, "torch": torch_module,
              STUB: _Stub(), "_getenv": _getenv, "_Dtypes": _Dtypes, RECORD: self.record}
        exec(self.code, ns)
        return ns

    def run(self) -> None:
        self.torch_globals = self._namespace(self.torch)
        self.fg_globals = self._namespace(fusegrad)
        self.converter = _Converter(self.torch, self.path, self.fg_globals)
        import unittest
        classes = [v for v in self.torch_globals.values() if isinstance(v, type)
                   and issubclass(v, unittest.TestCase) and v is not unittest.TestCase]
        for cls in classes:
            for name in sorted(n for n in vars(cls) if n.startswith("test")):
                if self.pattern and not self.pattern.search(f"{cls.__name__}.{name}"):
                    continue
                self.method = f"{cls.__name__}.{name}"
                inst = cls(name)
                inst.helper_test_exception = lambda *a, **k: None
                try:
                    getattr(inst, name)()
                except Exception as e:  # a statement that holds a call failed
                    self.body_errors.append(f"{self.method}: {_short(e)}")

    def record(self, site: int, shps, torch_fxn, atol=1e-6, rtol=1e-3, grad_atol=1e-4, grad_rtol=1e-3,
               forward_only=False, vals=None, low=-2, high=2) -> None:
        s = self.sites[site]
        self.occurrence[site] += 1
        k = self.occurrence[site]
        out = Outcome(f"{self.method}:{s.lineno}" + (f"#{k}" if k > 1 else ""), s.fxn_source)
        self.outcomes.append(out)
        tol = {n: v for n, v in (("atol", atol), ("rtol", rtol), ("grad_atol", grad_atol),
                                 ("grad_rtol", grad_rtol)) if n in s.explicit}
        try:
            self._case(out, shps, torch_fxn, forward_only, vals, low, high, tol)
        except Excluded as e:
            out.excluded = str(e)

    def _inputs(self, shps, vals, low, high, forward_only):
        torch = self.torch
        if shps is None:
            ts = [torch.tensor(x, requires_grad=not forward_only) for x in vals]
        else:
            np.random.seed(0)
            data = [np.random.uniform(low=low, high=high, size=size).astype(np.float32) for size in shps]
            ts = [torch.tensor(d, requires_grad=not forward_only) for d in data]
        return [t.type(torch.int32) if t.dtype == torch.int64 else t for t in ts]

    def _case(self, out: Outcome, shps, torch_fxn, forward_only, vals, low, high, tol) -> None:
        torch = self.torch
        try:
            ts = self._inputs(shps, vals, low, high, forward_only)
        except Exception as e:
            raise Excluded(f"torch rejects the inputs: {_short(e)}") from None
        try:
            ref = torch_fxn(*ts)
        except Exception as e:
            raise Excluded(f"torch raises: {_short(e)}") from None
        if not isinstance(ref, torch.Tensor):
            raise Excluded(f"torch's function returns {type(ref).__name__}, not a Tensor")
        if ref.is_complex():
            raise Excluded("complex output (fusegrad has no complex dtypes yet)")
        ref_grads = None
        if not forward_only and ts:
            try:
                ref_grads = torch.autograd.grad(torch_fxn(*ts).sum(), ts)
            except Exception as e:
                raise Excluded(f"torch's backward raises: {_short(e)}") from None
        fg_fxn = self.converter(torch_fxn)
        if "eager" in self.modes:
            out.eager = self._check(fg_fxn, ts, ref, ref_grads, tol, out, compiled=False)
        if "compiled" in self.modes:
            out.compiled = self._check(fg_fxn, ts, ref, ref_grads, tol, out, compiled=True)

    def _check(self, fg_fxn, ts, ref, ref_grads, tol, out: Outcome, compiled: bool) -> str | None:
        stage = "forward"
        try:
            xs = [self.converter.tensor(t) for t in ts]
            fn = fusegrad.compile(fg_fxn) if compiled else fg_fxn
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = fn(*xs)
                compare("forward", got, ref, tol.get("atol"), tol.get("rtol"))
                if ref_grads is not None:
                    stage = "backward"
                    xs = [self.converter.tensor(t) for t in ts]
                    grads = fusegrad.autograd.grad(fn(*xs).sum(), xs)
                    for i, (g, r) in enumerate(zip(grads, ref_grads)):
                        compare(f"grad of input {i}", g, r, tol.get("grad_atol"), tol.get("grad_rtol"))
            if compiled and any("eagerly" in str(w.message) for w in caught):
                out.ran_eagerly = True
            return None
        except Mismatch as e:
            return f"mismatch: {e}"
        except Excluded:
            raise
        except Exception as e:
            where = _user_frame(e)
            return f"{stage} raises {_short(e)}" + (f" [{where}]" if where else "")


def _user_frame(e: BaseException) -> str:
    """The innermost fusegrad frame that raised, as file:line."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/fusegrad/" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('/fusegrad/', 1)[1]}:{f.lineno}"


# ----------------------------------------------------------------------------- report

def _cause(failure: str) -> str:
    """A failure's cause without the numbers that differ from case to case."""
    text = re.sub(r"\[[^\]]*\]|\(\S*\)|\d+(\.\d+)?(e-?\d+)?", "#", failure)
    return text[:160]


def report(suite: Suite, verbose: bool) -> int:
    counted = [o for o in suite.outcomes if o.excluded is None]
    excluded = [o for o in suite.outcomes if o.excluded is not None]
    print(f"{len(suite.outcomes)} cases from {len({s.lineno for s in suite.sites})} helper_test_op calls; "
          f"{len(excluded)} excluded, {len(counted)} counted")
    for mode in suite.modes:
        fails = [o for o in counted if getattr(o, mode) is not None]
        n = len(counted)
        pct = 100.0 * (n - len(fails)) / n if n else 100.0
        extra = ""
        if mode == "compiled":
            extra = f" ({sum(o.ran_eagerly for o in counted)} of them ran eagerly: data-dependent trace)"
        print(f"{mode:9s}: {n - len(fails)} / {n} pass ({pct:.2f}%){extra}")
    for mode in suite.modes:
        groups: dict[str, list[Outcome]] = collections.defaultdict(list)
        for o in counted:
            if getattr(o, mode) is not None:
                groups[_cause(getattr(o, mode))].append(o)
        if not groups:
            continue
        print(f"\n{mode} failures by cause:")
        for _, cases in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  [{len(cases)}] {getattr(cases[0], mode)}")
            for o in cases[: None if verbose else 6]:
                print(f"      {o.name}  {o.source[:100]}")
            if not verbose and len(cases) > 6:
                print(f"      ... and {len(cases) - 6} more")
    reasons: dict[str, list[Outcome]] = collections.defaultdict(list)
    for o in excluded:
        reasons[_cause(o.excluded)].append(o)
    print("\nexcluded:" + ("" if reasons else " none"))
    for _, cases in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        print(f"  [{len(cases)}] {cases[0].excluded}")
        for o in cases[: None if verbose else 3]:
            print(f"      {o.name}  {o.source[:100]}")
    eager_fallbacks = [o for o in counted if o.ran_eagerly]
    if eager_fallbacks:
        print("\ncompiled calls that ran eagerly (their trace depends on data):")
        for o in eager_fallbacks:
            print(f"      {o.name}  {o.source[:100]}")
    if suite.body_errors:
        print("\ntest bodies that stopped at a statement holding a call:")
        for line in suite.body_errors:
            print(f"  {line}")
    if verbose:
        print("\nall cases:")
        for o in suite.outcomes:
            status = o.excluded and f"excluded ({o.excluded})" or " | ".join(
                f"{m}: {getattr(o, m) or 'ok'}" for m in suite.modes)
            print(f"  {o.name}: {status}")
    return 0 if all(getattr(o, m) is None for o in counted for m in suite.modes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_ops", help="path to tinygrad's test_ops.py")
    parser.add_argument("-k", dest="pattern", help="run test methods whose Class.name matches this regex")
    parser.add_argument("--mode", choices=("both", "eager", "compiled"), default="both")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    modes = ("eager", "compiled") if args.mode == "both" else (args.mode,)
    warnings.filterwarnings("ignore")
    np.seterr(all="ignore")
    suite = Suite(args.test_ops, modes, args.pattern)
    suite.run()
    return report(suite, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
