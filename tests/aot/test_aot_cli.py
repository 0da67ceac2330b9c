"""fusegrad-aot compile / show, as a user runs them (python -m fusegrad.aot)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.aot import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRAIN = textwrap.dedent("""
    import fusegrad as fg

    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(12, 16), fg.nn.ReLU(), fg.nn.Linear(16, 5))
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = fg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
""")


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "fusegrad.aot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_compile_then_show(tmp_path):
    (tmp_path / "train_cli_mod.py").write_text(TRAIN)
    out = _run(["compile", "train_cli_mod:step", "--example", "f32[8,12]", "--example",
                "i64[8]:5", "-o", "step.fgaot"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "wrote step.fgaot" in out.stdout
    shown = _run(["show", "step.fgaot"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for expected in ("in  arg0 x: f32[8,12]", "in  arg1 y: i64[8]", "out 0: f32[]",
                     "* model.0.weight: f32[16,12] <-", "graph @step(", "matmul",
                     "memory plan", "peak scratch bytes: "):
        assert expected in text, expected
    # Kernels with their fused ops: an elementwise epilogue fused into a matmul (whose
    # product is numpy's BLAS or, on AVX-512 CPUs, a generated GEMM).
    assert any(line.strip().startswith(("blas+llvm", "gemm+llvm")) and "(matmul," in line
               for line in text.splitlines())
    # The artifact the command line built runs here and trains.
    run = fg.aot.load(tmp_path / "step.fgaot")
    x = fg.tensor(np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32))
    y = fg.tensor(np.arange(8) % 5)
    first, second = run(x, y).item(), run(x, y).item()
    assert second < first


@pytest.mark.slow
def test_show_refuses_a_corrupt_file(tmp_path):
    path = tmp_path / "bad.fgaot"
    path.write_bytes(b"FGAO\r\n\x1a\n" + b"\0" * 100)
    out = _run(["show", str(path)], tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith("fusegrad-aot: error:") and "Traceback" not in out.stderr


def test_example_specs():
    rng = np.random.default_rng(0)
    a = cli.example_array("f32[2,3]", rng)
    assert a.shape == (2, 3) and a.dtype == np.float32
    b = cli.example_array("i64[100]:7", rng)
    assert b.dtype == np.int64 and b.min() >= 0 and b.max() < 7
    assert cli.example_array("f64[]", rng).shape == ()


def test_compile_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["compile", "no_such_module_xyz:step", "--example", "f32[2]",
                     "-o", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.startswith("fusegrad-aot: error:")
    assert cli.main(["compile", "os:path", "--example", "q7[2", "-o", str(tmp_path / "o")]) == 1


def test_unknown_dtypes_and_wrong_argument_counts_are_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "two_args.py").write_text("def f(x, y):\n    return x + y\n")
    monkeypatch.chdir(tmp_path)
    for examples, why in ((["bool8[3]", "f32[3]"], "unknown dtype 'bool8'"),
                          (["f32[3]"], "missing 1 required positional argument")):
        argv = ["compile", "two_args:f", "-o", str(tmp_path / "o")]
        for e in examples:
            argv += ["--example", e]
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("fusegrad-aot: error:") and why in err and err.count("\n") == 1


@pytest.mark.slow
def test_compile_with_a_symbolic_batch_dim(tmp_path):
    (tmp_path / "train_cli_dyn.py").write_text(TRAIN)
    out = _run(["compile", "train_cli_dyn:step", "--example", "f32[8,12]", "--example",
                "i64[8]:5", "--dim", "batch=2..64:0.0,1.0", "-o", "step.fgaot"], tmp_path)
    assert out.returncode == 0, out.stderr
    shown = _run(["show", "step.fgaot"], tmp_path)
    assert "in  arg0 x: f32[batch,12]" in shown.stdout
    assert "dim batch: sizes 2..64 (first x.size(0); compiled at 8)" in shown.stdout
    run = fg.aot.load(tmp_path / "step.fgaot")
    for n in (3, 20):
        assert np.isfinite(run(fg.zeros(n, 12), fg.tensor(np.arange(n) % 5)).item())


def test_dim_specs():
    b = cli.dynamic_shapes(["batch=4..:0.0,1.0"], 2)
    assert b[0][0] is b[1][0] and (b[0][0].min, b[0][0].__name__) == (4, "batch")
    assert cli.dynamic_shapes([], 2) is None
    for bad in ("batch:0.0", "batch=2..8:2.0", "1b=2..8:0.0"):
        try:
            cli.dynamic_shapes([bad], 2)
        except (ValueError, AssertionError) as e:
            assert "--dim" in str(e) or "identifier" in str(e), e
        else:
            raise AssertionError(bad)
