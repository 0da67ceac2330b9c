"""``fusegrad.config.recompile_limit`` (torch's ``recompile_limit``, alias ``cache_size_limit``):
a compiled function compiles for at most that many signatures; calls with further ones run
eagerly, with one warning that names the guard that kept changing and how to raise the limit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config


def counting(fn):
    """``fn`` with a count of how often its Python body ran: once per trace, and on every
    eager call."""
    def wrapped(*args):
        wrapped.runs += 1
        return fn(*args)
    wrapped.runs = 0
    wrapped.__name__ = "counted_fn"
    return wrapped


def calls_with_warnings(f, inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [f(x) for x in inputs]
    return outs, [w for w in caught if "recompile limit" in str(w.message)]


def test_default_limit_is_torchs_and_both_names_work(monkeypatch):
    assert fg.config.recompile_limit == 8
    assert fg.config.cache_size_limit == 8
    monkeypatch.setattr(fg_config.config, "recompile_limit", 8)
    fg.config.cache_size_limit = 5
    assert fg_config.config.recompile_limit == 5
    fg.config.recompile_limit = 6
    assert fg_config.config.cache_size_limit == 6
    monkeypatch.setenv("FUSEGRAD_RECOMPILE_LIMIT", "3")
    assert fg_config.reload().recompile_limit == 3
    monkeypatch.delenv("FUSEGRAD_RECOMPILE_LIMIT")
    fg_config.reload()
    assert fg.config.recompile_limit == 8


def test_new_shapes_past_the_limit_run_eagerly_with_one_warning():
    body = counting(lambda x: (x * 2 + 1).exp())
    f = fg.compile(body)
    inputs = [fg.arange(float(n)) / 8 for n in range(1, 31)]
    outs, limit_warnings = calls_with_warnings(f, inputs)
    for x, out in zip(inputs, outs):
        np.testing.assert_allclose(out.numpy(), np.exp(x.numpy() * 2 + 1), rtol=1e-6)
    assert f.compiles == 8 and len(f.cache) == 8          # memory stays bounded
    assert body.runs == 8 + 22                            # 8 traces, then 22 eager calls
    assert len(limit_warnings) == 1
    w = limit_warnings[0]
    msg = str(w.message)
    assert "counted_fn" in msg
    assert "recompile_limit = 8" in msg
    assert "the shape of tensor argument 0" in msg
    assert "dtype" not in msg.split("kept changing:")[1].split("(last")[0]
    assert "fusegrad.config.recompile_limit = N" in msg and "FUSEGRAD_RECOMPILE_LIMIT" in msg
    assert w.filename == __file__                         # points at the caller's line


def test_signatures_compiled_before_the_limit_still_run_compiled():
    body = counting(lambda x: x.sin() * 3)
    f = fg.compile(body)
    small = [fg.ones(n) for n in range(1, 9)]
    calls_with_warnings(f, small + [fg.ones(20)])
    runs = body.runs
    out = f(small[3])                                     # compiled before the limit
    assert body.runs == runs                              # no eager run, no retrace
    np.testing.assert_allclose(out.numpy(), np.sin(np.ones(4, np.float32)) * 3, rtol=1e-6)
    f(fg.ones(21))
    assert body.runs == runs + 1                          # a new shape: eager


def test_the_limit_is_configurable_and_names_a_changing_dtype(monkeypatch):
    monkeypatch.setattr(fg_config.config, "recompile_limit", 2)
    f = fg.compile(lambda x: x + 1)
    inputs = [fg.ones(3, dtype=dt) for dt in (fg.float32, fg.float64, fg.int64, fg.int32)]
    outs, limit_warnings = calls_with_warnings(f, inputs)
    assert f.compiles == 2
    for x, out in zip(inputs, outs):
        assert out.dtype is x.dtype
        np.testing.assert_array_equal(out.numpy(), x.numpy() + 1)
    msg = str(limit_warnings[0].message)
    assert "recompile_limit = 2" in msg and "the dtype of tensor argument 0" in msg
    assert "shape" not in msg.split("kept changing:")[1].split("(last")[0]


def test_raising_the_limit_at_run_time_compiles_again(monkeypatch):
    monkeypatch.setattr(fg_config.config, "recompile_limit", 1)
    body = counting(lambda x: x * x)
    f = fg.compile(body)
    calls_with_warnings(f, [fg.ones(2), fg.ones(3)])
    assert f.compiles == 1
    fg.config.recompile_limit = 4
    f(fg.ones(5))
    assert f.compiles == 2


@pytest.mark.slow
def test_eight_hundred_shapes_compile_eight_times():
    f = fg.compile(lambda x: (x * 0.5).tanh().sum())
    inputs = [fg.ones(n) for n in range(1, 801)]
    outs, limit_warnings = calls_with_warnings(f, inputs)
    assert f.compiles == 8 and len(limit_warnings) == 1
    for n, out in zip(range(1, 801), outs):
        np.testing.assert_allclose(out.item(), n * np.tanh(0.5), rtol=1e-5)
