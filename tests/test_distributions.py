"""fusegrad.distributions: values and gradients against torch.distributions where torch is
installed, and closed forms, numerical integrals, finite differences and sampling
statistics everywhere."""

import math

import numpy as np
import pytest

import fusegrad
import fusegrad.distributions as D
from fusegrad.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(0)


def _np(t):
    return t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)


def _close(got, want, rtol=1e-9, atol=1e-10):
    """float64 on both sides: both compute the same formula, so they agree to rounding."""
    np.testing.assert_allclose(_np(got), _np(want), rtol=rtol, atol=atol, equal_nan=True)


# --------------------------------------------------------------------------- cases
# Each case builds the same distribution from float64 numpy parameters with either library,
# and gives a value in its support (broadcasting against the batch shape) and the methods
# both libraries have for it.


def _pos(*shape, lo=0.5, hi=2.0):
    return RNG.uniform(lo, hi, shape)


def _lower_cholesky(n, *batch):
    m = np.tril(RNG.normal(size=batch + (n, n))) * 0.3
    idx = np.arange(n)
    m[..., idx, idx] = RNG.uniform(0.5, 1.5, batch + (n,))
    return m


def _simplex(*shape):
    w = RNG.uniform(0.1, 1.0, shape)
    return w / w.sum(-1, keepdims=True)


_LOW = RNG.normal(size=(3, 1))
CASES = {
    "Normal": (lambda lib, p: lib.distributions.Normal(p["loc"], p["scale"]),
               {"loc": RNG.normal(size=(3, 1)), "scale": _pos(4)},
               RNG.normal(size=(2, 3, 4)), ("cdf", "icdf")),
    "Laplace": (lambda lib, p: lib.distributions.Laplace(p["loc"], p["scale"]),
                {"loc": RNG.normal(size=(3, 1)), "scale": _pos(4)},
                RNG.normal(size=(2, 3, 4)), ("cdf", "icdf")),
    "Uniform": (lambda lib, p: lib.distributions.Uniform(p["low"], p["high"]),
                {"low": _LOW, "high": _LOW + _pos(4)},
                _LOW + RNG.uniform(0.0, 0.5, (3, 4)), ("cdf", "icdf")),
    "Exponential": (lambda lib, p: lib.distributions.Exponential(p["rate"]),
                    {"rate": _pos(3, 4)}, _pos(2, 3, 4, lo=0.1, hi=3.0), ("cdf", "icdf")),
    "Gamma": (lambda lib, p: lib.distributions.Gamma(p["concentration"], p["rate"]),
              {"concentration": _pos(3, 1, lo=0.5, hi=3.0), "rate": _pos(4)},
              _pos(2, 3, 4, lo=0.1, hi=3.0), ("cdf",)),
    "Beta": (lambda lib, p: lib.distributions.Beta(p["c1"], p["c0"]),
             {"c1": _pos(3, 1, lo=0.5, hi=3.0), "c0": _pos(4, lo=0.5, hi=3.0)},
             RNG.uniform(0.05, 0.95, (2, 3, 4)), ()),
    "Dirichlet": (lambda lib, p: lib.distributions.Dirichlet(p["concentration"]),
                  {"concentration": _pos(3, 4, lo=0.5, hi=3.0)}, _simplex(2, 3, 4), ()),
    "Bernoulli_probs": (lambda lib, p: lib.distributions.Bernoulli(probs=p["probs"]),
                        {"probs": RNG.uniform(0.05, 0.95, (3, 4))},
                        RNG.integers(0, 2, (2, 3, 4)).astype(np.float64), ()),
    "Bernoulli_logits": (lambda lib, p: lib.distributions.Bernoulli(logits=p["logits"]),
                         {"logits": RNG.normal(size=(3, 4))},
                         RNG.integers(0, 2, (2, 1, 4)).astype(np.float64), ()),
    "Categorical_probs": (lambda lib, p: lib.distributions.Categorical(probs=p["probs"]),
                          {"probs": _pos(3, 5)}, RNG.integers(0, 5, (2, 3)), ()),
    "Categorical_logits": (lambda lib, p: lib.distributions.Categorical(logits=p["logits"]),
                           {"logits": RNG.normal(size=(3, 5))}, RNG.integers(0, 5, (2, 1)), ()),
    "OneHotCategorical": (lambda lib, p: lib.distributions.OneHotCategorical(logits=p["logits"]),
                          {"logits": RNG.normal(size=(3, 5))},
                          np.eye(5)[RNG.integers(0, 5, (2, 3))], ()),
    "MVN_scale_tril": (lambda lib, p: lib.distributions.MultivariateNormal(
                           p["loc"], scale_tril=p["scale_tril"]),
                       {"loc": RNG.normal(size=(2, 3)), "scale_tril": _lower_cholesky(3)},
                       RNG.normal(size=(4, 2, 3)), ()),
    "MVN_covariance": (lambda lib, p: lib.distributions.MultivariateNormal(
                           p["loc"], covariance_matrix=p["l"] @ p["l"].mT),
                       {"loc": RNG.normal(size=(3,)), "l": _lower_cholesky(3, 2)},
                       RNG.normal(size=(4, 2, 3)), ()),
    "MVN_precision": (lambda lib, p: lib.distributions.MultivariateNormal(
                          p["loc"], precision_matrix=p["l"] @ p["l"].mT),
                      {"loc": RNG.normal(size=(2, 3)), "l": _lower_cholesky(3)},
                      RNG.normal(size=(2, 3)), ()),
    "Independent": (lambda lib, p: lib.distributions.Independent(
                        lib.distributions.Normal(p["loc"], p["scale"]), 1),
                    {"loc": RNG.normal(size=(3, 4)), "scale": _pos(3, 4)},
                    RNG.normal(size=(2, 3, 4)), ()),
    "LogNormal_affine": (lambda lib, p: lib.distributions.TransformedDistribution(
                             lib.distributions.Normal(p["loc"], p["scale"]),
                             [lib.distributions.ExpTransform(),
                              lib.distributions.AffineTransform(1.0, p["a"])]),
                         {"loc": RNG.normal(size=(3,)), "scale": _pos(3), "a": _pos(3)},
                         1.0 + _pos(2, 3, lo=0.1, hi=3.0), ("cdf", "icdf")),
    "Sigmoid_tanh_power": (lambda lib, p: lib.distributions.TransformedDistribution(
                               lib.distributions.Normal(p["loc"], p["scale"]),
                               [lib.distributions.SigmoidTransform(),
                                lib.distributions.PowerTransform(p["e"]),
                                lib.distributions.AffineTransform(-0.5, 1.5),
                                lib.distributions.TanhTransform()]),
                           {"loc": RNG.normal(size=(3,)), "scale": _pos(3), "e": _pos(3)},
                           np.tanh(-0.5 + 1.5 * RNG.uniform(0.1, 0.9, (2, 3))), ("cdf", "icdf")),
    "Affine_negative_scale": (lambda lib, p: lib.distributions.TransformedDistribution(
                                  lib.distributions.Laplace(p["loc"], p["scale"]),
                                  lib.distributions.AffineTransform(p["b"], -2.0)),
                              {"loc": RNG.normal(size=(3,)), "scale": _pos(3),
                               "b": RNG.normal(size=(3,))},
                              RNG.normal(size=(2, 3)), ("cdf", "icdf")),
}
# Methods whose gradient torch does not have (igamma's with respect to the shape).
NO_GRAD = {("Gamma", "cdf")}
PROPERTIES = ("mean", "variance", "stddev", "mode")


def _params(lib, arrays):
    return {k: lib.tensor(v, dtype=lib.float64, requires_grad=True) for k, v in arrays.items()}


