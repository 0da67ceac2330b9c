"""BLAS-style products and matrix helpers built on matmul: ``addmm`` and its family
(``addmv``, ``addr``, ``addbmm``, ``baddbmm``), ``inner``, ``vdot``, ``ger``, ``kron``,
``cross``, ``dist``, ``diff``, ``cov``, ``corrcoef``, ``adjoint``, ``matrix_power``.

Each is a composition of public ops, so it is traced, differentiated and compiled with no
rules of its own.
"""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.ops.complex import conj
from fusegrad.ops.composite import _named
from fusegrad.ops.creation import eye
from fusegrad.ops.decompositions import inv
from fusegrad.ops.elementwise import add, clamp, div, mul, ne, sqrt, sub, where
from fusegrad.ops.matmul import _check_mm, bmm, dot, float32_sums, matmul, mm, mv, outer
from fusegrad.ops.movement import broadcast_to, cat, narrow, reshape, transpose, unsqueeze
from fusegrad.ops.operands import cast
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.reductions import mean, norm, sum
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def _scaled_sum(x: Tensor, product: Tensor, beta, alpha) -> Tensor:
    """``beta * x + alpha * product``; with ``beta == 0`` the input's values are ignored (NaN
    in it does not propagate), as BLAS and torch do, but it stays in the graph: its gradient
    is zeros, as torch's, not None. ``x`` expands to the product's shape (torch's rule: it
    never broadcasts the product)."""
    x = broadcast_to(x, tuple(product.shape))
    if alpha != 1:
        product = mul(product, alpha)
    if beta == 0:
        return where(False, x, product)
    return add(x if beta == 1 else mul(x, beta), product)


def _integer_scalars(op: str, dtype: dtypes.DType, beta, alpha) -> tuple:
    """``beta`` and ``alpha`` for a product of integers, which keeps its dtype: torch refuses
    fractional ones for ``addr`` and truncates them toward zero for the others (a float
    factor would promote the result to float32)."""
    if dtype.category != 1:
        return beta, alpha
    if op == "addr":
        for name, v in (("beta", beta), ("alpha", alpha)):
            if isinstance(v, float):
                raise RuntimeError(f"For integral input tensors, argument {name} must not be a "
                                   "floating point number.")
    return int(beta), int(alpha)


def _check_input_dtype(op: str, x: Tensor, mat: Tensor) -> None:
    """torch adds a product only to an input of the product's dtype and raises otherwise
    (``addr`` excepted: it promotes, as a broadcast multiply does)."""
    if x.dtype is not mat.dtype:
        raise RuntimeError(f"{op}: self and mat2 must have the same dtype, but got "
                           f"{x.dtype.name} and {mat.dtype.name} (input "
                           f"{x.dtype.name}{list(x.shape)}, product operand "
                           f"{mat.dtype.name}{list(mat.shape)})")


