"""Checks run under ``mpiexec -n 2`` by tests/distributed/test_distributed.py.

    mpiexec -n 2 python tests/distributed/ddp_checks.py checks
    FUSEGRAD_DIST_DEBUG=1 mpiexec -n 2 python tests/distributed/ddp_checks.py debug
    mpiexec -n 2 python tests/distributed/ddp_checks.py train CKPT SAVE_AT STEPS [--resume]
    mpiexec -n 2 python tests/distributed/ddp_checks.py fault raise|exit|kill

``checks`` prints ``OK <name>`` per passed check (an AssertionError aborts the job);
``train`` prints ``LOSS <step> <value as float.hex>`` on rank 0; ``fault`` makes rank 1 fail
at the third step while rank 0 keeps training.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import fusegrad as fg
from fusegrad import nn
from fusegrad.nn import functional as F

dist = fg.distributed


def make_model(seed: int = 0) -> nn.Module:
    fg.manual_seed(seed + dist.rank())       # different per rank: DataParallel broadcasts
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 3))


def make_data(steps: int, batch: int = 16):
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((steps, batch, 6)).astype(np.float32)
    ys = rng.standard_normal((steps, batch, 3)).astype(np.float32)
    return xs, ys


def shard(a: np.ndarray) -> np.ndarray:
    """This rank's contiguous share of a batch."""
    n = len(a) // dist.world_size()
    return a[dist.rank() * n:(dist.rank() + 1) * n]


def train_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def params(model) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def reference(steps: int, opt_name: str) -> tuple[list, list]:
    """Single-process training on the whole batch from rank 0's initial weights."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 3))
    opt = make_opt(opt_name, model)
    step = train_step(model, opt)
    xs, ys = make_data(steps)
    losses = [float(step(fg.tensor(x), fg.tensor(y))) for x, y in zip(xs, ys)]
    return losses, params(model)


def make_opt(name: str, model):
    if name == "adam":
        return fg.optim.Adam(model.parameters(), lr=1e-2)
    return fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def ddp_run(steps: int, opt_name: str, compiled: bool) -> tuple[list, list, object]:
    model = dist.DataParallel(make_model(), bucket_cap_mb=0.004)    # 4 KiB: several buckets
    opt = make_opt(opt_name, model)
    step = train_step(model, opt)
    if compiled:
        step = fg.compile(step, fullgraph=True)
    xs, ys = make_data(steps)
    losses = []
    for x, y in zip(xs, ys):
        loss = step(fg.tensor(shard(x)), fg.tensor(shard(y)))
        dist.all_reduce(loss, "mean")            # the whole batch's loss, for comparison
        losses.append(float(loss))
    return losses, params(model), (model, step)


def close(a, b, what: str, rtol=2e-5, atol=2e-6) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=what)


def check_collectives() -> None:
    r, n = dist.rank(), dist.world_size()
    t = fg.tensor(np.arange(6, dtype=np.float32) + r)
    buffer = t._data
    dist.all_reduce(t)
    assert t._data is buffer, "all_reduce replaced the tensor's buffer"
    close(t.numpy(), sum(np.arange(6) + k for k in range(n)), "sum")
    t = fg.tensor([float(r), 10.0 * r])
    dist.all_reduce(t, dist.ReduceOp.MEAN)
    close(t.numpy(), [(n - 1) / 2, 10 * (n - 1) / 2], "mean")
    t = fg.tensor([r, -r], dtype=fg.int64)
    dist.all_reduce(t, "max")
    assert t.tolist() == [n - 1, 0], t.tolist()
    t = fg.full((2, 3), float(r))
    work = dist.all_reduce(t, "sum", async_op=True)
    work.wait()
    close(t.numpy(), np.full((2, 3), n * (n - 1) / 2), "async sum")
    t = fg.tensor(np.full(5, 7.0 + r, np.float32))
    buffer = t._data
    dist.broadcast(t, src=1)
    assert t._data is buffer and np.all(t.numpy() == 8.0), t
    dist.barrier()
    print(f"OK collectives {r}", flush=True)

    # Inside a compiled function the all-reduce is graph nodes.
    @fg.compile(fullgraph=True)
    def reduce_twice(x):
        y = x * 2
        dist.all_reduce(y, "mean")
        return y + 1
    x = fg.tensor([1.0 + r, 2.0])
    close(reduce_twice(x).numpy(), [2 * (1 + (n - 1) / 2) + 1, 5.0], "compiled all_reduce")
    close(reduce_twice(x).numpy(), [2 * (1 + (n - 1) / 2) + 1, 5.0], "compiled all_reduce again")
    ops = [nd.op for nd in reduce_twice.entries()[0].optimized.nodes]
    assert "allreduce_start" in ops and "allreduce_wait" in ops, ops
    print(f"OK compiled-collective {r}", flush=True)

    # The in-place all-reduce is not recorded by autograd, eager or compiled (as torch's):
    # the gradient passes through it as it is (the compiled one summed the ranks' cotangents,
    # and for "max" gave a rank without the maximum a gradient).
    def through(x, c):
        y = x * x
        dist.all_reduce(y, "max")
        return (y * c).sum()
    grads = []
    for f in (through, fg.compile(through)):
        x = fg.tensor([1.0 + r, 2.0], requires_grad=True)
        f(x, fg.tensor([1.0, 3.0 + r])).backward()
        grads.append(x.grad.numpy())
    close(grads[1], grads[0], "compiled gradient through all_reduce")
    close(grads[0], [2.0 * (1 + r), 12.0 + 4 * r], "eager gradient through all_reduce")
    print(f"OK all-reduce-gradient {r}", flush=True)


def check_training() -> None:
    r = dist.rank()
    steps = 5
    for opt_name in ("sgd", "adam"):
        ref_losses, ref_params = reference(steps, opt_name)
        for compiled in (False, True):
            losses, got, (model, step) = ddp_run(steps, opt_name, compiled)
            what = f"{opt_name} {'compiled' if compiled else 'eager'}"
            close(losses, ref_losses, what + " losses")
            for a, b in zip(got, ref_params):
                close(a, b, what + " parameters")
            # Every rank holds the same parameters.
            for p in model.parameters():
                q = p.detach().clone()
                dist.broadcast(q, 0)
                assert np.array_equal(q.numpy(), p.detach().numpy()), what
            if compiled:
                entry = step.entries()[-1]
                check_schedule(entry, len(model._buckets), what)
            print(f"OK ddp-{opt_name}-{'compiled' if compiled else 'eager'} {r}", flush=True)


def check_unused_parameter() -> None:
    """A parameter without a gradient leaves its bucket unreduced: the next forward says so
    instead of letting the ranks diverge."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    ddp = dist.DataParallel(model, bucket_cap_mb=1e-5)          # one parameter per bucket
    x = fg.ones(2, 3)
    model[0](x).sum().backward()                   # the second layer gets no gradient
    try:
        ddp(x)
    except RuntimeError as e:
        assert "never all-reduced" in str(e), e
    else:
        raise AssertionError("an unreduced bucket went unnoticed")
    ddp(x).sum().backward()                        # the state was reset: training goes on
    print(f"OK unused-parameter {dist.rank()}", flush=True)

    # A compiled step never runs forward's check again (regression test: its graph reduced
    # the used buckets only and the ranks' parameters diverged silently): the trace raises.
    opt = fg.optim.SGD(ddp.parameters(), lr=0.1)

    @fg.compile(fullgraph=True)
    def step(x):
        opt.zero_grad()
        ddp.module[0](x).sum().backward()
        opt.step()
    try:
        step(x)
    except RuntimeError as e:
        assert "never all-reduced" in str(e), e
    else:
        raise AssertionError("a compiled step left a bucket unreduced")
    ddp(x).sum().backward()
    print(f"OK unused-parameter-compiled {dist.rank()}", flush=True)