def _evaluate(lib, name):
    """Every quantity of case ``name`` with ``lib`` and the gradient of their finite sum."""
    factory, arrays, value, methods = CASES[name]
    params = _params(lib, arrays)
    dist = factory(lib, params)
    is_index = name.startswith("Categorical")
    v = lib.tensor(value, dtype=lib.int64 if is_index else lib.float64)
    outs = {"log_prob": dist.log_prob(v),
            "shapes": (tuple(dist.batch_shape), tuple(dist.event_shape))}
    for prop in PROPERTIES + ("entropy",):
        try:
            outs[prop] = dist.entropy() if prop == "entropy" else getattr(dist, prop)
        except NotImplementedError:
            outs[prop] = None
    q = lib.tensor(RNG.uniform(0.05, 0.95, tuple(dist.batch_shape)), dtype=lib.float64)
    for method in methods:
        outs[method] = getattr(dist, method)(v if method == "cdf" else q)
    total = 0
    for key, out in outs.items():
        if key == "shapes" or out is None or not out.dtype.is_floating_point or \
                (name, key) in NO_GRAD or not out.requires_grad:
            continue
        total = total + lib.where(lib.isfinite(out), out, 0.0).sum()
    total.backward()
    grads = {k: p.grad for k, p in params.items()}
    return outs, grads


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    torch = pytest.importorskip("torch")
    state = RNG.bit_generator.state
    ours, our_grads = _evaluate(fusegrad, name)
    RNG.bit_generator.state = state       # the same icdf arguments
    theirs, their_grads = _evaluate(torch, name)
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "shapes":
            assert ours[key] == theirs[key]
        elif theirs[key] is None:
            assert ours[key] is None, key
        else:
            assert tuple(ours[key].shape) == tuple(theirs[key].shape), key
            _close(ours[key], theirs[key])
    for key in their_grads:
        if their_grads[key] is None:
            assert our_grads[key] is None, key
        else:
            _close(our_grads[key], their_grads[key])


def test_float32_values_match_torch():
    torch = pytest.importorskip("torch")
    loc, scale = RNG.normal(size=(5,)).astype(np.float32), _pos(5).astype(np.float32)
    x = RNG.normal(size=(3, 5)).astype(np.float32)
    ours = D.Normal(fusegrad.tensor(loc), fusegrad.tensor(scale)).log_prob(fusegrad.tensor(x))
    theirs = torch.distributions.Normal(torch.tensor(loc), torch.tensor(scale)).log_prob(
        torch.tensor(x))
    assert ours.dtype == fusegrad.float32
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- kl_divergence

def _family_params():
    """Parameters for one batch of 3 of each family (shape (3,) or (3, 4) for vectors)."""
    low = RNG.normal(size=3) * 0.2 + 0.2
    return {
        "Normal": {"loc": RNG.normal(size=3), "scale": _pos(3)},
        "Laplace": {"loc": RNG.normal(size=3), "scale": _pos(3)},
        "Uniform": {"low": low, "high": low + _pos(3, lo=0.1, hi=0.5)},
        "Exponential": {"rate": _pos(3)},
        "Gamma": {"concentration": _pos(3, lo=0.5, hi=3.0), "rate": _pos(3)},
        "Beta": {"c1": _pos(3, lo=0.5, hi=3.0), "c0": _pos(3, lo=0.5, hi=3.0)},
        "Dirichlet": {"concentration": _pos(3, 4, lo=0.5, hi=3.0)},
        "Bernoulli": {"probs": RNG.uniform(0.05, 0.95, 3)},
        "Categorical": {"logits": RNG.normal(size=(3, 4))},
        "OneHotCategorical": {"probs": _pos(3, 4)},
        "MultivariateNormal": {"loc": RNG.normal(size=(3, 2)), "l": _lower_cholesky(2, 3)},
        "Independent": {"loc": RNG.normal(size=(3, 4)), "scale": _pos(3, 4)},
        "TransformedDistribution": {"loc": RNG.normal(size=3), "scale": _pos(3)},
    }


def _family(lib, name, p):
    d = lib.distributions
    if name == "Beta":
        return d.Beta(p["c1"], p["c0"])
    if name == "MultivariateNormal":
        return d.MultivariateNormal(p["loc"], scale_tril=p["l"])
    if name == "Independent":
        return d.Independent(d.Normal(p["loc"], p["scale"]), 1)
    if name == "TransformedDistribution":
        return d.TransformedDistribution(d.Normal(p["loc"], p["scale"]),
                                         [d.ExpTransform(), d.AffineTransform(1.0, 2.0)])
    return getattr(d, name)(*p.values()) if name not in ("Categorical", "OneHotCategorical") \
        else getattr(d, name)(**p)


def _kl_pairs():
    from fusegrad.distributions.kl import _KL_REGISTRY
    names = set(_family_params())
    pairs = []
    for p, q in _KL_REGISTRY:
        if p.__name__ in names and q.__name__ in names:
            pairs.append((p.__name__, q.__name__))
    return sorted(pairs)


def test_kl_registry_has_torchs_pairs_among_these_families():
    pytest.importorskip("torch")
    from torch.distributions.kl import _KL_REGISTRY as THEIRS
    names = set(_family_params())
    theirs = {(p.__name__, q.__name__) for p, q in THEIRS if p.__name__ in names and
              q.__name__ in names}
    assert set(_kl_pairs()) == theirs


@pytest.mark.parametrize("pair", _kl_pairs(), ids="-".join)
def test_kl_matches_torch(pair):
    torch = pytest.importorskip("torch")
    arrays = _family_params()
    results = {}
    for lib in (fusegrad, torch):
        ps = _params(lib, arrays[pair[0]])
        qs = _params(lib, {k: v * 1.1 if k == "l" else v + 0.05 for k, v in arrays[pair[1]].items()})
        kl = lib.distributions.kl_divergence(_family(lib, pair[0], ps), _family(lib, pair[1], qs))
        finite = lib.isfinite(kl)
        if kl.requires_grad and bool(finite.any()):
            lib.where(finite, kl, 0.0).sum().backward()
        results[lib.__name__] = (kl, [t.grad for t in list(ps.values()) + list(qs.values())])
    (ours, our_grads), (theirs, their_grads) = results["fusegrad"], results["torch"]
    assert tuple(ours.shape) == tuple(theirs.shape)
    _close(ours, theirs)
    for g, h in zip(our_grads, their_grads):
        if h is None:
            assert g is None or not np.any(_np(g))
        else:
            _close(g, h)


def test_kl_between_bernoullis_with_certain_outcomes():
    # p = 0 or 1 gives a finite KL; q = 0 or 1 where p is not gives inf, as torch's masks.
    p = D.Bernoulli(fusegrad.tensor([0.0, 1.0, 0.3, 0.3]))
    q = D.Bernoulli(fusegrad.tensor([0.5, 0.5, 0.0, 1.0]))
    got = D.kl_divergence(p, q).numpy()
    np.testing.assert_allclose(got[:2], [math.log(2)] * 2, rtol=1e-6)
    assert np.isposinf(got[2:]).all()


def test_kl_of_an_unregistered_pair_raises():
    with pytest.raises(NotImplementedError, match="No KL\\(p \\|\\| q\\) is implemented for p "
                                                  "type Normal and q type Categorical"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Categorical(fusegrad.ones(3)))
    with pytest.raises(NotImplementedError, match="cross KL-divergence between different "
                                                  "exponential families"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Bernoulli(0.5))


