"""``fusegrad-opt``: run a pass pipeline over graphs in the IR's text form, as ``mlir-opt`` and
``xdsl-opt`` do. Pass tests are text files that run it (see README, "Writing a pass test").

::

    fusegrad-opt input.fg -p simplify,cse,dce          # print the optimized graph
    fusegrad-opt - -p "fuse{max_inputs=8}" < input.fg  # stdin; prints the kernels as comments
    fusegrad-opt input.fg -p cse --print-ir-after-all  # IR after each pass, on stderr
    fusegrad-opt cases.fg --split-input-file           # graphs separated by '// -----' lines
    fusegrad-opt bad.fg --verify-diagnostics           # errors must be the expected ones
    fusegrad-opt mlp.fg -p fuse --bind B=32           # symbolic sizes specialized first
    fusegrad-opt --list-passes

Every graph in the input (or in each ``// -----`` chunk) goes through the pipeline on its own;
outputs follow in the same order. After a ``fuse`` pass the kernel partition prints before the
graph, one ``// kernel k0[elementwise 4x8](mul,add,tanh)`` comment per kernel.

``--verify-diagnostics`` checks errors against annotations in the input, as MLIR's does:

- ``// expected-error {{substring}}``: an error on this line (the comment ends a node line);
- ``// expected-error@+1 {{substring}}``, ``@-2``: an error that many lines below/above;
- ``// expected-error@unknown {{substring}}``: an error without a line (a verifier or pass
  error; the parser's errors have lines).

Every error must be expected and every expectation met; then the exit code is 0.

Exit codes: 0 on success, 1 on any error, always with a one-line ``fusegrad-opt: error: ...``
message and never a traceback (``--traceback`` shows one for errors inside a pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Sequence, TextIO

from fusegrad.ir.graph import Graph, IRError
from fusegrad.ir.parser import IRParseError, parse_many
from fusegrad.ir.printer import print_graph
from fusegrad.ir.specialize import specialize
from fusegrad.passes.manager import PASSES, PassManager, PipelineError
from fusegrad.symint import MIN_SYMBOL_SIZE, free_symbols

__all__ = ["main", "run_opt", "split_input", "render_graph"]

PROG = "fusegrad-opt"
SPLIT_MARKER_RE = re.compile(r"^//\s*-----\s*$")
SPLIT_MARKER = "// -----"
_EXPECTED_RE = re.compile(r"//\s*expected-error(?:@(?P<where>[+-]\d+|unknown))?\s*\{\{(?P<msg>.*?)\}\}")


class _UsageError(Exception):
    pass


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports errors as one line and prints help to the given stream."""

    def __init__(self, out: TextIO, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    def error(self, message: str):        # argparse would exit(2) with the usage
        raise _UsageError(message)

    def print_help(self, file: TextIO | None = None) -> None:
        super().print_help(file or self.out)


def _bindings(text: str) -> dict[str, int]:
    """``B=4,T=8`` as {symbol: size}; each size at least 2, as a symbol's is."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.strip().isidentifier() or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected SYMBOL=SIZE pairs, got {part!r}")
        if int(value) < MIN_SYMBOL_SIZE:
            raise argparse.ArgumentTypeError(f"{name.strip()}={value.strip()}: a symbolic size is "
                                             f"at least {MIN_SYMBOL_SIZE}")
        out[name.strip()] = int(value)
    return out


def _argument_parser(out: TextIO) -> argparse.ArgumentParser:
    p = _ArgumentParser(out, prog=PROG,
                        description="Run fusegrad passes over graphs in text form.")
    p.add_argument("input", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("-p", "--passes", "--pipeline", dest="pipeline", default="",
                   help='pass pipeline, e.g. "simplify,cse,dce" or "fuse{max_inputs=8}"')
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    p.add_argument("--split-input-file", action="store_true",
                   help="process the chunks between '// -----' lines separately")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check errors against expected-error annotations in the input")
    p.add_argument("--print-ir-after-all", action="store_true",
                   help="print the IR after each pass to stderr")
    p.add_argument("--timing", action="store_true", help="print the time of each pass to stderr")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="verify the input and the IR after each pass (default: on)")
    p.add_argument("--print-locations", action="store_true", help="print source locations")
    p.add_argument("--list-passes", action="store_true", help="list the passes and their options")
    p.add_argument("--bind", metavar="B=4,T=8", type=_bindings, default={},
                   help="specialize graphs with symbolic sizes to these values before the "
                   "pipeline (as a compiled function does at a call's sizes)")
    p.add_argument("--traceback", action="store_true",
                   help="on an error inside a pass, show the Python traceback")
    return p


# --------------------------------------------------------------------------- input chunks


@dataclass
class Chunk:
    """A piece of the input: its text and the number of lines before it in the file."""

    text: str
    line_offset: int


def split_input(text: str, split: bool) -> list[Chunk]:
    """The chunks between ``// -----`` lines (the whole text when ``split`` is false)."""
    if not split:
        return [Chunk(text, 0)]
    chunks, start, current = [], 0, []
    for i, line in enumerate(text.split("\n")):
        if SPLIT_MARKER_RE.match(line.strip()):
            chunks.append(Chunk("\n".join(current), start))
            start, current = i + 1, []
        else:
            current.append(line)
    chunks.append(Chunk("\n".join(current), start))
    return chunks


@dataclass
class Diagnostic:
    """An error, located by its 1-based line in the input file (None: no line)."""

    message: str
    line: int | None = None
    col: int | None = None


@dataclass
class Expectation:
    substring: str
    line: int | None          # None: @unknown
    source_line: int          # where the annotation is written
    met: bool = False


def expectations(chunk: Chunk) -> list[Expectation]:
    """The ``expected-error`` annotations in ``chunk``, with the lines they point at."""
    found = []
    for i, line in enumerate(chunk.text.split("\n")):
        at = chunk.line_offset + i + 1
        for m in _EXPECTED_RE.finditer(line):
            where = m.group("where")
            target = None if where == "unknown" else at + int(where or 0)
            found.append(Expectation(m.group("msg"), target, at))
    return found


# --------------------------------------------------------------------------- running


def render_graph(g: Graph, locations: bool = False) -> str:
    """A graph's text, preceded by its kernel partition when a ``fuse`` pass made one."""
    kernels = getattr(g, "kernels", None)
    lines = [f"// kernel {k}" for k in kernels.summary()] if kernels is not None else []
    return "\n".join(lines + [print_graph(g, locations=locations)])


def _one_line(e: BaseException) -> str:
    text = str(e).strip().split("\n")[0] or type(e).__name__
    return text if isinstance(e, (IRError, PipelineError)) else f"{type(e).__name__}: {text}"


def _specialized(g: Graph, bindings: dict[str, int]) -> Graph:
    """``g`` at the sizes ``bindings`` gives its symbols (all of them; a graph with no
    symbol is returned as it is)."""
    symbols = set().union(*(free_symbols(v.type.shape) for v in g.inputs))
    if not symbols:
        return g
    unbound = sorted(symbols - set(bindings))
    if unbound:
        raise IRError(f"--bind gives no size to symbol(s) {', '.join(unbound)} of @{g.name}")
    return specialize(g, {k: v for k, v in bindings.items() if k in symbols})


def _process(chunk: Chunk, pm: PassManager, args) -> tuple[str, Diagnostic | None]:
    """The output of one chunk, or the first error it raised."""
    try:
        graphs = parse_many(chunk.text)
    except IRParseError as e:
        return "", Diagnostic(e.message, chunk.line_offset + e.line, e.col)
    outputs = []
    for g in graphs:
        try:
            if args.bind:
                g = _specialized(g, args.bind)
            result = pm.run(g)
        except Exception as e:      # a bad graph, or a bug in a pass: report, don't crash
            if args.traceback:
                raise
            return "", Diagnostic(f"@{g.name}: {_one_line(e)}")
        outputs.append(render_graph(result, args.print_locations))
    return "\n\n".join(outputs), None


def _check_diagnostics(chunk: Chunk, diag: Diagnostic | None, name: str,
                       err: TextIO) -> bool:
    """Match ``diag`` against the chunk's annotations; report mismatches; True when clean."""
    wanted = expectations(chunk)
    ok = True
    if diag is not None:
        match = next((x for x in wanted if not x.met and x.line == diag.line
                      and x.substring in diag.message), None)
        if match is not None:
            match.met = True
        else:
            where = f"{name}:{diag.line}:{diag.col}" if diag.line is not None else name
            print(f"{where}: error: unexpected error: {diag.message}", file=err)
            ok = False
    for x in wanted:
        if not x.met:
            target = "without a line" if x.line is None else f"at line {x.line}"
            print(f"{name}:{x.source_line}: error: expected error {target} was not produced: "
                  f"{{{{{x.substring}}}}}", file=err)
            ok = False
    return ok


def _list_passes(out: TextIO) -> None:
    print("Passes (use as -p 'a,b{option=value}'):", file=out)
    for name in sorted(PASSES):
        cls = PASSES[name]
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        print(f"  {name:<10} {doc}", file=out)
        for f in dataclasses.fields(cls):
            kind = getattr(f.type, "__name__", f.type)
            print(f"  {'':<10}   {f.name}: {kind} = {f.default}", file=out)


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def run_opt(argv: Sequence[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    """``fusegrad-opt`` with its streams given: what :func:`main` runs, and what tests call
    in-process."""
    def fail(message: str) -> int:
        print(f"{PROG}: error: {message}", file=stderr)
        return 1

    try:
        args = _argument_parser(stdout).parse_args(list(argv))
    except _UsageError as e:
        return fail(f"{e} (see {PROG} --help)")
    except SystemExit as e:          # --help
        return int(e.code or 0)
    if args.list_passes:
        _list_passes(stdout)
        return 0
    try:
        pm = PassManager(args.pipeline, verify=args.verify, print_after_all=args.print_ir_after_all,
                         out=stderr)
    except PipelineError as e:
        return fail(str(e))
    name = "<stdin>" if args.input == "-" else args.input
    try:
        text = _read(args.input, stdin)
    except (OSError, UnicodeDecodeError) as e:
        return fail(f"cannot read {name}: {getattr(e, 'strerror', None) or e}")

    ok = True
    outputs = []
    for chunk in split_input(text, args.split_input_file):
        output, diag = _process(chunk, pm, args)
        outputs.append(output)
        if args.verify_diagnostics:
            ok &= _check_diagnostics(chunk, diag, name, stderr)
        elif diag is not None:
            where = f"{name}:{diag.line}:{diag.col}: " if diag.line is not None else f"{name}: "
            fail(where + diag.message)
            ok = False

    result = f"\n{SPLIT_MARKER}\n".join(outputs).strip("\n")
    try:
        if args.output == "-":
            stdout.write(result + "\n" if result else "")
        else:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(result + "\n" if result else "")
    except OSError as e:
        return fail(f"cannot write {args.output}: {e.strerror or e}")
    if args.timing:
        print(pm.timing_report(), file=stderr)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: ``fusegrad-opt [input] -p PIPELINE [options]``."""
    return run_opt(sys.argv[1:] if argv is None else argv, sys.stdin, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
