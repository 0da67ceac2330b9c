"""Write the FileCheck lines that a pass test expects, from the output it should produce (as
MLIR's ``generate-test-checks.py`` does)::

    fusegrad-opt test.fg -p cse | python -m fusegrad.passes.checkgen
    python -m fusegrad.passes.checkgen out.txt

For each graph it prints ``// CHECK-LABEL: graph @f(...)`` and a ``// CHECK-NEXT:`` line per
line of the graph. Node results are renumbered by every pass, so they become FileCheck
variables: ``[[V3:%[0-9]+]]`` where ``%3`` is defined, ``[[V3]]`` where it is used; graph
inputs keep their names, which passes keep. Kernel comment lines (``// kernel ...``) before a
graph are checked too. Review the generated lines and keep the ones that say what the test is
about: checks of every line make a test fail on any unrelated change.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

__all__ = ["generate_checks", "main"]

_RESULT_RE = re.compile(r"(?<![\w.%])%(\d+)\b")
_DEFINITION_RE = re.compile(r"^(\s*)%(\d+)(\s*=)")


def _escape(text: str) -> str:
    # FileCheck reads '[[' as a variable and '{{' as a regex; nested brackets of dense
    # constants and pad widths must be matched literally.
    return text.replace("{{", "{{\\{\\{}}").replace("[[", "{{\\[\\[}}")


def _substitute(line: str, defined: set[str]) -> str:
    """``line`` with escaped text and node results as FileCheck variables."""
    out, pos = [], 0
    definition = _DEFINITION_RE.match(line)
    for m in _RESULT_RE.finditer(line):
        out.append(_escape(line[pos:m.start()]))
        var = f"V{m.group(1)}"
        if definition is not None and m.start() == definition.start(2) - 1:
            out.append(f"[[{var}:%[0-9]+]]")
            defined.add(var)
        elif var in defined:
            out.append(f"[[{var}]]")
        else:
            out.append(m.group(0))     # not defined in this graph: keep the text
        pos = m.end()
    out.append(_escape(line[pos:]))
    return "".join(out)


def generate_checks(output: str, prefix: str = "CHECK") -> str:
    """The check lines for ``output`` (the text ``fusegrad-opt`` printed)."""
    lines: list[str] = []
    defined: set[str] = set()
    previous_checked = False       # whether the line before was checked (for -NEXT)
    for raw in output.split("\n"):
        line = raw.rstrip()
        if not line.strip() or line.strip() == "// -----":
            previous_checked = False
            continue
        stripped = line.strip()
        if stripped.startswith("graph @"):
            defined = set()
            lines.append(f"// {prefix}-LABEL: {_substitute(stripped, defined)}")
        elif stripped.startswith("// kernel ") and not previous_checked:
            lines.append(f"// {prefix}: {_escape(stripped)}")
        else:
            kind = f"{prefix}-NEXT" if previous_checked else prefix
            lines.append(f"// {kind}: {_substitute(stripped, defined)}")
        previous_checked = True
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fusegrad.passes.checkgen [file]``: print check lines for the file (or
    stdin)."""
    p = argparse.ArgumentParser(prog="python -m fusegrad.passes.checkgen",
                                description="Generate FileCheck lines for fusegrad-opt output.")
    p.add_argument("input", nargs="?", default="-", help="fusegrad-opt output (default: stdin)")
    p.add_argument("--check-prefix", default="CHECK", help="FileCheck prefix (default: CHECK)")
    args = p.parse_args(argv)
    try:
        text = sys.stdin.read() if args.input == "-" else open(args.input, encoding="utf-8").read()
    except OSError as e:
        print(f"checkgen: error: cannot read {args.input}: {e.strerror or e}", file=sys.stderr)
        return 1
    checks = generate_checks(text, args.check_prefix)
    if checks:
        print(checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
