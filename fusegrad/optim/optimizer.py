"""``Optimizer``: parameter groups, per-parameter state, and torch's state-dict layout.

Updates happen under ``no_grad`` with in-place tensor ops (``add_``, ``mul_``, ``copy_``),
so that a traced training step sees each one as an assignment to a parameter or a state
tensor, which functionalization turns into an output written back.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import defaultdict
from itertools import chain
from typing import Any, Callable, Iterable

import numpy as np

from fusegrad import dtypes, profiling
from fusegrad.autograd.grad_mode import enable_grad
from fusegrad.autograd.grad_utils import clear_grads
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.interop import checkpoint_tensor
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["Optimizer", "required"]

_ARRAY_DTYPES = (dtypes.float32, dtypes.float64)


def _captured_step(step: Callable) -> Callable:
    """Wrap a subclass's ``step`` so that, inside a compiled function being traced, the
    trace sees the optimizer: its learning rates become inputs read at each call and the
    structure of its state is guarded (fusegrad.tracer.capture)."""
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        if not primitive.compiling():
            if profiling.recorder is None:
                return step(self, *args, **kwargs)
            name = type(self).__name__
            with profiling.Span(profiling.recorder, f"Optimizer.step#{name}.step"):
                return step(self, *args, **kwargs)
        token = primitive.enter_optimizer(self)
        # Optimizers whose eager step reads the step count with .item() take their
        # capturable branch (tensor math on the step) while traced.
        flipped = [g for g in self.param_groups if self._capturable_when_compiled
                   and g.get("capturable") is False]
        for g in flipped:
            g["capturable"] = True
        try:
            return step(self, *args, **kwargs)
        finally:
            for g in flipped:
                g["capturable"] = False
            primitive.exit_optimizer(token)
    return wrapper


class _RequiredParameter:
    """Marks a hyperparameter that every param group must give (e.g. a required ``lr``)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _typename(obj) -> str:
    if isinstance(obj, Tensor):
        return obj.type()
    return type(obj).__qualname__


# In-place helpers with torch's arithmetic; torch's kernels evaluate them in this order.

def lerp_(t: Tensor, end: Tensor, weight: float | Tensor) -> Tensor:
    """``t += weight * (end - t)``, computed from the nearer end as torch's lerp kernel
    (elementwise for a tensor weight: a compiled step's ``1 - beta1``, an input)."""
    if isinstance(weight, Tensor):
        diff = F.sub(end, t)
        return t.copy_(F.where(F.lt(F.abs(weight), 0.5), F.add(t, F.mul(diff, weight)),
                               F.sub(end, F.mul(diff, F.rsub(weight, 1)))))
    if abs(weight) < 0.5:
        return t.add_(F.mul(F.sub(end, t), weight))
    return t.copy_(F.sub(end, F.mul(F.sub(end, t), 1 - weight)))


def addcmul_(t: Tensor, a: Tensor, b: Tensor, value: float = 1.0) -> Tensor:
    """``t += value * a * b``."""
    return t.add_(F.mul(F.mul(a, value), b))


def addcdiv_(t: Tensor, a: Tensor, b: Tensor, value: float = 1.0) -> Tensor:
    """``t += value * a / b``."""
    return t.add_(F.div(F.mul(a, value), b))


def eager_arrays(*tensors: Tensor | None) -> list | None:
    """The numpy arrays of ``tensors`` when an update may run on them directly, else None.

    An eager update (not traced, not captured by a compiled function) of float32 or float64
    tensors of one dtype and shape held in numpy arrays (on the CPU), none a view or
    read-only, computes with numpy ufuncs exactly what the tensor ops compute: the same
    ufuncs in the same order, with each Python scalar first rounded to the tensors' dtype,
    as the ops' promotion does. It skips their dispatch, autograd checks and out-of-place
    copies (torch's fused multi-tensor path plays that part there). None entries are passed
    through. Callers bump version counters as the in-place ops would.
    """
    if primitive.compiling():
        return None
    first = next(t for t in tensors if t is not None)
    dtype, shape = first._dtype, first._data.shape
    if dtype not in _ARRAY_DTYPES:
        return None
    arrays = []
    for t in tensors:
        if t is None:
            arrays.append(None)
            continue
        a = t._data
        if (t._trace is not None or t._dtype is not dtype or t._base is not None
                or type(a) is not np.ndarray or a.shape != shape or not a.flags.writeable):
            return None
        arrays.append(a)
    return arrays


def is_nonzero(value: float | Tensor) -> bool:
    """Whether a hyperparameter such as momentum is nonzero. A compiled step reads a nonzero
    float momentum at each call as a 0-d graph input (its value unknown while tracing); the
    trace's guard recompiles if it becomes zero, so such an input counts as nonzero."""
    if primitive.is_scalar_input(value):
        return True
    return bool(value != 0)


def eager_scalar(value):
    """A one-element tensor hyperparameter (a tensor ``lr``) as a Python number in an eager
    step, as torch's ``_to_scalar`` does for optimizers whose update takes Python floats; a
    traced step keeps it a tensor (its value is known at call time only)."""
    if isinstance(value, Tensor) and not primitive.compiling():
        return value.item()
    return value


