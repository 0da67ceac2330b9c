"""Autocast dispatch: which public ops run in the lower precision, which in float32, which
at the widest of their inputs' types, while ``fusegrad.autocast`` is on.

The state is per thread (``threading.local``), as torch's: a region entered on one thread
changes nothing on another. Ops named in :data:`POLICIES` are wrapped once by
:func:`autocast_op`, where they are defined: :func:`fusegrad.ops.registry.public` wraps the
registry's ops, :func:`wrap_namespace` those of ``nn.functional``, ``fft`` and ``linalg``.
While no thread has autocast on, a wrapped op costs one test of a module global.

The casts are ordinary ``Tensor.to`` calls: autograd records them, so an op's backward runs
in the dtype its forward ran in and a float32 parameter still gets a float32 gradient; a
traced function records them as ``cast`` nodes, and ``fusegrad.compile`` keys its graphs on
:func:`state_key`. Inside a wrapped op autocast is off, as torch's dispatcher excludes its
autocast key below an autocast kernel: the ops a float32 op is built of are not cast down.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

from fusegrad import dtypes
from fusegrad.ops import primitive as _primitive
from fusegrad.tensor import Tensor

LOWER = "lower_precision_fp"
FP32 = "fp32"
PROMOTE = "promote"
# No cast, autocast off inside: ops torch computes with kernels of their own (no autocast
# entry) that fusegrad builds from a listed op (mv from matmul), which must not cast.
FALLTHROUGH = "fallthrough"

# torch 2.13's CPU lists (aten/src/ATen/autocast_mode.cpp), under fusegrad's public names
# (aten's cross_entropy_loss is F.cross_entropy). Ops torch lists and fusegrad lacks are left
# out; an op in no list runs in the dtype its inputs have.
_CPU_LOWER = ("conv1d", "conv2d", "conv3d", "bmm", "mm", "baddbmm", "addmm", "addbmm", "linear",
              "matmul", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
              "scaled_dot_product_attention", "linalg.vecdot",
              # Not in torch's list, but torch's einsum runs as bmm, so its result is in the
              # lower precision too; fusegrad's einsum contracts without a listed op.
              "einsum")
_CPU_FP32 = ("avg_pool3d", "binary_cross_entropy", "grid_sample", "polar", "prod", "quantile",
             "nanquantile", "stft", "cdist", "trace", "view_as_complex", "cholesky",
             "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve", "pinverse", "max_pool3d",
             "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "mse_loss",
             "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "poisson_nll_loss",
             "smooth_l1_loss", "cross_entropy", "l1_loss", "huber_loss", "margin_ranking_loss",
             "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "ctc_loss", "kl_div",
             "multilabel_margin_loss", "binary_cross_entropy_with_logits", "geqrf", "qr", "svd",
             "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d",
             "adaptive_max_pool3d",
             *(f"fft.{n}" for n in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft",
                                    "rfft2", "irfft2", "rfftn", "irfftn", "hfft", "ihfft")),
             *(f"linalg.{n}" for n in ("cond", "matrix_rank", "solve", "cholesky", "svdvals", "eigvals",
                                       "eigvalsh", "inv", "householder_product", "tensorinv",
                                       "tensorsolve", "qr", "cholesky_ex", "svd", "eig", "eigh",
                                       "lstsq", "inv_ex")))
_CPU_PROMOTE = ("stack", "cat", "index_copy")
_CPU_FALLTHROUGH = ("mv", "dot", "vdot", "bilinear")

# torch 2.13's CUDA lists (the "Autocast Op Reference" of its amp docs).
_CUDA_LOWER = ("addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "multi_dot",
               "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
               "conv_transpose3d", "linear", "matmul", "mm", "mv", "prelu",
               "scaled_dot_product_attention")
_CUDA_FP32 = ("acos", "asin", "binary_cross_entropy_with_logits", "cosh", "cosine_embedding_loss",
              "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv",
              "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
              "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss",
              "mse_loss", "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm",
              "normalize", "pdist", "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt",
              "sinh", "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "sum",
              "renorm", "tan", "triplet_margin_loss")
_CUDA_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample",
                 "index_put", "scatter_add", "tensordot", "stack", "cat", "index_copy")

POLICIES: dict[str, dict[str, str]] = {
    device: {**{n: FALLTHROUGH for n in fallthrough}, **{n: PROMOTE for n in promote},
             **{n: FP32 for n in fp32}, **{n: LOWER for n in lower}}
    for device, lower, fp32, promote, fallthrough in (
        ("cpu", _CPU_LOWER, _CPU_FP32, _CPU_PROMOTE, _CPU_FALLTHROUGH),
        ("cuda", _CUDA_LOWER, _CUDA_FP32, _CUDA_PROMOTE, ()))}

# Ops of the fp32 lists that take a ``dtype=``: given one, they run in it, uncast (torch's
# fp32_set_opt_dtype).
_OPT_DTYPE = frozenset(("softmax", "log_softmax", "softmin", "cumsum", "cumprod", "sum", "prod"))

DEFAULT_DTYPES = {"cpu": dtypes.bfloat16, "cuda": dtypes.float16}


class _AutocastState(threading.local):
    """One thread's autocast settings (torch keeps them in its thread-local state too)."""

    def __init__(self):
        self.enabled = {"cpu": False, "cuda": False}
        self.dtype = dict(DEFAULT_DTYPES)
        self.cache_enabled = True
        self.nesting = 0
        self.inside_op = False
        self.cache: dict[int, tuple[Tensor, Tensor]] = {}


