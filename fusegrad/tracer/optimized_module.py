"""``OptimizedModule``: what ``fusegrad.compile(module)`` returns, as ``torch.compile``.

It is a module holding the original as its one submodule ``_orig_mod``, so its state-dict
keys, parameter and module names carry torch's ``_orig_mod.`` prefix: a checkpoint saved
from a compiled torch model loads into a compiled fusegrad model and back. The original
module loads it once the prefix is taken off, torch's way::

    sd = compiled.state_dict()
    fusegrad.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "_orig_mod.")
    model.load_state_dict(sd)          # or save compiled._orig_mod.state_dict()

Attribute reads and writes go to the original module (``compiled.fc``,
``compiled.training``), as torch's do; reads it lacks find the compiled function's own
(``compiled.compiles``, ``compiled.lower(x)``, ``compiled.recompile_reasons``).

``fusegrad.compile`` (:mod:`fusegrad.tracer.compile`) makes it; torch's path
``fusegrad._dynamo.eval_frame.OptimizedModule`` names the same class.
"""

from __future__ import annotations

from typing import Any

from fusegrad.nn.modules.module import Module

__all__ = ["OptimizedModule"]


class OptimizedModule(Module):
    """A compiled module: calling it runs ``forward``, the :class:`CompiledFunction` of the
    original module ``_orig_mod`` (its hooks included, traced into the program)."""

    # Set on the wrapper itself; every other attribute is the original module's.
    _opt_mod_attributes = frozenset({"_orig_mod", "forward", "_compile_options",
                                     "_compiled_type", "__dict__"})

    def __init__(self, mod: Module, compiled):
        """``compiled``: the :class:`~fusegrad.tracer.compile.CompiledFunction` of ``mod``."""
        super().__init__()
        self._orig_mod = mod                    # registered: state-dict keys get the prefix
        self.forward = compiled
        # What a copy compiles itself again with (see __setstate__).
        self._compiled_type = type(compiled)
        self._compile_options = compiled._options()

    @property
    def training(self) -> bool:                          # type: ignore[override]
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        # Module.__init__ sets the default before _orig_mod exists: the original's flag is kept.
        if "_orig_mod" in self.__dict__.get("_modules", ()):
            self._orig_mod.training = value

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        modules = d.get("_modules")
        if modules is None or "_orig_mod" not in modules:
            raise AttributeError(name)
        if name == "_orig_mod":
            return modules["_orig_mod"]
        try:
            return getattr(modules["_orig_mod"], name)
        except AttributeError:
            compiled = d.get("forward")
            if compiled is None or name.startswith("__"):
                raise
            return getattr(compiled, name)      # (raises the module's error when it lacks it)

    def __setattr__(self, name: str, value) -> None:
        if hasattr(type(self), name) or name in OptimizedModule._opt_mod_attributes:
            return super().__setattr__(name, value)
        return setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if hasattr(type(self), name) or name in OptimizedModule._opt_mod_attributes:
            return super().__delattr__(name)
        return delattr(self._orig_mod, name)

    def __len__(self) -> int:
        return len(self._orig_mod)

    def __dir__(self):
        return sorted(set(dir(self._orig_mod)) | set(super().__dir__()))

    def __getstate__(self) -> dict:
        # A copy (deepcopy, pickle) compiles its own copy of the module again: the programs
        # are of this module's tensors.
        state = super().__getstate__()
        state.pop("forward", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "forward",
                           self._compiled_type(self._orig_mod, **self._compile_options))
