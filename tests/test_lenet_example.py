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


def test_lenet_compiled_losses_equal_eager():
    """Over 2 epochs (88 SGD steps), the compiled step's losses are no farther from a float64
    run's than eager's are (tests/drift.py), and both runs learn."""
    import fusegrad as fg
    from tests.drift import assert_no_farther_than_eager
    example = _example()
    args = example.parse_args(["--epochs", "2", "--batch-size", "32"])
    data = example.load_data(args.seed)
    eager, eager_accuracy, _ = example.train(False, data, args)
    compiled, compiled_accuracy, _ = example.train(True, data, args)
    exact, _, _ = example.train(False, data, args, dtype=fg.float64)
    assert len(eager) == len(compiled) == 88
    assert_no_farther_than_eager(compiled, eager, exact, what="step losses")
    assert min(eager_accuracy, compiled_accuracy) > 0.5    # one epoch learns


def test_lenet_example_prints_the_model_and_both_runs(capsys):
    _example().main(["--epochs", "1", "--batch-size", "128"])
    out = capsys.readouterr().out
    assert "Conv2d(1, 6, kernel_size=(3, 3)" in out
    assert "largest difference of the 11 step losses, eager vs compiled" in out
    assert len([line for line in out.splitlines() if "test accuracy" in line]) == 2
