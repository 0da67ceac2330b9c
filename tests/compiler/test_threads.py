"""fusegrad.compile and eager autograd from several threads at once.

Tracing state is per thread (``fusegrad.tracer.state``): a function compiled in one thread
records none of the ops other threads run eagerly, and grad mode is per thread as in torch.
A compiled function compiles a signature once however many threads call it first, and a
compile that fails leaves nothing behind. Every threaded result is compared with the same
work run in one thread: the same programs and numpy calls, so the values are equal exactly.
"""

from __future__ import annotations

import queue
import sys
import threading

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.tracer import programs
from fusegrad.tracer.state import is_compiling

TIMEOUT_S = 120        # a thread still running after this is a deadlock


@pytest.fixture
def switch_often():
    """Threads switch every microsecond instead of every 5 ms: races show up at once."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def run_threads(*targets) -> list:
    """Run each target in a thread of its own, started together (a barrier); their results,
    or the first error any of them raised."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)
    errors: list = []

    def body(k, fn):
        try:
            barrier.wait()
            results[k] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k, fn), daemon=True)
               for k, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a thread did not finish: a deadlock"
    if errors:
        raise errors[0]
    return results


def inputs(*shape: int, seed: int) -> fg.Tensor:
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.uniform(-1, 1, size=shape).astype(np.float32))


def linear(n_in: int, n_out: int, seed: int) -> fg.nn.Linear:
    fg.manual_seed(seed)
    return fg.nn.Linear(n_in, n_out)


def value(t: fg.Tensor) -> np.ndarray:
    return t.detach().numpy()


def relu_rows(x):
    return (x * 2 - 0.5).relu().sum(1)


def eager_ones_backward_grad(x: fg.Tensor, n_out: int) -> np.ndarray:
    """The weight gradient of ``linear(x).sum()``: each row is the column sums of ``x``."""
    return np.tile(x.numpy().sum(0, dtype=np.float32), (n_out, 1))


# --------------------------------------------------------------------------- the case


def test_eager_backward_beside_a_compiling_thread():
    # Compiling in one thread made the other thread's eager backward raise
    # ConcretizationError, and the compile raise and keep a broken entry. Each trace here
    # waits until the eager thread has run a forward and backward while it traces.
    inside, leave = queue.SimpleQueue(), queue.SimpleQueue()

    class Gated(fg.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = linear(8, 2, seed=0)

        def forward(self, x):
            inside.put(True)
            leave.get(timeout=TIMEOUT_S)
            return self.linear(x)

    m, other = Gated(), linear(8, 2, seed=1)
    cm = fg.compile(m)
    xs = [inputs(n, 8, seed=n) for n in (1, 2, 3)]
    xe = inputs(4, 8, seed=9)
    compiled = threading.Event()
    done = [0]

    def eager():
        while not compiled.is_set():
            other(xe).sum().backward()
            done[0] += 1
            if not inside.empty():
                inside.get()
                other(xe).sum().backward()      # while the other thread traces
                done[0] += 1
                leave.put(True)

    def compiling():
        try:
            return [value(cm(x)) for x in xs]
        finally:
            compiled.set()

    _, outs = run_threads(eager, compiling)
    assert cm.compiles == len(xs)
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, value(m.linear(x)), rtol=1e-6, atol=1e-6)
    # Each backward added the same gradient: the same sum as in one thread.
    g = eager_ones_backward_grad(xe, 2)
    total = np.zeros_like(g)
    for _ in range(done[0]):
        total += g
    np.testing.assert_array_equal(other.weight.grad.numpy(), total)
    # The entries stay sound: later calls in one thread hit them.
    for x in xs:
        np.testing.assert_allclose(value(cm(x)), value(m.linear(x)), rtol=1e-6, atol=1e-6)
    assert cm.compiles == len(xs)


