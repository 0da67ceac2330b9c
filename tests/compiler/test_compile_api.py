"""``fusegrad.compile`` as users meet it: guards and recompiles, debug output, graph breaks,
static arguments, modules, ``lower``, backends, output structures, in-place writes to
inputs, random numbers and threads."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as NF
from fusegrad import config as fg_config
from fusegrad.ir.kernel_graph import Kernel
from fusegrad.ir.symbolic import ConcretizationError
from fusegrad.runtime import cpu
from fusegrad.runtime import threads as threads_module
from fusegrad.tracer.compile import RECOMPILE_WARNING_LIMIT
from tests.compiler.compare import assert_same, strided, values


def f32(*shape, seed=0):
    return fg.from_numpy(values(shape, fg.float32, seed, special=False))


# --------------------------------------------------------------------------- guards


def test_new_data_reuses_the_compiled_program():
    f = fg.compile(lambda x, y: (x * y).exp())
    for seed in range(3):
        x, y = f32(4, 5, seed=seed), f32(4, 5, seed=seed + 10)
        assert_same(f(x, y), (x * y).exp())
    assert f.compiles == 1


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "grad_mode"])
def test_guard_change_recompiles(change):
    f = fg.compile(lambda x: x * 2 + 1)
    x = f32(4, 5)
    f(x)
    if change == "shape":
        other = f32(5, 4)
    elif change == "dtype":
        other = x.double()
    elif change == "requires_grad":
        other = f32(4, 5).requires_grad_()
    else:
        other = x
    if change == "grad_mode":
        with fg.no_grad():
            out = f(f32(4, 5).requires_grad_())
        assert not out.requires_grad
        f(f32(4, 5).requires_grad_())
        assert f.compiles == 3
        return
    assert_same(f(other).detach(), (other * 2 + 1).detach())
    assert f.compiles == 2
    f(other)
    assert f.compiles == 2


def test_python_scalar_arguments_are_guarded_by_value():
    f = fg.compile(lambda x, n: x * n)
    x = f32(3)
    assert_same(f(x, 2), x * 2)
    assert_same(f(x, 3), x * 3)
    assert f.compiles == 2


def test_default_dtype_is_guarded():
    f = fg.compile(lambda x: x.sum() + fg.zeros(2))
    x = f32(3)
    assert f(x).dtype is fg.float32
    fg.set_default_dtype(fg.float64)
    assert_same(f(x), x.sum() + fg.zeros(2))
    assert f.compiles == 2


def test_input_layout_needs_no_recompile():
    f = fg.compile(lambda x: x * 2 + 1)
    for kind in ("contiguous", "T", "slice", "T"):
        x = fg.from_numpy(strided(values((4, 5), fg.float32), kind))
        assert_same(f(x), x * 2 + 1)


def test_static_argnums_and_argnames():
    def scale(x, n, *, mode):
        return x * n if mode == "mul" else x + n

    by_num = fg.compile(scale, static_argnums=1, static_argnames="mode")
    x = f32(4)
    assert_same(by_num(x, 2, mode="mul"), x * 2)
    assert_same(by_num(x, 2, mode="mul"), x * 2)
    assert by_num.compiles == 1
    assert_same(by_num(x, 3, mode="mul"), x * 3)
    assert_same(by_num(x, 3, mode="add"), x + 3)
    assert by_num.compiles == 3


def test_recompile_warning_after_the_limit():
    f = fg.compile(lambda x: x + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, RECOMPILE_WARNING_LIMIT + 4):
            f(f32(n))
    recompiles = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(recompiles) == 1
    assert f"compiled for {RECOMPILE_WARNING_LIMIT} different" in str(recompiles[0].message)
    assert recompiles[0].filename == __file__


def test_debug_prints_a_line_per_compile(monkeypatch, capsys):
    monkeypatch.setenv("FUSEGRAD_DEBUG", "1")
    fg_config.reload()
    f = fg.compile(lambda x: x.exp())
    f(f32(3))
    f(f32(3))
    f(f32(4))
    err = capsys.readouterr().err
    compiled = [line for line in err.splitlines() if line.startswith("[fusegrad] compiled")]
    assert len(compiled) == 2, err
    assert "1 kernels" in compiled[0]
    reasons = [line for line in err.splitlines() if "recompile reason" in line]
    assert len(reasons) == 1 and "(3,)" in reasons[0] and "(4,)" in reasons[0], err


# --------------------------------------------------------------------------- graph breaks


def data_dependent(x):
    if x.sum() > 0:          # the line the error must name
        return x * 2
    return -x


def test_fullgraph_names_the_users_line():
    line = inspect.getsourcelines(data_dependent)[1] + 1
    with pytest.raises(ConcretizationError, match=f"{__file__}:{line}"):
        fg.compile(data_dependent, fullgraph=True)(f32(3))


@pytest.mark.parametrize("fn", [
    lambda x: x.nonzero(), lambda x: x[x > 0], lambda x: x * x.sum().item(),
    lambda x: fg.allclose(x, x), lambda x: NF.one_hot(x.long().abs())])
def test_data_dependent_ops_raise_under_fullgraph(fn):
    with pytest.raises(ConcretizationError):
        fg.compile(fn, fullgraph=True)(f32(3))


def test_graph_break_runs_eagerly_with_one_warning():
    f = fg.compile(data_dependent)
    x, y = f32(3), -f32(5).abs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same(f(x), data_dependent(x))
        assert_same(f(x), data_dependent(x))
        assert_same(f(y), data_dependent(y))
    assert len(caught) == 1 and "eagerly" in str(caught[0].message)
    assert caught[0].filename == __file__


# --------------------------------------------------------------------------- modules


def test_compiled_module_sees_optimizer_updates_without_recompiling():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    compiled = fg.compile(model)
    opt = fg.optim.SGD(model.parameters(), lr=0.5)
    x = f32(4, 5)
    before = compiled(x)
    before.pow(2).sum().backward()
    opt.step()
    after = compiled(x)
    assert compiled.compiles == 1
    with fg.no_grad():
        assert_same(after.detach(), model(x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(after.detach().numpy(), before.detach().numpy())
    assert len(list(compiled.parameters())) == 4


def test_module_train_and_eval_are_separate_programs():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.5))
    compiled = fg.compile(model)
    x = f32(4, 5)
    with fg.no_grad():
        model.eval()
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        model.train()
        fg.manual_seed(3)
        got = compiled(x)
        fg.manual_seed(3)
        assert_same(got, model(x), rtol=1e-5, atol=1e-6)
    assert compiled.compiles == 2


# --------------------------------------------------------------------------- lower, backends


def test_lower_compiles_without_running():
    calls = []

    def f(x, calls=calls):       # a default argument: not a value the compile guards
        calls.append(x)
        return (x * 2).exp().sum(-1)

    compiled = fg.compile(f)
    lowered = compiled.lower(f32(3, 4))
    assert len(calls) == 1 and calls[0]._trace is not None     # traced, not run
    assert lowered.kernels == ["k0[reduction 3x4](mul,exp,sum)"]
    assert 'define void @"k0"(' in lowered.llvm_ir
    assert [n.op for n in lowered.graph.nodes] == ["mul", "exp", "sum"]
    assert not lowered.program._allocated
    assert "// kernels:" in str(lowered)
    compiled(f32(3, 4))
    assert compiled.compiles == 1


def test_interpreter_backend_matches_llvm():
    def f(x, w):
        return NF.softmax(x @ w, -1), NF.layer_norm(x, (4,)).sum()

    x, w = f32(3, 4), f32(4, 6, seed=1)
    interp = fg.compile(f, backend="interpreter")
    llvm = fg.compile(f)
    with fg.no_grad():
        assert_same(interp(x, w), f(x, w), rtol=1e-6, atol=1e-7)
        assert_same(llvm(x, w), interp(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown backend"):
        fg.compile(f, backend="tpu")


# --------------------------------------------------------------------------- outputs


def test_outputs_inputs_views_literals_and_containers():
    def f(x, y):
        return {"x": x, "view": x.t(), "slice": y[1:, ::2], "lit": 3, "none": None,
                "pair": (x + y, [y.sum(), 2.5]), "const": fg.ones(2)}

    x, y = f32(3, 4), f32(3, 4, seed=1)
    compiled = fg.compile(f)
    with fg.no_grad():
        assert_same(compiled(x, y), f(x, y))
        assert_same(compiled(x, y), f(x, y))       # second call: the reused program


def test_returned_buffers_are_not_overwritten_by_the_next_call():
    f = fg.compile(lambda x: x * 2)
    first = f(f32(4))
    keep = first.numpy().copy()
    f(f32(4, seed=1))
    np.testing.assert_array_equal(first.numpy(), keep)


def test_in_place_writes_to_inputs_are_written_back():
    def step(w, g, m):
        m.mul_(0.9).add_(g)
        w.sub_(0.1 * m)
        return (w * w).sum()

    w, g, m = f32(5), f32(5, seed=1), f32(5, seed=2)
    w_eager, m_eager = w.clone(), m.clone()
    loss_eager = step(w_eager, g, m_eager)
    compiled = fg.compile(step)
    loss = compiled(w, g, m)
    assert_same(loss, loss_eager)
    assert_same(w, w_eager)
    assert_same(m, m_eager)
    assert w._version_counter.value > 0


def test_random_numbers_are_reproducible_and_advance():
    def noisy(x):
        return x + fg.rand(3, 4), NF.dropout(x, 0.5)

    x = f32(3, 4)
    compiled = fg.compile(noisy)
    fg.manual_seed(7)
    first = compiled(x)
    second = compiled(x)
    fg.manual_seed(7)
    again = compiled(x)
    fg.manual_seed(7)
    eager = noisy(x)
    assert_same(again, first)
    assert_same(first, eager)
    assert not np.array_equal(first[0].numpy(), second[0].numpy())
    assert compiled.compiles == 1


# --------------------------------------------------------------------------- threads


def test_threads_split_large_kernels_without_changing_results(monkeypatch):
    rows = cpu.PARALLEL_THRESHOLD // 256 + 7
    x = f32(rows, 512)
    w = f32(512, seed=1)
    fns = {"elementwise": lambda x, w: (x * w + 1).tanh(),
           "row_reduction": lambda x, w: NF.softmax(x * w, -1),
           "column_reduction": lambda x, w: (x * w).sum(0)}
    results = {}
    submitted = []
    real_pool = threads_module.thread_pool

    class CountingPool:
        def submit(self, *a):
            submitted.append(a)
            return real_pool().submit(*a)

    monkeypatch.setattr(threads_module, "thread_pool", CountingPool)
    for threads in ("1", "2"):
        monkeypatch.setenv("FUSEGRAD_NUM_THREADS", threads)
        fg_config.reload()
        # Each large kernel runs untimed, then once on one thread and once split (TUNE_RUNS
        # 1), then as timed: every call's result must be the same.
        monkeypatch.setattr(cpu, "TUNE_RUNS", 1)
        compiled = {name: fg.compile(fn) for name, fn in fns.items()}
        results[threads] = {name: [c(x, w).numpy().copy() for _ in range(4)]
                            for name, c in compiled.items()}
        assert bool(submitted) == (threads == "2")
    assert len(submitted) >= 2          # the elementwise and the row-reduction kernels
    for name in fns:
        for got in results["1"][name][1:] + results["2"][name]:
            np.testing.assert_array_equal(got, results["1"][name][0])


def _sleeping_step(per_element: float, fixed: float) -> cpu.LaunchStep:
    """A LaunchStep whose 'kernel' sleeps (releasing the GIL, as a kernel call does)
    ``fixed`` seconds plus ``per_element`` per element of its range."""
    import time

    def fn(table, lo, hi):
        time.sleep(fixed + per_element * (hi - lo))
    return cpu.LaunchStep(Kernel("k", "elementwise", shape=(8,)), fn, 8,
                          cpu.PARALLEL_THRESHOLD, 0)


def test_large_kernels_are_split_only_where_splitting_was_measured_faster(monkeypatch):
    monkeypatch.setattr(fg_config.config, "num_threads", 2)
    divisible = _sleeping_step(0.002, 0.0)        # 16 ms alone, 8 ms in two halves
    fixed = _sleeping_step(0.0, 0.01)             # 10 ms however it is cut
    for step in (divisible, fixed):
        for _ in range(1 + 2 * cpu.TUNE_RUNS):
            step.run(None)
    assert divisible.split[2] is True and fixed.split[2] is False
    fg.set_num_threads(3)         # another thread count is measured again
    try:
        fixed.run(None)
        assert 3 not in fixed.split and fixed.timings[3] == ([], []) and fixed.split[2] is False
    finally:
        fg.set_num_threads(2)


def test_large_kernels_take_the_fast_call_path_and_still_thread(monkeypatch):
    """A function whose kernels are large enough to thread calls them without the general
    path's per-call work when one thread is configured, and threads them when more are
    configured later, with the same results either way."""
    rows = cpu.PARALLEL_THRESHOLD // 256 + 7
    x = f32(rows, 256)
    submitted = []
    real_pool = threads_module.thread_pool

    class CountingPool:
        def submit(self, *a):
            submitted.append(a)
            return real_pool().submit(*a)

    monkeypatch.setattr(threads_module, "thread_pool", CountingPool)
    monkeypatch.setattr(fg_config.config, "num_threads", 1)
    compiled = fg.compile(lambda x: (x * 0.5).exp())
    first = compiled(x)
    keep = first.numpy().copy()
    assert [e.fast is not None for e in compiled.entries()] == [True]
    np.testing.assert_allclose(keep, np.exp(x.numpy().astype(np.float64) * 0.5), rtol=4e-7)
    monkeypatch.setattr(fg_config.config, "num_threads", 2)
    monkeypatch.setattr(cpu, "TUNE_RUNS", 1)
    for _ in range(3):          # untimed, one thread, split (then as measured)
        second = compiled(x)
        np.testing.assert_array_equal(second.numpy(), keep)
    assert submitted
    np.testing.assert_array_equal(first.numpy(), keep)      # not overwritten by the call


def test_in_place_update_is_written_in_the_parameters_own_buffer():
    @fg.compile
    def step(p, g):
        p.sub_(0.1 * g)
        return p.sum()

    p, g = fg.randn(1000), fg.randn(1000)
    want = p.numpy() - np.float32(0.1) * g.numpy()
    address = p._data.ctypes.data
    total = step(p, g)
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-6, atol=1e-6)   # FMA contraction
    np.testing.assert_allclose(total.item(), want.sum(), rtol=1e-4)
    assert p._data.ctypes.data == address
    assert step.lower(p, g).program.donated     # no copy back: the kernel wrote p


def test_donated_argument_gives_its_buffer_to_the_output():
    f = fg.compile(lambda x, y: (x * 2 + y).exp(), donate_argnums=0)
    x, y = fg.randn(64), fg.randn(64)
    want = np.exp(x.numpy() * 2 + y.numpy())
    out = f(x, y)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    assert out._data is x._data


def test_donation_is_refused_when_the_kernel_reads_other_elements():
    # x.T + x reads x transposed: writing the output into x would clobber unread elements.
    h = fg.compile(lambda x: x.T + x, donate_argnums=0)
    x = fg.randn(8, 8)
    want = x.numpy().T + x.numpy()
    out = h(x)
    np.testing.assert_allclose(out.numpy(), want)
    assert not h.lower(x).program.donated


def test_row_scratch_keeps_softmax_exact():
    x = fg.randn(16, 300)
    f = fg.compile(lambda x: fg.nn.functional.softmax(x, dim=-1))
    e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(f(x).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)
    assert "alloca float, i64 300" in f.lower(x).llvm_ir


def test_lowered_drawing_shows_each_kernel_as_a_cluster():
    f = fg.compile(lambda x, w: (x @ w).relu().sum(-1).exp())
    dot = f.lower(fg.randn(4, 8), fg.randn(8, 3)).to_dot()
    assert dot.count("subgraph cluster_") == 2      # matmul+relu, then the row reduction
    assert "matmul" in dot and "exp" in dot


def test_compile_decorates_a_method_per_instance():
    """@fg.compile in a class body: bound through each instance (self is not lost), each
    instance with its own traces; static_argnums count self, as jax.jit's do."""
    class Scaler:
        def __init__(self, k):
            self.k = k

        @fg.compile(static_argnums=2)
        def f(self, x, n):
            return x * self.k * n

    x = fg.ones(2)
    scalers = [Scaler(float(k)) for k in range(fg.config.recompile_limit + 2)]
    for k, s in enumerate(scalers):                 # more instances than the recompile limit
        np.testing.assert_array_equal(s.f(x, 3).numpy(), [3.0 * k] * 2)
        assert s.f.compiles == 1
    np.testing.assert_array_equal(Scaler.f(scalers[2], x, 5).numpy(), [10.0, 10.0])


def test_deepcopy_of_a_compiled_module_is_a_compiled_copy():
    import copy
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(2, 3), fg.nn.ReLU(), fg.nn.Linear(3, 1))
    compiled = fg.compile(model)
    x = fg.randn(4, 2)
    before = compiled(x).detach().numpy()
    twin = copy.deepcopy(compiled)                   # e.g. the best model so far
    with fg.no_grad():
        for p in model.parameters():
            p.mul_(2)
    np.testing.assert_array_equal(twin(x).detach().numpy(), before)
    assert not np.allclose(compiled(x).detach().numpy(), before)
    assert isinstance(twin, type(compiled)) and len(list(twin.parameters())) == 4
