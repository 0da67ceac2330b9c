"""Guards guard what the compiled code reads, and only that.

A global is guarded when the code loads it as a global (``LOAD_GLOBAL``), not when its name
appears only as an attribute name (``opt.step()`` does not read a global ``step``). One test
per kind of read: a global value, an attribute chain of a user's Python module, an attribute
of a global object, a method call's receiver, a closure cell, a global read only by a called
helper, a global list or dict read by index; and the name used only as an attribute, which
is not guarded. Then: the recompile reasons and counts, and what a guard cannot be built of.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.tracer.guards import code_reads

x3 = fg.tensor([1.0, 2.0, 3.0])


# --------------------------------------------------------------------------- what code reads


def test_code_reads_globals_apart_from_attribute_names():
    def step_fn(opt, loss, x):
        opt.zero_grad()
        loss.backward()
        opt.step()
        return x * K_GLOBAL + cfg_module.sub.SCALE + [v for v in LIST_GLOBAL][0]  # noqa: F821

    reads = code_reads(step_fn.__code__)
    assert reads.globals == {"K_GLOBAL", "cfg_module", "LIST_GLOBAL"}
    assert {"zero_grad", "backward", "step", "sub", "SCALE"} <= reads.attributes
    assert not {"step", "backward"} & reads.globals
    assert reads.chains["cfg_module"] == {("sub", "SCALE")}


def test_code_reads_nested_code_and_writes():
    def outer(x):
        global WRITTEN
        WRITTEN = 1
        return (lambda y: y * INNER_GLOBAL)(x)  # noqa: F821

    reads = code_reads(outer.__code__)
    assert {"WRITTEN", "INNER_GLOBAL"} <= reads.globals


# --------------------------------------------------------------------------- a test per read

K = 2.0


def test_global_value_is_guarded():
    global K
    f = fg.compile(lambda x: x * K)
    try:
        assert f(x3).tolist() == [2.0, 4.0, 6.0]
        K = 3.0
        assert f(x3).tolist() == [3.0, 6.0, 9.0]
        assert f(x3).tolist() == [3.0, 6.0, 9.0]
        assert f.compiles == 2 and f.recompile_reasons == ["global 'K': 2.0 -> 3.0 changed"]
    finally:
        K = 2.0


settings = types.ModuleType("user_settings")      # a user's Python module (import settings)
settings.SCALE = 2.0
settings.sub = types.ModuleType("user_settings.sub")
settings.sub.SHIFT = 1.0
settings.unrelated = 0


def test_attribute_chain_of_a_users_module_is_guarded():
    f = fg.compile(lambda x: x * settings.SCALE + settings.sub.SHIFT)
    try:
        assert f(x3).tolist() == [3.0, 5.0, 7.0]
        settings.unrelated = 5                       # not read: no recompile
        assert f(x3).tolist() == [3.0, 5.0, 7.0] and f.compiles == 1
        settings.SCALE = 1.0
        assert f(x3).tolist() == [2.0, 3.0, 4.0]
        settings.sub.SHIFT = 0.0
        assert f(x3).tolist() == [1.0, 2.0, 3.0]
        assert f.compiles == 3
        assert f.recompile_reasons == ["attribute 'SCALE': 2.0 -> 1.0 changed",
                                       "attribute 'SHIFT': 1.0 -> 0.0 changed"]
    finally:
        settings.SCALE, settings.sub.SHIFT, settings.unrelated = 2.0, 1.0, 0


def test_attribute_chain_of_a_users_module_in_a_closure_is_guarded():
    def make():
        config = settings                            # a module held by a closure cell
        return lambda x: x * config.SCALE
    f = fg.compile(make())
    try:
        assert f(x3).tolist() == [2.0, 4.0, 6.0]
        settings.SCALE = 3.0
        assert f(x3).tolist() == [3.0, 6.0, 9.0] and f.compiles == 2
    finally:
        settings.SCALE = 2.0


config_object = types.SimpleNamespace(k=2.0, other=1.0)


def test_attribute_of_a_global_object_is_guarded():
    f = fg.compile(lambda x: x * config_object.k)
    try:
        assert f(x3).tolist() == [2.0, 4.0, 6.0]
        config_object.k = 4.0
        assert f(x3).tolist() == [4.0, 8.0, 12.0]
        assert f.compiles == 2
    finally:
        config_object.k = 2.0


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


scaler = Scaler(2.0)


def test_receiver_of_a_method_call_is_guarded():
    global scaler
    f = fg.compile(lambda x: scaler.apply(x))
    try:
        assert f(x3).tolist() == [2.0, 4.0, 6.0]
        scaler.k = 3.0                               # read by the method
        assert f(x3).tolist() == [3.0, 6.0, 9.0]
        scaler = Scaler(5.0)                         # another receiver
        assert f(x3).tolist() == [5.0, 10.0, 15.0]
        assert f.compiles == 3
    finally:
        scaler = Scaler(2.0)


def test_closure_cell_is_guarded():
    k = 2.0
    f = fg.compile(lambda x: x * k)
    assert f(x3).tolist() == [2.0, 4.0, 6.0]
    k = 0.5
    assert f(x3).tolist() == [0.5, 1.0, 1.5]
    assert f.compiles == 2 and f.recompile_reasons == ["a closure variable: 2.0 -> 0.5 changed"]


HELPER_K = 2.0


def helper(x):
    return x * HELPER_K


def test_global_read_only_by_a_called_helper_is_guarded():
    global HELPER_K
    f = fg.compile(lambda x: helper(x) + 1)
    try:
        assert f(x3).tolist() == [3.0, 5.0, 7.0]
        HELPER_K = 1.0
        assert f(x3).tolist() == [2.0, 3.0, 4.0]
        assert f.compiles == 2
    finally:
        HELPER_K = 2.0


step = 0            # a global named like the methods and attributes the code below uses
backward = 0


def test_a_name_used_only_as_an_attribute_is_not_guarded():
    global step, backward
    holder = types.SimpleNamespace(step=lambda t: t + 1, backward=1.0)
    f = fg.compile(lambda x: holder.step(x) * holder.backward)
    for step in range(5):
        backward = step
        assert f(x3).tolist() == [2.0, 3.0, 4.0]
    assert f.compiles == 1 and f.recompile_reasons == []
    step = backward = 0


sizes = [1.0, 2.0]
options = {"scale": 2.0, "unused": 1.0}


def test_global_list_and_dict_read_by_index_are_guarded():
    f = fg.compile(lambda x: x * sizes[1] * options["scale"])
    try:
        assert f(x3).tolist() == [4.0, 8.0, 12.0]
        options["unused"] = 7.0                      # a key the code does not read
        assert f(x3).tolist() == [4.0, 8.0, 12.0] and f.compiles == 1
        sizes[1] = 3.0
        assert f(x3).tolist() == [6.0, 12.0, 18.0]
        options["scale"] = 1.0
        assert f(x3).tolist() == [3.0, 6.0, 9.0]
        assert f.compiles == 3
    finally:
        sizes[1], options["scale"], options["unused"] = 2.0, 2.0, 1.0


# --------------------------------------------------------------------------- a training loop

model = fg.nn.Linear(4, 1)
optimizer = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(x):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_loop_with_a_global_step_compiles_once_or_for_the_first_and_steady_steps(momentum):
    """``for step in range(12)`` at module level binds a global ``step``; the step calls
    ``optimizer.step()``: the global is not read, so the loop never runs eagerly and compiles
    once (plain SGD), or twice with momentum (the first step makes the momentum buffers; the
    steady step reads them). Every call recompiled, and after eight the step ran eagerly."""
    global step, optimizer
    fg.manual_seed(0)
    m = fg.nn.Linear(4, 1)
    twin = fg.nn.Linear(4, 1)
    twin.load_state_dict(m.state_dict())
    model.load_state_dict(m.state_dict())
    optimizer = fg.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    eager_opt = fg.optim.SGD(twin.parameters(), lr=0.1, momentum=momentum)
    compiled = fg.compile(train_step)
    x = fg.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no recompile-limit or eager warning
        for step in range(12):  # noqa: B007  (binds the global)
            got = compiled(x)
            eager_opt.zero_grad()
            want = twin(x).pow(2).mean()
            want.backward()
            eager_opt.step()
            np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5, atol=1e-7)
    step = 0
    if momentum:
        assert compiled.compiles == 2
        assert compiled.recompile_reasons == [
            "an optimizer's state (made by the first step, whose program runs once) changed"]
    else:
        assert compiled.compiles == 1 and compiled.recompile_reasons == []
    np.testing.assert_allclose(model.weight.detach().numpy(), twin.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-7)


def test_debug_prints_every_recompile_reason(monkeypatch, capsys):
    """FUSEGRAD_DEBUG=1 printed the recompile after the optimizer made its state by calling a
    ``why`` the one-shot entry's guard did not have (an AttributeError)."""
    monkeypatch.setenv("FUSEGRAD_DEBUG", "1")
    fg_config.reload()
    global optimizer
    optimizer = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compiled = fg.compile(train_step)
    x = fg.ones(8, 4)
    for _ in range(3):
        compiled(x)
    compiled(fg.ones(5, 4))
    err = capsys.readouterr().err
    reasons = [line for line in err.splitlines() if "recompile reason" in line]
    assert len(reasons) == 2, err
    assert "optimizer's state" in reasons[0]
    assert "(8, 4)" in reasons[1] and "(5, 4)" in reasons[1]
    assert compiled.compiles == 3 and len(compiled.recompile_reasons) == 2


