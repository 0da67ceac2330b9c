"""``fusegrad.amp.GradScaler``: loss scaling for float16 training (torch.amp.GradScaler).

::

    scaler = fusegrad.amp.GradScaler("cpu")
    for x, y in data:
        optimizer.zero_grad()
        with fusegrad.autocast("cpu", dtype=fusegrad.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()       # gradients of loss * scale
        scaler.unscale_(optimizer)          # optional: clip the true gradients here
        scaler.step(optimizer)              # skipped when a gradient holds inf or NaN
        scaler.update()                     # backoff after an overflow, growth after a run

The scale and the count of steps since the last overflow are tensors, updated by tensor
ops as torch's ``_amp_update_scale_`` does. Eagerly, :meth:`step`'s decision whether to call
``optimizer.step()`` reads one value back to the host (``found_inf.item()``, as torch's). In a
compiled function the whole iteration is one graph: the step always runs, and each parameter
and optimizer state tensor (step counters included) then takes ``where(found_inf, old, new)``,
so a skipped step leaves them as they were without a host round trip.
"""

from __future__ import annotations

import functools
import warnings
from collections import defaultdict
from enum import Enum
from typing import Any

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.creation import full
from fusegrad.tensor import Tensor

__all__ = ["OptState", "GradScaler"]

_FIX = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _FirstValues(dict):
    """An optimizer's state for one parameter that remembers, for each entry made while a
    traced step runs, the value it held when it was made (what a skipped step restores)."""

    def __init__(self, gradients: set, *args: Any) -> None:
        super().__init__(*args)
        self.gradients = gradients
        self.first: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self and key not in self.first:
            self.first[key] = _initial_value(value, self.gradients)
        super().__setitem__(key, value)


def _initial_value(value: Any, gradients: set) -> Any:
    """What a skipped first step leaves in a state entry the step made: the value it was made
    with (zeros, the learning rate, a step count of 0), copied before the step updates it; a
    zero tensor for an entry made from a gradient (SGD's momentum buffer, which torch leaves
    absent: a zero buffer steps the same without dampening)."""
    if not isinstance(value, Tensor):
        return value
    if value._trace is not None and _reaches(value._value, gradients):
        return F.zeros_like(value)
    return F.clone(value)


def _reaches(value, targets: set) -> bool:
    """Whether graph value ``value`` is one of ``targets`` or computed from one of them."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v in targets:
            return True
        if id(v) in seen or getattr(v, "producer", None) is None:
            continue
        seen.add(id(v))
        todo.extend(v.producer.inputs)
    return False


def _step_unless(optimizer, skip: Tensor, args: tuple, kwargs: dict) -> Any:
    """``optimizer.step(*args, **kwargs)`` traced, then every parameter and state tensor set to
    ``where(skip, old, new)``: torch's skipped step as graph nodes (``skip`` is a 0-d bool
    tensor known only when the compiled function runs)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state
    with no_grad():
        old_params = [F.clone(p) for p in params]
        old_state = {p: {k: F.clone(v) if isinstance(v, Tensor) else v for k, v in s.items()}
                     for p, s in state.items()}
    gradients = {p.grad._value for p in params if p.grad is not None and p.grad._trace is not None}
    factory = getattr(state, "default_factory", None)
    for p in list(state):
        state[p] = _FirstValues(gradients, state[p])
    if factory is not None:
        state.default_factory = functools.partial(_FirstValues, gradients)
    try:
        retval = optimizer.step(*args, **kwargs)
    finally:
        if factory is not None:
            state.default_factory = factory
        firsts = {}
        for p, s in list(state.items()):
            if isinstance(s, _FirstValues):
                firsts[p] = s.first
                state[p] = dict(s)
    with no_grad():
        for p, old in zip(params, old_params):
            F.assign_(p, F.where(skip, old, p))
        for p, s in state.items():
            for key, new in s.items():
                old = old_state.get(p, {}).get(key, _MISSING)
                if old is _MISSING:
                    old = firsts.get(p, {}).get(key, _MISSING)
                if not isinstance(new, Tensor):
                    if old is not _MISSING and old != new:
                        primitive.refuse_traced(f"GradScaler.step(): {type(optimizer).__name__}'s "
                                                f"state {key!r} changed as a Python value")
                    continue
                if old is _MISSING:
                    old = F.zeros_like(new)
                F.assign_(new, F.where(skip, old, new))
    return retval


