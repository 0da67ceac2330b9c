"""Data-parallel training over MPI: step time on 1 and 2 ranks, bytes communicated per step,
the overlap of communication with the backward, and a model of scaling to 8 and 64 machines.

    python benchmarks/bench_ddp.py              # launches mpiexec -n 1 and -n 2 itself
    python benchmarks/bench_ddp.py --steps 30 --hidden 1024

Workload: an MLP 512-H-H-H-10 (H = ``--hidden``, GELU, cross-entropy), SGD with momentum, a
fixed batch per rank (``--batch``, weak scaling: N ranks train on N times the samples per
step), every kernel on one thread per rank, the whole step compiled with the gradient
all-reduce inside (buckets of ``--bucket-mb``). Each rank measures, after warm-up, medians
of per-step times (ranks synchronised by a barrier per round):

- the compiled DDP step; the eager DDP step;
- the compute alone: the same compiled step without ``DataParallel``, same batch;
- the all-reduce alone: blocking all-reduces of the step's buckets, back to back;
- bytes all-reduced per step, seconds blocked in the step's waits, and seconds in any MPI
  call of the step (start, the tests between kernels, waits: ``comm_stats``).

Overlap is the share of the all-reduce time that the step hides behind its kernels:
``1 - in MPI / allreduce alone`` (the MPI library moves data inside its calls, so time in
any of them is communication the step's thread paid for). On one machine the ranks also
share its cores, so what is hidden here is bounded by what the cores can do at once; on
separate machines the network does the moving.

The scaling model (weak scaling; a ring all-reduce, as NCCL, Horovod and the MPI libraries
run for large messages): a bucket of ``S`` bytes takes
``T_ring(N) = 2 (N - 1) / N * S / B + 2 (N - 1) * alpha`` on ``N`` machines, ``B`` the link
bandwidth (10 and 100 Gb/s, 90% usable) and ``alpha`` a per-message latency (25 us at 10
Gb/s, 5 us at 100 Gb/s, typical of TCP and of RDMA fabrics). The buckets run one after
another on the link, each from the moment the compiled step starts it (measured on two
ranks, less the time in MPI calls, scaled to one rank's speed); what ends after the step
reaches its first wait (measured the same way) is exposed:
``T(N) = T_compute + exposed``, ``T_compute`` the step without communication measured on
one rank. Efficiency is ``T_compute / T(N)``, the speedup over one machine ``N`` times that;
"no-overlap" is ``T_compute`` plus every bucket's ring time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

NETWORKS = [("10 Gb/s", 10e9 / 8 * 0.9, 25e-6), ("100 Gb/s", 100e9 / 8 * 0.9, 5e-6)]
MACHINES = (8, 64)


def worker(args) -> None:
    import fusegrad as fg
    from fusegrad import nn
    from fusegrad.nn import functional as F
    dist = fg.distributed
    dist.init()
    fg.set_num_threads(1)
    world, rank = dist.world_size(), dist.rank()

    def make_model():
        fg.manual_seed(0)
        h = args.hidden
        return nn.Sequential(nn.Linear(512, h), nn.GELU(), nn.Linear(h, h), nn.GELU(),
                             nn.Linear(h, h), nn.GELU(), nn.Linear(h, 10))

    def make_step(model, compiled=True):
        opt = fg.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return fg.compile(step, fullgraph=True) if compiled else step

    rng = np.random.default_rng(rank)
    x = fg.tensor(rng.standard_normal((args.batch, 512)).astype(np.float32))
    y = fg.tensor(rng.integers(0, 10, args.batch))

    def median_step(step, steps):
        for _ in range(3):
            step(x, y)
        times = []
        for _ in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            step(x, y)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    ddp = dist.DataParallel(make_model(), bucket_cap_mb=args.bucket_mb)
    compiled = make_step(ddp)
    for _ in range(3):
        compiled(x, y)
    timeline = instrument(compiled.entries()[-1].program)
    stats = dist.comm_stats()
    stats.reset()
    t_ddp = median_step(compiled, args.steps)
    schedule = schedule_offsets(timeline[-args.steps:]) if timeline else None
    calls = stats.allreduce_calls
    per_step = max(1, calls // (args.steps + 3)) if calls else 0
    bytes_per_step = stats.allreduce_bytes / (args.steps + 3)
    blocked = stats.wait_seconds / (args.steps + 3)
    in_mpi = stats.mpi_seconds / (args.steps + 3)
    t_eager = median_step(make_step(dist.DataParallel(make_model(), bucket_cap_mb=args.bucket_mb),
                                    compiled=False), max(3, args.steps // 3))
    t_compute = median_step(make_step(make_model()), args.steps)

    # The all-reduce alone: the step's buckets, blocking, back to back.
    buckets = [np.zeros(sum(p.numel() for p in b.params), np.float32) for b in ddp._buckets]
    t_allreduce = 0.0
    if world > 1:
        times = []
        for _ in range(args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            for arr in buckets:
                dist.all_reduce(fg.from_numpy(arr))
            times.append(time.perf_counter() - t0)
        t_allreduce = float(np.median(times))
    result = {"ranks": world, "step": t_ddp, "eager": t_eager, "compute": t_compute,
              "allreduce": t_allreduce, "blocked": blocked, "mpi": in_mpi, "bytes": bytes_per_step,
              "buckets": per_step, "params": sum(p.numel() for p in ddp.parameters()),
              "hidden": args.hidden, "batch": args.batch, "schedule": schedule}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def instrument(program) -> list:
    """Record, per call of ``program``, when each all-reduce starts (with its bytes) and when
    the first wait begins: ``[[("start", nbytes, t), ..., ("wait", nbytes, t)], ...]``, ``t``
    the time on the clock less the time spent in MPI calls so far (on one machine MPI copies
    the data inside its calls: that time is not the step's computation)."""
    from fusegrad import distributed
    from fusegrad.distributed.prims import AllreduceStartStep, AllreduceWaitStep
    stats = distributed.comm_stats()
    calls: list = []
    for st in program.steps:
        if isinstance(st, (AllreduceStartStep, AllreduceWaitStep)):
            kind = "start" if isinstance(st, AllreduceStartStep) else "wait"
            nbytes = st.node.output.type.numel * 4

            def run(prog, _run=st.run, kind=kind, nbytes=nbytes):
                if kind == "start" and (not calls or calls[-1][-1][0] == "wait"):
                    calls.append([])
                if kind == "start" or calls[-1][-1][0] == "start":
                    calls[-1].append((kind, nbytes, time.perf_counter() - stats.mpi_seconds))
                _run(prog)
            st.run = run
    return calls


def schedule_offsets(calls: list) -> dict:
    """Median offsets (seconds from the first start) of each start and of the first wait."""
    starts = [[t - c[0][2] for kind, _, t in c if kind == "start"] for c in calls]
    waits = [c[-1][2] - c[0][2] for c in calls]
    sizes = [n for kind, n, _ in calls[0] if kind == "start"]
    return {"sizes": sizes, "starts": np.median(np.array(starts), axis=0).tolist(),
            "wait": float(np.median(waits))}


def exposed_seconds(schedule: dict, n: int, bandwidth: float, alpha: float) -> float:
    """Communication the step would wait for on ``n`` machines: the buckets' ring
    all-reduces run one after another on the link, each from its measured start; what ends
    after the measured first wait is exposed."""
    link = 0.0
    for start, size in zip(schedule["starts"], schedule["sizes"]):
        link = max(link, start) + ring_seconds(n, size, bandwidth, alpha)
    return max(0.0, link - schedule["wait"])


def ring_seconds(n: int, nbytes: float, bandwidth: float, alpha: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` machines (reduce-scatter + all-gather)."""
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * alpha


def launch(ranks: int, args) -> dict:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or \
        shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("mpiexec not found: pip install fusegrad[mpi]")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "FUSEGRAD_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker",
           "--steps", str(args.steps), "--hidden", str(args.hidden), "--batch", str(args.batch),
           "--bucket-mb", str(args.bucket_mb)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"the {ranks}-rank run failed:\n{run.stdout}\n{run.stderr}")


def report(results: list[dict]) -> None:
    ms = 1e3
    r0 = results[0]
    h = r0["hidden"]
    print(f"\nDataParallel: MLP 512-{h}-{h}-{h}-10 ({r0['params'] / 1e6:.2f} M parameters), "
          f"{r0['batch']} samples per rank, 1 thread per rank")
    print(f"{'ranks':>5} {'compiled ms':>12} {'eager ms':>9} {'compute ms':>11} {'MB/step':>8} "
          f"{'buckets':>8} {'allreduce ms':>13} {'in MPI ms':>10} {'blocked ms':>11} "
          f"{'overlap':>8}")
    for r in results:
        head = (f"{r['ranks']:>5} {r['step'] * ms:>12.2f} {r['eager'] * ms:>9.2f} "
                f"{r['compute'] * ms:>11.2f} {r['bytes'] / 1e6:>8.2f} {r['buckets']:>8} ")
        if not r["allreduce"]:
            print(head + f"{'-':>13} {'-':>10} {'-':>11} {'-':>8}")
            continue
        r["overlap"] = max(0.0, 1 - r["mpi"] / r["allreduce"])
        print(head + f"{r['allreduce'] * ms:>13.2f} {r['mpi'] * ms:>10.2f} "
              f"{r['blocked'] * ms:>11.2f} {r['overlap']:>8.0%}")
    two = results[-1]
    nbytes = two["params"] * 4
    compute = results[0]["compute"]
    # The offsets were measured on two ranks sharing the cores: scaled to one rank's speed by
    # the ratio of the step's computation on one rank and on two (without time in MPI calls).
    scale = compute / (two["step"] - two["mpi"])
    schedule = dict(two["schedule"])
    schedule["starts"] = [t * scale for t in schedule["starts"]]
    schedule["wait"] *= scale
    print(f"\nScaling model (weak scaling): T_compute {compute * ms:.2f} ms measured on 1 rank, "
          f"{nbytes / 1e6:.2f} MB of gradients in {len(schedule['sizes'])} buckets; the "
          f"compiled step starts them {', '.join(f'{t * ms:.1f}' for t in schedule['starts'])} ms "
          f"after the first and waits at {schedule['wait'] * ms:.1f} ms (measured on 2 ranks, "
          f"scaled by {scale:.2f} to one rank's speed)")
    print(f"{'network':>9} {'machines':>9} {'ring ms':>8} {'exposed ms':>11} {'step ms':>8} "
          f"{'no-overlap ms':>14} {'efficiency':>11} {'speedup':>8}")
    for name, bandwidth, alpha in NETWORKS:
        for n in MACHINES:
            ring = sum(ring_seconds(n, b, bandwidth, alpha) for b in schedule["sizes"])
            exposed = exposed_seconds(schedule, n, bandwidth, alpha)
            step = compute + exposed
            eff = compute / step
            print(f"{name:>9} {n:>9} {ring * ms:>8.2f} {exposed * ms:>11.2f} {step * ms:>8.2f} "
                  f"{(compute + ring) * ms:>14.2f} {eff:>11.0%} {n * eff:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--bucket-mb", type=float, default=2.0)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    report([launch(1, args), launch(2, args)])


if __name__ == "__main__":
    main()
