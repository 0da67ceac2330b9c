"""checkgen writes check lines that pass FileCheck on the output they came from, and only on
outputs that differ from it in SSA numbering."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

from fusegrad.passes.checkgen import generate_checks, main
from fusegrad.passes.opt_cli import run_opt

REPO = Path(__file__).resolve().parents[2]
INPUT = REPO / "tests" / "filecheck" / "pipeline" / "simplify_cse_fold_dce.fg"

EXTRA = """graph @g(%x: f32[2,2]) -> (f32[4,4], f32[2,2]) {
  %0 = pad %x {widths=[[1, 1], [1, 1]], value=0.0} : f32[4,4]
  %1 = constant {value=dense<[[1.0, 2.0], [3.0, 4.0]]>} : f32[2,2]
  %2 = add %x, %1 : f32[2,2]
  return %0, %2
}"""


def _output() -> str:
    out, err = io.StringIO(), io.StringIO()
    text = INPUT.read_text() + "\n" + EXTRA
    assert run_opt(["-p", "simplify,cse,fold,dce,fuse"], io.StringIO(text), out, err) == 0, err
    return out.getvalue()


def _filecheck(checks: str, output: str, tmp_path: Path) -> subprocess.CompletedProcess:
    check_file = tmp_path / "checks.fg"
    check_file.write_text(checks + "\n")
    return subprocess.run([sys.executable, "-m", "filecheck", str(check_file)], input=output,
                          capture_output=True, text=True, timeout=60)


def test_generated_checks_pass_on_their_output(tmp_path):
    output = _output()
    checks = generate_checks(output)
    lines = checks.splitlines()
    assert lines[0].startswith("// CHECK: // kernel k0[matmul 4x8]")
    assert "// CHECK-LABEL: graph @layer(%x: f32[4,8], %w: f32[8,8]) -> (f32[4,8]) {" in lines
    assert "// CHECK-NEXT: [[V0:%[0-9]+]] = matmul %x, %w : f32[4,8]" in lines
    assert "// CHECK-NEXT: return [[V3]]" in lines
    assert any("pad %x {widths={{\\[\\[}}1, 1], [1, 1]]" in line for line in lines)
    result = _filecheck(checks, output, tmp_path)
    assert result.returncode == 0, result.stderr

    # Renumbered results still match; a changed op does not.
    renumbered = re.sub(r"%(\d+)\b", lambda m: f"%{int(m.group(1)) + 10}", output)
    assert _filecheck(checks, renumbered, tmp_path).returncode == 0
    changed = output.replace("tanh", "sigmoid")
    assert _filecheck(checks, changed, tmp_path).returncode != 0


def test_command_line(tmp_path):
    out_file = tmp_path / "out.txt"
    out_file.write_text("graph @f(%x: f32[2]) -> (f32[2]) {\n  %0 = exp %x : f32[2]\n"
                        "  return %0\n}\n")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([str(out_file)]) == 0
    assert buf.getvalue().splitlines() == [
        "// CHECK-LABEL: graph @f(%x: f32[2]) -> (f32[2]) {",
        "// CHECK-NEXT: [[V0:%[0-9]+]] = exp %x : f32[2]",
        "// CHECK-NEXT: return [[V0]]",
        "// CHECK-NEXT: }",
    ]