def test_register_kl_takes_the_most_specific_pair():
    class MyNormal(D.Normal):
        pass

    @D.register_kl(MyNormal, D.Normal)
    def _mine(p, q):
        return fusegrad.tensor(42.0)

    try:
        assert D.kl_divergence(MyNormal(0.0, 1.0), D.Normal(0.0, 1.0)).item() == 42.0
        assert D.kl_divergence(D.Normal(0.0, 1.0), MyNormal(0.0, 1.0)).item() == 0.0
    finally:
        from fusegrad.distributions.kl import _KL_MEMOIZE, _KL_REGISTRY
        del _KL_REGISTRY[MyNormal, D.Normal]
        _KL_MEMOIZE.clear()


# --------------------------------------------------------------------------- validation

# Each builds something invalid with ``lib`` (fusegrad or torch) and must raise there.
INVALID = {
    "negative scale": lambda lib: lib.distributions.Normal(0.0, -1.0),
    "one bad scale": lambda lib: lib.distributions.Normal(lib.zeros(2), lib.tensor([1.0, -1.0])),
    "probs and logits": lambda lib: lib.distributions.Bernoulli(probs=0.5, logits=0.0),
    "neither": lambda lib: lib.distributions.Categorical(),
    "0-d probs": lambda lib: lib.distributions.Categorical(lib.tensor(1.0)),
    "probs above 1": lambda lib: lib.distributions.Bernoulli(lib.tensor([1.5])),
    "low above high": lambda lib: lib.distributions.Uniform(1.0, 0.0),
    "index out of support": lambda lib: lib.distributions.Categorical(
        lib.tensor([0.5, 0.5])).log_prob(lib.tensor(2)),
    "not a tensor": lambda lib: lib.distributions.Normal(0.0, 1.0).log_prob(1.0),
    "event shape": lambda lib: lib.distributions.MultivariateNormal(
        lib.zeros(2), lib.eye(2)).log_prob(lib.zeros(3)),
    "batch shape": lambda lib: lib.distributions.Normal(lib.zeros(3), 1.0).log_prob(lib.zeros(2)),
    "negative gamma value": lambda lib: lib.distributions.Gamma(1.0, 1.0).log_prob(
        lib.tensor(-1.0)),
    "off the simplex": lambda lib: lib.distributions.Dirichlet(
        lib.tensor([1.0, 2.0])).log_prob(lib.tensor([0.5, 0.6])),
    "not one-hot": lambda lib: lib.distributions.OneHotCategorical(lib.ones(3)).log_prob(
        lib.tensor([1.0, 1.0, 0.0])),
    "beta outside": lambda lib: lib.distributions.Beta(2.0, 2.0).log_prob(lib.tensor(1.5)),
    "two covariances": lambda lib: lib.distributions.MultivariateNormal(
        lib.zeros(2), lib.eye(2), scale_tril=lib.eye(2)),
    "0-d loc": lambda lib: lib.distributions.MultivariateNormal(lib.tensor(0.0), lib.eye(2)),
    "not positive definite": lambda lib: lib.distributions.MultivariateNormal(
        lib.zeros(2), lib.tensor([[1.0, 2.0], [2.0, 1.0]])),
    "not lower": lambda lib: lib.distributions.MultivariateNormal(
        lib.zeros(2), scale_tril=lib.tensor([[1.0, 2.0], [0.0, 1.0]])),
    "independent ndims": lambda lib: lib.distributions.Independent(
        lib.distributions.Normal(0.0, 1.0), 1),
    "transforms type": lambda lib: lib.distributions.TransformedDistribution(
        lib.distributions.Normal(0.0, 1.0), [1]),
    "default validate": lambda lib: lib.distributions.Distribution.set_default_validate_args(3),
    "dirichlet 0-d": lambda lib: lib.distributions.Dirichlet(lib.tensor(1.0)),
    "negative concentration": lambda lib: lib.distributions.Dirichlet(lib.tensor([1.0, -1.0])),
    "cache size": lambda lib: lib.distributions.ExpTransform(cache_size=2),
}


def _error(fn, lib):
    with pytest.raises(Exception) as info:
        fn(lib)
    return info.value


@pytest.mark.parametrize("case", sorted(INVALID))
def test_validation_errors_match_torch(case):
    torch = pytest.importorskip("torch")
    ours, theirs = _error(INVALID[case], fusegrad), _error(INVALID[case], torch)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs).replace("torch.Size", "fusegrad.Size")


def test_validation_errors_without_torch():
    with pytest.raises(ValueError, match=r"^Expected parameter scale \(Tensor of shape \(\)\) of "
                                         r"distribution Normal\(loc: 0.0, scale: -1.0\) to "
                                         r"satisfy the constraint GreaterThan\(lower_bound=0.0\), "
                                         r"but found invalid values:\n-1.0$"):
        D.Normal(0.0, -1.0)
    with pytest.raises(ValueError, match=r"to be within the support \(IntegerInterval\("
                                         r"lower_bound=0, upper_bound=1\)\) of the distribution "
                                         r"Categorical\(probs: fusegrad.Size\(\[2\]\)\)"):
        D.Categorical(fusegrad.tensor([0.5, 0.5])).log_prob(fusegrad.tensor(2))
    with pytest.raises(ValueError, match="Either `probs` or `logits` must be specified"):
        D.Bernoulli()


def test_validate_args_off():
    D.Normal(0.0, -1.0, validate_args=False)       # no check
    assert math.isnan(D.Normal(0.0, -1.0, validate_args=False).log_prob(
        fusegrad.tensor(0.0)).item())
    D.Distribution.set_default_validate_args(False)
    try:
        D.Normal(0.0, -1.0)
        D.Gamma(1.0, 1.0).log_prob(fusegrad.tensor(-1.0))
    finally:
        D.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        D.Normal(0.0, -1.0)


# --------------------------------------------------------------------------- without torch:
# densities integrated on a fine grid (float64): they integrate to 1, and their moments,
# entropy, cdf and KL divergences are those the closed forms give.

def _t(x):
    return fusegrad.tensor(x, dtype=fusegrad.float64)


ONE_D = {
    "Normal": (lambda: D.Normal(_t(0.3), _t(1.2)), (-12.0, 12.0)),
    "Laplace": (lambda: D.Laplace(_t(-0.4), _t(0.7)), (-20.0, 20.0)),
    "Uniform": (lambda: D.Uniform(_t(-0.5), _t(1.5)), (-0.5, 1.5)),
    "Exponential": (lambda: D.Exponential(_t(1.7)), (0.0, 40.0)),
    "Gamma": (lambda: D.Gamma(_t(2.5), _t(1.3)), (0.0, 60.0)),
    "Beta": (lambda: D.Beta(_t(2.5), _t(1.5)), (0.0, 1.0)),
    "LogNormal": (lambda: D.TransformedDistribution(D.Normal(_t(0.0), _t(0.4)),
                                                    [D.ExpTransform(), D.AffineTransform(0.5, 2.0)]),
                  (0.5 + 1e-9, 60.0)),
}
GRID = 100001


def _density(dist, lo, hi):
    # From 0: geometric spacing, which integrates the log singularity of a ratio at 0 too.
    x = np.linspace(lo, hi, GRID) if lo != 0 else np.concatenate([[0.0], np.geomspace(1e-14, hi, GRID)])
    with fusegrad.no_grad():
        logp = dist.log_prob(_t(x)).numpy()
    return x, logp


def _integral(x, y):
    return np.trapezoid(y, x) if hasattr(np, "trapezoid") else np.trapz(y, x)


