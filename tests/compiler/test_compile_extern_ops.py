"""The extern primitives of the decompositions, special functions and order statistics,
compiled: each runs its numpy reference between kernels, on values the compiled graph
computed (views, transposes and elementwise producers around it), and agrees with eager."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.compiler.compare import assert_same, check_compiled, strided, tensors, values
from tests.compiler.test_compile_ops import numpy_ops

# The primitives these tests compile, for tests/compiler/test_compile_ops.py's inventory.
EXTERN_PRIMITIVES = (
    "inv", "solve", "det", "slogdet_sign", "logabsdet", "cholesky", "qr_q", "qr_r", "svd_u",
    "svd_s", "svd_vh", "eigh_values", "eigh_vectors", "matrix_exp", "lu_p", "lu_l", "lu_u",
    "lu_pivots", "pivots_to_p", "geqrf_a", "geqrf_tau",
    "polygamma", "lgamma", "erfc", "erfinv", "i0", "i1", "igamma", "igammac", "nextafter",
    "frexp_mantissa", "frexp_exponent", "gcd", "lcm", "mode_index",
    "standard_gamma", "standard_gamma_grad")


def _matrices(seed: int) -> np.ndarray:
    a = values((3, 4, 4), fg.float64, seed, special=False)
    return strided(a + 4 * np.eye(4), "T")


def linalg_program(a, b):
    spd = a @ a.mT + fg.eye(4, dtype=a.dtype)
    q, r = fg.linalg.qr(a)
    u, s, vh = fg.linalg.svd(a, full_matrices=False)
    lam, vec = fg.linalg.eigh(spd)
    sign, logabs = fg.linalg.slogdet(a)
    lu_data, pivots = fg.linalg.lu_factor(a)
    p, low, up = fg.linalg.lu(a)
    h, tau = fg.geqrf(a)
    return (fg.linalg.inv(a), fg.linalg.solve(a, b), fg.linalg.det(a), sign, logabs,
            fg.linalg.cholesky(spd), q, r, (u @ vh).abs(), s, lam, (vec * vec),
            fg.matrix_exp(a * 0.1), p, low, up, pivots,
            fg.linalg.lu_solve(lu_data, pivots, b), h, tau)


def test_linalg_primitives_compiled():
    a, b = _matrices(1), values((3, 4, 2), fg.float64, 2, special=False)
    compiled = check_compiled(linalg_program, a, b, rtol=1e-9, atol=1e-12)
    ran = numpy_ops(compiled, a, b)
    assert {"inv", "solve", "svd_s", "eigh_vectors", "lu_l", "geqrf_tau"} <= ran


def special_program(x, pos, k, n):
    return (fg.lgamma(pos), fg.digamma(pos), fg.polygamma(2, pos), fg.erfc(x), fg.erfinv(x / 4),
            fg.i0(x), bind_i1(x), fg.igamma(pos, pos.flip(0)), fg.igammac(pos, pos * 2),
            fg.nextafter(x, x.flip(1)), fg.frexp(x).mantissa, fg.frexp(x).exponent,
            fg.gcd(k, n), fg.lcm(k, n), fg.mode(k.abs() % 3, 1).values,
            fg.mode(k.abs() % 3, 1).indices)


def bind_i1(x):
    from fusegrad.ops.primitive import bind
    from fusegrad.ops.special import i1_prim
    return bind(i1_prim, x)


def test_special_primitives_compiled():
    x = strided(values((4, 9), fg.float64, 3), "slice")
    pos = strided(values((4, 9), fg.float64, 4, special=False, low=0.2), "T")
    k, n = values((4, 9), fg.int64, 5), values((4, 9), fg.int64, 6)
    compiled = check_compiled(special_program, x, pos, k, n, rtol=1e-12)
    assert {"polygamma", "erfinv", "gcd", "mode_index", "frexp_exponent"} <= \
        numpy_ops(compiled, x, pos, k, n)


def test_float32_special_functions_compiled():
    x = values((3, 7), fg.float32, 7, special=False, low=0.1)
    check_compiled(lambda t: (fg.lgamma(t), fg.erfinv(t / 4), fg.i0(t), fg.digamma(t)), x,
                   rtol=1e-6)


def gamma_program(alpha, x):
    from fusegrad.ops.primitive import bind
    from fusegrad.ops.sampling import standard_gamma, standard_gamma_grad_prim
    shape = alpha.abs() + 0.1
    return standard_gamma(shape), bind(standard_gamma_grad_prim, shape, x.abs() + 0.1)


def test_gamma_sampling_primitives_compiled():
    # The draws are keyed by the generator's state: seeded alike, compiled draws are eager's.
    alpha = strided(values((4, 9), fg.float64, 8, special=False), "T")
    x = values((4, 9), fg.float64, 9, special=False)
    fg.manual_seed(0)
    want = gamma_program(*tensors(alpha, x))
    compiled = fg.compile(gamma_program, fullgraph=True)
    fg.manual_seed(0)
    assert_same(compiled(*tensors(alpha, x)), want, 1e-12, None)
    assert {"standard_gamma", "standard_gamma_grad"} <= numpy_ops(compiled, alpha, x)


def test_embedding_and_loss_checks_run_native_loops_and_raise_as_numpy_does():
    """A step's embedding gradient (index_add of rows) and its target and index checks run
    native loops (runtime.native); a failing check, and a case the loop does not cover (a
    loss's ignore_index), goes to the numpy reference, which accepts it or raises."""
    from fusegrad.runtime.cpu import NativeStep
    rng = np.random.default_rng(0)
    emb = fg.nn.Embedding(10, 4)
    head = fg.nn.Linear(4, 6)

    def step(tokens, targets):
        logits = head(emb(tokens)).reshape(-1, 6)
        loss = fg.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
        loss.backward()
        return loss

    def run(tokens, targets, compiled):
        emb.weight.grad = head.weight.grad = head.bias.grad = None
        loss = (compiled or step)(fg.tensor(tokens), fg.tensor(targets))
        return float(loss), emb.weight.grad.numpy().copy()

    cstep = fg.compile(step)
    tokens = rng.integers(0, 10, (3, 5))
    targets = rng.integers(0, 6, 15)
    targets_ignored = targets.copy()
    targets_ignored[[2, 7]] = -100
    for t in (targets, targets_ignored):
        want = run(tokens, t, None)
        got = run(tokens, t, cstep)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7)
    program = cstep.entries()[-1].program
    native = sorted(s.kernel.nodes[0].op for s in program.steps if isinstance(s, NativeStep))
    assert native == ["check_index", "check_target", "index_add"]
    bad = targets.copy()
    bad[4] = 6
    with pytest.raises(IndexError, match="Target 6 is out of bounds"):
        cstep(fg.tensor(tokens), fg.tensor(bad))
    bad_tokens = tokens.copy()
    bad_tokens[1, 2] = 10
    with pytest.raises(IndexError, match="index 10 is out of bounds"):
        cstep(fg.tensor(bad_tokens), fg.tensor(targets))