def test_a_compile_that_raises_leaves_nothing_behind(monkeypatch):
    # The trace succeeds, building the program fails: no entry is cached, and the optimizer
    # state the trace made (a first step's momentum buffers) is taken back.
    def make():
        m = linear(4, 2, seed=0)
        opt = fg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        def step(x):
            opt.zero_grad()
            loss = (m(x) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        return m, opt, step

    x = inputs(3, 4, seed=0)
    m_ref, _, step_ref = make()
    step_ref = fg.compile(step_ref)
    ref = [step_ref(x).item() for _ in range(3)]

    m, opt, step = make()
    step = fg.compile(step)
    real = programs.Program
    failures = [1]

    def flaky(*args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise MemoryError("no memory for the kernels")
        return real(*args, **kwargs)

    monkeypatch.setattr(programs, "Program", flaky)
    with pytest.raises(MemoryError, match="no memory"):
        step(x)
    assert step.entries() == [] and len(opt.state) == 0
    assert [step(x).item() for _ in range(3)] == ref
    for p, q in zip(m.parameters(), m_ref.parameters()):
        np.testing.assert_array_equal(value(p), value(q))


# --------------------------------------------------------------------------- first calls


def test_four_threads_calling_a_function_first_compile_it_once():
    f = fg.compile(relu_rows)
    x = inputs(5, 3, seed=0)
    outs = run_threads(*[lambda: value(f(x))] * 4)
    assert f.compiles == 1
    for y in outs:
        np.testing.assert_array_equal(y, outs[0])
    np.testing.assert_allclose(outs[0], relu_rows(x).numpy(), rtol=1e-6, atol=1e-6)


def sgd_step(momentum: float):
    m = linear(4, 3, seed=0)
    opt = fg.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)

    @fg.compile
    def step(x):
        opt.zero_grad()
        loss = (m(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    return m, step


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_four_threads_calling_a_compiled_sgd_step_first(momentum):
    # One model and optimizer: the four steps run one after another (the calls of a
    # compiled function with state hold its lock), as four steps in one thread do.
    x = inputs(2, 4, seed=0)
    m_ref, step_ref = sgd_step(momentum)
    ref = sorted(step_ref(x).item() for _ in range(4))
    m, step = sgd_step(momentum)
    losses = run_threads(*[lambda: step(x).item()] * 4)
    assert sorted(losses) == ref
    assert step.compiles == step_ref.compiles
    for p, q in zip(m.parameters(), m_ref.parameters()):
        np.testing.assert_array_equal(value(p), value(q))


# --------------------------------------------------------------------------- per thread state


def test_grad_mode_tracing_and_random_keys_are_per_thread():
    seen = {}
    # C queues: the compiled function's guards see no Python state change in them.
    inside, leave = queue.SimpleQueue(), queue.SimpleQueue()

    def traced(x):
        inside.put(True)
        leave.get(timeout=TIMEOUT_S)       # the other thread runs while this one traces
        return x * 2

    def tracing():
        with fg.no_grad():
            return value(fg.compile(traced, fullgraph=True)(inputs(3, seed=0)))

    def eager():
        inside.get(timeout=TIMEOUT_S)
        try:
            seen["compiling"] = is_compiling()
            seen["grad"] = fg.is_grad_enabled()
            w = fg.ones(3, requires_grad=True)
            (w * 3).sum().backward()
            seen["w.grad"] = w.grad.numpy()
            seen["rand"] = fg.rand(2)     # from the generator, not the trace's key input
        finally:
            leave.put(True)

    out, _ = run_threads(tracing, eager)
    assert seen["compiling"] is False and seen["grad"] is True
    np.testing.assert_array_equal(seen["w.grad"], [3.0, 3.0, 3.0])
    assert type(seen["rand"]) is fg.Tensor and seen["rand"].shape == (2,)
    np.testing.assert_array_equal(out, inputs(3, seed=0).numpy() * 2)


def modes_in_a_new_thread(lib) -> list:
    """(grad enabled, inference mode) seen by a thread started under no_grad, and by one
    started under inference_mode."""
    seen = []
    for mode in (lib.no_grad, lib.inference_mode):
        with mode():
            t = threading.Thread(target=lambda: seen.append(
                (lib.is_grad_enabled(), lib.is_inference_mode_enabled())))
            t.start()
            t.join()
    return seen


def test_a_new_thread_starts_with_grad_enabled():
    assert modes_in_a_new_thread(fg) == [(True, False), (True, False)]


def test_a_new_thread_starts_in_torchs_modes():
    torch = pytest.importorskip("torch")
    assert modes_in_a_new_thread(fg) == modes_in_a_new_thread(torch)


def test_threads_drawing_random_numbers_never_share_them(switch_often):
    # Each draw of four numbers takes one counter of the generator: threads drawing at once
    # get the draws one thread gets, in some order, never one draw twice.
    fg.manual_seed(0)
    alone = np.stack([fg.rand(4).numpy() for _ in range(4 * 50)])
    fg.manual_seed(0)
    draws = run_threads(*[lambda: [fg.rand(4).numpy() for _ in range(50)]] * 4)
    together = np.stack([d for thread in draws for d in thread])
    np.testing.assert_array_equal(np.unique(together, axis=0), np.unique(alone, axis=0))
    assert fg.default_generator.get_state().numpy()[1] == 4 * 50


# --------------------------------------------------------------------------- stress


def stress(calls: int, new_signatures: int) -> None:
    """Four threads, each calling compiled functions (one shared by all, a compiled module
    shared by all, a training step of its own) and running eager forward and backward on a
    model of its own, ``calls`` times, while a fifth thread compiles new signatures of the
    shared functions. Every result equals the same work done in one thread."""

    def setup_workers():
        workers = []
        for i in range(4):
            eager_model = linear(4, 2, seed=20 + i)
            trained = linear(4, 2, seed=30 + i)
            opt = fg.optim.SGD(trained.parameters(), lr=0.05)

            def step(x, trained=trained, opt=opt):
                opt.zero_grad()
                loss = (trained(x) ** 2).mean()
                loss.backward()
                opt.step()
                return loss
            xs = [inputs(2, 4, seed=100 * i + k) for k in range(3)]
            workers.append((eager_model, trained, fg.compile(step), xs))
        return workers

    def work(shared, cm, worker):
        eager_model, trained, step, xs = worker
        out = []
        for k in range(calls):
            x = xs[k % len(xs)]
            y = eager_model(x)
            (y * y).sum().backward()
            out.append((value(shared(x)), value(cm(x)), value(step(x)), value(y)))
        return out, [p.grad.numpy() for p in eager_model.parameters()], \
            [value(p) for p in trained.parameters()]

    def compile_new(shared, cm):
        out = []
        for n in range(3, 3 + new_signatures):
            x = inputs(n, 4, seed=1000 + n)
            out.append((value(shared(x)), value(cm(x))))
        return out

    # Pure functions, shared: the threads compile them, the run in one thread hits.
    shared = fg.compile(relu_rows)
    cm = fg.compile(linear(4, 3, seed=10))
    workers = setup_workers()
    together = run_threads(*[lambda w=w: work(shared, cm, w) for w in workers],
                           lambda: compile_new(shared, cm))
    assert shared.compiles == cm.compiles == 1 + new_signatures
    alone = [work(shared, cm, w) for w in setup_workers()] + [compile_new(shared, cm)]
    assert shared.compiles == cm.compiles == 1 + new_signatures
    for a, b in zip(alone, together):
        for u, v in zip(_flat(a), _flat(b)):
            np.testing.assert_array_equal(u, v)


def _flat(tree) -> list:
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _flat(item)]
    return [tree]


def test_threads_calling_and_compiling_at_once(switch_often):
    stress(calls=20, new_signatures=1)


@pytest.mark.slow
def test_threads_calling_and_compiling_at_once_1000_calls():
    stress(calls=1000, new_signatures=6)
