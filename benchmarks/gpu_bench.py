"""A short GPU benchmark: fusegrad's CUDA kernels against the device's copy bandwidth and,
where torch with CUDA is installed, against torch on the same GPU. Prints one table.

Run by ``benchmarks/gpu_check.sh``; ``--quick`` uses smaller sizes. Each figure is the
median of several timed repeats after a warm-up, timed around a stream synchronize.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fusegrad as fg  # noqa: E402
import fusegrad.nn.functional as F  # noqa: E402
from fusegrad.passes.fusion import fuse  # noqa: E402
from fusegrad.passes.manager import PassManager  # noqa: E402
from fusegrad.passes.partition import partition_joint  # noqa: E402
from fusegrad.runtime import cuda as rt  # noqa: E402
from fusegrad.tracer.compile import DEFAULT_PIPELINE  # noqa: E402

try:
    import torch
    HAVE_TORCH = torch.cuda.is_available()
except ImportError:
    HAVE_TORCH = False


def timed(fn, repeats: int = 10, sync=rt.synchronize) -> float:
    """Median seconds of ``fn()`` (after two warm-up calls)."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_timed(fn, repeats: int = 10) -> float | None:
    if not HAVE_TORCH:
        return None
    return timed(fn, repeats, torch.cuda.synchronize)


def _no_torch_when_simulated(simulated: bool) -> None:
    global HAVE_TORCH
    if simulated:
        HAVE_TORCH = False


def program(fn, *shapes, dtype=np.float32):
    args = [fg.zeros(*s) for s in shapes]
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(fn, *args)))
    return rt.CudaProgram(kg), kg


