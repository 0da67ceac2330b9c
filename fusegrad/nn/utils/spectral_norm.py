"""``torch.nn.utils.spectral_norm`` and ``remove_spectral_norm``: the older, hook-based
spectral normalization (torch recommends :func:`fusegrad.nn.utils.parametrizations.spectral_norm`
for new code). ``module.weight`` becomes ``weight_orig / sigma``, recomputed by a forward
pre-hook; ``weight_orig`` is the parameter, ``weight_u`` and ``weight_v`` the buffers that
hold the power iteration's singular vector estimates (the state_dict keys torch has)."""

from __future__ import annotations

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.nn import functional as NF
from fusegrad.nn.modules.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.nn.utils.parametrizations import reshape_weight_to_matrix
from fusegrad.ops import functional as F
from fusegrad.ops.creation import randn
from fusegrad.tensor import Tensor

__all__ = ["SpectralNorm", "spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
    """The forward pre-hook that recomputes ``module.<name>`` as ``<name>_orig / sigma``,
    after ``n_power_iterations`` steps of power iteration on ``<name>_u`` and ``<name>_v`` in
    training mode (evaluation mode uses the stored vectors as they are)."""

    _version: int = 1

    def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0,
                 eps: float = 1e-12) -> None:
        self.name, self.dim, self.eps = name, dim, eps
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.n_power_iterations = n_power_iterations

    def compute_weight(self, module: Module, do_power_iteration: bool) -> Tensor:
        weight = getattr(module, self.name + "_orig")
        u = getattr(module, self.name + "_u")
        v = getattr(module, self.name + "_v")
        weight_mat = reshape_weight_to_matrix(weight, self.dim)
        if do_power_iteration:
            # v first, then u (the parametrization's order is the reverse); the buffers are
            # updated in place and the weight's gradient sees clones of them, as in torch.
            with no_grad():
                for _ in range(self.n_power_iterations):
                    v.copy_(NF.normalize(F.mv(weight_mat.t(), u), dim=0, eps=self.eps))
                    u.copy_(NF.normalize(F.mv(weight_mat, v), dim=0, eps=self.eps))
            u, v = u.clone(), v.clone()
        sigma = F.dot(u, F.mv(weight_mat, v))
        return weight / sigma

    def remove(self, module: Module) -> None:
        with no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        delattr(module, self.name)
        delattr(module, self.name + "_u")
        delattr(module, self.name + "_v")
        delattr(module, self.name + "_orig")
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module: Module, inputs) -> None:
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    @staticmethod
    def apply(module: Module, name: str, n_power_iterations: int, dim: int,
              eps: float) -> "SpectralNorm":
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, SpectralNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two spectral_norm hooks on the same "
                                   f"parameter {name}")
        fn = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters[name]
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        with no_grad():
            h, w = reshape_weight_to_matrix(weight, fn.dim).shape
            u = NF.normalize(randn(h, dtype=weight.dtype, device=weight.device), dim=0,
                             eps=fn.eps)
            v = NF.normalize(randn(w, dtype=weight.dtype, device=weight.device), dim=0,
                             eps=fn.eps)
        delattr(module, fn.name)
        module.register_parameter(fn.name + "_orig", weight)
        # a plain attribute until the first forward recomputes it (torch's weight.data)
        setattr(module, fn.name, weight.detach())
        module.register_buffer(fn.name + "_u", u)
        module.register_buffer(fn.name + "_v", v)
        module.register_forward_pre_hook(fn)
        return fn


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: int | None = None) -> Module:
    """Divide ``module.<name>`` by its spectral norm (the largest singular value of the weight
    as a ``dim``-by-rest matrix), estimated by power iteration before every forward; ``dim``
    is 1 for transposed convolutions, else 0.

    >>> m = spectral_norm(nn.Linear(20, 40))
    >>> m.weight_u.size()
    fusegrad.Size([40])
    """
    if dim is None:
        dim = 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Fold ``<name>_orig / sigma`` (the stored vectors, no further iteration) back into one
    parameter ``<name>`` and drop the hook and the buffers."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, SpectralNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"spectral_norm of '{name}' not found in {module}")