def test_counters_count_compiles_as_torchs_do():
    counters = fg._dynamo.utils.counters
    counters.clear()
    f = fg.compile(lambda x: x * 2)
    f(x3)
    f(x3)
    f(fg.ones(2))
    assert counters["frames"]["total"] == counters["frames"]["ok"] == 2
    assert counters["stats"]["unique_graphs"] == 2 and f.compiles == 2


# --------------------------------------------------------------------------- unguardable reads


def exec_defined(source: str, name: str):
    """A function made by exec into a namespace without ``__name__`` (its ``__module__`` is
    None), as code generators and the differential fuzzer make theirs."""
    ns: dict = {}
    exec(source, ns)  # noqa: S102
    return ns[name]


def test_a_called_function_without_a_module_compiles():
    prog = exec_defined("def prog(a):\n    return (a * 2).sin()\n", "prog")
    assert prog.__module__ is None
    f = fg.compile(lambda x: prog(x), fullgraph=True)
    np.testing.assert_allclose(f(fg.ones(3)).numpy(), np.sin(np.full(3, 2.0, np.float32)),
                               rtol=1e-6)
    assert f.compiles == 1


def test_a_guard_that_cannot_be_built_runs_eagerly_and_says_so(monkeypatch, capsys):
    class Unreadable:
        """An object whose attribute dict cannot be read as a dict."""

        @property
        def __dict__(self):
            raise RuntimeError("no attributes here")

        k = 2.0

    obj = Unreadable()
    monkeypatch.setenv("FUSEGRAD_DEBUG", "1")
    fg_config.reload()
    f = fg.compile(lambda x: x * obj.k)
    with pytest.warns(UserWarning, match="cannot guard what"):
        assert f(x3).tolist() == [2.0, 4.0, 6.0]
    assert f(x3).tolist() == [2.0, 4.0, 6.0] and f.compiles == 0
    assert "running <lambda> eagerly: fusegrad.compile cannot guard" in capsys.readouterr().err
    assert any("cannot guard" in reason for reason in fg._dynamo.utils.counters["graph_break"])
    with pytest.raises(fg.ConcretizationError, match="no attributes here"):
        fg.compile(lambda x: x * obj.k, fullgraph=True)(x3)