def device(shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return rt.DeviceArray.from_host(a, rt.allocator_of(rt.driver())), a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--simulate", action="store_true",
                        help="check this script without a GPU: tiny sizes on the simulated "
                             "driver (the numbers mean nothing)")
    opts = parser.parse_args()
    if opts.simulate:
        from fusegrad.testing.simulated_cuda import SimulatedDriver
        rt.set_driver(SimulatedDriver(max_grid=1))
    drv = rt.driver()
    tiny = opts.simulate
    _no_torch_when_simulated(tiny)
    rows = []          # (what, size, fusegrad ms, reference, ref ms, ratio text)

    # Copy bandwidth: a device-to-device copy of the GELU input.
    n = 1 << (8 if tiny else 22 if opts.quick else 26)
    x, xh = device((n,))
    y = rt.DeviceArray.empty((n,), np.float32, x.allocator)
    t_copy = timed(lambda: drv.dtod(y.ptr, x.ptr, x.nbytes))
    copy_bw = 2 * x.nbytes / t_copy
    rows.append(("device copy", f"2^{n.bit_length() - 1} f32", t_copy * 1e3, "-", None,
                 f"{copy_bw / 1e9:.0f} GB/s"))

    gelu, _ = program(lambda v: F.gelu(v) * 2.0 + v, (n,))
    t = timed(lambda: gelu(x))
    bw = 2 * x.nbytes / t
    ref = None
    if HAVE_TORCH:
        tx = torch.from_numpy(xh).cuda()
        ref = torch_timed(lambda: torch.nn.functional.gelu(tx) * 2.0 + tx)
    rows.append(("GELU chain", f"2^{n.bit_length() - 1} f32", t * 1e3, "torch", ref,
                 f"{bw / copy_bw:.0%} of copy BW"))

    rows_n, cols = (2, 64) if tiny else (1024, 4096) if opts.quick else (8192, 4096)
    a, ah = device((rows_n, cols), 1)
    w, wh = device((cols,), 2)
    b, bh = device((cols,), 3)
    softmax, _ = program(lambda v: F.softmax(v, -1), (rows_n, cols))
    layer_norm, _ = program(lambda v, g, c: F.layer_norm(v, (cols,), g, c), (rows_n, cols),
                            (cols,), (cols,))
    for name, prog, inputs, tfn in [
            ("softmax", softmax, (a,), lambda ta: torch.softmax(ta, -1)),
            ("layer_norm", layer_norm, (a, w, b),
             lambda ta: torch.nn.functional.layer_norm(ta, (cols,), tw, tb))]:
        t = timed(lambda: prog(*inputs))
        ref = None
        if HAVE_TORCH:
            ta, tw, tb = (torch.from_numpy(v).cuda() for v in (ah, wh, bh))
            ref = torch_timed(lambda: tfn(ta))
        rows.append((name, f"{rows_n}x{cols} f32", t * 1e3, "torch", ref,
                     f"{2 * a.nbytes / t / 1e9:.0f} GB/s"))

    m = 16 if tiny else 1024 if opts.quick else 4096
    p, ph = device((m, m), 4)
    q, qh = device((m, m), 5)
    matmul, _ = program(lambda u, v: u @ v, (m, m), (m, m))
    t = timed(lambda: matmul(p, q), repeats=3)
    ref = None
    if HAVE_TORCH:
        tp, tq = torch.from_numpy(ph).cuda(), torch.from_numpy(qh).cuda()
        ref = torch_timed(lambda: tp @ tq, repeats=3)
    rows.append(("matmul (cuBLAS ref)", f"{m}^3 f32", t * 1e3, "torch", ref,
                 f"{2 * m ** 3 / t / 1e12:.1f} TFLOP/s"))

    # MLP forward + backward (the compiled training step's kernels, minus the optimizer).
    batch, d_in, d_hid, d_out = (4, 8, 16, 3) if tiny else (256, 256, 1024, 10) if opts.quick \
        else (4096, 1024, 4096, 10)

    def mlp(xx, w1, b1, w2, b2):
        return (F.gelu(xx @ w1 + b1) @ w2 + b2).square().mean()
    shapes = [(batch, d_in), (d_in, d_hid), (d_hid,), (d_hid, d_out), (d_out,)]
    g = PassManager(DEFAULT_PIPELINE).run(fg.trace(mlp, *[fg.zeros(*s) for s in shapes]))
    part = partition_joint(g, wrt=[1, 2, 3, 4], free_inputs=[])
    fwd = rt.CudaProgram(fuse(PassManager(DEFAULT_PIPELINE).run(part.forward)))
    bwd = rt.CudaProgram(fuse(PassManager(DEFAULT_PIPELINE).run(part.backward)))
    params = [device(s, 10 + i) for i, s in enumerate(shapes)]
    seed = rt.DeviceArray.from_host(np.ones((), np.float32), x.allocator)

    def step():
        outs = fwd(*[d for d, _ in params])
        return bwd(*outs[part.n_forward_outputs:], seed)
    t = timed(step, repeats=5)
    ref = None
    if HAVE_TORCH:
        tparams = [torch.from_numpy(h).cuda().requires_grad_(i > 0)
                   for i, (_, h) in enumerate(params)]

        def torch_step():
            xx, w1, b1, w2, b2 = tparams
            loss = (torch.nn.functional.gelu(xx @ w1 + b1) @ w2 + b2).square().mean()
            return torch.autograd.grad(loss, tparams[1:])
        ref = torch_timed(torch_step, repeats=5)
    rows.append(("MLP fwd+bwd", f"{batch}x{d_in}->{d_hid}->{d_out}", t * 1e3, "torch", ref,
                 ""))

    print(f"\nfusegrad on {getattr(drv, 'arch', '?')} ({drv.name} driver)")
    print(f"{'what':22} {'size':22} {'fusegrad ms':>12} {'torch ms':>10} {'torch/fg':>9}  note")
    for what, size, ms, _, ref, note in rows:
        ref_ms = f"{ref * 1e3:10.3f}" if ref is not None else f"{'-':>10}"
        ratio = f"{ref * 1e3 / ms:9.2f}" if ref is not None else f"{'-':>9}"
        print(f"{what:22} {size:22} {ms:12.3f} {ref_ms} {ratio}  {note}")


if __name__ == "__main__":
    main()
