"""SparseAdam (torch/optim/sparse_adam.py): Adam masked to the rows a sparse gradient holds.

torch's SparseAdam updates only from gradients of the sparse COO layout, which only a
backward such as ``nn.Embedding(sparse=True)``'s makes, and refuses dense gradients.
fusegrad has no sparse layout (its ``Embedding`` refuses ``sparse=True``), so every gradient
is dense: the optimizer is constructed, validated, saved and loaded as torch's, and its
``step`` raises torch's error for a dense gradient, which points to Adam.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer

__all__ = ["SparseAdam"]


class SparseAdam(Optimizer):
    """``torch.optim.SparseAdam``, for sparse gradients; with fusegrad's dense gradients its
    ``step`` raises torch's ``RuntimeError`` (use :class:`fusegrad.optim.Adam`)."""

    # Checked here with torch's own message (a ValueError naming the parameters).
    _takes_complex_params = True

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False) -> None:
        check_tensor_lr(lr)
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "maximize": maximize}
        super().__init__(params, defaults)
        complex_params = [[i, j] for i, group in enumerate(self.param_groups)
                          for j, p in enumerate(group["params"]) if p.is_complex()]
        if complex_params:
            raise ValueError(f"Complex params at indices {complex_params}: SparseAdam does not "
                             f"support complex parameters")

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """Evaluate the closure; raise torch's error for the first parameter with a gradient
        (every fusegrad gradient is dense). With no gradients it does nothing, as torch."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    raise RuntimeError("SparseAdam does not support dense gradients, please "
                                       "consider Adam instead")
        return loss
