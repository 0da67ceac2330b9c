"""fusegrad-opt's options and errors, run in-process through ``run_opt`` (the FileCheck tests
in tests/filecheck/ exercise its output), plus one run as the real command line."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest

from fusegrad.passes.manager import PASSES, Pass
from fusegrad.passes.opt_cli import main, run_opt, split_input

REPO = Path(__file__).resolve().parents[2]

GRAPH = """graph @f(%x: f32[4]) -> (f32[4]) {
  %0 = exp %x : f32[4] loc("model.py":3)
  %1 = exp %x : f32[4]
  %2 = add %0, %1 : f32[4]
  return %2
}
"""


def opt(*argv: str, stdin: str = GRAPH) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_opt(list(argv), io.StringIO(stdin), out, err)
    return code, out.getvalue(), err.getvalue()


def test_reads_stdin_and_writes_the_result(tmp_path):
    code, out, err = opt("-p", "cse")
    assert code == 0 and err == ""
    assert out.count("exp") == 1 and out.endswith("}\n")
    target = tmp_path / "out.fg"
    assert opt("-", "-p", "cse", "-o", str(target)) == (0, "", "")
    assert target.read_text() == out


def test_every_graph_of_a_file_is_processed():
    code, out, _ = opt("-p", "cse", stdin=GRAPH + "\n" + GRAPH.replace("@f", "@g"))
    assert code == 0 and "graph @f" in out and "graph @g" in out and out.count("exp") == 2


def test_locations_print_on_request():
    assert 'loc("model.py":3)' not in opt()[1]
    assert 'loc("model.py":3)' in opt("--print-locations")[1]


def test_split_input_keeps_line_numbers():
    chunks = split_input("a\n// -----\nb\nc\n  // -----  \nd", split=True)
    assert [(c.text, c.line_offset) for c in chunks] == [("a", 0), ("b\nc", 2), ("d", 5)]


@pytest.mark.parametrize("argv,stdin,message", [
    (["-p", "cse,"], GRAPH, None),
    (["-p", "nope"], GRAPH, "unknown pass 'nope'"),
    (["-p", "fold{size=3}"], GRAPH, "pass 'fold' has no option 'size'"),
    (["/no/such/file.fg"], "", "cannot read /no/such/file.fg"),
    (["--frobnicate"], GRAPH, "unrecognized arguments: --frobnicate"),
    ([], "graph @f(", "<stdin>:1:10: expected"),
    ([], "graph @f(%x: f32[4]) -> (f32[4]) {\n  return %y\n}", "<stdin>:2:10: use of undefined"),
])
def test_errors_are_one_clean_line(argv, stdin, message):
    code, out, err = opt(*argv, stdin=stdin)
    if message is None:
        assert code == 0
        return
    assert code == 1 and out == ""
    assert err.startswith("fusegrad-opt: error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.fixture
def exploding_pass(monkeypatch):
    class Explode(Pass):
        """Fails, as a buggy pass would."""
        name = "explode"

        def run(self, graph):
            raise KeyError("boom")

    monkeypatch.setitem(PASSES, "explode", dataclasses.dataclass(Explode))


def test_a_crashing_pass_is_reported_not_dumped(exploding_pass):
    code, _, err = opt("-p", "cse,explode")
    assert code == 1
    assert err == "fusegrad-opt: error: <stdin>: @f: KeyError: 'boom'\n"
    with pytest.raises(KeyError):
        opt("-p", "explode", "--traceback")


def test_verify_diagnostics_reports_unexpected_and_missing_errors(exploding_pass):
    good = "// expected-error@+1 {{expected a tensor type}}\ngraph @f(%x: bad) -> () {\n}"
    assert opt("--verify-diagnostics", stdin=good) == (0, "", "")
    wrong_line = "// expected-error {{expected a tensor type}}\ngraph @f(%x: bad) -> () {\n}"
    code, _, err = opt("--verify-diagnostics", stdin=wrong_line)
    assert code == 1
    assert "<stdin>:2:14: error: unexpected error: expected a tensor type" in err
    assert "<stdin>:1: error: expected error at line 1 was not produced" in err
    code, _, err = opt("--verify-diagnostics", stdin=GRAPH + "// expected-error@+1 {{nothing}}")
    assert code == 1 and "was not produced: {{nothing}}" in err
    # Errors without a line (a pass, the verifier) match @unknown.
    unknown = GRAPH + "// expected-error@unknown {{KeyError: 'boom'}}"
    assert opt("-p", "explode", "--verify-diagnostics", stdin=unknown)[0] == 0


def test_timing_and_list_passes():
    code, _, err = opt("-p", "simplify,cse", "--timing")
    assert code == 0 and err.splitlines()[0].split() == ["pass", "ms", "%"]
    assert "cse" in err and "simplify" in err
    code, out, _ = opt("--list-passes")
    names = [line.split()[0] for line in out.splitlines()[1:] if line.startswith("  ") and
             not line.startswith("    ")]
    assert {"cse", "dce", "fold", "fuse", "simplify"} <= set(names)
    assert "max_elements: int = 1024" in out


def test_print_ir_after_all_goes_to_stderr():
    code, out, err = opt("-p", "cse,dce", "--print-ir-after-all")
    assert code == 0
    assert [line.split(" IR Dump After ")[1].split("{")[0].split()[0]
            for line in err.splitlines() if "IR Dump After" in line] == ["cse", "dce"]
    assert "IR Dump" not in out


def test_main_takes_argv(capsys):
    assert main(["--list-passes"]) == 0
    assert "simplify" in capsys.readouterr().out


@pytest.mark.slow
def test_the_command_line_pipes_into_filecheck():
    """The whole path a RUN line takes without the in-process shortcut: ``python -m``."""
    test = REPO / "tests" / "filecheck" / "cse" / "cse.fg"
    opt_run = subprocess.run([sys.executable, "-m", "fusegrad.passes.opt_cli", str(test), "-p", "cse"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert opt_run.returncode == 0, opt_run.stderr
    check = subprocess.run([sys.executable, "-m", "filecheck", str(test)], input=opt_run.stdout,
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert check.returncode == 0, check.stderr


def test_help_goes_to_the_given_stream():
    code, out, err = opt("--help")
    assert code == 0 and out.startswith("usage: fusegrad-opt") and "--split-input-file" in out


# --------------------------------------------------------------------------- symbolic sizes

SYMBOLIC = """graph @mlp(%x: f32[B,8], %w: f32[8,4]) -> (f32[B,4], f32[4*B], f32[]) {
  %0 = matmul %x, %w : f32[B,4]
  %1 = maximum %0, 0.0 : f32[B,4]
  %2 = reshape %1 {shape=[4*B]} : f32[4*B]
  %3 = sum %2 {axes=[0]} : f32[]
  %4 = mul %3, 1.0 : f32[]
  return %1, %2, %4
}
"""


@pytest.mark.parametrize("pipeline", ["simplify,cse,dce", "fold,simplify,cse,dce", "partition",
                                      "vjp,simplify,cse,dce"])
def test_passes_read_and_write_symbolic_types(pipeline):
    # fold compared a symbolic element count with its limit, and partition and vjp needed
    # the sizes a trace was made at, which a graph read from text has not.
    code, out, err = opt("-p", pipeline, stdin=SYMBOLIC)
    assert code == 0 and err == "", err
    assert "f32[B,8]" in out and "f32[4*B]" in out


def test_fuse_partitions_symbolic_sizes_and_bind_specializes():
    code, out, err = opt("-p", "fuse", stdin=SYMBOLIC)
    assert code == 0 and err == ""
    assert "%x: f32[B,8]" in out and out.startswith("// kernel k0[")
    code, out, err = opt("-p", "fuse", "--bind", "B=16", stdin=SYMBOLIC)
    assert code == 0 and err == ""
    assert "%x: f32[16,8]" in out and "f32[64]" in out and out.startswith("// kernel k0[")
    assert opt("-p", "cse", "--bind", "B=16")[1] == opt("-p", "cse")[1]   # no symbols: as is


@pytest.mark.parametrize("bind,message", [
    ("T=4", "--bind gives no size to symbol(s) B of @mlp"),
    ("B=1", "argument --bind: B=1: a symbolic size is at least 2"),
    ("B", "argument --bind: expected SYMBOL=SIZE pairs, got 'B'"),
])
def test_bad_bindings_are_one_line_errors(bind, message):
    code, out, err = opt("-p", "cse", "--bind", bind, stdin=SYMBOLIC)
    assert code == 1 and out == "" and err.count("\n") == 1 and message in err, err
