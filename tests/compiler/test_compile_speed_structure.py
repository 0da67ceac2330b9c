"""What keeps compiling fast, asserted as structure (never as wall time):

- fusion's kernel reachability, kept up to date as kernels grow and merge, answers as a
  search over the finished kernel graph does, and the partition is the one the search-based
  partitioner (rescanning after every sibling merge) makes;
- kernels are compiled one module each and cached per kernel: two programs sharing a kernel
  compile it once, a kernel's code does not depend on where its buffers sit in a program,
  and a training step's first-step and steady graphs share their kernels;
- the cache finds kernels by their description, which determines their IR, so a warm cache
  builds no IR.
"""

from __future__ import annotations

import dataclasses
import math

import llvmlite.ir as llvm_ir
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.passes import fusion
from fusegrad.runtime import cpu, jit
from fusegrad.runtime.cpu import LaunchStep
from fusegrad.testing.programs import RandomChoices, generate

F = fg.nn.functional


# --------------------------------------------------------------------------- fusion


class SearchPartitioner(fusion._Partitioner):
    """The partitioner with reachability found by searching the kernel graph at each query
    and sibling merging that rescans from the first pair after every merge (the definition
    the incremental bookkeeping must reproduce)."""

    def depends(self, a, b) -> bool:
        seen, stack = set(), [a]
        while stack:
            k = stack.pop()
            for n in k.nodes:
                for op in n.inputs:
                    pk = self._producer_kernel(op)
                    if pk is None or pk is k or id(pk) in seen:
                        continue
                    if pk is b:
                        return True
                    seen.add(id(pk))
                    stack.append(pk)
        return False

    def mergeable(self, a, b) -> bool:
        return not any((self.depends(c, a) and self.depends(b, c)) or
                       (self.depends(c, b) and self.depends(a, c))
                       for c in self.kernels if c is not a and c is not b)

    def merge_siblings(self) -> None:
        merged = True
        while merged:
            merged = False
            for i, a in enumerate(self.kernels):
                if a.kind != "elementwise":
                    continue
                for b in self.kernels[i + 1:]:
                    if b.kind == "elementwise" and b.shape == a.shape and \
                            not self.depends(b, a) and not self.depends(a, b) and \
                            self.mergeable(a, b) and self.within_budget(a.nodes + b.nodes):
                        self.absorb(a, b)
                        merged = True
                        break
                if merged:
                    break


def partition(part: fusion._Partitioner) -> list[tuple]:
    return [(k.kind, k.shape, k.axes, [id(n) for n in k.nodes]) for k in part.run()]


