"""On a real GPU (skipped without one): every kernel family of the zoo against eager, and a
compiled MLP forward and backward against the CPU program. ``benchmarks/gpu_check.sh`` runs
these."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.passes.manager import PassManager
from fusegrad.passes.partition import partition_joint
from fusegrad.runtime.cpu import Program
from fusegrad.tracer.compile import DEFAULT_PIPELINE
from tests.codegen.gpu_zoo import ZOO, mlp_args, mlp_loss
from tests.codegen.test_gpu_lowering import as_float, kernel_graph, kernel_graph_of, tolerance

pytestmark = pytest.mark.skipif(not fg.cuda.is_available(), reason="no CUDA device")


def run_on_device(kg, arrays):
    from fusegrad.runtime.cuda import CudaProgram
    outs = CudaProgram(kg)(*arrays)
    fg.cuda.synchronize()
    return [o.to_host() for o in outs]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_on_the_gpu_matches_eager(name):
    fn, args = ZOO[name]
    eager = fn(*args)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    got = run_on_device(kernel_graph(fn, args), [a._data for a in args])
    for g, e in zip(got, eager):
        ref = e._data
        assert g.shape == ref.shape and g.dtype == ref.dtype
        tol = tolerance(ref.dtype)
        if ref.dtype == np.float32:
            # CUDA's expf/tanhf/erff are within 2 ulp; the CPU mathlib within 1.
            tol = {"rtol": 1e-5 * 4, "atol": 1e-5 * 4}
        np.testing.assert_allclose(as_float(g), as_float(ref), **tol)


def test_mlp_step_on_the_gpu_matches_the_cpu():
    args = mlp_args()
    g = PassManager(DEFAULT_PIPELINE).run(fg.trace(mlp_loss, *args))
    part = partition_joint(g, wrt=[1, 2, 3, 4], free_inputs=[])
    arrays = [a._data for a in args]
    fwd = kernel_graph_of(part.forward)
    cpu = Program(fwd)(*arrays)
    gpu = run_on_device(fwd, arrays)
    for c, s in zip(cpu, gpu):
        np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5)
    bwd = kernel_graph_of(part.backward)
    saved = list(cpu[part.n_forward_outputs:])
    seeds = [np.ones(v.type.shape, v.type.dtype.np_dtype)
             for v in part.backward.inputs[len(saved):]]
    cpu_grads = Program(bwd)(*saved, *seeds)
    gpu_grads = run_on_device(bwd, saved + seeds)
    for c, s in zip(cpu_grads, gpu_grads):
        np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5)


def test_compiled_training_step_on_the_gpu_matches_eager():
    def run(backend):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.GELU(), fg.nn.Linear(64, 10))
        opt = fg.optim.Adam(model.parameters(), lr=1e-3)

        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        if backend is not None:
            step = fg.compile(step, backend=backend)
        x = fg.randn(64, 32)
        y = fg.tensor(np.arange(64) % 10)
        losses = [step(x, y).item() for _ in range(4)]
        return losses, [p.detach().numpy() for p in model.parameters()]
    eager_losses, eager_params = run(None)
    gpu_losses, gpu_params = run("cuda")
    np.testing.assert_allclose(gpu_losses, eager_losses, rtol=1e-4)
    for a, b in zip(gpu_params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
