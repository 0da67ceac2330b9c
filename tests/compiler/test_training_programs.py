"""Training programs as a torch user writes them, at module level (tests/compiler/programs/):
a ResNet-style CNN and a small GAN, with the loop variable ``step``, epoch counters and lists
of losses as globals. Compiled, each step compiles at most twice (the first call, then the
first call with optimizer state) and gives eager's losses.

Each program runs as a script would (``runpy.run_path``): its functions' globals are the
script's, as in ``python train.py``.
"""

from __future__ import annotations

import pathlib
import runpy
import warnings

import numpy as np
import pytest

PROGRAMS = pathlib.Path(__file__).parent / "programs"
EPS32 = float(np.finfo(np.float32).eps)


def run(name: str, compiled: bool, **names) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # a recompile-limit or eager-fallback warning fails
        return runpy.run_path(str(PROGRAMS / name), init_globals={"COMPILE": compiled, **names})


def assert_losses_close(got: list, want: list) -> None:
    # Each step's loss differs from eager's by the rounding of a different summation order
    # (a few float32 ulp per op), compounded through the parameter updates of earlier steps.
    np.testing.assert_allclose(got, want, rtol=64 * EPS32 * len(want), atol=0)


@pytest.mark.slow
def test_resnet_training_loop_compiles_twice_and_equals_eager():
    eager, compiled = run("resnet_train.py", False), run("resnet_train.py", True)
    step_fn = compiled["step_fn"]
    assert step_fn.compiles == 2
    assert step_fn.recompile_reasons == [
        "an optimizer's state (made by the first step, whose program runs once) changed"]
    assert compiled["step"] == 2 and compiled["epochs_done"] == 2 and compiled["global_step"] == 6
    assert_losses_close(compiled["losses"], eager["losses"])
    assert_losses_close(compiled["val_losses"], eager["val_losses"])


@pytest.mark.slow
def test_gan_training_loop_compiles_each_step_twice_and_equals_eager():
    eager, compiled = run("gan_train.py", False), run("gan_train.py", True)
    for fn in (compiled["d_fn"], compiled["g_fn"]):
        assert fn.compiles == 2, fn.recompile_reasons
    assert len(compiled["d_losses"]) == len(compiled["g_losses"]) == 6
    assert_losses_close(compiled["d_losses"], eager["d_losses"])
    assert_losses_close(compiled["g_losses"], eager["g_losses"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet_train.py", "gan_train.py"])
def test_the_programs_are_torch_programs(name):
    """The same scripts run under torch (eagerly): they are what a torch user writes."""
    torch = pytest.importorskip("torch")
    ns = run(name, False, torch=torch)
    losses = ns.get("losses") or ns["d_losses"]
    assert len(losses) == 6 and all(np.isfinite(losses))
