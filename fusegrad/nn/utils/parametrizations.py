"""``torch.nn.utils.parametrizations``: ``weight_norm``, ``spectral_norm`` and ``orthogonal``
written as parametrizations (:mod:`fusegrad.nn.utils.parametrize`), with torch's defaults,
state_dict keys and messages.

- ``weight_norm(m)``: ``weight = g * v / ||v||`` with the norm over every dim but ``dim``;
  ``original0`` is g, ``original1`` is v.
- ``spectral_norm(m)``: ``weight / sigma``, sigma the largest singular value of the weight
  as a matrix, estimated by power iteration (``n_power_iterations`` per training-mode
  forward; buffers ``_u`` and ``_v``).
- ``orthogonal(m)``: an orthogonal (or unitary) matrix, through the matrix exponential, the
  Cayley map or Householder reflections of the trained tensor.
"""

from __future__ import annotations

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.nn import functional as NF
from fusegrad.nn.modules.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from fusegrad.nn.modules.module import Module
from fusegrad.nn.utils import parametrize
from fusegrad.ops import decompositions as linalg
from fusegrad.ops import functional as F
from fusegrad.ops.creation import randn
from fusegrad.tensor import Tensor
from fusegrad.type_info import finfo

__all__ = ["weight_norm", "spectral_norm", "orthogonal"]


