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
- bytes all-reduced per step and seconds blocked in the step's waits (``comm_stats``).

Overlap is the share of the all-reduce time that the step hides behind its kernels:
``1 - blocked / allreduce alone``. (On one machine the ranks share its cores, so what is
hidden here is bounded by what the cores can do at once; on separate machines the network
does the moving.)

The scaling model (weak scaling, a ring all-reduce as NCCL, Horovod and MPI libraries use
for large messages): per step, ``T(N) = T_compute + (1 - overlap) * T_ring(N)`` with
``T_ring(N) = 2 (N - 1) / N * S / B + 2 (N - 1) * alpha``, ``S`` the gradient bytes, ``B``
the link bandwidth (10 and 100 Gb/s, of which 90% usable) and ``alpha`` a per-message latency
(25 us at 10 Gb/s, 5 us at 100 Gb/s, typical of TCP and of RDMA fabrics). ``T_compute`` and
``overlap`` are the figures measured here; efficiency is ``T_compute / T(N)``, and the
speedup over one machine ``N * efficiency``.
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
    stats = dist.comm_stats()
    stats.reset()
    t_ddp = median_step(compiled, args.steps)
    calls = stats.allreduce_calls
    per_step = max(1, calls // (args.steps + 3)) if calls else 0
    bytes_per_step = stats.allreduce_bytes / (args.steps + 3)
    blocked = stats.wait_seconds / (args.steps + 3)
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
              "allreduce": t_allreduce, "blocked": blocked, "bytes": bytes_per_step,
              "buckets": per_step, "params": sum(p.numel() for p in ddp.parameters())}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


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
    print(f"\nDataParallel, MLP 512-{results[0]['params']} params, batch per rank fixed, "
          "1 thread per rank, compiled step")
    print(f"{'ranks':>5} {'step ms':>8} {'eager ms':>9} {'compute ms':>11} {'MB/step':>8} "
          f"{'buckets':>8} {'allreduce ms':>13} {'blocked ms':>11} {'overlap':>8}")
    for r in results:
        overlap = max(0.0, 1 - r["blocked"] / r["allreduce"]) if r["allreduce"] else float("nan")
        r["overlap"] = overlap
        print(f"{r['ranks']:>5} {r['step'] * ms:>8.2f} {r['eager'] * ms:>9.2f} "
              f"{r['compute'] * ms:>11.2f} {r['bytes'] / 1e6:>8.2f} {r['buckets']:>8} "
              f"{r['allreduce'] * ms:>13.2f} {r['blocked'] * ms:>11.2f} "
              f"{overlap:>8.0%}" if r["allreduce"] else
              f"{r['ranks']:>5} {r['step'] * ms:>8.2f} {r['eager'] * ms:>9.2f} "
              f"{r['compute'] * ms:>11.2f} {r['bytes'] / 1e6:>8.2f} {r['buckets']:>8} "
              f"{'-':>13} {'-':>11} {'-':>8}")
    two = results[-1]
    nbytes = two["params"] * 4
    compute = results[0]["compute"]
    overlap = two.get("overlap", 0.0)
    if overlap != overlap:          # nan: one rank only
        overlap = 0.0
    print(f"\nScaling model (weak scaling; T_compute {compute * ms:.2f} ms measured on 1 rank, "
          f"{nbytes / 1e6:.2f} MB of gradients, overlap {overlap:.0%} measured on 2 ranks)")
    print(f"{'network':>9} {'machines':>9} {'ring ms':>8} {'step ms':>8} {'no-overlap ms':>14} "
          f"{'efficiency':>11} {'speedup':>8}")
    for name, bandwidth, alpha in NETWORKS:
        for n in MACHINES:
            ring = ring_seconds(n, nbytes, bandwidth, alpha)
            step = compute + (1 - overlap) * ring
            eff = compute / step
            print(f"{name:>9} {n:>9} {ring * ms:>8.2f} {step * ms:>8.2f} "
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