_MISSING = object()


def non_finite_check_and_unscale_(grads: list[Tensor], found_inf: Tensor, inv_scale: Tensor) -> Tensor:
    """Multiply each of ``grads`` by ``inv_scale`` in place and return ``found_inf`` raised to 1
    when one of them holds an inf or NaN (torch's ``_amp_foreach_non_finite_check_and_unscale_``,
    which writes ``found_inf`` in place; here the result is returned, a tensor op)."""
    for g in grads:
        bad = F.logical_not(F.all(F.isfinite(g)))
        found_inf = F.maximum(found_inf, bad.to(dtypes.float32))
        F.assign_(g, F.mul(g, inv_scale.to(g.dtype)))
    return found_inf


def update_scale(scale: Tensor, growth_tracker: Tensor, found_inf: Tensor, growth_factor: float,
                 backoff_factor: float, growth_interval: int) -> tuple[Tensor, Tensor]:
    """The next scale and growth tracker (torch's ``_amp_update_scale_``): after an overflow the
    scale times ``backoff_factor`` and the tracker 0; after ``growth_interval`` clean steps in a
    row the scale times ``growth_factor`` (kept only while finite) and the tracker 0."""
    overflow = F.gt(found_inf, 0.0)
    successful = F.add(growth_tracker, 1)
    grow = F.eq(successful, growth_interval)
    grown = F.mul(scale, growth_factor)
    grown = F.where(F.isfinite(grown), grown, scale)
    new_scale = F.where(overflow, F.mul(scale, backoff_factor), F.where(grow, grown, scale))
    new_tracker = F.where(F.logical_or(overflow, grow), F.zeros_like(successful), successful)
    return new_scale, new_tracker


