"""``BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d``."""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.nn import functional as NF
from fusegrad.nn import init
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.ops import functional as F
from fusegrad.ops.creation import empty, ones, tensor, zeros
from fusegrad.tensor import Tensor

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d",
           "InstanceNorm3d"]


class _NormBase(Module):
    """Per-channel affine parameters and running statistics, initialized as torch's: weight
    ones, bias zeros, running_mean zeros, running_var ones, num_batches_tracked 0."""

    _input_dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(empty(num_features, dtype=dtype, device=device))
            if bias:
                self.bias = Parameter(empty(num_features, dtype=dtype, device=device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", ones(num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", tensor(0, dtype=dtypes.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Zero the running mean and the batch count, and set the running variance to one."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        # torch added num_batches_tracked in its state dict version 2 and loads a state dict
        # without version metadata (a plain dict, a safetensors file, an older checkpoint)
        # that lacks it by keeping the current count, so strict loading does not fail.
        key = prefix + "num_batches_tracked"
        if self.track_running_stats and key not in state_dict:
            state_dict[key] = (self.num_batches_tracked if self.num_batches_tracked is not None
                               else tensor(0, dtype=dtypes.int64))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_input_dim(self, input: Tensor) -> None:  # noqa: A002
        if input.ndim not in self._input_dims:
            want = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"expected {want} input (got {input.ndim}D input)")

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                # the cumulative average: a tensor, so a compiled step reads the count each call
                momentum = F.reciprocal(F.cast(self.num_batches_tracked, dtypes.float64))
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return NF.batch_norm(input, self.running_mean if track else None,
                             self.running_var if track else None, self.weight, self.bias,
                             use_batch_stats, momentum, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L), per channel C.

    >>> bn = BatchNorm1d(16)     # training: batch statistics, running statistics updated
    """

    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W), per channel C."""

    _input_dims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalization of (N, C, D, H, W), per channel C."""

    _input_dims = (5,)


class _InstanceNorm(_NormBase):
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        self._check_input_dim(input)
        batched = input.ndim == self._input_dims[-1]
        x = input if batched else F.unsqueeze(input, 0)
        use_input_stats = self.training or not self.track_running_stats
        # momentum=None leaves the running statistics as they are (torch passes 0.0 here; no
        # cumulative average as in BatchNorm).
        out = NF.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                               use_input_stats, 0.0 if self.momentum is None else self.momentum,
                               self.eps)
        return out if batched else F.squeeze(out, 0)


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) or (C, L): each channel of each sample over L."""

    _input_dims = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) or (C, H, W) over H and W."""

    _input_dims = (3, 4)


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of (N, C, D, H, W) or (C, D, H, W) over D, H and W."""

    _input_dims = (4, 5)
