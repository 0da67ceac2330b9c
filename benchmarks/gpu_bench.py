"""The GPU benchmark of ``benchmarks/gpu_check.sh``: fusegrad's CUDA path against the card's
copy bandwidth measured in the same run and, where torch has CUDA, against torch eager and
torch.compile on the same card. Prints one table; every result is checked (against torch, or
numpy on the host) and a wrong value makes the exit status 1.

Workloads: a device-to-device copy (the bandwidth peak), GELU over 2^24 floats, softmax over
4096x1024, the sum of 2^24 floats, a 4096x4096 float32 matmul (cuBLASLt; TF32 off, as
torch's default), the small-MLP training step (batch 128) compiled with and without CUDA
graphs (``mode="reduce-overhead"``) against torch eager, and the char transformer's training
step against torch.compile's. ``--quick`` uses smaller sizes; ``--simulate`` checks this
script on the simulated driver, without a GPU (tiny sizes; the times mean nothing). Each time
is the median of timed repeats after warm-up calls, each repeat timed around a synchronize.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import fusegrad as fg  # noqa: E402
import fusegrad.nn.functional as F  # noqa: E402
from fusegrad.runtime import cuda as rt  # noqa: E402

try:
    import torch
    HAVE_TORCH = torch.cuda.is_available()
except ImportError:
    torch = None
    HAVE_TORCH = False

ROWS: list[tuple] = []        # (workload, size, fusegrad ms, torch ms, torch.compile ms, note)
FAILURES: list[str] = []


INNER = 10       # calls per timed repeat (1 when simulated)


def timed(fn, repeats: int = 5, sync=None, warmup: int = 2) -> float:
    """Seconds per call of ``fn()`` after ``warmup`` calls: the median over ``repeats`` of
    :data:`INNER` calls launched back to back and one synchronize, so that the time is the
    device's while the host launches faster than the device runs (throughput, as
    torch.utils.benchmark measures)."""
    sync = sync or rt.synchronize
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(INNER):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / INNER)
    return statistics.median(times)


def torch_timed(fn, repeats: int = 5, warmup: int = 2) -> float | None:
    if not HAVE_TORCH:
        return None
    try:
        return timed(fn, repeats, torch.cuda.synchronize, warmup)
    except Exception as e:            # torch.compile missing a compiler: say so, go on
        print(f"  (torch: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
        return None


def check(what: str, got, want, rtol: float, atol: float = 0.0) -> None:
    """Record a failure when ``got`` is not within tolerance of ``want``."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        err = np.abs(got - want).max() if got.shape == want.shape else "shape"
        FAILURES.append(f"{what}: wrong values (max abs error {err}, rtol {rtol})")


def row(what, size, seconds, ref=None, ref_compiled=None, note="") -> None:
    ROWS.append((what, size, seconds, ref, ref_compiled, note))


def cuda_tensor(shape, seed: int) -> tuple:
    host = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return fg.tensor(host).to("cuda"), host


def program(fn, *tensors):
    """``fn`` compiled for CUDA (the tensors are cuda tensors: outputs stay on the device)."""
    compiled = fg.compile(fn, backend="cuda")
    compiled(*tensors)
    return lambda: compiled(*tensors)


def bandwidth_rows(drv, sizes: dict) -> None:
    n = sizes["copy"]
    src, _ = cuda_tensor((n,), 0)
    dst = rt.DeviceArray.empty((n,), np.float32, src._data.allocator)
    t_copy = timed(lambda: drv.dtod(dst.ptr, src._data.ptr, 4 * n))
    peak = 2 * 4 * n / t_copy
    row("device copy (peak)", f"2^{n.bit_length() - 1} f32", t_copy, note=f"{peak / 1e9:.0f} GB/s")

    def share(nbytes, t) -> str:
        return f"{nbytes / t / 1e9:.0f} GB/s = {nbytes / t / peak:.0%} of copy"

    n = sizes["gelu"]
    x, xh = cuda_tensor((n,), 1)
    run = program(F.gelu, x)
    got = run().cpu().numpy()
    check("GELU", got, F.gelu(fg.tensor(xh)).numpy(), rtol=1e-5, atol=1e-6)
    tx = torch.from_numpy(xh).cuda() if HAVE_TORCH else None
    t = timed(run)
    row("GELU", f"2^{n.bit_length() - 1} f32", t,
        torch_timed(lambda: torch.nn.functional.gelu(tx)), note=share(8 * n, t))

    rows_n, cols = sizes["softmax"]
    a, ah = cuda_tensor((rows_n, cols), 2)
    run = program(lambda v: F.softmax(v, -1), a)
    want = np.exp(ah - ah.max(-1, keepdims=True))
    check("softmax", run().cpu().numpy(), want / want.sum(-1, keepdims=True), rtol=1e-5,
          atol=1e-7)
    ta = torch.from_numpy(ah).cuda() if HAVE_TORCH else None
    t = timed(run)
    row("softmax", f"{rows_n}x{cols} f32", t, torch_timed(lambda: torch.softmax(ta, -1)),
        note=share(8 * rows_n * cols, t))

    n = sizes["sum"]
    s, sh = cuda_tensor((n,), 3)
    run = program(lambda v: v.sum(), s)
    # float32 sums in another order: within sqrt(n) roundings of the float64 sum's scale
    check("sum", run().cpu().numpy(), sh.astype(np.float64).sum(), rtol=0,
          atol=4 * np.sqrt(n) * np.finfo(np.float32).eps * np.abs(sh).sum() / np.sqrt(n))
    ts = torch.from_numpy(sh).cuda() if HAVE_TORCH else None
    t = timed(run)
    row("sum", f"2^{n.bit_length() - 1} f32", t, torch_timed(lambda: ts.sum()),
        note=share(4 * n, t))


