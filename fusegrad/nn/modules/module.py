"""``nn.Module``: the base class of layers and models, with torch's registration rules.

A module keeps its parameters, buffers and submodules in three ordered dicts; assigning a
:class:`Parameter`, a Module, or a tensor to a registered buffer name routes the value into
the right dict (``__setattr__``), and ``__getattr__`` finds them again. Every traversal
(``named_parameters``, ``state_dict``, ``__repr__``) walks those dicts in registration order,
which is what makes state-dict keys and printed models match PyTorch's.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple
from typing import Callable, Iterator, Mapping

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.autograd.grad_utils import clear_grads
from fusegrad.nn.parameter import Parameter
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.interop import checkpoint_tensor
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["Module", "RemovableHandle", "register_compiler"]

# The function behind Module.compile (fusegrad.compile): nn knows no tracer, so
# fusegrad.tracer registers it here when it is imported (see register_compiler).
_COMPILER: list[Callable] = []


def register_compiler(compile_fn: Callable) -> None:
    """Make ``compile_fn(module, *args, **kwargs)`` what :meth:`Module.compile` calls;
    ``fusegrad.tracer`` registers ``fusegrad.compile`` at import."""
    _COMPILER[:] = [compile_fn]


def _typename(obj) -> str:
    """torch.typename: ``fusegrad.FloatTensor`` for tensors, the qualified name otherwise."""
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", "") or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        module = obj.__class__.__module__ or ""
        qualname = obj.__class__.__qualname__
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def _addindent(text: str, spaces: int) -> str:
    """Indent every line but the first (torch's helper for nested module reprs)."""
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    first = lines.pop(0)
    rest = [(" " * spaces) + line if line.strip() else "" for line in lines]
    return first + "\n" + "\n".join(rest)


class _Registry(OrderedDict):
    """A module's parameters, buffers, submodules or hooks: an ordered dict whose changes
    move :data:`STATE_VERSION` (``Sequential.append``, ``del model._modules[k]``, a removed
    hook), as assignments to the module's attributes do."""

    __slots__ = ()

    def __setitem__(self, key, value) -> None:
        STATE_VERSION[0] += 1
        OrderedDict.__setitem__(self, key, value)

    def __delitem__(self, key) -> None:
        STATE_VERSION[0] += 1
        OrderedDict.__delitem__(self, key)

    def clear(self) -> None:
        STATE_VERSION[0] += 1
        OrderedDict.clear(self)

    def pop(self, *args):
        STATE_VERSION[0] += 1
        return OrderedDict.pop(self, *args)

    def popitem(self, last: bool = True):
        STATE_VERSION[0] += 1
        return OrderedDict.popitem(self, last)

    def update(self, *args, **kwargs) -> None:
        STATE_VERSION[0] += 1
        OrderedDict.update(self, *args, **kwargs)

    def setdefault(self, key, default=None):
        STATE_VERSION[0] += 1
        return OrderedDict.setdefault(self, key, default)

    def move_to_end(self, key, last: bool = True) -> None:
        STATE_VERSION[0] += 1
        OrderedDict.move_to_end(self, key, last)


# The state_dict key of what a module's get_extra_state returns (torch's name).
_EXTRA_STATE_KEY = "_extra_state"

# Moved by every change of any module's attributes (``training``, ``momentum``, a replaced
# parameter), registrations and hooks. A compiled function compares the state of the modules
# its trace read only when this moved since its last call (fusegrad.tracer.guards).
STATE_VERSION = [0]


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What ``load_state_dict`` returns: keys missing from and unexpected in the state dict."""

    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by ``register_*_hook``: ``remove()`` unregisters the hook."""

    _next_id = itertools.count()

    def __init__(self, hooks: dict):
        self._hooks = hooks
        self.id = next(RemovableHandle._next_id)

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class _Hook:
    """A forward hook registered with options (``with_kwargs``, ``always_call``)."""

    __slots__ = ("fn", "with_kwargs", "always_call")

    def __init__(self, fn: Callable, with_kwargs: bool, always_call: bool):
        self.fn, self.with_kwargs, self.always_call = fn, with_kwargs, always_call


def _register(hooks: dict, hook, prepend: bool) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


class Module:
    """Base class for all neural network modules, with ``torch.nn.Module``'s API.

    Subclasses call ``super().__init__()`` first, assign parameters and submodules as
    attributes, and define ``forward``; calling the module runs ``forward`` (with hooks).

    >>> class Net(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = Linear(3, 2)
    ...     def forward(self, x):
    ...         return self.fc(x).relu()
    """

    training: bool
    _version: int = 1

    def __init__(self) -> None:
        # object.__setattr__ because our __setattr__ reads these dicts.
        set_ = object.__setattr__
        set_(self, "training", True)
        set_(self, "_parameters", _Registry())
        set_(self, "_buffers", _Registry())
        set_(self, "_non_persistent_buffers_set", set())
        set_(self, "_modules", _Registry())
        set_(self, "_forward_hooks", _Registry())
        set_(self, "_forward_pre_hooks", _Registry())

    def forward(self, *args, **kwargs):
        """The computation; every subclass defines it."""
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    def __call__(self, *args, **kwargs):
        compiling = primitive.compiling()
        if compiling:
            primitive.note_module(self)
        compiled = self.__dict__.get("_compiled_call")
        if compiled is not None and not compiling and not any(
                isinstance(a, Tensor) and a._trace is not None for a in args):
            return compiled(*args, **kwargs)
        # The hook dicts are tested first: most modules have none, and copying an empty dict's
        # values twice per call is most of what a call costs beyond forward.
        if self._forward_pre_hooks:
            for hook in tuple(self._forward_pre_hooks.values()):
                if type(hook) is _Hook:
                    result = hook.fn(self, args, kwargs)
                    if result is not None:
                        if not (isinstance(result, tuple) and len(result) == 2):
                            raise RuntimeError(
                                "forward pre-hook must return None or a tuple of (new_args, "
                                f"new_kwargs), but got {result!r}.")
                        args, kwargs = result
                        args = args if isinstance(args, tuple) else (args,)
                    continue
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        if not self._forward_hooks:
            return self.forward(*args, **kwargs)
        try:
            out = self.forward(*args, **kwargs)
        except BaseException:
            for hook in tuple(self._forward_hooks.values()):
                if type(hook) is _Hook and hook.always_call:
                    hook.fn(self, args, kwargs, None) if hook.with_kwargs else \
                        hook.fn(self, args, None)
            raise
        for hook in tuple(self._forward_hooks.values()):
            if type(hook) is _Hook:
                result = hook.fn(self, args, kwargs, out) if hook.with_kwargs else \
                    hook.fn(self, args, out)
            else:
                result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    def compile(self, *args, **kwargs) -> None:
        """Compile this module's calls in place (torch's ``Module.compile``): ``module(x)``
        then runs ``fusegrad.compile(module, *args, **kwargs)``; the arguments are
        ``fusegrad.compile``'s."""
        object.__setattr__(self, "_compiled_call", _COMPILER[0](self, *args, **kwargs))
        object.__setattr__(self, "_compile_args", (args, kwargs))

    def __getstate__(self) -> dict:
        # A copy (deepcopy, pickle) compiles itself again (see __setstate__): the compiled
        # programs are of this module's tensors.
        state = self.__dict__.copy()
        state.pop("_compiled_call", None)
        return state

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` runs before ``forward``; it may return replacement args.
        ``with_kwargs``: ``hook(module, args, kwargs)``, which may return ``(args, kwargs)``.
        ``prepend``: before the hooks registered so far."""
        return _register(self._forward_pre_hooks,
                         _Hook(hook, with_kwargs, False) if with_kwargs else hook, prepend)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False,
                              with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` runs after ``forward``; it may replace the output.
        ``with_kwargs``: ``hook(module, args, kwargs, output)``. ``prepend``: before the hooks
        registered so far. ``always_call``: also when ``forward`` raises (with output None)."""
        return _register(self._forward_hooks, _Hook(hook, with_kwargs, always_call)
                         if with_kwargs or always_call else hook, prepend)

    # ------------------------------------------------------------------ registration

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or None, a placeholder) under ``name``."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                f"created explicitly. To express '{name}' as a function of another Tensor, "
                "compute the value in the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not a parameter (saved in ``state_dict`` when
        ``persistent``), e.g. running statistics."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError('buffer name can\'t contain "."')
        if name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        """Add a submodule under ``name`` (it can then be reached as an attribute)."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {_typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    register_module = add_module

    @staticmethod
    def _check_name(name, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')

    def __setattr__(self, name: str, value) -> None:
        def remove_from(*dicts_or_sets):
            for d in dicts_or_sets:
                if name in d:
                    if isinstance(d, dict):
                        del d[name]
                    else:
                        d.discard(name)

        STATE_VERSION[0] += 1
        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules,
                        self._non_persistent_buffers_set)
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
            return
        modules = self.__dict__.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(self.__dict__, self._parameters, self._buffers,
                        self._non_persistent_buffers_set)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as child module '{name}' "
                                "(torch.nn.Module or None expected)")
            modules[name] = value
            return
        buffers = self.__dict__.get("_buffers")
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{_typename(value)}' as buffer '{name}' "
                                "(torch.Tensor or None expected)")
            if value is not None and value._trace is not None:
                primitive.note_attribute(buffers, name, value, True)
            buffers[name] = value
            return
        if isinstance(value, Tensor) and value._trace is not None:
            primitive.note_attribute(self.__dict__, name, value, False)
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: look in the registration dicts.
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise _missing_attribute("torch.nn.Module", type(self).__name__, name)

    def __delattr__(self, name: str) -> None:
        STATE_VERSION[0] += 1
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def __dir__(self):
        keys = (list(dir(self.__class__)) + list(self.__dict__) + list(self._parameters)
                + list(self._modules) + list(self._buffers))
        return sorted(k for k in set(keys) if not k[0].isdigit())

    def __setstate__(self, state: dict) -> None:
        d = self.__dict__
        d.update(state)
        for key in ("_parameters", "_buffers", "_modules", "_forward_hooks",
                    "_forward_pre_hooks"):
            if not isinstance(d.get(key), _Registry):     # an older pickle's plain dicts
                d[key] = _Registry(d.get(key) or ())
        d.setdefault("_non_persistent_buffers_set", set())
        if "_compile_args" in d:
            args, kwargs = d["_compile_args"]
            self.compile(*args, **kwargs)

    # ------------------------------------------------------------------ traversal

    def _named_members(self, get_members, prefix: str = "", recurse: bool = True,
                       remove_duplicate: bool = True):
        memo: set[int] = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs; a parameter shared by two modules appears once."""
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse,
                                       remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter of this module (and its submodules when ``recurse``), once each."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) pairs, persistent or not."""
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse,
                                       remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct submodules with their names (each module once)."""
        memo: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def children(self) -> Iterator["Module"]:
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """This module and every descendant, depth first, with dotted names ('' for self)."""
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        """This module and every descendant, in ``named_modules()``' order (depth first, each
        module once), walked with a stack: without names, and without a generator per level
        (a compiled step reads every module's ``training`` flag at each call)."""
        seen, todo = set(), [self]
        while todo:
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            children = m._modules
            if children:
                todo.extend(c for c in reversed(children.values()) if c is not None)

    def get_submodule(self, target: str) -> "Module":
        """The submodule at dotted path ``target`` ('' is this module)."""
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path ``target``."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        param = getattr(mod, name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + name + "` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at dotted path ``target``."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if name not in mod._buffers:
            raise AttributeError("`" + name + "` is not a buffer")
        return mod._buffers[name]

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every submodule (children first) and then on this module."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ modes and grads

    def train(self, mode: bool = True) -> "Module":
        """Set training mode (Dropout drops, ...) on this module and all descendants."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` of every parameter (e.g. False to freeze a module)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all parameters: to None by default (torch 2), else to 0."""
        clear_grads(self.parameters(), set_to_none)

    # ------------------------------------------------------------------ conversion

    def _apply(self, fn: Callable[[Tensor], Tensor]) -> "Module":
        """Apply ``fn`` to every parameter, gradient and buffer, keeping parameter objects.

        Parameters keep their identity (``param.data = fn(param)``) so that an optimizer
        built before ``model.double()`` still holds the model's parameters.
        """
        for module in self.children():
            module._apply(fn)
        for param in self._parameters.values():
            if param is None:
                continue
            with no_grad():
                new = fn(param)
            if new is not param:
                param.data = new
            if param.grad is not None:
                with no_grad():
                    g = fn(param.grad)
                if g is not param.grad:
                    param.grad.data = g     # the gradient object stays too, as torch's
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    def to(self, *args, **kwargs) -> "Module":
        """Move and/or cast: ``to(dtype)`` casts floating-point parameters and buffers."""
        dtype, device = F.parse_to_args(args, kwargs)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but "
                            f"got desired dtype={dtype}")

        def convert(t: Tensor) -> Tensor:
            return F.to(t, device=device, dtype=dtype if t.is_floating_point() else None)
        return self._apply(convert)

    def _cast_floats(self, dtype: dtypes.DType) -> "Module":
        return self._apply(lambda t: F.cast(t, dtype) if t.is_floating_point() else t)

    def float(self) -> "Module":
        return self._cast_floats(dtypes.float32)

    def double(self) -> "Module":
        return self._cast_floats(dtypes.float64)

    def half(self) -> "Module":
        return self._cast_floats(dtypes.float16)

    def bfloat16(self) -> "Module":
        return self._cast_floats(dtypes.bfloat16)

    def type(self, dst_type) -> "Module":
        return self._apply(lambda t: F.cast(t, dst_type))

    def cpu(self) -> "Module":
        return self.to("cpu")

    def cuda(self, device=None) -> "Module":
        if isinstance(device, int):       # module.cuda(1): an index
            device = f"cuda:{device}"
        return self.to("cuda" if device is None else device)

    # ------------------------------------------------------------------ state dict

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if type(self).get_extra_state is not Module.get_extra_state:
            destination[prefix + _EXTRA_STATE_KEY] = self.get_extra_state()

    def get_extra_state(self):
        """State beyond parameters and buffers, saved under ``"_extra_state"`` in
        :meth:`state_dict`. Override it together with :meth:`set_extra_state`; a module that
        does not has no such entry."""
        raise RuntimeError("Module.get_extra_state() is only called when a subclass overrides it")

    def set_extra_state(self, state) -> None:
        """Restore what :meth:`get_extra_state` returned; ``load_state_dict`` calls it."""
        raise RuntimeError("Module.set_extra_state() is only called when a subclass overrides it")

    def state_dict(self, *, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> "OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by dotted name (detached unless ``keep_vars``)."""
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".",
                                  keep_vars=keep_vars)
        return destination

    def _load_from_state_dict(self, state_dict: Mapping, prefix: str, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list,
                              assign: bool = False) -> None:
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(),
                                                        persistent.items()) if v is not None}
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = checkpoint_tensor(state_dict[key])
            if not isinstance(value, Tensor):
                error_msgs.append(f'While copying the parameter named "{key}", expected '
                                  f"torch.Tensor or Tensor-like object from checkpoint but "
                                  f"received {type(value)}")
                continue
            if param.ndim == 0 and value.ndim == 1 and value.shape[0] == 1:
                value = value[0]
            if value.shape != param.shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{value.shape} from checkpoint, the shape in current model "
                                  f"is {param.shape}.")
                continue
            try:
                with no_grad():
                    if assign:
                        # the module's requires_grad wins, as torch: a frozen layer stays
                        # frozen when a checkpoint's Parameter is assigned in
                        if isinstance(param, Parameter) and not isinstance(value, Parameter):
                            value = Parameter(value, requires_grad=param.requires_grad)
                        elif isinstance(param, Parameter):
                            value.requires_grad_(param.requires_grad)
                        setattr(self, name, value)
                    else:
                        param.copy_(value)
            except Exception as ex:  # noqa: BLE001 - torch reports any failure this way
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions '
                                  f"in the model are {param.size()} and whose dimensions in the "
                                  f"checkpoint are {value.size()}, an exception occurred : "
                                  f"{ex.args}.")
        extra_key = prefix + _EXTRA_STATE_KEY
        if type(self).set_extra_state is not Module.set_extra_state:
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if not key.startswith(prefix) or key == extra_key:
                    continue
                head = key[len(prefix):].split(".", 1)
                if len(head) > 1:
                    if head[0] not in self._modules:
                        unexpected_keys.append(key)
                elif head[0] not in local_state:
                    unexpected_keys.append(key)

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True,
                        assign: bool = False) -> _IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict``; with ``strict`` its keys must
        match :meth:`state_dict`'s exactly. Returns the missing and unexpected keys."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []

        def load(module: Module, local: Mapping, prefix: str) -> None:
            module._load_from_state_dict(local, prefix, True, missing, unexpected, errors,
                                         assign)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    load(child, {k: v for k, v in local.items() if k.startswith(child_prefix)},
                         child_prefix)

        load(self, dict(state_dict), "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ printing

    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The module's own settings for ``repr`` (one line, or several)."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({key}): " + _addindent(repr(module), 2)
                       for key, module in self._modules.items()]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