def training_step_graph(make_opt, sizes=(12, 32, 32, 5)):
    fg.manual_seed(0)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [fg.nn.Linear(a, b), fg.nn.GELU()]
    m = fg.nn.Sequential(*layers[:-1])
    opt = make_opt(m.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss
    rng = np.random.RandomState(0)
    x = fg.tensor(rng.randn(16, sizes[0]).astype(np.float32))
    y = fg.tensor(rng.randint(0, sizes[-1], 16))
    f = fg.compile(step, fullgraph=True)
    f(x, y)                     # the steady step (with .grad and optimizer state) is next
    return f.lower(x, y).graph


def random_graphs(count: int):
    for seed in range(count):
        program = generate(RandomChoices(seed), max_ops=12)
        args = [fg.from_numpy(a) for a in program.arrays()]
        yield fg.compile(program.function()).lower(*args).graph


GRAPHS = {
    "sgd_momentum_step": lambda: [training_step_graph(
        lambda p: fg.optim.SGD(p, lr=0.1, momentum=0.9))],
    "adamw_step": lambda: [training_step_graph(
        lambda p: fg.optim.AdamW(p, lr=1e-3, weight_decay=0.1))],
    "random_programs": lambda: list(random_graphs(12)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("max_inputs", [4, 64])
def test_incremental_reachability_matches_search(name, max_inputs):
    for g in GRAPHS[name]():
        part = fusion._Partitioner(g, max_inputs)
        got = partition(part)
        assert got == partition(SearchPartitioner(g, max_inputs))
        search = SearchPartitioner(g, max_inputs)
        search.group_of, search.views = part.group_of, part.views
        ks = part.kernels
        for a in ks:
            for b in ks:
                assert part.depends(a, b) == search.depends(a, b), (a, b)
        # Execution order: every kernel runs after the kernels it reads.
        for i, k in enumerate(ks):
            assert not any(part.depends(k, later) for later in ks[i:])


def test_sibling_merge_counts_merges_once():
    # Six independent elementwise kernels of one shape, each behind its own reduction so
    # that they start apart: they end as one kernel (plus the reductions), as rescanning
    # after each merge gives.
    def f(*xs):
        return [(x.sum(-1, keepdim=True) * x).exp() for x in xs]
    xs = [fg.randn(4, 8) for _ in range(6)]
    g = fg.compile(f).lower(*xs).graph
    part = fusion._Partitioner(g, 64)
    assert partition(part) == partition(SearchPartitioner(g, 64))


# --------------------------------------------------------------------------- per-kernel cache


@pytest.fixture
def fresh_memory_cache():
    jit.clear_memory_cache()
    yield
    jit.clear_memory_cache()


def moved(before: dict) -> dict:
    return {k: jit.stats[k] - before[k] for k in ("compiles", "disk_hits", "memory_hits")}


def test_two_programs_sharing_a_kernel_compile_it_once(fresh_memory_cache, monkeypatch):
    monkeypatch.setattr(fg_config.config, "cache_dir", None)
    x, y = fg.randn(6, 5), fg.randn(3)
    before = dict(jit.stats)
    one = fg.compile(lambda x: (x * 2 + 1).exp())
    np.testing.assert_allclose(one(x).numpy(), np.exp(x.numpy() * 2 + 1), rtol=1e-6)
    assert moved(before) == {"compiles": 1, "disk_hits": 0, "memory_hits": 0}
    # The same kernel, now on the second argument (its buffers sit at other slots of the
    # program), beside a kernel of its own.
    before = dict(jit.stats)
    two = fg.compile(lambda y, x: ((y - 3).sin(), (x * 2 + 1).exp()))
    s, e = two(y, x)
    np.testing.assert_allclose(s.numpy(), np.sin(y.numpy() - 3), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(e.numpy(), np.exp(x.numpy() * 2 + 1), rtol=1e-6)
    assert moved(before) == {"compiles": 1, "disk_hits": 0, "memory_hits": 1}
    first = set(one.lower(x).program.jit.addresses)
    second = set(two.lower(y, x).program.jit.addresses)
    assert len(first) == 1 and len(second) == 2 and first < second


def test_equal_kernels_in_one_program_are_one_symbol(fresh_memory_cache):
    a, b = fg.randn(5, 3), fg.randn(5, 3)
    f = fg.compile(lambda a, b: (a.sum(-1, keepdim=True) * a, b.sum(-1, keepdim=True) * b))
    prog = f.lower(a, b).program
    launches = [s for s in prog.steps if isinstance(s, LaunchStep)]
    assert len(launches) == 2 and len(prog.jit.addresses) == 1
    assert launches[0].table != launches[1].table         # each reads its own buffers
    got = f(a, b)
    for t, v in zip(got, (a, b)):
        want = v.numpy().sum(-1, keepdims=True) * v.numpy()
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-6)


def test_program_llvm_ir_names_functions_by_kernel():
    prog = fg.compile(lambda x: (x + 1).exp().sum(-1)).lower(fg.randn(3, 4)).program
    assert 'define void @"k0"(' in prog.llvm_ir
    assert all(symbol.startswith("fg_") for symbol in prog.jit.addresses)


def test_training_step_first_and_steady_graphs_share_kernels(fresh_memory_cache, monkeypatch):
    monkeypatch.setattr(fg_config.config, "cache_dir", None)
    fg.manual_seed(0)
    m = fg.nn.Sequential(fg.nn.Linear(10, 16), fg.nn.ReLU(), fg.nn.Linear(16, 4))
    opt = fg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)   # state made on step 1

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss
    rng = np.random.RandomState(0)
    x = fg.tensor(rng.randn(8, 10).astype(np.float32))
    y = fg.tensor(rng.randint(0, 4, 8))
    f = fg.compile(step, fullgraph=True)
    before = dict(jit.stats)
    losses = [float(f(x, y)) for _ in range(3)]
    assert f.compiles == 2
    assert losses[2] < losses[0]
    counts = moved(before)
    # The steady graph reuses the first step's kernels where they are the same (the forward
    # and backward; the momentum update differs: the first step makes the buffer).
    assert counts["compiles"] > 0 and counts["memory_hits"] >= 5


# --------------------------------------------------------------------------- kernel descriptions


def emitted_kernels(prog):
    """(description, IR, buffers as description indices) of each LLVM kernel of ``prog``,
    the IR built afresh."""
    out = []
    for i, k in enumerate(prog.kg.kernels):
        if not prog._lowered(i, k) or cpu.split_plan(k) is not None:
            continue        # split reductions are compiled per program, not by description
        level = 1 if math.prod(k.shape) < cpu.SMALL_KERNEL_WORK else 3
        text, values = cpu.kernel_description(k, prog.kg, level)
        module = llvm_ir.Module(name="kernel")
        local = cpu._LocalSlots(prog.slots)
        cpu.emit_kernel(module, dataclasses.replace(k, name="fg_kernel"), prog.kg, local)
        out.append((text, str(module), tuple(values.index(v) for v in local.values)))
    return out


def corpus_programs():
    from tests.compiler.test_kernel_counts import CASES
    for fn, args, _ in CASES.values():
        yield fg.compile(fn).lower(*[fg.from_numpy(a) if isinstance(a, np.ndarray) else a
                                     for a in args]).program
    for seed in range(12):
        program = generate(RandomChoices(100 + seed), max_ops=12)
        args = [fg.from_numpy(a) for a in program.arrays()]
        yield fg.compile(program.function()).lower(*args).program
    for make_opt in (lambda p: fg.optim.SGD(p, lr=0.1, momentum=0.9),
                     lambda p: fg.optim.Adam(p, lr=1e-3)):
        g = training_step_graph(make_opt)
        yield cpu.Program(fusion.fuse(g))


@pytest.mark.slow
def test_equal_kernel_descriptions_mean_equal_ir():
    # The cache keys kernels by description and skips building their IR: a description
    # must determine the IR and which of its values each buffer number is.
    seen: dict[str, tuple[str, tuple]] = {}
    kernels = 0
    for prog in corpus_programs():
        for text, ir_text, buffers in emitted_kernels(prog):
            kernels += 1
            assert seen.setdefault(text, (ir_text, buffers)) == (ir_text, buffers), text
    assert kernels > 50 and len(seen) < kernels         # some kernels recur


def test_warm_cache_builds_no_ir(tmp_path, monkeypatch, fresh_memory_cache):
    monkeypatch.setattr(fg_config.config, "cache_dir", str(tmp_path))
    built = []
    real = cpu.emit_kernel
    monkeypatch.setattr(cpu, "emit_kernel", lambda *a: built.append(1) or real(*a))
    x = fg.randn(5, 9)

    def run():
        f = fg.compile(lambda x: (x - x.amax(-1, keepdim=True)).exp() * 2 + x.sin())
        return f(x).numpy()
    want = (np.exp(x.numpy() - x.numpy().max(-1, keepdims=True)) * 2 + np.sin(x.numpy()))
    np.testing.assert_allclose(run(), want, rtol=1e-5, atol=1e-6)
    assert built                                        # cold: IR built and compiled
    built.clear()
    jit.clear_memory_cache()                            # as a fresh process would be
    before = dict(jit.stats)
    np.testing.assert_allclose(run(), want, rtol=1e-5, atol=1e-6)
    assert not built and moved(before)["compiles"] == 0 and moved(before)["disk_hits"] >= 1


def test_kernel_records_round_trip_and_reject_other_formats():
    record = jit.KernelRecord("fg_0123abcd", (2, 0, 1), b"\x7fELF object")
    assert jit.KernelRecord.from_bytes(record.to_bytes()) == record
    for junk in (b"", b"\x7fELF object", b"FGKERNEL1\nnot json\n", record.to_bytes()[:15],
                 b'FGKERNEL1\n{"symbol": "x; rm", "buffers": []}\n',
                 b'FGKERNEL1\n{"symbol": "fg_01", "buffers": [-1]}\n'):
        assert jit.KernelRecord.from_bytes(junk) is None
