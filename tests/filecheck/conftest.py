"""Collect every ``tests/filecheck/**/*.fg`` file as a test that runs its ``// RUN:`` lines.

A RUN line is a shell pipeline, as in LLVM's lit::

    // RUN: fusegrad-opt %s -p cse | filecheck %s
    // RUN: not fusegrad-opt %s 2>&1 | filecheck %s --check-prefix=ERR

``%s`` is the file's path. The commands are ``fusegrad-opt``, ``filecheck`` (the Python
FileCheck clone), and ``not`` before a command that must fail; ``2>&1`` sends a command's
stderr into the pipe. Stages are separated by `` | `` with spaces around it; a line that
ends with ``\\`` continues on the next RUN line. The test fails when any stage fails
(pipefail), with the FileCheck report and what each stage printed.

Both tools run in this process (``fusegrad.passes.opt_cli.run_opt`` and filecheck's
Matcher), because starting Python and importing fusegrad for every file costs about two
seconds on a small machine. ``FUSEGRAD_FILECHECK_SUBPROCESS=1`` runs every line through bash
instead, as ``sys.executable -m fusegrad.passes.opt_cli`` and ``sys.executable -m
filecheck``; ``tests/passes/test_pass_opt_cli.py`` runs one file that way in any case.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_RUN_RE = re.compile(r"//\s*RUN:(.*)$")


def run_lines(text: str) -> list[str]:
    """The commands of a test file's RUN lines (continuations joined)."""
    commands, pending = [], ""
    for line in text.split("\n"):
        m = _RUN_RE.search(line)
        if not m:
            continue
        part = m.group(1).strip()
        if part.endswith("\\"):
            pending += part[:-1] + " "
            continue
        commands.append((pending + part).strip())
        pending = ""
    if pending:
        commands.append(pending.strip())
    return commands


@dataclass
class Stage:
    """One command of a pipeline."""

    argv: list[str]
    negate: bool = False
    merge_stderr: bool = False
    code: int = 0
    stdout: str = ""
    stderr: str = ""


@dataclass
class RunResult:
    command: str
    stages: list[Stage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all((s.code != 0) == s.negate for s in self.stages)

    def report(self) -> str:
        lines = [f"RUN: {self.command}"]
        for s in self.stages:
            status = f"exit {s.code}" + (" (expected a failure)" if s.negate else "")
            lines.append(f"--- {' '.join(s.argv)}: {status}")
            if s.stdout:
                lines.append(f"stdout:\n{s.stdout.rstrip()}")
            if s.stderr:
                lines.append(f"stderr:\n{s.stderr.rstrip()}")
        return "\n".join(lines)


def parse_pipeline(command: str, path: Path) -> list[Stage]:
    """``command`` with ``%s`` substituted, split into stages."""
    tokens = shlex.split(command.replace("%s", shlex.quote(str(path))))
    stages, current = [], []
    for tok in tokens + ["|"]:
        if tok != "|":
            current.append(tok)
            continue
        stage = Stage([])
        if current and current[0] == "not":
            stage.negate, current = True, current[1:]
        if "2>&1" in current:
            stage.merge_stderr = True
            current = [t for t in current if t != "2>&1"]
        if not current:
            raise ValueError(f"empty command in RUN line: {command}")
        stage.argv = current
        stages.append(stage)
        current = []
    return stages


def _run_fusegrad_opt(stage: Stage, stdin: str) -> None:
    from fusegrad.passes.opt_cli import run_opt
    out = io.StringIO()
    err = out if stage.merge_stderr else io.StringIO()
    stage.code = run_opt(stage.argv[1:], io.StringIO(stdin), out, err)
    stage.stdout = out.getvalue()
    stage.stderr = "" if stage.merge_stderr else err.getvalue()


def _run_filecheck(stage: Stage, stdin: str) -> None:
    from filecheck.finput import FInput
    from filecheck.matcher import Matcher
    from filecheck.options import parse_argv_options
    from filecheck.parser import Parser
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            opts = parse_argv_options(["filecheck", *stage.argv[1:]])
            if opts.input_file == "-":
                finput = FInput("-", FInput.canonicalize_line_ends(stdin))
            else:
                finput = FInput.from_opts(opts)
            stage.code = Matcher(opts, finput, Parser.from_opts(opts)).run()
        except (RuntimeError, OSError) as e:
            print(f"filecheck: {e}", file=err)
            stage.code = 2
    stage.stderr = err.getvalue()


def _filecheck_api() -> bool:
    """Whether this filecheck has the internals the in-process runner uses (1.0.x does)."""
    try:
        from filecheck.finput import FInput
        from filecheck.matcher import Matcher
        from filecheck.options import parse_argv_options  # noqa: F401
        from filecheck.parser import Parser
    except ImportError:
        return False
    return all(hasattr(c, a) for c, a in [(FInput, "canonicalize_line_ends"),
                                          (FInput, "from_opts"), (Matcher, "run"),
                                          (Parser, "from_opts")])


_IN_PROCESS = {"fusegrad-opt": _run_fusegrad_opt}
if _filecheck_api():
    _IN_PROCESS["filecheck"] = _run_filecheck


def _shell_command(stages: list[Stage]) -> str:
    tools = {"fusegrad-opt": [sys.executable, "-m", "fusegrad.passes.opt_cli"],
             "filecheck": [sys.executable, "-m", "filecheck"]}
    parts = []
    for s in stages:
        argv = tools.get(s.argv[0], s.argv[:1]) + s.argv[1:]
        text = shlex.join(argv) + (" 2>&1" if s.merge_stderr else "")
        parts.append(f"{{ ! {text}; }}" if s.negate else text)
    return " | ".join(parts)


def execute(command: str, path: Path, subprocess_mode: bool = False) -> RunResult:
    """Run one RUN line for the test file at ``path``."""
    result = RunResult(command, parse_pipeline(command, path))
    if subprocess_mode or any(s.argv[0] not in _IN_PROCESS for s in result.stages):
        shell = _shell_command(result.stages)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=REPO, text=True,
                              capture_output=True, timeout=120)
        last = Stage([shell], code=done.returncode, stdout=done.stdout, stderr=done.stderr)
        result.stages = [last]
        return result
    data = ""
    for stage in result.stages:
        _IN_PROCESS[stage.argv[0]](stage, data)
        data = stage.stdout
    return result


class FileCheckFailure(Exception):
    pass


class FileCheckItem(pytest.Item):
    """One ``.fg`` file: every RUN line must succeed."""

    def runtest(self) -> None:
        commands = run_lines(self.path.read_text(encoding="utf-8"))
        if not commands:
            raise FileCheckFailure(f"{self.path}: no '// RUN:' line")
        subprocess_mode = os.environ.get("FUSEGRAD_FILECHECK_SUBPROCESS", "") not in ("", "0")
        for command in commands:
            result = execute(command, self.path, subprocess_mode)
            if not result.ok:
                raise FileCheckFailure(result.report())

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, FileCheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        try:
            shown = self.path.relative_to(REPO)
        except ValueError:
            shown = self.path
        return self.path, 0, f"filecheck {shown}"


class FileCheckFile(pytest.File):
    def collect(self):
        yield FileCheckItem.from_parent(self, name=self.path.stem)


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".fg":
        return FileCheckFile.from_parent(parent, path=file_path)
    return None