class GradScaler:
    """Scale the loss so that small float16 gradients do not flush to zero, unscale the
    gradients before the optimizer sees them, skip steps whose gradients overflowed, and
    adapt the scale (torch.amp.GradScaler, with its defaults and errors)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if self._device == "cuda":
            from fusegrad.runtime import cuda as cuda_runtime  # optional: loads the CUDA runtime
            if enabled and not cuda_runtime.is_available():
                warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                              stacklevel=2)
                self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale: Tensor | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: Tensor | None = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
            self._make_storage()

    def _make_storage(self) -> None:
        """Make the scale and growth tracker tensors now, on ``device``; the first
        :meth:`scale` adopts them (torch makes them there). Made before any compiled function
        that calls :meth:`scale` is traced, they are state the graph reads at each call and
        writes back; made while tracing, they would be constants of the graph, and the
        scale that :meth:`update` changes would never reach the compiled backward."""
        self._storage = (full((), self._init_scale, dtype=dtypes.float32, device=self._device),
                         full((), self._init_growth_tracker, dtype=dtypes.int32, device=self._device))

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[Tensor, Tensor]:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + _FIX)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + _FIX)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self, dev) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        scale, tracker = self._storage
        if scale.device != dev:
            scale = full((), self._init_scale, dtype=dtypes.float32, device=dev)
            tracker = full((), self._init_growth_tracker, dtype=dtypes.int32, device=dev)
        self._scale, self._growth_tracker = scale, tracker

    def scale(self, outputs):
        """``outputs`` (a tensor, or an iterable of them) times the current scale."""
        if not self._enabled:
            return outputs

        def apply_scale(val):
            if isinstance(val, Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(val.device)
                return F.mul(val, self._scale.to(val.device))
            if isinstance(val, (list, tuple)):
                return type(val)(map(apply_scale, val))
            if hasattr(val, "__iter__"):
                return map(apply_scale, val)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")
        return apply_scale(outputs)

    def _unscale_grads_(self, optimizer, inv_scale: Tensor, found_inf: Tensor,
                        allow_fp16: bool) -> dict:
        per_device_and_dtype: dict = defaultdict(lambda: defaultdict(list))
        with no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == dtypes.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    per_device_and_dtype[param.grad.device][param.grad.dtype].append(param.grad)
            found = {}
            for device, per_dtype in per_device_and_dtype.items():
                dev_found = found_inf.to(device)
                for grads in per_dtype.values():
                    dev_found = non_finite_check_and_unscale_(grads, dev_found, inv_scale.to(device))
                found[device] = dev_found
        return found

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (once per :meth:`update`),
        recording whether one holds an inf or NaN; call it before clipping gradients."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # The reciprocal in float64, rounded once to float32 (torch's).
        inv_scale = F.reciprocal(self._scale.to(dtypes.float64)).to(dtypes.float32)
        found_inf = full((), 0.0, dtype=dtypes.float32, device=self._scale.device)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED

    def step(self, optimizer, *args: Any, **kwargs: Any):
        """Unscale ``optimizer``'s gradients (unless :meth:`unscale_` did) and call
        ``optimizer.step(*args, **kwargs)`` unless one of them holds an inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = None
        found = list(optimizer_state["found_inf_per_device"].values())
        if primitive.compiling():
            combined = found[0]
            for f in found[1:]:
                combined = F.add(combined, f.to(combined.device))
            retval = _step_unless(optimizer, F.gt(combined, 0.0), args, kwargs)
        elif not sum(v.item() for v in found):
            retval = optimizer.step(*args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Back the scale off after a step that overflowed, grow it after ``growth_interval``
        clean steps; or set it to ``new_scale``."""
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                F.fill_(self._scale, new_scale)
            else:
                reason = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                          "torch.FloatTensor with requires_grad=False.")
                if new_scale.device.type != self._device or new_scale.numel() != 1 or \
                        new_scale.requires_grad is True:
                    raise AssertionError(reason)
                F.assign_(self._scale, new_scale.reshape(()).to(dtypes.float32))
        else:
            found_infs = [found_inf.to(_scale.device) for state in self._per_optimizer_states.values()
                          for found_inf in state["found_inf_per_device"].values()]
            if len(found_infs) == 0:
                raise AssertionError("No inf checks were recorded prior to update.")
            if not primitive.compiling() and any(f._trace is not None for f in found_infs):
                raise RuntimeError("GradScaler.update() outside the compiled function whose step() "
                                   "checked the gradients: that check is a value of its graph. Call "
                                   "update() in the same compiled function as step().")
            found_inf_combined = found_infs[0]
            for f in found_infs[1:]:
                found_inf_combined = F.add(found_inf_combined, f)
            with no_grad():
                new, tracker = update_scale(_scale, _growth_tracker, found_inf_combined, self._growth_factor,
                                            self._backoff_factor, self._growth_interval)
                F.assign_(_scale, new)
                F.assign_(_growth_tracker, tracker)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _get_scale_async(self) -> Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None \
                else int(self._growth_tracker.item())
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """The scale, the factors, the interval and the tracker ({} when disabled)."""
        if self._enabled:
            return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                    "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                    "_growth_tracker": self._get_growth_tracker()}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            F.fill_(self._scale, state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            F.fill_(self._growth_tracker, state_dict["_growth_tracker"])
        else:
            self._make_storage()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError("A GradScaler instance may only be pickled at the beginning "
                                     "of an iteration, or at the end after scaler.update().")
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
            state["_storage"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._enabled:
            self._make_storage()
