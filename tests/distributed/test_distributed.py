"""fusegrad.distributed: collectives, DataParallel (eager and compiled), DistributedSampler,
the overlap schedule, faults and checkpoint resume.

The multi-process tests launch ``mpiexec -n 2`` on tests/distributed/ddp_checks.py, which
runs several checks per launch (each launch costs an interpreter start and compiles); they
skip when mpi4py or mpiexec is missing. The rest run in this process, with a process group
of one rank that never imports mpi4py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.distributed import comm, prims
from fusegrad.ir.parser import parse
from fusegrad.ir.printer import print_graph
from fusegrad.ops.primitive import bind
from fusegrad.passes.schedule import overlap_collectives
from fusegrad.utils.data import DistributedSampler

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("ddp_checks.py")


@pytest.fixture
def one_rank(monkeypatch):
    """A process group of one rank without MPI (collectives are identities)."""
    monkeypatch.setattr(comm, "_GROUP", comm.ProcessGroup(None, None, 0, 1, 5.0))


# --------------------------------------------------------------------------- one process


@pytest.mark.slow
def test_import_does_not_load_mpi4py():
    """Nor does a data-parallel script run without a launcher (a job of one rank)."""
    code = ("import sys, fusegrad as fg\n"
            "model = fg.distributed.DataParallel(fg.nn.Linear(2, 2))\n"
            "model(fg.ones(1, 2)).sum().backward()\n"
            "assert fg.distributed.world_size() == 1 and not fg.distributed.is_initialized()\n"
            "assert 'mpi4py' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_missing_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setattr(comm, "_GROUP", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=re.escape("pip install fusegrad[mpi]")):
        fg.distributed.init()


def test_collectives_on_one_rank(one_rank):
    t = fg.tensor([1.0, 2.0])
    fg.distributed.all_reduce(t, "mean")
    fg.distributed.broadcast(t, 0)
    fg.distributed.barrier()
    assert t.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="op must be one of"):
        fg.distributed.all_reduce(t, "prod")
    with pytest.raises(ValueError, match="contiguous"):
        fg.distributed.all_reduce(fg.ones(3, 4).t())
    with pytest.raises(TypeError, match="no datatype"):
        fg.distributed.all_reduce(fg.ones(3, dtype=fg.float16))


def test_compiled_all_reduce_is_graph_nodes(one_rank):
    def f(x):
        y = x * 2
        fg.distributed.all_reduce(y, "sum")
        return y + 1

    x = fg.tensor([1.0, -2.0, 3.0])
    compiled = fg.compile(f, fullgraph=True)
    np.testing.assert_array_equal(compiled(x).numpy(), [3.0, -3.0, 7.0])
    entry = compiled.entries()[0]
    ops = [n.op for n in entry.optimized.nodes]
    assert ops.count("allreduce_start") == 1 and ops.count("allreduce_wait") == 1
    steps = {type(s).__name__ for s in entry.program.steps}
    assert {"AllreduceStartStep", "AllreduceWaitStep"} <= steps
    # The interpreter runs the primitives' numpy references.
    interpreted = fg.compile(f, fullgraph=True, backend="interpreter")
    np.testing.assert_array_equal(interpreted(x).numpy(), [3.0, -3.0, 7.0])


def test_allreduce_text_form_round_trips():
    text = """graph @f(%x: f32[4]) -> (f32[4]) {
  %0 = allreduce_start %x {op="sum"} : f32[4]
  %1 = allreduce_wait %0 : f32[4]
  return %1
}"""
    assert print_graph(parse(text)).strip() == text


def test_overlap_schedule_starts_early_and_waits_late(one_rank):
    def f(x, y):
        a = (x * 2).exp()
        b = y.sin().cos()                       # independent work, traced before the start
        h = bind(prims.allreduce_start, a, op="sum")
        return bind(prims.allreduce_wait, h) + b

    g = fg.trace(f, fg.ones(4), fg.ones(4))
    ops = [n.op for n in g.nodes]
    assert ops.index("allreduce_start") > ops.index("cos")
    scheduled = [n.op for n in overlap_collectives(g).nodes]
    assert scheduled == ["mul", "exp", "allreduce_start", "sin", "cos", "allreduce_wait", "add"]
    plain = fg.trace(lambda x: x.exp(), fg.ones(2))
    assert overlap_collectives(plain) is plain


def test_fusion_keeps_kernels_after_a_wait_after_it(one_rank):
    """Horizontal fusion must not merge a kernel that reads a wait's result with an earlier
    independent one: the merged kernel would run early and pull the wait before the work it
    should overlap (regression test)."""
    from fusegrad.passes.fusion import fuse

    def f(x, y):
        first = bind(prims.allreduce_start, x @ x.t(), op="sum")        # a matmul kernel
        second = bind(prims.allreduce_start, y.exp() * 2, op="sum")   # elementwise, [4, 4]
        late = bind(prims.allreduce_wait, first) * 3                  # the same shape
        return late, bind(prims.allreduce_wait, second)

    g = overlap_collectives(fg.trace(f, fg.ones(4, 3), fg.ones(4, 4)))
    kernels = [k.describe() for k in fuse(g).kernels]
    starts = [i for i, k in enumerate(kernels) if "allreduce_start" in k]
    waits = [i for i, k in enumerate(kernels) if "allreduce_wait" in k]
    assert max(starts) < min(waits), kernels


def test_post_accumulate_grad_hook_eager_and_compiled():
    """The hook sees the accumulated gradient; in a compiled step it runs on the traced
    gradient, and what it writes to ``.grad`` is in the graph (regression test: the traced
    backward used to skip leaf hooks)."""
    def run(compiled: bool):
        fg.manual_seed(0)
        lin = fg.nn.Linear(3, 2)
        def hook(p):
            p.grad = p.grad * 2

        for p in lin.parameters():
            p.register_post_accumulate_grad_hook(hook)
        opt = fg.optim.SGD(lin.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = lin(x).square().sum()
            loss.backward()
            opt.step()
            return loss
        if compiled:
            step = fg.compile(step, fullgraph=True)
        x = fg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        losses = [float(step(x)) for _ in range(3)]
        return losses, [p.detach().numpy() for p in lin.parameters()]

    eager, compiled = run(False), run(True)
    np.testing.assert_allclose(eager[0], compiled[0], rtol=1e-5)
    for a, b in zip(eager[1], compiled[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # (a hook that also records into a Python list is refused in a compiled step:
    # tests/compiler/test_compile_state.py)


def test_data_parallel_on_one_rank_is_the_module(one_rank):
    fg.manual_seed(0)
    lin = fg.nn.Linear(3, 2)
    model = fg.distributed.DataParallel(lin)
    x = fg.ones(2, 3)
    np.testing.assert_array_equal(model(x).detach().numpy(), lin(x).detach().numpy())
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    assert model.buckets == [["bias", "weight"]]


def test_distributed_sampler_splits_like_torch():
    # torch: pad by repeating the start, then every num_replicas-th index from rank.
    parts = [list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False))
             for r in range(4)]
    assert parts == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    parts = [list(DistributedSampler(range(10), 4, r, shuffle=False, drop_last=True))
             for r in range(4)]
    assert parts == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert len(DistributedSampler(range(10), 4, 0, drop_last=True)) == 2
    # More padding than data: the indices repeat whole.
    parts = [list(DistributedSampler(range(2), 5, r, shuffle=False)) for r in range(5)]
    assert parts == [[0], [1], [0], [1], [0]]
    # Shuffled: one permutation shared by the ranks, new with each epoch.
    samplers = [DistributedSampler(range(12), 3, r, seed=7) for r in range(3)]
    first = [list(s) for s in samplers]
    assert sorted(sum(first, [])) == list(range(12))
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert sorted(sum(second, [])) == list(range(12)) and second != first
    assert [list(s) for s in samplers] == second
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(4), num_replicas=2, rank=2)


# --------------------------------------------------------------------------- two processes


def _mpiexec() -> str:
    pytest.importorskip("mpi4py", reason="the two-rank tests need mpi4py (pip install fusegrad[mpi])")
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if found is None:
        pytest.skip("the two-rank tests need mpiexec (pip install fusegrad[mpi])")
    return found


def launch(*args: str, env: dict | None = None, timeout: float = 120,
           script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """``mpiexec -n 2 python SCRIPT ARGS``; fails the test if it outlives ``timeout``."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "FUSEGRAD_NUM_THREADS": "1",
                   # Open MPI refuses root unless told, and two ranks may exceed the cores.
                   "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_rmaps_base_oversubscribe": "1",
                   "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                   **(env or {})}
    return subprocess.run([_mpiexec(), "-n", "2", sys.executable, str(script), *args],
                          capture_output=True, text=True, env=environment, timeout=timeout,
                          cwd=ROOT)


