"""``Linear``, ``Identity`` and ``Flatten``."""

from __future__ import annotations

import math

from fusegrad.nn import functional as NF
from fusegrad.nn import init
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.ops import functional as F
from fusegrad.ops.creation import empty
from fusegrad.tensor import Tensor

__all__ = ["Identity", "Linear", "NonDynamicallyQuantizableLinear", "Bilinear", "Flatten",
           "Unflatten"]


class Identity(Module):
    """Returns its input; any constructor arguments are ignored (a placeholder)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape (out_features, in_features).

    Initialized as torch does: ``kaiming_uniform_(weight, a=sqrt(5))``, which is
    U(-1/sqrt(in), 1/sqrt(in)), and the bias uniform in the same bound.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty((out_features, in_features), dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh weights with torch's default initialization."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """A Linear by another name: torch's class of ``MultiheadAttention.out_proj`` (it keeps
    torch's quantization from swapping that layer), so that printed models match torch's."""


class Bilinear(Module):
    """``y = x1^T A x2 + b`` with ``weight`` A of shape (out_features, in1_features,
    in2_features); weight and bias initialized U(-1/sqrt(in1), 1/sqrt(in1)) as torch does."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        self.weight = Parameter(empty((out_features, in1_features, in2_features), dtype=dtype,
                                      device=device))
        if bias:
            self.bias = Parameter(empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh weights with torch's default initialization."""
        if self.in1_features <= 0:
            raise ValueError(f"in1_features must be > 0, but got (in1_features="
                             f"{self.in1_features})")
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return NF.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")

class Flatten(Module):
    """Flatten dims ``start_dim`` .. ``end_dim`` into one (the batch dim 0 is kept)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.flatten(input, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        self.dim = dim
        self.unflattened_size = tuple(unflattened_size)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.unflatten(input, self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