@pytest.mark.parametrize("name", sorted(ONE_D))
def test_density_moments_entropy_and_cdf_by_integration(name):
    make, (lo, hi) = ONE_D[name]
    dist = make()
    x, logp = _density(dist, lo, hi)
    p = np.exp(logp)
    tol = 2e-5    # the trapezoid rule at the edges of the support (Uniform's, Beta's sqrt edge)
    assert abs(_integral(x, p) - 1) < tol
    try:
        mean, var = dist.mean.item(), dist.variance.item()
    except NotImplementedError:
        mean = var = None
    if mean is not None:
        assert abs(_integral(x, x * p) - mean) < tol * max(1.0, abs(mean))
        assert abs(_integral(x, (x - mean) ** 2 * p) - var) < tol * max(1.0, var)
        assert abs(dist.stddev.item() - math.sqrt(var)) < 1e-12
    try:
        entropy = dist.entropy().item()
    except NotImplementedError:
        entropy = None
    if entropy is not None:
        plogp = p * np.where(p > 0, logp, 0.0)
        assert abs(-_integral(x, plogp) - entropy) < 10 * tol
    try:
        probe = x[GRID // 7 :: GRID // 5]
        cdf = dist.cdf(_t(probe)).numpy()
    except NotImplementedError:
        return
    cumulative = [_integral(x[x <= v], p[x <= v]) for v in probe]
    np.testing.assert_allclose(cdf, cumulative, atol=10 * tol)
    try:
        back = dist.icdf(_t(cdf)).numpy()
    except NotImplementedError:
        return
    inner = (cdf > 1e-3) & (cdf < 1 - 1e-3)       # away from the flat tails
    np.testing.assert_allclose(back[inner], probe[inner], rtol=1e-7, atol=1e-7)


KL_1D = [("Normal", "Normal"), ("Normal", "Laplace"), ("Laplace", "Laplace"),
         ("Laplace", "Normal"), ("Exponential", "Exponential"), ("Exponential", "Gamma"),
         ("Exponential", "Normal"), ("Gamma", "Gamma"), ("Gamma", "Exponential"),
         ("Gamma", "Normal"), ("Beta", "Beta"), ("Beta", "Normal"), ("Beta", "Exponential"),
         ("Beta", "Gamma"), ("Beta", "Uniform"), ("Uniform", "Uniform"), ("Uniform", "Normal"),
         ("Uniform", "Beta"), ("Uniform", "Gamma"), ("Uniform", "Exponential")]
KL_Q = {
    "Normal": lambda: D.Normal(_t(-0.2), _t(1.5)),
    "Laplace": lambda: D.Laplace(_t(0.1), _t(1.1)),
    "Exponential": lambda: D.Exponential(_t(0.9)),
    "Gamma": lambda: D.Gamma(_t(1.8), _t(0.8)),
    "Beta": lambda: D.Beta(_t(1.5), _t(2.0)),
    "Uniform": lambda: D.Uniform(_t(-1.0), _t(2.0)),
}
KL_P = {**{k: v for k, v in ONE_D.items()}, "Uniform": (lambda: D.Uniform(_t(0.2), _t(0.9)),
                                                         (0.2, 0.9))}


@pytest.mark.parametrize("pair", KL_1D, ids="-".join)
def test_kl_is_the_integral_of_the_log_density_ratio(pair):
    make_p, (lo, hi) = KL_P[pair[0]]
    p, q = make_p(), KL_Q[pair[1]]()
    x, logp = _density(p, lo, hi)
    # q's density at p's support edge may be 0 or infinite where p's is 0: move off it.
    with fusegrad.no_grad():
        logq = q.log_prob(_t(np.clip(x, 1e-12, 1 - 1e-12) if pair[1] == "Beta" else
                             np.maximum(x, 1e-12) if pair[1] == "Gamma" else x)).numpy()
    dens = np.exp(logp)
    integrand = dens * np.where(dens > 0, logp - logq, 0.0)
    want = _integral(x, integrand)
    got = D.kl_divergence(p, q).item()
    assert abs(got - want) < 2e-4 * max(1.0, abs(want)), (got, want)


def test_discrete_closed_forms():
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    other = np.array([[0.3, 0.3, 0.4], [0.2, 0.2, 0.6]])
    cat, cat_q = D.Categorical(_t(probs)), D.Categorical(logits=_t(np.log(other) + 3.0))
    np.testing.assert_allclose(cat.entropy().numpy(), -(probs * np.log(probs)).sum(-1))
    np.testing.assert_allclose(cat.log_prob(fusegrad.tensor([2, 0])).numpy(),
                               np.log([0.7, 0.5]))
    np.testing.assert_allclose(D.kl_divergence(cat, cat_q).numpy(),
                               (probs * np.log(probs / other)).sum(-1))
    assert cat.mode.tolist() == [2, 0]
    onehot = D.OneHotCategorical(_t(probs))
    np.testing.assert_allclose(onehot.log_prob(_t(np.eye(3)[[2, 0]])).numpy(), np.log([0.7, 0.5]))
    np.testing.assert_allclose(onehot.variance.numpy(), probs * (1 - probs))
    p = np.array([0.2, 0.5, 0.9])
    b = D.Bernoulli(_t(p))
    np.testing.assert_allclose(b.entropy().numpy(), -(p * np.log(p) + (1 - p) * np.log1p(-p)))
    np.testing.assert_allclose(b.log_prob(_t([1.0, 0.0, 1.0])).numpy(),
                               np.log([0.2, 0.5, 0.9]))
    assert np.isnan(b.mode.numpy()[1]) and b.mode.numpy()[[0, 2]].tolist() == [0.0, 1.0]
    np.testing.assert_allclose(D.Bernoulli(logits=_t(np.log(p / (1 - p)))).probs.numpy(), p)


def test_multivariate_normal_closed_forms():
    loc = np.array([0.5, -1.0, 2.0])
    cov = np.array([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.5]])
    x = RNG.normal(size=(4, 3))
    diff = x - loc
    want = -0.5 * (np.einsum("bi,ij,bj->b", diff, np.linalg.inv(cov), diff)
                   + np.log(np.linalg.det(2 * np.pi * cov)))
    for kw in ({"covariance_matrix": _t(cov)}, {"precision_matrix": _t(np.linalg.inv(cov))},
               {"scale_tril": _t(np.linalg.cholesky(cov))}):
        m = D.MultivariateNormal(_t(loc), **kw)
        np.testing.assert_allclose(m.log_prob(_t(x)).numpy(), want, rtol=1e-10)
        np.testing.assert_allclose(m.covariance_matrix.numpy(), cov, atol=1e-12)
        np.testing.assert_allclose(m.precision_matrix.numpy(), np.linalg.inv(cov), atol=1e-10)
        np.testing.assert_allclose(m.variance.numpy(), np.diag(cov))
        assert abs(m.entropy().item() - 0.5 * np.log(np.linalg.det(2 * np.pi * np.e * cov))) < 1e-12
    cov2 = np.diag([1.0, 2.0, 3.0])
    q = D.MultivariateNormal(_t(np.zeros(3)), _t(cov2))
    inv2 = np.linalg.inv(cov2)
    want_kl = 0.5 * (np.trace(inv2 @ cov) + loc @ inv2 @ loc - 3
                     + np.log(np.linalg.det(cov2) / np.linalg.det(cov)))
    assert abs(D.kl_divergence(D.MultivariateNormal(_t(loc), _t(cov)), q).item() - want_kl) < 1e-12


def test_dirichlet_closed_forms():
    a = np.array([1.5, 2.0, 3.5])
    x = np.array([0.2, 0.3, 0.5])
    d = D.Dirichlet(_t(a))
    want = math.lgamma(a.sum()) - sum(math.lgamma(v) for v in a) + ((a - 1) * np.log(x)).sum()
    assert abs(d.log_prob(_t(x)).item() - want) < 1e-12
    np.testing.assert_allclose(d.mean.numpy(), a / a.sum())
    np.testing.assert_allclose(d.mode.numpy(), (a - 1) / (a - 1).sum())
    # All below 1: a corner, that of the first category (torch takes the argmax of 0 / 0).
    assert D.Dirichlet(_t([0.5, 0.2, 0.9])).mode.tolist() == [1.0, 0.0, 0.0]
    # Beta is the two-category Dirichlet
    beta = D.Beta(_t(2.0), _t(3.0))
    assert abs(beta.log_prob(_t(0.3)).item() - D.Dirichlet(_t([2.0, 3.0])).log_prob(
        _t([0.3, 0.7])).item()) < 1e-14


GRADCHECKS = {
    "Normal": lambda a, b, v: D.Normal(a, b.exp()).log_prob(v),
    "Laplace": lambda a, b, v: D.Laplace(a, b.exp()).log_prob(v),
    "Gamma": lambda a, b, v: D.Gamma(a.exp(), b.exp()).log_prob(v.exp()),
    "Gamma_entropy": lambda a, b, v: D.Gamma(a.exp(), b.exp()).entropy(),
    "Beta": lambda a, b, v: D.Beta(a.exp(), b.exp()).log_prob(v.sigmoid()),
    "Beta_entropy": lambda a, b, v: D.Beta(a.exp(), b.exp()).entropy(),
    "Dirichlet_kl": lambda a, b, v: D.kl_divergence(D.Dirichlet(a.exp()), D.Dirichlet(b.exp())),
    "Normal_icdf": lambda a, b, v: D.Normal(a, b.exp()).icdf(v.sigmoid()),
    "Categorical": lambda a, b, v: D.Categorical(logits=a).entropy() + D.kl_divergence(
        D.Categorical(logits=a), D.Categorical(logits=b)),
    "MultivariateNormal": lambda a, b, v: D.MultivariateNormal(
        a, scale_tril=b.tril(-1) + b.diagonal().exp().diag_embed()).log_prob(v),
    "Transformed": lambda a, b, v: D.TransformedDistribution(
        D.Normal(a, b.exp()), [D.SigmoidTransform(), D.TanhTransform()]).log_prob(
            (v.sigmoid() * 0.7).tanh()),
}


@pytest.mark.parametrize("name", sorted(GRADCHECKS))
def test_gradients_are_finite_differences(name):
    square = name == "MultivariateNormal"
    a = _t(RNG.normal(size=3) * 0.5).requires_grad_()
    b = _t(RNG.normal(size=(3, 3) if square else 3) * 0.3).requires_grad_()
    v = _t(RNG.normal(size=3) * 0.5).requires_grad_()
    fn = GRADCHECKS[name]
    assert gradcheck(fn, (a, b, v), atol=1e-7, rtol=1e-5)


def test_shapes_expand_and_sample_shapes():
    n = D.Normal(fusegrad.zeros(3, 1), fusegrad.ones(4))
    assert n.batch_shape == (3, 4) and n.event_shape == ()
    assert n.sample((2,)).shape == (2, 3, 4)
    e = n.expand((5, 3, 4))
    assert e.batch_shape == (5, 3, 4) and e.log_prob(fusegrad.zeros(5, 3, 4)).shape == (5, 3, 4)
    m = D.MultivariateNormal(fusegrad.zeros(2), fusegrad.eye(2))
    assert m.expand((6,)).rsample((2,)).shape == (2, 6, 2)
    ind = D.Independent(n, 1)
    assert (ind.batch_shape, ind.event_shape) == ((3,), (4,))
    assert ind.expand((2, 3)).sample().shape == (2, 3, 4)
    c = D.Categorical(logits=fusegrad.zeros(2, 5))
    assert c.sample((7,)).shape == (7, 2) and c.expand((3, 2)).sample().shape == (3, 2)
    assert c.enumerate_support().shape == (5, 2)
    oh = D.OneHotCategorical(logits=fusegrad.zeros(2, 5))
    assert oh.sample((3,)).shape == (3, 2, 5) and oh.enumerate_support().shape == (5, 2, 5)
    for dist in (D.Gamma(fusegrad.ones(3), 1.0), D.Beta(fusegrad.ones(3), 2.0),
                 D.Dirichlet(fusegrad.ones(3, 4)), D.Exponential(fusegrad.ones(3)),
                 D.Laplace(0.0, fusegrad.ones(3)), D.Uniform(0.0, fusegrad.ones(3)),
                 D.Bernoulli(fusegrad.full((3,), 0.5))):
        shape = tuple(dist.batch_shape) + tuple(dist.event_shape)
        assert dist.sample((2,)).shape == (2,) + shape
        assert dist.expand((4,) + tuple(dist.batch_shape)).sample().shape == (4,) + shape
    assert D.Normal(0.0, 1.0).batch_shape == () and D.Normal(0.0, 1.0).sample().shape == ()
    t = D.TransformedDistribution(D.Normal(fusegrad.zeros(3), 1.0), D.ExpTransform())
    assert t.expand((2, 3)).sample().shape == (2, 3)


def test_transforms():
    x = _t(RNG.normal(size=(2, 3)))
    for tr in (D.ExpTransform(), D.SigmoidTransform(), D.TanhTransform(),
               D.AffineTransform(1.0, -3.0), D.PowerTransform(_t(2.0)),
               D.ComposeTransform([D.ExpTransform(), D.AffineTransform(_t([1.0, 2.0, 3.0]), 2.0)])):
        y = tr(x.exp() if isinstance(tr, D.PowerTransform) else x)
        back = tr.inv(y)
        np.testing.assert_allclose(back.numpy(), (x.exp() if isinstance(tr, D.PowerTransform)
                                                  else x).numpy(), rtol=1e-9, atol=1e-12)
    sm = D.SoftmaxTransform()
    np.testing.assert_allclose(sm(x).sum(-1).numpy(), 1.0)
    np.testing.assert_allclose(D.AbsTransform()(x).numpy(), np.abs(x.numpy()))
    cached = D.ExpTransform(cache_size=1)
    y = cached(x)
    assert cached.inv(y) is x
    assert D.ExpTransform() == D.ExpTransform() and D.ExpTransform().inv == D.ExpTransform().inv
    assert D.AffineTransform(1.0, 2.0) == D.AffineTransform(1.0, 2.0)
    assert D.AffineTransform(1.0, 2.0) != D.AffineTransform(1.0, 3.0)
    assert repr(D.ComposeTransform([D.ExpTransform()])) == "ComposeTransform(\n    ExpTransform()\n)"
    assert D.AffineTransform(0.0, -2.0).sign == -1 and D.ExpTransform().inv.sign == 1


# --------------------------------------------------------------------------- sampling

N_DRAWS = 20000


def _moment_bounds(x, axis=0):
    """Six standard errors of the sample mean and variance of ``x`` (draws along ``axis``),
    from the draws' own second and fourth central moments."""
    centered = x - x.mean(axis)
    m2, m4 = (centered ** 2).mean(axis), (centered ** 4).mean(axis)
    n = x.shape[axis]
    return 6 * np.sqrt(m2 / n), 6 * np.sqrt(np.maximum(m4 - m2 ** 2, 0) / n)


