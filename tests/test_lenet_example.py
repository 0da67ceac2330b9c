"""examples/train_lenet.py: the CNN trains, and its compiled step gives eager's losses."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sklearn")


def _example():
    path = Path(__file__).resolve().parent.parent / "examples" / "train_lenet.py"
    spec = importlib.util.spec_from_file_location("train_lenet_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lenet_compiled_losses_equal_eager(capsys):
    rel = _example().main(["--epochs", "2", "--batch-size", "32"])
    assert rel < 1e-5
    out = capsys.readouterr().out
    assert "Conv2d(1, 6, kernel_size=(3, 3)" in out
    accuracies = [float(line.split()[3]) for line in out.splitlines() if "test accuracy" in line]
    assert len(accuracies) == 2 and min(accuracies) > 0.5   # one epoch learns
