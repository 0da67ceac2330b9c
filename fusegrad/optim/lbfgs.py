"""L-BFGS: limited-memory BFGS with an optional strong-Wolfe line search, as
``torch.optim.LBFGS`` runs it (Nocedal and Wright, Numerical Optimization, algorithms 7.4,
3.5 and 3.6).

Every parameter is one flat vector here: the gradient is gathered into one tensor, the
search direction is one tensor, and the update is spread back over the parameters. The
scalars of the recursion (curvature products, step lengths) are 0-d tensors of the
parameters' dtype, as in torch, so the two agree to rounding; each iteration reads values on
the host (comparisons against tolerances), so a compiled function that calls ``step`` runs
it eagerly.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad.autograd.grad_mode import enable_grad, no_grad
from fusegrad.ops import functional as F
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer
from fusegrad.tensor import Tensor

__all__ = ["LBFGS"]


class LBFGS(Optimizer):
    """``torch.optim.LBFGS(params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
    tolerance_change=1e-9, history_size=100, line_search_fn=None)``.

    ``step(closure)`` runs up to ``max_iter`` iterations (and ``max_eval`` closure calls):
    the direction is the two-loop recursion over the last ``history_size`` curvature pairs;
    the step is ``lr`` (scaled by ``1 / |g|_1`` on the very first iteration), or the one a
    strong-Wolfe line search finds (``line_search_fn="strong_wolfe"``). It stops early when
    the gradient's largest element is at most ``tolerance_grad``, or the step or the change
    of loss falls under ``tolerance_change``. Returns the closure's first loss.
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1, max_iter: int = 20,
                 max_eval: int | None = None, tolerance_grad: float = 1e-7,
                 tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                    "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                    "history_size": history_size, "line_search_fn": line_search_fn}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    # ------------------------------------------------------------------ flat views

    def _flat_grad(self) -> Tensor:
        parts = [F.zeros(p.numel(), dtype=p.dtype) if p.grad is None else p.grad.reshape(-1)
                 for p in self._params]
        return F.cat(parts, 0)

    def _add_grad(self, step: float | Tensor, direction: Tensor) -> None:
        """``params += step * direction``, the flat direction spread over the parameters."""
        offset = 0
        for p in self._params:
            n = p.numel()
            p.add_(F.mul(direction[offset:offset + n].view_as(p), step))
            offset += n

    def _evaluate_at(self, closure: Callable, origin: list[Tensor], step, direction: Tensor):
        """The loss and flat gradient at ``origin + step * direction``; the parameters are
        put back to ``origin``."""
        self._add_grad(step, direction)
        loss = float(closure())
        grad = self._flat_grad()
        for p, value in zip(self._params, origin):
            p.copy_(value)
        return loss, grad

    # ------------------------------------------------------------------ step

    @no_grad()
    def step(self, closure: Callable[[], Any]):  # noqa: C901 - torch's loop, one piece
        """Run the iterations; ``closure`` clears the gradients, computes the loss, calls
        ``backward()`` and returns the loss."""
        if closure is None:
            raise RuntimeError("LBFGS.step() requires a closure that reevaluates the model and "
                               "returns the loss")
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        history_size, line_search = group["history_size"], group["line_search_fn"]
        if line_search is not None and line_search != "strong_wolfe":
            raise RuntimeError("only 'strong_wolfe' is supported")

        def evaluate():
            with enable_grad():
                return closure()

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = evaluate()
        loss = float(orig_loss)
        evals = 1
        state["func_evals"] += 1
        flat_grad = self._flat_grad()
        if bool(flat_grad.abs().max() <= tol_grad):
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        h_diag, prev_flat_grad = state.get("H_diag"), state.get("prev_flat_grad")
        prev_loss = state.get("prev_loss")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d = flat_grad.neg()
                old_dirs, old_stps, ro, h_diag = [], [], [], 1
            else:
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = y.dot(s)
                if bool(ys > 1e-10):          # keep the pair only where curvature is positive
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)
                d = _two_loop(flat_grad, old_dirs, old_stps, ro, h_diag,
                              state.setdefault("al", [None] * history_size))
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr
            else:
                t = lr
            gtd = flat_grad.dot(d)
            if bool(gtd > -tol_change):       # not a descent direction
                break

            ls_evals = 0
            if line_search is not None:
                origin = [p.clone() for p in self._params]
                loss, flat_grad, t, ls_evals = _strong_wolfe(
                    lambda step, origin=origin, d=d: self._evaluate_at(evaluate, origin, step, d),
                    t, d, loss, flat_grad, gtd)
                self._add_grad(t, d)
                opt_cond = bool(flat_grad.abs().max() <= tol_grad)
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = float(evaluate())
                    flat_grad = self._flat_grad()
                    opt_cond = bool(flat_grad.abs().max() <= tol_grad)
                    ls_evals = 1
            evals += ls_evals
            state["func_evals"] += ls_evals

            if n_iter == max_iter or evals >= max_eval or opt_cond:
                break
            if bool(d.mul(t).abs().max() <= tol_change) or abs(loss - prev_loss) < tol_change:
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss


def _two_loop(grad: Tensor, dirs: list, stps: list, ro: list, h_diag, al: list) -> Tensor:
    """The L-BFGS direction ``-H g`` by the two-loop recursion over the curvature pairs
    (``dirs`` are gradient changes y, ``stps`` parameter steps s, ``ro`` = 1 / y.s)."""
    q = grad.neg()
    for i in range(len(dirs) - 1, -1, -1):
        al[i] = stps[i].dot(q) * ro[i]
        q.sub_(F.mul(dirs[i], al[i]))
    r = F.mul(q, h_diag)
    for i in range(len(dirs)):
        be_i = dirs[i].dot(r) * ro[i]
        r.add_(F.mul(stps[i], al[i] - be_i))
    return r


def _cubic_minimum(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimizer of the cubic through ``(x1, f1)`` and ``(x2, f2)`` with slopes ``g1``,
    ``g2``, clamped to ``bounds`` (default: between x1 and x2); their midpoint when the cubic
    has no minimum."""
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if bool(d2_square >= 0):
        d2 = d2_square.sqrt()
        if x1 <= x2:
            x = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            x = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(x, lo), hi)
    return (lo + hi) / 2.0


def _strong_wolfe(evaluate: Callable, t, d: Tensor, f: float, g: Tensor, gtd,  # noqa: C901
                  c1: float = 1e-4, c2: float = 0.9, tolerance_change: float = 1e-9,
                  max_ls: int = 25):
    """A step length ``t`` along ``d`` meeting the strong Wolfe conditions (sufficient
    decrease ``c1``, curvature ``c2``): bracket, then zoom with cubic interpolation.
    ``evaluate(t)`` returns the loss and flat gradient there. Returns the loss, gradient and
    step chosen, and the number of evaluations."""
    d_norm = d.abs().max()
    g = g.clone()
    f_new, g_new = evaluate(t)
    evals = 1
    gtd_new = g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    bracket = bracket_f = bracket_g = bracket_gtd = None
    while ls_iter < max_ls:
        if bool(f_new > (f + c1 * t * gtd)) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if bool(abs(gtd_new) <= -c2 * gtd):
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if bool(gtd_new >= 0):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        # extrapolate: a cubic step between 1.01 t and 10 t
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        t_prev, t = t, _cubic_minimum(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                                      bounds=(min_step, max_step))
        f_prev, g_prev, gtd_prev = f_new, g_new.clone(), gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # zoom: shrink the bracket until a point meets both conditions
    insufficient = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if bool(abs(bracket[1] - bracket[0]) * d_norm < tolerance_change):
            break
        t = _cubic_minimum(bracket[0], bracket_f[0], bracket_gtd[0],
                           bracket[1], bracket_f[1], bracket_gtd[1])
        # keep away from the bracket's ends: a point within 10% of one makes little progress
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insufficient or t >= max(bracket) or t <= min(bracket):
                t = (max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket))
                     else min(bracket) + eps)
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
        if bool(f_new > (f + c1 * t * gtd)) or f_new >= bracket_f[low]:
            bracket[high], bracket_f[high] = t, f_new
            bracket_g[high], bracket_gtd[high] = g_new.clone(), gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if bool(abs(gtd_new) <= -c2 * gtd):
                done = True
            elif bool(gtd_new * (bracket[high] - bracket[low]) >= 0):
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low] = t, f_new
            bracket_g[low], bracket_gtd[low] = g_new.clone(), gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals
