"""examples/train_loop.py: a resumed run reproduces the uninterrupted run's losses exactly."""

import importlib.util
from pathlib import Path

import fusegrad as fg

ARGS = ["--synthetic", "--epochs", "4", "--samples", "192", "--batch-size", "32"]


def _example():
    path = Path(__file__).resolve().parent.parent / "examples" / "train_loop.py"
    spec = importlib.util.spec_from_file_location("train_loop_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resumed_losses_equal_uninterrupted(capsys):
    assert _example().main(ARGS) == 0
    out = capsys.readouterr().out
    assert "matches the uninterrupted run exactly" in out
    losses = [float(line.split()[1]) for line in out.splitlines()[1:5]]
    assert losses[-1] < losses[0]  # it trains


def test_resume_that_loses_the_shuffle_state_is_caught(capsys, monkeypatch):
    # Without the generator state the resumed epochs shuffle differently: the check must notice.
    monkeypatch.setattr(fg.Generator, "set_state", lambda self, state: None)
    assert _example().main(ARGS) == 1
    assert "differ" in capsys.readouterr().out
