"""Grad modes: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``.

Each is a context manager and a decorator, as in PyTorch. The flag is thread-local so that a
kernel thread pool or a user's data-loading thread cannot flip another thread's mode.

A base module (it imports nothing of fusegrad): the ops below autograd read the mode when they
record the tape. Its public face is :mod:`fusegrad.autograd.grad_mode`, which re-exports it.
"""

from __future__ import annotations

import functools
import inspect
import threading

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
           "is_inference_mode_enabled"]

_state = threading.local()


def is_grad_enabled() -> bool:
    """Whether operations on tensors that require grad are recorded for backward."""
    return getattr(_state, "enabled", True)


def _set_enabled(flag: bool) -> None:
    _state.enabled = flag


def is_inference_mode_enabled() -> bool:
    return getattr(_state, "inference", False)


class _GradModeContext:
    """Base for the grad-mode managers: a context manager that also decorates functions."""

    _target: bool

    def __enter__(self):
        self._prev = is_grad_enabled()
        _set_enabled(self._target)
        return self

    def __exit__(self, *exc) -> bool:
        _set_enabled(self._prev)
        return False

    def __call__(self, fn):
        if inspect.isgeneratorfunction(fn):
            return self._wrap_generator(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__._fresh(self):
                return fn(*args, **kwargs)
        return wrapper

    def _wrap_generator(self, fn):
        """A decorated generator function: the mode holds while the generator's body runs,
        each step, not only while the call makes the generator (which runs none of it); the
        caller's mode is back in force at every ``yield``, as torch's decorators do."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            gen = fn(*args, **kwargs)
            resume, value = gen.send, None
            while True:
                try:
                    with self.__class__._fresh(self):
                        out = resume(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    resume, value = gen.send, (yield out)
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as exc:
                    resume, value = gen.throw, exc
        return wrapper

    def _fresh(self):
        return self.__class__()

    def clone(self):
        return self._fresh()


class _NoParamContext(_GradModeContext):
    """Usable as ``@no_grad()`` and as bare ``@no_grad``, as in torch 2."""

    def __new__(cls, fn=None):
        inst = super().__new__(cls)
        return inst(fn) if fn is not None else inst


class no_grad(_NoParamContext):  # noqa: N801 - torch's name
    """Disable gradient recording inside the block (or the decorated function)."""

    _target = False


class enable_grad(_NoParamContext):  # noqa: N801
    """Enable gradient recording inside the block, e.g. within a ``no_grad`` region."""

    _target = True


class set_grad_enabled(_GradModeContext):  # noqa: N801
    """Set grad mode to ``mode``; takes effect at once, and as a context manager restores it."""

    def __init__(self, mode: bool):
        self._target = bool(mode)
        self._prev = is_grad_enabled()
        _set_enabled(self._target)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        _set_enabled(self._prev)
        return False

    def __call__(self, fn):
        # As a decorator, construction must not change the mode of the code that decorates:
        # restore it now; each call of ``fn`` sets the mode afresh (as torch does).
        _set_enabled(self._prev)
        return super().__call__(fn)

    def _fresh(self):
        inst = object.__new__(set_grad_enabled)
        inst._target = self._target
        inst._prev = is_grad_enabled()
        _set_enabled(inst._target)
        return inst


class inference_mode(_GradModeContext):  # noqa: N801
    """Like ``no_grad``; tensors made inside are plain tensors (fusegrad keeps no extra
    inference-tensor state, so this is ``no_grad`` plus the flag ``is_inference_mode_enabled``)."""

    def __init__(self, mode: bool = True):
        self._mode = bool(mode)
        self._target = not self._mode

    def __enter__(self):
        self._prev_inf = is_inference_mode_enabled()
        _state.inference = self._mode
        return super().__enter__()

    def __exit__(self, *exc) -> bool:
        _state.inference = self._prev_inf
        return super().__exit__(*exc)

    def _fresh(self):
        return inference_mode(self._mode)