def _norm_except_dim(v: Tensor, dim: int) -> Tensor:
    """The 2-norm of ``v`` over every dim but ``dim`` (all of them for ``dim=-1``), kept
    broadcastable against ``v``."""
    if dim == -1:
        return v.norm(2)
    dims = [d for d in range(v.dim()) if d != dim % v.dim()]
    return v.pow(2).sum(dim=dims, keepdim=True).sqrt()


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return weight_v * (weight_g / _norm_except_dim(weight_v, self.dim))

    def right_inverse(self, weight: Tensor):
        return _norm_except_dim(weight, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Reparametrize ``module.<name>`` as ``g * v / ||v||`` (torch's
    ``parametrizations.weight_norm``); the magnitude ``g`` and direction ``v`` are trained.
    ``dim=None`` takes the norm of the whole tensor."""
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module


def reshape_weight_to_matrix(weight: Tensor, dim: int) -> Tensor:
    """``weight`` as the matrix whose spectral norm spectral normalization divides by: ``dim``
    (the output dim) first, every other dim flattened into the columns (a vector is one
    column)."""
    if dim != 0:
        weight = weight.permute(dim, *(d for d in range(weight.dim()) if d != dim))
    return weight.reshape(weight.shape[0], -1)


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0,
                 eps: float = 1e-12):
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError("Dimension out of range (expected to be in range of "
                             f"[-{ndim}, {ndim - 1}] but got {dim})")
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            weight_mat = reshape_weight_to_matrix(weight, self.dim)
            h, w = weight_mat.shape
            u = randn(h, dtype=weight.dtype)
            v = randn(w, dtype=weight.dtype)
            self.register_buffer("_u", NF.normalize(u, dim=0, eps=self.eps))
            self.register_buffer("_v", NF.normalize(v, dim=0, eps=self.eps))
            self._power_method(weight_mat, 15)      # start near the top singular vectors

    @no_grad()
    def _power_method(self, weight_mat: Tensor, n_power_iterations: int) -> None:
        for _ in range(n_power_iterations):
            self._u.copy_(NF.normalize(F.mv(weight_mat, self._v), dim=0, eps=self.eps))
            self._v.copy_(NF.normalize(F.mv(weight_mat.mH, self._u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.ndim == 1:
            return NF.normalize(weight, dim=0, eps=self.eps)
        weight_mat = reshape_weight_to_matrix(weight, self.dim)
        if self.training:
            self._power_method(weight_mat, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = F.vdot(u, F.mv(weight_mat, v))
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: int | None = None) -> Module:
    """Reparametrize ``module.<name>`` as itself divided by its spectral norm, estimated by
    power iteration (torch's ``parametrizations.spectral_norm``). ``dim`` is the output
    dim: 1 for transposed convolutions, else 0."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0
    parametrize.register_parametrization(
        module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module


_ORTHOGONAL_MAPS = ("matrix_exp", "cayley", "householder")


class _Orthogonal(Module):
    def __init__(self, weight: Tensor, orthogonal_map: str, *, use_trivialization: bool = True):
        super().__init__()
        if weight.is_complex() and orthogonal_map == "householder":
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape = weight.shape
        self.orthogonal_map = orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, x: Tensor) -> Tensor:
        n, k = x.size(-2), x.size(-1)
        transposed = n < k
        if transposed:                  # work on the tall matrix
            x = x.mT
            n, k = k, n
        if self.orthogonal_map in ("matrix_exp", "cayley"):
            x = x.tril()
            if n != k:
                x = F.cat([x, F.zeros(*x.shape[:-2], n, n - k, dtype=x.dtype)], dim=-1)
            a = x - x.mH                # skew-symmetric (skew-Hermitian)
            if self.orthogonal_map == "matrix_exp":
                q = linalg.matrix_exp(a)
            else:
                eye = F.eye(n, dtype=a.dtype)
                q = linalg.solve(eye - 0.5 * a, eye + 0.5 * a)
            if n != k:
                q = q[..., :k]
        else:
            a = x.tril(diagonal=-1)
            tau = 2.0 / (1.0 + (a * a).sum(dim=-2))
            q = linalg.householder_product(a, tau)
            # the diagonal's integer part picks each reflection's sign
            q = q * x.diagonal(dim1=-2, dim2=-1).int().unsqueeze(-2)
        base = self._buffers.get("base")
        if base is not None:
            q = base @ q
        return q.mT if transposed else q

    @no_grad()
    def right_inverse(self, q: Tensor) -> Tensor:
        if q.shape != self.shape:
            raise ValueError(f"Expected a matrix or batch of matrices of shape {self.shape}. "
                             f"Got a tensor of shape {q.shape}.")
        q_init = q
        n, k = q.size(-2), q.size(-1)
        transpose = n < k
        if transpose:
            q = q.mT
            n, k = k, n
        if "base" not in self._buffers:
            if self.orthogonal_map in ("matrix_exp", "cayley"):
                raise NotImplementedError("It is not possible to assign to the matrix exponential "
                                          "or the Cayley parametrizations when "
                                          "use_trivialization=False.")
            a, tau = F.geqrf(q)
            diag = a.diagonal(dim1=-2, dim2=-1)
            diag.copy_(F.where(tau == 0.0, -diag.sign(), diag.sign()))
            return a.mT if transpose else a
        if n == k:
            q = q.clone() if _is_orthogonal(q) else _make_orthogonal(q)
        else:                           # complete the columns to a square orthogonal matrix
            extra = randn(*q.shape[:-2], n, n - k, dtype=q.dtype)
            q = _make_orthogonal(F.cat([q, extra], dim=-1))
        self.base = q
        neg_id = F.zeros_like(q_init)
        neg_id.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
        return neg_id


def _is_orthogonal(q: Tensor) -> bool:
    n, k = q.size(-2), q.size(-1)
    eye = F.eye(k, dtype=q.dtype)
    return bool(F.allclose(q.mH @ q, eye, atol=10.0 * n * finfo(q.dtype).eps))


def _make_orthogonal(a: Tensor) -> Tensor:
    x, tau = F.geqrf(a)
    q = linalg.householder_product(x, tau)
    return q * x.diagonal(dim1=-2, dim2=-1).sgn().unsqueeze(-2)


def orthogonal(module: Module, name: str = "weight", orthogonal_map: str | None = None, *,
               use_trivialization: bool = True) -> Module:
    """Make ``module.<name>`` an orthogonal (unitary) matrix or batch of matrices (torch's
    ``parametrizations.orthogonal``). ``orthogonal_map`` is ``"matrix_exp"`` (the default
    for square or complex matrices), ``"cayley"`` or ``"householder"`` (the default
    otherwise). With ``use_trivialization`` the map is applied around the matrix the tensor
    had (buffer ``base``), so training starts at the registered value."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.ndim < 2:
        raise ValueError("Expected a matrix or batch of matrices. "
                         f"Got a tensor of {weight.ndim} dimensions.")
    if orthogonal_map is None:
        square = weight.size(-2) == weight.size(-1)
        orthogonal_map = "matrix_exp" if square or weight.is_complex() else "householder"
    if orthogonal_map not in _ORTHOGONAL_MAPS:
        raise ValueError('orthogonal_map has to be one of "matrix_exp", "cayley", "householder". '
                         f"Got: {orthogonal_map}")
    orth = _Orthogonal(weight, orthogonal_map, use_trivialization=use_trivialization)
    parametrize.register_parametrization(module, name, orth, unsafe=True)
    return module