SAMPLED = {
    "Normal": lambda: D.Normal(_t([0.5, -2.0]), _t([1.0, 0.3])),
    "Laplace": lambda: D.Laplace(_t([0.5, -2.0]), _t([1.0, 0.3])),
    "Uniform": lambda: D.Uniform(_t([0.5, -2.0]), _t([1.0, 0.3])),
    "Exponential": lambda: D.Exponential(_t([0.5, 3.0])),
    "Gamma": lambda: D.Gamma(_t([0.2, 1.0, 4.5]), _t([1.0, 2.0, 0.5])),
    "Beta": lambda: D.Beta(_t([0.3, 2.0, 5.0]), _t([0.5, 2.0, 1.5])),
    "Dirichlet": lambda: D.Dirichlet(_t([0.4, 1.0, 3.0])),
    "Bernoulli": lambda: D.Bernoulli(_t([0.1, 0.5, 0.95])),
    "OneHotCategorical": lambda: D.OneHotCategorical(_t([0.1, 0.2, 0.3, 0.4])),
    "MultivariateNormal": lambda: D.MultivariateNormal(_t([1.0, -1.0]),
                                                       _t([[2.0, 0.6], [0.6, 0.5]])),
    "Independent": lambda: D.Independent(D.Normal(_t([0.5, -2.0]), _t([1.0, 0.3])), 1),
    "LogNormal": lambda: D.TransformedDistribution(D.Normal(_t(0.0), _t(0.5)), D.ExpTransform()),
}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sample_moments(name):
    dist = SAMPLED[name]()
    fusegrad.manual_seed(1234)
    x = dist.sample((N_DRAWS,)).numpy()
    if name == "LogNormal":
        mean, var = math.exp(0.125), (math.exp(0.25) - 1) * math.exp(0.25)
    else:
        mean, var = dist.mean.numpy(), dist.variance.numpy()
    mean_bound, var_bound = _moment_bounds(x)
    assert np.all(np.abs(x.mean(0) - mean) < mean_bound)
    assert np.all(np.abs(x.var(0) - var) < var_bound)
    if name == "MultivariateNormal":
        cov = np.cov(x.T)
        assert abs(cov[0, 1] - 0.6) < 6 * math.sqrt((2.0 * 0.5 + 0.6 ** 2) / N_DRAWS)
    fusegrad.manual_seed(1234)
    np.testing.assert_array_equal(dist.sample((N_DRAWS,)).numpy(), x)   # reproducible


def test_categorical_sample_frequencies():
    probs = np.array([[0.05, 0.25, 0.0, 0.7], [0.25, 0.25, 0.25, 0.25]])
    fusegrad.manual_seed(7)
    x = D.Categorical(_t(probs)).sample((N_DRAWS,)).numpy()
    assert x.dtype == np.int64 and x.shape == (N_DRAWS, 2)
    freq = np.stack([(x == k).mean(0) for k in range(4)], -1)
    assert freq[0, 2] == 0.0          # a category of probability 0 is never drawn
    assert np.all(np.abs(freq - probs) < 6 * np.sqrt(probs * (1 - probs) / N_DRAWS) + 1e-12)


def test_samples_differ_between_draws_and_seeds():
    fusegrad.manual_seed(0)
    a, b = D.Gamma(_t(2.0), _t(1.0)).sample((4,)), D.Gamma(_t(2.0), _t(1.0)).sample((4,))
    assert not np.array_equal(a.numpy(), b.numpy())
    assert np.all(a.numpy() > 0)
    assert D.Gamma(_t(1e-4), _t(1.0)).sample((1000,)).numpy().min() > 0   # underflow clamped


# rsample gradients: the mean over draws of d f(x) / d theta is d E[f(x)] / d theta (the
# central difference of the closed-form expectation). Each draw has its own parameter copy,
# so its gradient is one sample; the bound is six standard errors of their mean.
RSAMPLE_GRADIENTS = {
    # name: (make(a, b) -> dist, (a, b), f, E[f(x)] as a function of (a, b))
    "Gamma_small": (lambda a, b: D.Gamma(a, b), (0.3, 2.0), lambda x: x, lambda a, b: a / b),
    "Gamma_square": (lambda a, b: D.Gamma(a, b), (2.5, 0.7), lambda x: x ** 2,
                     lambda a, b: a * (a + 1) / b ** 2),
    "Beta": (lambda a, b: D.Beta(a, b), (0.6, 2.0), lambda x: x, lambda a, b: a / (a + b)),
    "Beta_square": (lambda a, b: D.Beta(a, b), (3.0, 1.5), lambda x: x ** 2,
                    lambda a, b: a * (a + 1) / ((a + b) * (a + b + 1))),
    "Normal": (lambda a, b: D.Normal(a, b), (0.5, 1.5), lambda x: x ** 2,
               lambda a, b: a ** 2 + b ** 2),
    "Laplace": (lambda a, b: D.Laplace(a, b), (0.5, 1.5), lambda x: (x - 0.5).abs(),
                lambda a, b: abs(a - 0.5) + b * math.exp(-abs(a - 0.5) / b)),
    "Uniform": (lambda a, b: D.Uniform(a, b), (0.5, 1.5), lambda x: x ** 2,
                lambda a, b: (a * a + a * b + b * b) / 3),
    "Exponential": (lambda a, b: D.Exponential(a * b), (2.0, 1.0), lambda x: x,
                    lambda a, b: 1 / (a * b)),
}


@pytest.mark.parametrize("name", sorted(RSAMPLE_GRADIENTS))
def test_rsample_gradient_is_unbiased(name):
    make, (a0, b0), f, expectation = RSAMPLE_GRADIENTS[name]
    n, h = 3000, 1e-6
    analytic = ((expectation(a0 + h, b0) - expectation(a0 - h, b0)) / (2 * h),
                (expectation(a0, b0 + h) - expectation(a0, b0 - h)) / (2 * h))
    a = fusegrad.full((n,), a0, dtype=fusegrad.float64, requires_grad=True)
    b = fusegrad.full((n,), b0, dtype=fusegrad.float64, requires_grad=True)
    fusegrad.manual_seed(3)
    dist = make(a, b)
    assert dist.has_rsample
    f(dist.rsample()).sum().backward()
    for grad, want in zip((a.grad.numpy(), b.grad.numpy()), analytic):
        assert abs(grad.mean() - want) < 6 * grad.std() / math.sqrt(n) + 1e-12, (grad.mean(), want)


def test_dirichlet_rsample_gradient_is_unbiased():
    n, alpha = 3000, np.array([0.5, 1.5, 3.0])
    conc = _t(np.tile(alpha, (n, 1))).requires_grad_()
    fusegrad.manual_seed(5)
    D.Dirichlet(conc).rsample()[:, 0].sum().backward()
    total = alpha.sum()
    want = np.array([total - alpha[0], -alpha[0], -alpha[0]]) / total ** 2   # d E[x_0]
    grad = conc.grad.numpy()
    assert np.all(np.abs(grad.mean(0) - want) < 6 * grad.std(0) / math.sqrt(n))


def test_multivariate_normal_rsample_gradient():
    n = 8000
    tril = _t(np.tile([[1.0, 0.0], [0.5, 0.8]], (n, 1, 1))).requires_grad_()
    fusegrad.manual_seed(6)
    x = D.MultivariateNormal(fusegrad.zeros(n, 2, dtype=fusegrad.float64), scale_tril=tril).rsample()
    (x ** 2).sum().backward()     # E = trace(L L^T): gradient 2 L
    grad = tril.grad.numpy()
    want = 2 * np.array([[1.0, 0.0], [0.5, 0.8]])
    assert np.all(np.abs(grad.mean(0) - want) < 6 * grad.std(0) / math.sqrt(n) + 1e-12)