def test_two_ranks_match_single_process_training():
    """Collectives; eager and compiled DataParallel (SGD with momentum, Adam) equal
    single-process training on the whole batch; compiled steps schedule the all-reduces
    between backward kernels."""
    run = launch("checks")
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("collectives", "compiled-collective", "all-reduce-gradient", "ddp-sgd-eager",
                 "ddp-sgd-compiled",
                 "ddp-adam-eager", "ddp-adam-compiled", "unused-parameter",
                 "unused-parameter-compiled", "shape-mismatch", "bucket-layouts"):
        for rank in (0, 1):
            assert f"OK {name} {rank}" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_debug_flag_checks_each_collective_on_two_ranks():
    """FUSEGRAD_DIST_DEBUG=1: all_reduce of f32[4] on one rank and i32[4] on the other, or of
    f32[2,3] against f32[3,2] (the same byte count), eager or compiled, raises on both ranks
    naming both layouts (regression test: summed silently wrong, as torch with gloo does)."""
    run = launch("debug", env={"FUSEGRAD_DIST_DEBUG": "1"}, timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert f"OK debug-calls {rank}" in run.stdout, run.stdout + run.stderr


def test_layout_disagreement_names_ranks_tensor_and_layouts():
    lay = [("parameter w", "f32[2,3], bucket 0"), ("parameter b", "f32[3], bucket 0")]
    assert comm.layout_disagreement([lay, list(lay), list(lay)]) is None
    other = [lay[0], ("parameter b", "i32[3], bucket 0")]
    assert comm.layout_disagreement([lay, lay, other]) == (
        "rank 0 and rank 2 disagree on tensor 1 (parameter b): rank 0 has parameter b: f32[3], "
        "bucket 0, rank 2 has parameter b: i32[3], bucket 0")
    assert comm.layout_disagreement([lay, lay[:1]]) == (
        "rank 0 and rank 1 disagree on tensor 1 (parameter b): rank 0 has parameter b: f32[3], "
        "bucket 0, rank 1 has no such tensor")
    assert comm.layout_text(np.zeros((2, 3), np.int32)) == "i32[2,3]"


@pytest.mark.parametrize("value, on", [("1", True), ("DETAIL", True), ("0", False), ("", False),
                                       ("OFF", False)])
def test_debug_flag_values(monkeypatch, value, on):
    monkeypatch.setenv("FUSEGRAD_DIST_DEBUG", value)
    assert comm.debug_enabled() is on


def test_layout_checks_need_no_messages_on_one_rank(one_rank):
    assert comm.agree_on_layout([("x", "f32[1]")], "test") is None
    assert comm.allgather_array(np.arange(3), "test").tolist() == [[0, 1, 2]]


@pytest.mark.slow
def test_train_ddp_example_runs_on_two_ranks(tmp_path):
    script = ROOT / "examples" / "train_ddp.py"
    run = launch("--epochs", "1", "--samples", "256", "--checkpoint",
                 str(tmp_path / "example.fg"), script=script)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "epoch 0: loss" in run.stdout and "on 2 ranks" in run.stdout, run.stdout
    assert (tmp_path / "example.fg").exists()


def _losses(out: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^LOSS (\d+) (\S+)$", out, re.M)}


@pytest.mark.slow
def test_resume_from_checkpoint_gives_identical_losses(tmp_path):
    ckpt = str(tmp_path / "ddp.fg")
    full = launch("train", ckpt, "3", "6")
    assert full.returncode == 0, full.stdout + full.stderr
    resumed = launch("train", ckpt, "3", "6", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    a, b = _losses(full.stdout), _losses(resumed.stdout)
    assert sorted(a) == list(range(6)) and sorted(b) == [3, 4, 5]
    assert all(a[i] == b[i] for i in b), (a, b)


@pytest.mark.slow
@pytest.mark.parametrize("fault, message", [
    ("raise", "rank 1 of 2 raised ValueError: a fault injected at step 2"),
    ("exit", "rank 0 of 2 waited 3 s for allreduce_start"),
    ("kill", "exited with non-zero status"),
])
def test_a_failing_rank_stops_the_job(fault, message, tmp_path):
    """A rank that raises aborts the job; one that exits cleanly mid-training leaves the
    other to time out in its next all-reduce; one that dies is reported by mpiexec. The
    launch's timeout is what would catch a hang."""
    run = launch("train", str(tmp_path / "unused.fg"), "0", "6",
                 env={"DDP_FAULT": fault, "DDP_TIMEOUT": "3"}, timeout=60)
    assert run.returncode != 0
    assert message in run.stdout + run.stderr, run.stdout + run.stderr
    assert "LOSS 5" not in run.stdout