def test_a_gradient_hook_without_a_module_is_traced_into_the_step():
    double = exec_defined("def double(g):\n    return g * 2\n", "double")
    w = fg.ones(3, requires_grad=True)
    w.register_hook(double)

    def step(x):
        w.grad = None
        (w * x).sum().backward()
        return w.grad * 1

    f = fg.compile(step, fullgraph=True)
    assert f(x3).tolist() == [2.0, 4.0, 6.0] and f.compiles == 1


class Trainer:
    """A trainer object as users write them: a ``step`` counter next to ``self.opt.step()``."""

    def __init__(self, scale: float):
        fg.manual_seed(0)
        self.model = fg.nn.Linear(3, 1)
        self.opt = fg.optim.SGD(self.model.parameters(), lr=0.1)
        self.step = 0
        self.scale = scale

    @fg.compile
    def train_step(self, x):
        self.opt.zero_grad()
        loss = self.model(x).pow(2).mean() * self.scale
        loss.backward()
        self.opt.step()
        return loss


def test_an_attribute_the_code_only_calls_as_a_method_is_not_guarded_by_value():
    """``trainer.step`` (a counter) has the name of ``self.opt.step()``, which the code only
    calls: the counter is not read, and counting steps does not recompile. ``self.scale``,
    read as a value, is guarded."""
    trainer = Trainer(1.0)
    x = fg.ones(4, 3)
    for _ in range(4):
        trainer.train_step(x)
        trainer.step += 1
    assert trainer.train_step.compiles == 1
    trainer.scale = 2.0
    trainer.train_step(x)
    assert trainer.train_step.compiles == 2
    assert trainer.train_step.recompile_reasons == ["attribute 'scale': 1.0 -> 2.0 changed"]


LAST_SCALE = 0.0


def test_a_global_the_function_only_writes_is_guarded_and_the_write_refused():
    """``global LAST_SCALE; LAST_SCALE = ...`` stores without loading: a compiled call would
    not write it, so the trace's write is found, undone and refused."""
    def record(x):
        global LAST_SCALE
        LAST_SCALE = 2.0
        return x * 2

    with pytest.raises(fg.ConcretizationError, match="global 'LAST_SCALE': 0.0 -> 2.0"):
        fg.compile(record, fullgraph=True)(x3)
    assert LAST_SCALE == 0.0