STATE = _AutocastState()
# How many threads have autocast on for some device: 0 is the one test a wrapped op pays
# while autocast is off everywhere. Changed under the lock, read without it.
_active_threads = 0
_active_lock = threading.Lock()


def set_enabled(device_type: str, enabled: bool) -> None:
    """Turn this thread's autocast for ``device_type`` on or off."""
    global _active_threads
    state = STATE
    was = any(state.enabled.values())
    state.enabled[device_type] = enabled
    now = any(state.enabled.values())
    if was != now:
        with _active_lock:
            _active_threads += 1 if now else -1


def state_key():
    """What of this thread's autocast state a traced function depends on: None while it is
    off, else the devices it is on for and their dtypes. ``fusegrad.compile`` keys its
    graphs on it (torch's guards on the autocast state), so a function traced outside an
    autocast region is traced again when called inside one."""
    if not _active_threads:
        return None
    state = STATE
    on = tuple((device, state.dtype[device].name) for device, enabled in state.enabled.items() if enabled)
    return on or None


def autocast_op(fn: Callable | None = None, *, name: str | None = None) -> Callable:
    """``fn`` with autocast's casts of its tensor arguments when its name is in one of the
    device lists of :data:`POLICIES`; ``fn`` itself otherwise."""
    if fn is None:
        return functools.partial(autocast_op, name=name)
    key = name or fn.__name__
    policies = {device: table[key] for device, table in POLICIES.items() if key in table}
    if not policies or getattr(fn, "_autocast", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _active_threads:
            return fn(*args, **kwargs)
        state = STATE
        if state.inside_op:
            return fn(*args, **kwargs)
        device = _device_of(args, kwargs)
        policy = policies.get(device)
        if policy is None or not state.enabled.get(device, False):
            return fn(*args, **kwargs)
        if policy == FP32 and key in _OPT_DTYPE and kwargs.get("dtype") is not None:
            target = None
        elif policy == LOWER:
            target = state.dtype[device]
        elif policy == FP32:
            target = dtypes.float32
        elif policy == PROMOTE:
            target = _widest(args, kwargs)
        else:
            target = None
        if target is not None:
            # A traced op's casts belong to its graph: none is cached.
            cache = state.cache if state.cache_enabled and policy == LOWER and \
                not _primitive.traced(*_tensors(args, kwargs)) else None
            args = tuple(_cast(a, target, policy, cache) for a in args)
            kwargs = {k: _cast(v, target, policy, cache) for k, v in kwargs.items()}
        state.inside_op = True
        try:
            return fn(*args, **kwargs)
        finally:
            state.inside_op = False
    wrapper._autocast = True
    return wrapper


def without_autocast(fn: Callable) -> Callable:
    """``fn`` run with autocast off inside: for the in-place variants of listed ops
    (``x.addmm_``), which torch's autocast lists leave out (they write into ``x``'s dtype)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _active_threads or STATE.inside_op:
            return fn(*args, **kwargs)
        STATE.inside_op = True
        try:
            return fn(*args, **kwargs)
        finally:
            STATE.inside_op = False
    return wrapper


def wrap_namespace(namespace: dict, prefix: str = "") -> None:
    """Wrap, in a module's ``namespace``, each function whose ``prefix + name`` is listed
    (``nn.functional``'s ops, ``fusegrad.fft``'s as ``"fft.rfft"``): for ops defined outside
    the registry, which wraps its own."""
    names = set().union(*POLICIES.values())
    for name, value in list(namespace.items()):
        if prefix + name in names and callable(value):
            namespace[name] = autocast_op(value, name=prefix + name)


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, Tensor))


def _device_of(args, kwargs) -> str | None:
    for t in _tensors(args, kwargs):
        return t.device.type
    return None


def _widest(args, kwargs):
    """The widest floating type among the tensor arguments but float64 (torch's promote
    policy, which leaves float64 alone); None when fewer than two floating types meet."""
    found = {t.dtype for t in _tensors(args, kwargs)
             if t.dtype.is_floating_point and t.dtype != dtypes.float64}
    if len(found) < 2:
        return None
    out = found.pop()
    for dt in found:
        out = dtypes.promote_types(out, dt)
    return out


def _cast(value, target, policy: str, cache: dict | None):
    if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
        return type(value)(_cast(v, target, policy, cache) for v in value)
    if not isinstance(value, Tensor) or not value.dtype.is_floating_point or value.dtype == target:
        return value
    # float64 is never cast (torch's is_eligible).
    if value.dtype == dtypes.float64:
        return value
    # Cast leaves that require grad once per region (the parameters): torch's cast cache.
    if cache is not None and value.is_leaf and value.requires_grad:
        hit = cache.get(id(value))
        if hit is not None and hit[0] is value and hit[1].dtype == target:
            return hit[1]
        out = value.to(target)
        cache[id(value)] = (value, out)
        return out
    return value.to(target)
