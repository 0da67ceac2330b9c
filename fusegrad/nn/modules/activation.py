"""Activation modules: thin wrappers over :mod:`fusegrad.nn.functional`."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.ops.creation import full
from fusegrad.tensor import Tensor

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Softmax", "LogSoftmax", "LeakyReLU",
           "Softplus", "Hardtanh", "ReLU6", "ELU", "SELU", "CELU", "Mish", "Hardswish",
           "Hardsigmoid", "PReLU", "Softsign", "Tanhshrink", "Threshold", "GLU", "Softmin"]


class ReLU(Module):
    """``max(x, 0)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """Gaussian error linear unit; ``approximate='tanh'`` uses the tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    """Hyperbolic tangent."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.tanh(input)


class Sigmoid(Module):
    """Logistic sigmoid ``1 / (1 + exp(-x))``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.sigmoid(input)


class SiLU(Module):
    """``x * sigmoid(x)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.silu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Softmax(Module):
    """Softmax along ``dim``."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """Log of the softmax along ``dim``."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.log_softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LeakyReLU(Module):
    """``x`` where positive, else ``negative_slope * x``."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardtanh(Module):
    """``x`` clamped to [min_val, max_val]."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return (f"min_val={self.min_val}, max_val={self.max_val}"
                + (", inplace=True" if self.inplace else ""))


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class _Inplace(Module):
    _fn = None

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ELU(Module):
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    """``x`` where positive, else ``alpha * (exp(x / alpha) - 1)``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.celu(input, self.alpha, self.inplace)


class SELU(_Inplace):
    """Scaled ELU with the self-normalizing constants."""

    _fn = staticmethod(NF.selu)


class Mish(_Inplace):
    """``x * tanh(softplus(x))``."""

    _fn = staticmethod(NF.mish)


class Hardswish(_Inplace):
    """``x * relu6(x + 3) / 6``."""

    _fn = staticmethod(NF.hardswish)


class Hardsigmoid(_Inplace):
    """``relu6(x + 3) / 6``."""

    _fn = staticmethod(NF.hardsigmoid)


class PReLU(Module):
    """``x`` where positive, else ``weight * x``, with a learned slope (one, or one per
    channel), initialized to ``init``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(full((num_parameters,), init, dtype=dtype, device=device))

    def reset_parameters(self) -> None:
        self.weight.data.fill_(self.init)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softsign(Module):
    """``x / (1 + |x|)``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.softsign(input)


class LogSigmoid(Module):
    """``log(sigmoid(x))``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.logsigmoid(input)


class _Shrink(Module):
    """An activation of one threshold ``lambd``, applied by ``_fn``."""

    _fn = None

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return self._fn(input, self.lambd)

    def extra_repr(self) -> str:
        return str(self.lambd)


class Softshrink(_Shrink):
    """``x -+ lambd`` outside ``[-lambd, lambd]``, else 0."""

    _fn = staticmethod(NF.softshrink)


class Hardshrink(_Shrink):
    """``x`` outside ``[-lambd, lambd]``, else 0."""

    _fn = staticmethod(NF.hardshrink)


class Tanhshrink(Module):
    """``x - tanh(x)``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.tanhshrink(input)


class Threshold(Module):
    """``x`` where ``x > threshold``, else ``value``."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return (f"threshold={self.threshold}, value={self.value}"
                + (", inplace=True" if self.inplace else ""))


class GLU(Module):
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(Module):
    """Softmax of ``-x`` along ``dim``."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.softmin(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