def test_standard_gamma_gradient_is_the_quantile_derivative():
    # dx/da at a fixed CDF value, against central differences of the quantile (Newton's
    # method on the float64 incomplete gamma function).
    from fusegrad.ops.sampling import _standard_gamma_grad_impl
    from fusegrad.ops.special import _igamma_np, _lgamma_np
    a = np.array([0.05, 0.5, 2.0, 10.0, 100.0])
    x = np.array([1e-20, 0.3, 1.5, 14.0, 90.0])
    p = _igamma_np(a, x, False)

    def quantile(shape):
        q = x.copy()
        for _ in range(8):
            density = np.exp((shape - 1) * np.log(q) - q - _lgamma_np(shape))
            q = q - (_igamma_np(shape, q, False) - p) / density
        return q
    h = 1e-5 * a
    want = (quantile(a + h) - quantile(a - h)) / (2 * h)
    np.testing.assert_allclose(_standard_gamma_grad_impl(a, x), want, rtol=1e-6)


def test_rsample_is_not_available_where_torch_has_none():
    for dist in (D.Bernoulli(0.5), D.Categorical(fusegrad.ones(3)), D.OneHotCategorical(fusegrad.ones(3))):
        assert not dist.has_rsample
        with pytest.raises(NotImplementedError):
            dist.rsample()
    assert D.Independent(D.Normal(fusegrad.zeros(2), 1.0), 1).has_rsample


# --------------------------------------------------------------------------- compiled

def test_compiled_vae_loss_equals_eager():
    x = _t(RNG.uniform(0, 1, (6, 4)))
    w_enc = _t(RNG.normal(size=(4, 4)) * 0.5).requires_grad_()
    w_dec = _t(RNG.normal(size=(2, 4)) * 0.5).requires_grad_()

    def vae_loss(x, w_enc, w_dec):
        mu, log_sigma = (x @ w_enc).chunk(2, -1)
        q = D.Normal(mu, log_sigma.exp())
        z = q.rsample()
        recon = D.Normal(z @ w_dec, 1.0).log_prob(x).sum(-1)
        prior = D.Normal(fusegrad.zeros_like(mu), fusegrad.ones_like(mu))
        return (D.kl_divergence(q, prior).sum(-1) - recon).mean() + 0.1 * q.entropy().mean()

    results = []
    for fn in (vae_loss, fusegrad.compile(vae_loss)):
        for p in (w_enc, w_dec):
            p.grad = None
        fusegrad.manual_seed(11)
        loss = fn(x, w_enc, w_dec)
        loss.backward()
        results.append((loss.item(), w_enc.grad.numpy().copy(), w_dec.grad.numpy().copy()))
    (loss, g1, g2), (closs, cg1, cg2) = results
    assert abs(loss - closs) < 1e-12 * max(1.0, abs(loss))
    np.testing.assert_allclose(cg1, g1, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cg2, g2, rtol=1e-10, atol=1e-12)


def test_compiled_policy_gradient_loss_equals_eager():
    obs = _t(RNG.normal(size=(8, 3)))
    w = _t(RNG.normal(size=(3, 4))).requires_grad_()

    def policy_loss(obs, w):
        dist = D.Categorical(logits=obs @ w)
        actions = dist.sample()
        reward = (actions == 2).to(obs.dtype) - 0.1 * actions.to(obs.dtype)
        return -(dist.log_prob(actions) * reward).mean() - 0.01 * dist.entropy().mean(), actions

    results = []
    for fn in (policy_loss, fusegrad.compile(policy_loss)):
        w.grad = None
        fusegrad.manual_seed(4)
        loss, actions = fn(obs, w)
        loss.backward()
        results.append((loss.item(), actions.numpy(), w.grad.numpy().copy()))
    (loss, actions, grad), (closs, cactions, cgrad) = results
    np.testing.assert_array_equal(cactions, actions)
    assert abs(loss - closs) < 1e-12
    np.testing.assert_allclose(cgrad, grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["Gamma", "Beta", "Dirichlet", "MultivariateNormal",
                                    "TransformedDistribution", "Bernoulli", "OneHotCategorical"])
def test_compiled_log_prob_rsample_and_kl_equal_eager(family):
    arrays = _family_params()[family]

    def run(*params):
        p = _family(fusegrad, family, dict(zip(arrays, params)))
        q = _family(fusegrad, family, {k: v * 0.9 for k, v in zip(arrays, params)})
        x = p.rsample() if p.has_rsample else p.sample()
        entropy = 0.0 if family == "TransformedDistribution" else p.entropy().sum()  # none
        return p.log_prob(x).sum() + D.kl_divergence(p, q).sum() + entropy, x

    params = [_t(v) for v in arrays.values()]
    fusegrad.manual_seed(2)
    want, want_x = run(*params)
    fusegrad.manual_seed(2)
    got, got_x = fusegrad.compile(run)(*params)
    np.testing.assert_allclose(got_x.numpy(), want_x.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-10)


def test_compiled_function_skips_validation_it_cannot_do():
    # The values are unknown while tracing: validation is skipped there, not an error.
    f = fusegrad.compile(lambda loc, scale, x: D.Normal(loc, scale).log_prob(x))
    out = f(fusegrad.zeros(3), fusegrad.ones(3), fusegrad.ones(3))
    np.testing.assert_allclose(out.numpy(), -0.5 - 0.5 * math.log(2 * math.pi), rtol=1e-6)


# --------------------------------------------------------------------------- user programs
# Written against torch's API, run with ``lib`` = fusegrad or torch unchanged.

VAE_DATA = (np.random.default_rng(1).uniform(size=(64, 12)) <
            np.linspace(0.1, 0.9, 12)).astype(np.float32)


def vae_training(lib, steps, compile_step=False, init=None):
    """A small VAE: a Normal posterior by rsample, a Bernoulli decoder, the KL to the
    standard Normal prior by kl_divergence; Adam on the negative ELBO."""
    nn, dist = lib.nn, lib.distributions

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
            self.decoder = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 12))

        def forward(self, x):
            mu, log_sigma = self.encoder(x).chunk(2, dim=-1)
            posterior = dist.Normal(mu, log_sigma.exp())
            z = posterior.rsample()
            likelihood = dist.Bernoulli(logits=self.decoder(z))
            prior = dist.Normal(lib.zeros_like(mu), lib.ones_like(mu))
            kl = dist.kl_divergence(posterior, prior).sum(-1)
            return (kl - likelihood.log_prob(x).sum(-1)).mean()

    model = VAE()
    if init is not None:
        model.load_state_dict({k: lib.tensor(v) for k, v in init.items()})
    opt = lib.optim.Adam(model.parameters(), lr=1e-2)

    def step(x):
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        return loss

    if compile_step:
        step = lib.compile(step)
    data = lib.tensor(VAE_DATA)
    losses = [step(data).item() for _ in range(steps)]
    return losses, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


ARM_MEANS = [0.2, 0.5, 0.8, 0.3]


def reinforce_bandit(lib, steps, compile_step=False, init=None):
    """REINFORCE on a 4-armed Bernoulli bandit: a Categorical policy, sampled arms, sampled
    rewards, the mean reward as baseline."""
    nn, dist = lib.nn, lib.distributions
    arm_means = lib.tensor(ARM_MEANS)
    policy = nn.Linear(2, 4)
    if init is not None:
        policy.load_state_dict({k: lib.tensor(v) for k, v in init.items()})
    opt = lib.optim.Adam(policy.parameters(), lr=0.05)

    def step(context):
        opt.zero_grad()
        actions = dist.Categorical(logits=policy(context))
        arms = actions.sample()
        rewards = dist.Bernoulli(probs=arm_means[arms]).sample()
        loss = -(actions.log_prob(arms) * (rewards - rewards.mean())).mean()
        loss.backward()
        opt.step()
        return loss, rewards.mean()

    if compile_step:
        step = lib.compile(step)
    context = lib.ones(32, 2)
    history = [tuple(v.item() for v in step(context)) for _ in range(steps)]
    final = lib.softmax(policy(lib.ones(1, 2)), -1)[0].detach().numpy()
    state = {k: v.detach().numpy().copy() for k, v in policy.state_dict().items()}
    return history, final, state