def matmul_row(sizes: dict) -> None:
    m = sizes["matmul"]
    p, ph = cuda_tensor((m, m), 4)
    q, qh = cuda_tensor((m, m), 5)
    run = program(lambda u, v: u @ v, p, q)
    got = run().cpu().numpy()
    rows = np.random.default_rng(0).choice(m, size=min(m, 64), replace=False)
    want = ph[rows].astype(np.float64) @ qh.astype(np.float64)
    check("matmul", got[rows], want, rtol=0, atol=8 * m * np.finfo(np.float32).eps * 4)
    t = timed(run, repeats=5)
    ref = None
    if HAVE_TORCH:
        tp, tq = torch.from_numpy(ph).cuda(), torch.from_numpy(qh).cuda()
        ref = torch_timed(lambda: tp @ tq, repeats=5)
    blas = "cuBLASLt" if rt.cublaslt_for(rt.driver()) is not None else "tiled kernel"
    row(f"matmul ({blas})", f"{m}^3 f32", t, ref, note=f"{2 * m ** 3 / t / 1e12:.1f} TFLOP/s")


def mlp_rows(sizes: dict) -> None:
    """The small MLP's compiled training step on cuda tensors (SGD with momentum), launched
    kernel by kernel and replayed as a CUDA graph, against torch eager from the same
    weights."""
    batch, widths = sizes["mlp"]

    def make(lib):
        lib.manual_seed(0)
        layers = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers += [lib.nn.Linear(a, b)] + ([lib.nn.ReLU()] if i < len(widths) - 2 else [])
        return lib.nn.Sequential(*layers)
    weights = {k: v.detach().numpy().copy() for k, v in make(fg).state_dict().items()}
    rng = np.random.default_rng(0)
    xh = rng.standard_normal((batch, widths[0])).astype(np.float32)
    yh = rng.integers(0, widths[-1], batch)

    def fg_step(mode):
        model = make(fg)
        model.load_state_dict({k: fg.tensor(v) for k, v in weights.items()})
        model = model.to("cuda")
        opt = fg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        @fg.compile(backend="cuda", mode=mode)
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.tensor(xh).to("cuda"), fg.tensor(yh).to("cuda")
        losses = [step(x, y).item() for _ in range(3)]
        return losses, lambda: step(x, y)
    losses, run = fg_step(None)
    t_plain = timed(run, repeats=5)
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="cudagraphs: the cross_entropy check")
        graph_losses, run_graph = fg_step("reduce-overhead")
    t_graph = timed(run_graph, repeats=5)
    check("MLP step, CUDA graph against kernel launches", graph_losses, losses, rtol=1e-5)
    ref = None
    if HAVE_TORCH:
        tmodel = make(torch)
        tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        tmodel = tmodel.cuda()
        topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
        tx, ty = torch.from_numpy(xh).cuda(), torch.from_numpy(yh).cuda()

        def torch_step():
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
            loss.backward()
            topt.step()
            return loss
        torch_losses = [torch_step().item() for _ in range(3)]
        check("MLP step against torch", losses, torch_losses, rtol=1e-4)
        ref = torch_timed(torch_step, repeats=5)
    size = f"b{batch} {'-'.join(map(str, widths))}"
    row("MLP step", size, t_plain, ref, note="kernel launches")
    row("MLP step, CUDA graph", size, t_graph, ref,
        note=f"{t_plain / t_graph:.1f}x the launches")