def check_shape_mismatch() -> None:
    """Modules of different shapes on the ranks are refused on every rank (regression test:
    rank 0's broadcast filled a larger parameter on rank 1 only in part, silently)."""
    for width in (2 + dist.rank(), 3 - dist.rank()):
        expect_refused(lambda w=width: dist.DataParallel(nn.Linear(4, w)),
                       "same module on every rank, with the same parameters requiring grad "
                       "and the same bucket_cap_mb: rank 0 and rank 1 disagree on tensor 0 "
                       f"(parameter weight): rank 0 has parameter weight: f32[{width},4], "
                       f"bucket 0, rank 1 has parameter weight: f32[{5 - width},4], bucket 0"
                       if dist.rank() == 0 else
                       f"rank 0 has parameter weight: f32[{5 - width},4], bucket 0, rank 1 has "
                       f"parameter weight: f32[{width},4]")
    dist.DataParallel(nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2)))
    print(f"OK shape-mismatch {dist.rank()}", flush=True)


def expect_refused(make, message: str, error=RuntimeError) -> None:
    try:
        make()
    except error as e:
        assert message in str(e), e
    else:
        raise AssertionError(f"rank {dist.rank()}: accepted, expected {message!r}")


def check_bucket_layouts() -> None:
    """Buckets of equal byte counts but other layouts are refused on every rank, naming the
    ranks, the parameter and both layouts (regression test: f32[2,3] against f32[3,2], or a
    parameter frozen on one rank only, was all-reduced silently wrong)."""
    r = dist.rank()

    class Pair(nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.a = nn.Parameter(fg.ones(*shape))
            self.b = nn.Parameter(fg.ones(6))

    expect_refused(lambda: dist.DataParallel(Pair((2, 3) if r == 0 else (3, 2))),
                   "rank 0 and rank 1 disagree on tensor 0 (parameter a): rank 0 has parameter "
                   "a: f32[2,3], bucket 0, rank 1 has parameter a: f32[3,2], bucket 0")
    frozen = Pair((2, 3))
    (frozen.a if r == 0 else frozen.b).requires_grad_(False)     # 24 bytes to reduce on each
    expect_refused(lambda: dist.DataParallel(frozen), "parameter a: f32[2,3], no gradient")
    expect_refused(lambda: dist.DataParallel(Pair((2, 3)), bucket_cap_mb=1e-5 if r else 25),
                   "rank 0 has parameter a: f32[2,3], bucket 0, rank 1 has parameter a: "
                   "f32[2,3], bucket 1")
    dist.DataParallel(Pair((2, 3)))
    print(f"OK bucket-layouts {r}", flush=True)


def _reduce_twice(x):
    y = x * 2
    dist.all_reduce(y)
    return y


def check_debug_calls() -> None:
    """FUSEGRAD_DIST_DEBUG=1: each collective checks the ranks' dtypes and shapes first."""
    r = dist.rank()
    assert dist.group().debug
    t = fg.tensor(np.arange(4, dtype=np.float32 if r == 0 else np.int32))
    expect_refused(lambda: dist.all_reduce(t), "all_reduce(sum): the ranks pass tensors of "
                   "other dtypes or shapes: rank 0 passes f32[4], rank 1 passes i32[4]",
                   dist.DistributedError)
    t = fg.ones(2, 3) if r == 0 else fg.ones(3, 2)
    expect_refused(lambda: dist.all_reduce(t, "mean"),
                   "rank 0 passes f32[2,3], rank 1 passes f32[3,2]", dist.DistributedError)
    expect_refused(lambda: dist.broadcast(t, 0), "broadcast from rank 0: the ranks pass",
                   dist.DistributedError)
    compiled = fg.compile(_reduce_twice)
    expect_refused(lambda: compiled(t), "rank 1 passes f32[3,2]", dist.DistributedError)
    same = fg.ones(2, 3)
    dist.all_reduce(same)
    assert same.tolist() == [[2.0] * 3] * 2, same
    model = dist.DataParallel(nn.Linear(3, 2))
    model(fg.ones(4, 3)).sum().backward()
    print(f"OK debug-calls {r}", flush=True)


def check_schedule(entry, n_buckets: int, what: str) -> None:
    """The compiled step reduces each bucket in the graph, and the first reduction starts
    before the backward's last matmul: communication overlaps backward kernels."""
    kinds = [k.describe() for k in entry.program.kg.kernels]
    starts = [i for i, k in enumerate(kinds) if "allreduce_start" in k]
    waits = [i for i, k in enumerate(kinds) if "allreduce_wait" in k]
    matmuls = [i for i, k in enumerate(kinds) if "matmul" in k]
    assert len(starts) == n_buckets == len(waits), (what, kinds)
    assert starts[0] < matmuls[-1], (what, kinds)
    assert max(starts) < min(waits), (what, kinds)


def train(ckpt: str, save_at: int, steps: int, resume: bool) -> None:
    """Compiled DDP training with Adam; rank 0 saves a checkpoint after ``save_at`` steps, or
    (``resume``) every rank starts from it."""
    model = dist.DataParallel(make_model())
    opt = fg.optim.Adam(model.parameters(), lr=1e-2)
    first = 0
    if resume:
        state = fg.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = state["step"]
    step = fg.compile(train_step(model, opt), fullgraph=True)
    xs, ys = make_data(steps)
    fault = os.environ.get("DDP_FAULT")
    for i in range(first, steps):
        if fault and dist.rank() == 1 and i == 2:
            if fault == "raise":
                raise ValueError("a fault injected at step 2")
            if fault == "exit":
                sys.exit(0)
            os._exit(3)
        loss = step(fg.tensor(shard(xs[i])), fg.tensor(shard(ys[i])))
        dist.all_reduce(loss, "mean")
        if dist.rank() == 0:
            print(f"LOSS {i} {float(loss).hex()}", flush=True)
        if i + 1 == save_at and not resume:
            if dist.rank() == 0:
                fg.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                         "step": i + 1}, ckpt)
            dist.barrier()


def main() -> None:
    timeout = os.environ.get("DDP_TIMEOUT")
    dist.init(timeout=float(timeout) if timeout else None)
    fg.set_num_threads(1)
    mode = sys.argv[1]
    if mode == "checks":
        check_collectives()
        check_unused_parameter()
        check_shape_mismatch()
        check_bucket_layouts()
        check_training()
    elif mode == "debug":
        check_debug_calls()
    elif mode == "train":
        train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "--resume" in sys.argv)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