@pytest.mark.slow
def test_vae_program_trains_eager_and_compiled_alike():
    runs = {}
    for compiled in (False, True):
        fusegrad.manual_seed(0)
        runs[compiled] = vae_training(fusegrad, 30, compile_step=compiled)
    (eager, eager_state), (comp, comp_state) = runs[False], runs[True]
    assert eager[-1] < eager[0] - 1.0                        # it learns
    # float32: fused kernels sum in another order; the runs agree to float32 rounding grown
    # over 30 Adam steps.
    np.testing.assert_allclose(comp, eager, rtol=1e-4)
    for k in eager_state:
        np.testing.assert_allclose(comp_state[k], eager_state[k], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_reinforce_program_learns_the_best_arm_eager_and_compiled_alike():
    runs = {}
    for compiled in (False, True):
        fusegrad.manual_seed(0)
        runs[compiled] = reinforce_bandit(fusegrad, 60, compile_step=compiled)
    (eager, eager_probs, _), (comp, comp_probs, _) = runs[False], runs[True]
    assert eager_probs.argmax() == 2 and eager_probs[2] > 0.6
    # Same seed, same draws: the compiled step samples the same arms and rewards.
    np.testing.assert_allclose(np.array(comp), np.array(eager), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(comp_probs, eager_probs, rtol=1e-3)


class _SharedDraws:
    """The same uniforms, in the same order, for two libraries: their samplers are patched
    to invert them (torch's own generator differs from fusegrad's)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def uniforms(self, lib, shape, dtype):
        return lib.tensor(self.rng.uniform(size=tuple(shape)), dtype=dtype)

    def patch(self, monkeypatch, lib):
        draws = self

        def categorical_sample(d, sample_shape=()):
            cdf = d.probs.detach().cumsum(-1)
            u = draws.uniforms(lib, d._extended_shape(sample_shape), cdf.dtype)
            return (cdf <= (u.unsqueeze(-1) * cdf[..., -1:])).sum(-1).clamp(max=d._num_events - 1)

        def bernoulli_sample(d, sample_shape=()):
            probs = d.probs.detach()
            return (draws.uniforms(lib, d._extended_shape(sample_shape), probs.dtype) < probs).to(
                probs.dtype)

        def standard_normal(shape, dtype, device=None):
            return lib.tensor(draws.rng.normal(size=tuple(shape)), dtype=dtype)

        monkeypatch.setattr(lib.distributions.Categorical, "sample", categorical_sample)
        monkeypatch.setattr(lib.distributions.Bernoulli, "sample", bernoulli_sample)
        monkeypatch.setattr(lib.distributions.normal, "_standard_normal", standard_normal)


@pytest.mark.slow
def test_vae_program_matches_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    fusegrad.manual_seed(0)
    _, init = vae_training(fusegrad, 0)
    runs = {}
    for lib in (fusegrad, torch):
        _SharedDraws(3).patch(monkeypatch, lib)
        runs[lib.__name__] = vae_training(lib, 15, init=init)
    (ours, our_state), (theirs, their_state) = runs["fusegrad"], runs["torch"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    for k in their_state:
        np.testing.assert_allclose(our_state[k], their_state[k], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_reinforce_program_matches_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    fusegrad.manual_seed(0)
    _, _, init = reinforce_bandit(fusegrad, 0)
    runs = {}
    for lib in (fusegrad, torch):
        _SharedDraws(4).patch(monkeypatch, lib)
        runs[lib.__name__] = reinforce_bandit(lib, 40, init=init)
    (ours, our_probs, _), (theirs, their_probs, _) = runs["fusegrad"], runs["torch"]
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(our_probs, their_probs, rtol=1e-3)
    assert their_probs.argmax() == 2


def test_the_issue_line_runs_under_import_fusegrad_as_torch():
    import fusegrad as torch
    x = torch.tensor([0.0, 1.0])
    np.testing.assert_allclose(torch.distributions.Normal(0., 1.).log_prob(x).numpy(),
                               [-0.9189385, -1.4189385], rtol=1e-6)


def test_compiled_sampling_draws_fresh_numbers_each_call():
    f = fusegrad.compile(lambda c: D.Gamma(c, 1.0).rsample() + D.Categorical(logits=c).sample())
    c = fusegrad.ones(5)
    fusegrad.manual_seed(0)
    first, second = f(c).numpy(), f(c).numpy()
    assert not np.array_equal(first, second)
    fusegrad.manual_seed(0)
    np.testing.assert_array_equal(f(c).numpy(), first)


def test_gamma_draws_keep_to_their_counters():
    # A draw reserves its counters up front: the numbers after it do not depend on how many
    # rejection rounds it took, and do not overlap with its own.
    from fusegrad.ops.sampling import standard_gamma
    fusegrad.manual_seed(9)
    standard_gamma(_t([0.5, 3.0, 40.0]))
    after = fusegrad.rand(4, dtype=fusegrad.float64).numpy()
    fusegrad.manual_seed(9)
    standard_gamma(_t([0.01, 1.0, 2.0]))
    np.testing.assert_array_equal(fusegrad.rand(4, dtype=fusegrad.float64).numpy(), after)
    draws = standard_gamma(_t([np.inf, np.nan, -1.0, 2.0])).numpy()
    assert np.isposinf(draws[0]) and np.isnan(draws[1:3]).all() and draws[3] > 0


@pytest.mark.parametrize("name", ["Normal", "Exponential", "Gamma", "Beta", "Dirichlet",
                                  "Bernoulli"])
def test_exponential_family_bregman_forms_equal_the_closed_forms(name):
    # The natural parameters and log normalizers give the same entropy and KL divergence as
    # the closed forms (the generic path torch uses for families without one).
    from fusegrad.distributions.kl import _kl_expfamily_expfamily
    arrays = _family_params()[name]
    p = _family(fusegrad, name, {k: _t(v) for k, v in arrays.items()})
    q = _family(fusegrad, name, {k: _t(v * 0.9) for k, v in arrays.items()})
    if name not in ("Beta", "Dirichlet"):    # no mean carrier measure, as in torch
        _close(D.ExponentialFamily.entropy(p), p.entropy(), rtol=1e-9, atol=1e-12)
    _close(_kl_expfamily_expfamily(p, q), D.kl_divergence(p, q), rtol=1e-9, atol=1e-12)


def test_names_torch_has_and_fusegrad_lacks_say_so():
    with pytest.raises(AttributeError, match="torch.distributions.Poisson is not implemented in "
                                             "fusegrad yet"):
        getattr(D, "Poisson")  # noqa: B009
    with pytest.raises(AttributeError, match="^module 'fusegrad.distributions' has no attribute "
                                             "'Normall'$"):
        getattr(D, "Normall")  # noqa: B009
    assert D.identity_transform(fusegrad.ones(2)).tolist() == [1.0, 1.0]


def test_fusegrad_has_every_name_it_exports_and_torch_has_them_too():
    torch = pytest.importorskip("torch")
    modules = {"constraints", "transforms"}     # torch's submodules, not in its __all__
    assert set(D.__all__) - modules <= set(torch.distributions.__all__)
    assert set(torch.distributions.__all__) - set(D.__all__) == set(D._NOT_YET)