def transformer_row(sizes: dict) -> None:
    """The char transformer's compiled training step (AdamW) against torch.compile's."""
    from char_transformer import make_model
    gpt = sizes["gpt"]

    def build(lib):
        lib.manual_seed(0)
        model = make_model(lib, vocab=gpt["vocab"], block=gpt["block"], n_embd=gpt["n_embd"],
                           n_head=gpt["n_head"], n_layer=gpt["n_layer"])
        return model
    weights = {k: v.detach().numpy().copy() for k, v in build(fg).state_dict().items()}
    rng = np.random.default_rng(0)
    shape = (gpt["batch"], gpt["block"])
    idx, tgt = rng.integers(0, gpt["vocab"], shape), rng.integers(0, gpt["vocab"], shape)

    def fg_step(mode):
        model = build(fg)
        model.load_state_dict({k: fg.tensor(v) for k, v in weights.items()})
        model = model.to("cuda")
        opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, capturable=True)

        @fg.compile(backend="cuda", mode=mode)
        def step(x, y):
            opt.zero_grad()
            loss = model(x, y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.tensor(idx).to("cuda"), fg.tensor(tgt).to("cuda")
        return [step(x, y).item() for _ in range(3)], lambda: step(x, y)
    losses, run = fg_step(None)
    t = timed(run)
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="cudagraphs: the cross_entropy check")
        graph_losses, run_graph = fg_step("reduce-overhead")
    t_graph = timed(run_graph)
    check("char transformer step, CUDA graph against kernel launches", graph_losses, losses,
          rtol=1e-5)
    ref = None
    if HAVE_TORCH:
        tmodel = build(torch)
        tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        tmodel = tmodel.cuda()
        topt = torch.optim.AdamW(tmodel.parameters(), lr=3e-3, weight_decay=0.1)
        tx, ty = torch.from_numpy(idx).cuda(), torch.from_numpy(tgt).cuda()

        def torch_step():
            topt.zero_grad()
            loss = tmodel(tx, ty)
            loss.backward()
            topt.step()
            return loss
        compiled = torch.compile(torch_step)
        try:
            torch_losses = [compiled().item() for _ in range(3)]
            check("char transformer step against torch.compile", losses, torch_losses,
                  rtol=1e-3)
            ref = torch_timed(compiled)
        except Exception as e:           # no C compiler for inductor, ...: report, go on
            print(f"  (torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
    size = f"b{gpt['batch']} T{gpt['block']} C{gpt['n_embd']} L{gpt['n_layer']}"
    row("char transformer step", size, t, None, ref, note="kernel launches")
    row("char transformer step, graph", size, t_graph, None, ref,
        note=f"{t / t_graph:.1f}x the launches")


SIZES = {
    "full": {"copy": 1 << 26, "gelu": 1 << 24, "softmax": (4096, 1024), "sum": 1 << 24,
             "matmul": 4096, "mlp": (128, (784, 256, 256, 10)),
             "gpt": {"vocab": 100, "block": 64, "n_embd": 128, "n_head": 4, "n_layer": 2,
                     "batch": 32}},
    "quick": {"copy": 1 << 22, "gelu": 1 << 20, "softmax": (1024, 1024), "sum": 1 << 20,
              "matmul": 1024, "mlp": (128, (784, 256, 256, 10)),
              "gpt": {"vocab": 100, "block": 32, "n_embd": 64, "n_head": 4, "n_layer": 2,
                      "batch": 16}},
    "simulate": {"copy": 1 << 8, "gelu": 1 << 8, "softmax": (4, 64), "sum": 1 << 10,
                 "matmul": 16, "mlp": (8, (12, 16, 16, 3)),
                 "gpt": {"vocab": 11, "block": 4, "n_embd": 8, "n_head": 2, "n_layer": 1,
                         "batch": 2}},
}


def print_table(drv) -> None:
    print(f"\nfusegrad on {getattr(drv, 'arch', '?')} ({drv.name} driver); torch "
          f"{torch.__version__ if HAVE_TORCH else 'without CUDA: no reference'}")
    print(f"{'workload':26} {'size':22} {'fusegrad ms':>12} {'torch ms':>9} {'compile ms':>10}"
          f" {'speedup':>8}  note")
    for what, size, t, ref, ref_c, note in ROWS:
        best = min((r for r in (ref, ref_c) if r is not None), default=None)
        cells = [f"{r * 1e3:9.3f}" if r is not None else f"{'-':>9}" for r in (ref,)]
        cells.append(f"{ref_c * 1e3:10.3f}" if ref_c is not None else f"{'-':>10}")
        speed = f"{best / t:7.2f}x" if best is not None else f"{'-':>8}"
        print(f"{what:26} {size:22} {t * 1e3:12.3f} {cells[0]} {cells[1]} {speed}  {note}")


def main() -> int:
    global HAVE_TORCH, INNER
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--simulate", action="store_true",
                        help="check this script without a GPU: tiny sizes on the simulated "
                             "driver (the numbers mean nothing)")
    opts = parser.parse_args()
    if opts.simulate:
        from fusegrad.testing.simulated_cuda import SimulatedDriver
        rt.set_driver(SimulatedDriver(max_grid=1, cublas=True))
        HAVE_TORCH, INNER = False, 1
    sizes = SIZES["simulate" if opts.simulate else "quick" if opts.quick else "full"]
    drv = rt.driver()
    for part in (bandwidth_rows, matmul_row, mlp_rows, transformer_row):
        start = time.perf_counter()
        try:
            part(drv, sizes) if part is bandwidth_rows else part(sizes)
        except Exception as e:
            FAILURES.append(f"{part.__name__}: {type(e).__name__}: {e}")
        print(f"  ({part.__name__}: {time.perf_counter() - start:.1f} s)", flush=True)
    print_table(drv)
    for failure in FAILURES:
        print("FAILED:", failure)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