def plain_scalars(*values) -> bool:
    """Whether every hyperparameter is a Python int or float (a tensor or numpy scalar
    promotes differently, so it takes the tensor ops)."""
    return all(type(v) is float or type(v) is int for v in values)


class Optimizer:
    """Base class of optimizers (``torch.optim.Optimizer``).

    ``params`` is an iterable of tensors, or of dicts (param groups) each with a
    ``"params"`` entry and optional per-group hyperparameters overriding ``defaults``.
    Subclasses implement :meth:`step`; per-parameter state lives in ``self.state[param]``.
    """

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: torch's names fusegrad lacks say so.
        raise _missing_attribute("torch.optim.Optimizer", type(self).__name__, name)

    # Set by optimizers whose capturable branch is what a traced step should run.
    _capturable_when_compiled = False
    # The float hyperparameters a compiled step reads at each call (graph inputs), so that a
    # scheduler changes them without a recompile: "lr", and where the step does no Python
    # control flow on their values, "momentum" or "betas" (beta1). A user's optimizer keeps
    # the lr only: its step may well test ``momentum > 0``.
    graph_hyperparameters: tuple[str, ...] = ("lr",)
    # Whether the update is right for complex parameters as written: true of updates linear
    # in the gradient (SGD's). torch runs the others on the parameters' real views
    # (view_as_real); fusegrad's do not yet, and refuse complex parameters.
    _takes_complex_params = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None:
            cls.step = _captured_step(step)

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got " + _typename(params))
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        text = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            text += f"\nParameter Group {i}\n"
            for key in sorted(group):
                if key != "params":
                    text += f"    {key}: {group[key]}\n"
        return text + ")"

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (with its own hyperparameters) to optimize."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            param_group["params"] = list(params)
        names = [p[0] for p in param_group["params"] if isinstance(p, tuple)]
        param_group["params"] = [p[1] if isinstance(p, tuple) else p
                                 for p in param_group["params"]]
        if names:
            if len(names) != len(param_group["params"]):
                raise ValueError("all optimizer params should be with/without names. Some param "
                                 "names are missing")
            param_group["param_names"] = names
        for p in param_group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                + _typename(p))
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
            if p.is_complex() and not self._takes_complex_params:
                raise NotImplementedError(
                    f"{type(self).__name__}: complex parameters are not supported by fusegrad's "
                    f"{type(self).__name__} (got one of {p.dtype}, shape {list(p.shape)}); keep "
                    f"the parameter real with a last dimension of 2 and take view_as_complex of "
                    f"it in the forward, or use SGD")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        ids = [id(p) for p in param_group["params"]]
        if len(ids) != len(set(ids)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in "
                          "future, this will cause an error; see "
                          "github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if existing & set(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized tensors: to None (default), or to zero."""
        params = (p for group in self.param_groups for p in group["params"])
        if profiling.recorder is None or primitive.compiling():
            clear_grads(params, set_to_none)
            return
        name = type(self).__name__
        with profiling.Span(profiling.recorder, f"Optimizer.zero_grad#{name}.zero_grad"):
            clear_grads(params, set_to_none)

    def step(self, closure: Callable[[], Any] | None = None):
        """Perform one update; ``closure`` re-evaluates the model and returns the loss."""
        raise NotImplementedError

    def _eval_closure(self, closure: Callable[[], Any] | None):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    # ------------------------------------------------------------------ state dict

    def state_dict(self) -> dict[str, Any]:
        """``{'state': {index: {...}}, 'param_groups': [{..., 'params': [index, ...]}]}``:
        parameters are replaced by their position across all groups, as in torch."""
        mapping: dict[int, int] = {}
        start = 0

        def pack(group: dict[str, Any]) -> dict[str, Any]:
            nonlocal start
            packed = {k: v for k, v in group.items() if k != "params"}
            mapping.update({id(p): i for i, p in enumerate(group["params"], start)
                            if id(p) not in mapping})
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            return packed

        groups = [pack(g) for g in self.param_groups]
        state = {(mapping[id(k)] if isinstance(k, Tensor) else k): v
                 for k, v in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore state and hyperparameters saved by :meth:`state_dict`; state tensors
        are copied and cast to their parameter's dtype (the ``step`` count excepted)."""
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups, strict=True)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups), strict=True))

        def cast(param: Tensor, value, key=None):
            if not isinstance(value, (Tensor, dict, list, tuple)):
                # A torch optimizer's state dict holds torch tensors (the layout is the same):
                # copied into fusegrad tensors, as Module.load_state_dict does.
                value = checkpoint_tensor(value)
            if isinstance(value, Tensor):
                if key == "step":
                    return F.clone(value)
                if param.is_floating_point() and value.is_floating_point():
                    return F.clone(F.cast(value, param.dtype))
                return F.clone(value)
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(cast(param, v) for v in value)
            return value

        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = cast(param, v)
            else:
                state[k] = v
        for group, new in zip(groups, saved_groups, strict=True):
            new["params"] = group["params"]
            if "param_names" in group and "param_names" not in new:
                new["param_names"] = group["param_names"]
        self.__setstate__({"state": state, "param_groups": saved_groups})
