"""A kernel never reads, through a view, a value it computes itself.

The bug behind these tests: ``a.exp().amin(0).var(0)``'s backward fused ``min`` and the
``eq`` mask of its VJP into one kernel, but ``min``'s result had already been stored for the
variance kernel, so its keepdim broadcast became a *view* of that buffer, and the mask read
it from memory before the kernel had written it (all-NaN gradients). It needs a reduced value
that another kernel reads first and that its own kernel then broadcasts back: amax/amin
masks, softmax-like normalisations, centred moments, over any axis.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.compiler.compare import assert_same, tensors, values


def own_view_reads(kg) -> list[str]:
    """Kernels of ``kg`` that read a view of a value computed in the same kernel."""
    bad = []
    for k in kg.kernels:
        own = {n.output for n in k.nodes}
        for n in k.nodes:
            for op in n.inputs:
                view = kg.views.get(op)
                if view is not None and view.base in own:
                    bad.append(f"{k.describe()} reads {n.op}'s operand from memory")
    return bad


def grads(fn, arrays, compiled: bool):
    xs = [fg.from_numpy(a.copy()).requires_grad_() for a in arrays]
    out = (fg.compile(fn) if compiled else fn)(*xs)
    (out * 1.5).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in xs]


def test_issue_repro_amin_var_gradient():
    a = np.random.RandomState(0).randn(2, 2).astype("f4")
    fn = lambda a: a.exp().amin(dim=0).var(dim=0)  # noqa: E731
    got, (g,) = grads(fn, [a], compiled=True)
    want, (w,) = grads(fn, [a], compiled=False)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w, [[0, -1.5 * 1.7443], [1.5 * 3.1109, 0]], atol=1e-3)


# A reduced value read by a second reduction (so it is materialized) and broadcast back
# against the reduced input (so its kernel needs it in registers): the VJP of amax/amin,
# of var/std and of softmax, over first, middle and last axes.
PROGRAMS = {
    "amin_var": lambda a: a.exp().amin(0).var(0),
    "amax_std_last": lambda a: a.sin().amax(-1).std(-1),
    "amax_sum_middle": lambda a: (a * 2).amax(1).sum(),
    "amin_keepdim_mask": lambda a: (a.amin(0).sum() + (a == a.amin(0, keepdim=True))).sum(),
    "var_of_var": lambda a: a.var(0).var(),
    "softmax_axis0_sum": lambda a: (fg.nn.functional.softmax(a, 0) * a).sum(0).var(),
    "centred_then_max": lambda a: (a - a.mean(0)).amax(0) * a.mean(0).sum(),
}
SHAPES = [(2, 2), (3, 5), (4, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_reduced_value_broadcast_back_values_and_gradients(name, shape):
    fn = PROGRAMS[name]
    a = values(shape, fg.float64, seed=len(name), special=False)
    got, (g,) = grads(fn, [a], compiled=True)
    want, (w,) = grads(fn, [a], compiled=False)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
    assert np.isfinite(g).all()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_no_kernel_reads_its_own_output_through_a_view(name):
    a = fg.from_numpy(values((3, 5), fg.float32, special=False)).requires_grad_()
    compiled = fg.compile(PROGRAMS[name])
    compiled(a).sum().backward()
    entry = next(iter(compiled.cache.values()))[0]
    assert own_view_reads(entry.program.kg) == []
    for program, _ in entry.backward.values():
        assert own_view_reads(program.kg) == []


def test_forward_mask_of_a_reduction_read_elsewhere_first():
    # Forward only: the row max goes to another kernel (sum over it) before the mask uses it.
    fn = lambda a: (a.amax(0).sum(), a == a.amax(0, keepdim=True), a - a.amax(0))  # noqa: E731
    a = values((6, 7), fg.float32, special=False)
    with fg.no_grad():
        want = fn(*tensors(a))
        got = fg.compile(fn)(*tensors(a))
    assert_same(got, want)