@public(torch=True, method=True, inplace=True)
def addmm(x: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * x + alpha * (mat1 @ mat2)``."""
    _check_input_dtype("addmm", x, mat2)
    beta, alpha = _integer_scalars("addmm", x.dtype, beta, alpha)
    if x.dtype in (dtypes.bfloat16, dtypes.float16) and mat1.dtype is x.dtype and \
            mat1.ndim == 2 == mat2.ndim:
        # torch's 16-bit addmm: the input added to the float32 sums, rounded once.
        _check_mm(mat1, mat2)
        wide = _scaled_sum(cast(x, dtypes.float32), float32_sums(mat1, mat2), beta, alpha)
        return _named(cast(wide, x.dtype), "AddmmBackward0")
    return _named(_scaled_sum(x, mm(mat1, mat2), beta, alpha), "AddmmBackward0")


@public(torch=True, method=True, inplace=True)
def addmv(x: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * x + alpha * (mat @ vec)``."""
    _check_input_dtype("addmv", x, vec)
    beta, alpha = _integer_scalars("addmv", x.dtype, beta, alpha)
    return _named(_scaled_sum(x, mv(mat, vec), beta, alpha), "AddmvBackward0")


@public(torch=True, method=True, inplace=True)
def addr(x: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * x + alpha * outer(vec1, vec2)``."""
    product = outer(vec1, vec2)
    beta, alpha = _integer_scalars("addr", dtypes.result_type(x, product), beta, alpha)
    return _named(_scaled_sum(x, product, beta, alpha), "AddrBackward0")


@public(torch=True, method=True, inplace=True)
def baddbmm(x: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * x + alpha * bmm(batch1, batch2)``."""
    _check_input_dtype("baddbmm", x, batch2)
    beta, alpha = _integer_scalars("baddbmm", x.dtype, beta, alpha)
    return _named(_scaled_sum(x, bmm(batch1, batch2), beta, alpha), "BaddbmmBackward0")


@public(torch=True, method=True, inplace=True)
def addbmm(x: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * x + alpha * sum_b(batch1[b] @ batch2[b])``."""
    _check_input_dtype("addbmm", x, batch2)
    # The sum over the batch keeps the operands' dtype (an integer sum would be int64).
    product = sum(bmm(batch1, batch2), 0, dtype=batch1.dtype)
    beta, alpha = _integer_scalars("addbmm", x.dtype, beta, alpha)
    return _named(_scaled_sum(x, product, beta, alpha), "AddbmmBackward0")


ger = public(outer, name="ger", torch=True, method=True)


@public(torch=True, method=True)
def inner(x: Tensor, other: Tensor) -> Tensor:
    """Sum over the last dims of both: ``x[..., k] * other[..., k]``, the free dims of ``x``
    then those of ``other``; a scalar operand multiplies."""
    if x.ndim == 0 or other.ndim == 0:
        return mul(x, other)
    if x.shape[-1] != other.shape[-1]:
        raise RuntimeError(f"inner() the last dimension must match on both input tensors but got "
                           f"shapes {list(x.shape)} and {list(other.shape)}")
    lhs = reshape(x, (-1, x.shape[-1]))
    rhs = reshape(other, (-1, other.shape[-1]))
    return reshape(mm(lhs, transpose(rhs, 0, 1)), tuple(x.shape[:-1]) + tuple(other.shape[:-1]))


@public(torch=True, method=True)
def vdot(x: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-D tensors, conjugating the first (a no-op for real ones)."""
    return dot(conj(x), other)


@public(torch=True, method=True)
def kron(x: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product: block ``(i, j)`` is ``x[i, j] * other`` (any number of dims)."""
    nd = max(x.ndim, other.ndim)
    a = reshape(x, (1,) * (nd - x.ndim) + tuple(x.shape))
    b = reshape(other, (1,) * (nd - other.ndim) + tuple(other.shape))
    # a's dims interleaved with b's: (a0, 1, a1, 1, ...) * (1, b0, 1, b1, ...).
    a_shape = [s for d in a.shape for s in (d, 1)]
    b_shape = [s for d in b.shape for s in (1, d)]
    prod = mul(reshape(a, tuple(a_shape)), reshape(b, tuple(b_shape)))
    return reshape(prod, tuple(p * q for p, q in zip(a.shape, b.shape)))


@public(torch=True, method=True)
def cross(x: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (the first dim of size 3 when None)."""
    if x.ndim != other.ndim:
        raise RuntimeError(f"linalg.cross: inputs must have the same number of dimensions. Got "
                           f"{x.ndim} and {other.ndim}")
    if dim is None:
        dim = next((d for d, n in enumerate(x.shape) if n == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    axis = normalize_axis(dim, x.ndim, "cross")
    if x.shape[axis] != 3 or other.shape[axis] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got "
                           f"{x.shape[axis]} and {other.shape[axis]}")
    a = [narrow(x, axis, i, 1) for i in range(3)]
    b = [narrow(other, axis, i, 1) for i in range(3)]
    parts = [sub(mul(a[1], b[2]), mul(a[2], b[1])), sub(mul(a[2], b[0]), mul(a[0], b[2])),
             sub(mul(a[0], b[1]), mul(a[1], b[0]))]
    return cat(parts, axis)


@public(torch=True, method=True)
def dist(x: Tensor, other: Tensor, p: float = 2) -> Tensor:
    """The ``p``-norm of ``x - other``."""
    return _named(norm(sub(x, other), p), "DistBackward0")


@public(torch=True, method=True)
def diff(x: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The ``n``-th forward difference along ``dim``, after ``prepend`` and ``append``."""
    axis = normalize_axis(dim, x.ndim, "diff")
    if prepend is not None or append is not None:
        parts = [t for t in (prepend, x, append) if t is not None]
        x = cat(parts, axis)
    for _ in range(n):
        size = x.shape[axis]
        if size == 0:
            break
        later, earlier = narrow(x, axis, 1, size - 1), narrow(x, axis, 0, size - 1)
        # bool: where neighbours differ (torch's logical_xor)
        x = ne(later, earlier) if x.dtype is dtypes.bool_ else sub(later, earlier)
    return x


@public(torch=True, method=True)
def cov(x: Tensor, *, correction: int = 1, fweights: Tensor | None = None,
        aweights: Tensor | None = None) -> Tensor:
    """The covariance of the variables in the rows of ``x`` (observations in its columns),
    with optional integer frequency weights and observation weights, as numpy.cov."""
    if x.ndim > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an "
                           f"input with {x.ndim} dimensions")
    obs = x if x.ndim == 2 else reshape(x, (1, -1))
    if not obs.dtype.is_floating_point:
        obs = obs.to(dtypes.get_default_dtype())
    w = None
    if fweights is not None:
        w = fweights
    if aweights is not None:
        w = aweights if w is None else mul(w, aweights)
    if w is None:
        n = obs.shape[1]
        avg = mean(obs, 1, keepdim=True)
        norm_factor = n - correction
    else:
        w = w.to(obs.dtype)
        w_sum = sum(w)
        avg = div(sum(mul(obs, w), 1, keepdim=True), w_sum)
        if correction == 0:
            norm_factor = w_sum
        elif aweights is None:
            norm_factor = sub(w_sum, correction)
        else:
            norm_factor = sub(w_sum, div(mul(sum(mul(w, aweights.to(obs.dtype))), correction),
                                         w_sum))
    centered = sub(obs, avg)
    weighted = centered if w is None else mul(centered, w)
    c = div(mm(weighted, transpose(centered, 0, 1)), clamp(norm_factor, min=0)
            if isinstance(norm_factor, Tensor) else max(norm_factor, 0))
    return reshape(c, ()) if x.ndim < 2 else c


@public(torch=True, method=True)
def corrcoef(x: Tensor) -> Tensor:
    """Pearson correlation coefficients of the rows of ``x``, clipped into [-1, 1]."""
    c = cov(x)
    if c.ndim == 0:
        return div(c, c)
    d = sqrt(c.diagonal())
    c = div(div(c, unsqueeze(d, 1)), unsqueeze(d, 0))
    return clamp(c, -1, 1)


@public(torch=True, method=True)
def adjoint(x: Tensor) -> Tensor:
    """The conjugate transpose of the last two dims (the transpose, for real tensors)."""
    if x.ndim < 2:
        raise RuntimeError("tensor.adjoint() is only supported on matrices or batches of matrices. "
                           f"Got {x.ndim}-D tensor.")
    return transpose(x, -2, -1)


@public(torch=True, method=True)
def matrix_power(x: Tensor, n: int) -> Tensor:
    """``x @ x @ ... @ x`` (``n`` times) by repeated squaring; ``n = 0`` gives the identity and
    a negative ``n`` a power of the inverse."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, but they "
                           f"are {x.shape[-2] if x.ndim >= 2 else x.ndim} by "
                           f"{x.shape[-1] if x.ndim else 0} matrices")
    if n == 0:
        # The identity in x's shape whatever x holds (x * 0 is NaN where x is inf or NaN),
        # with x in the graph: its gradient is zeros, as torch's.
        return where(False, x, eye(x.shape[-1], dtype=x.dtype))
    if n < 0:
        x, n = inv(x), -n
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result

