"""What a compiled function touches outside its arguments, captured while it is traced.

``fusegrad.compile`` traces a function once and runs the graph many times, so everything the
function reads or writes outside its arguments must be in the graph, or the graph goes stale
(a frozen constant, a lost update). While a compiled function is traced, a
:class:`StateCapture` sits on the trace (and on its thread's captures in
:mod:`fusegrad.tracer.state`) and turns each such effect into graph inputs and outputs:

- A tensor created before the trace began (a parameter, a buffer, an optimizer's state, any
  captured global) is an *external* tensor: a graph input read at call time, and every op on
  it is recorded, even when no operand is traced. Tensors created while tracing are
  *internal*: constants of the graph, computed eagerly while tracing.
- An in-place write to an external tensor rebinds its symbolic value; the final value is an
  output written back into the tensor after each call (functionalization). An internal
  tensor written with traced values (an optimizer's state made on its first step) gets the
  same treatment if it is still alive when the trace ends.
- ``.grad`` of a leaf (a parameter, an argument requiring grad) is a slot: read, it is the
  gradient present at call time (an input); written, cleared (``zero_grad``) or accumulated
  into by ``backward()``, its final value is written back after each call.
- ``loss.backward()`` and ``autograd.grad`` differentiate the graph recorded so far with the
  same VJP rules as the autodiff pass, appending the reverse graph to it.
- An optimizer's learning rates (and nonzero momentums, Adam's beta1) are inputs read from
  its param groups at call time, so a scheduler changes them without a recompile; the
  structure of its state is guarded.

What cannot be captured raises :class:`~fusegrad.ir.symbolic.ConcretizationError` naming
the user's line (``compile`` then runs the function eagerly, or raises with ``fullgraph``):
reading the value of an external tensor (``.item()``), assigning ``.data``, hooks on traced
tensors. ``retain_grad()`` on a traced intermediate is captured: ``backward()`` writes its
gradient into its ``.grad`` as eager does.
"""

from __future__ import annotations

import gc
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.engine import hook_result
from fusegrad.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from fusegrad.ir.graph import Value
from fusegrad.ir.symbolic import (
    USER_LINE,
    ConcretizationError,
    GraphTrace,
    SymbolicTensor,
    innermost_trace,
    literal_tensor,
    user_location,
)
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.primitive import TensorType
from fusegrad.passes.attention import fuse_attention
from fusegrad.passes.autodiff import _reverse
from fusegrad.symint import holds_symbol
from fusegrad.tensor import Tensor
from fusegrad.tracer.guards import ClosureGuard, hashable
from fusegrad.tracer.state import pop_capture, push_capture

__all__ = ["StateCapture", "CaptureInfo", "capturing"]


@dataclass
class CaptureInfo:
    """How a captured graph's extra inputs are read and its extra outputs written back.

    Input and output positions index the graph's inputs and outputs.
    """

    grad_inputs: list[tuple[int, int]] = field(default_factory=list)   # (leaf, grad input)
    grad_guards: list[tuple[int, tuple | None]] = field(default_factory=list)  # leaf, grad type
    grad_writes: list[tuple[int, int, bool]] = field(default_factory=list)  # leaf, out, in place
    grad_clears: list[int] = field(default_factory=list)                 # leaf -> None
    # Leaves whose gradient the function clears before writing a new one, never reading it:
    # dropped before the call runs (as zero_grad drops it), so its buffer can be reused.
    grad_drops: list[int] = field(default_factory=list)
    scalar_inputs: list[tuple[Callable[[], Any], int, Any]] = field(default_factory=list)
    # (input, its values at trace time): inputs the trace read as host data (host_values)
    value_guards: list[tuple[int, np.ndarray]] = field(default_factory=list)
    internal_writes: list[tuple[Tensor, int]] = field(default_factory=list)  # tensor, output
    # a module attribute set to a traced tensor: its dict, the name, the output it takes
    attribute_writes: list[tuple[dict, str, int]] = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    optimizer_signatures: list = field(default_factory=list)
    modules: list = field(default_factory=list)     # the modules the trace called
    did_backward: bool = False
    rollback: Callable[[], None] | None = None   # undo the trace's Python-level effects


class StateCapture:
    """The effects of a compiled function on state outside its arguments (module doc)."""

    def __init__(self, trace: GraphTrace, inputs: list[tuple[SymbolicTensor, Tensor]]):
        self.trace = trace
        trace.capture = self
        # Graph input value -> the concrete tensor it stands for at trace time (arguments,
        # module state, captured tensors). Leaves among them have a .grad slot.
        self.concrete_of: dict[Value, Tensor] = {}
        # id(array) of a captured tensor -> (tensor, its symbolic tensor, its graph input)
        self.external: dict[int, tuple[Tensor, SymbolicTensor, Value]] = {}
        self.written: dict[int, tuple] = {}      # internal, written: (weakref, sym, array)
        # id(symbolic tensor) -> graph input, for the symbolic tensors that stand for leaves
        self.leaf_syms: dict[int, Value] = {}
        self.grads: dict[Value, Tensor | None] = {}                      # leaf -> current grad
        self.grad_inputs: dict[Value, tuple[SymbolicTensor, Value]] = {}
        self.grad_guards: dict[Value, tuple | None] = {}
        self.scalars: list[tuple[Callable[[], Any], SymbolicTensor]] = []
        self.value_guards: dict[Value, np.ndarray] = {}   # graph input -> values read
        self.optimizers: list = []
        self.modules: dict[int, Any] = {}          # id -> module called (note_module)
        # (id(dict), name) -> [dict, name, value before the trace, traced value now, buffer?]
        self.attributes: dict[tuple[int, str], list] = {}
        self._optimizer_snapshots: list = []
        self._optimizer_signatures: list = []
        self.did_backward = False
        # Called once a traced backward() has accumulated its gradients and run the leaves'
        # hooks (torch's queue_callback): data-parallel training checks there that every
        # bucket was reduced, since the replayed graph never reaches its Python checks.
        self.after_backward: list[Callable[[], None]] = []
        self._keep: list = []          # symbolic tensors whose ids key leaf_syms
        # Leaves made while tracing that require grad (``x.detach().requires_grad_()``, a
        # factory's ``requires_grad=True``): (tensor or a weak reference to a concrete one,
        # its value). backward() accumulates into their ``.grad`` as eager would.
        self.internal_leaves: list[tuple[Any, Value]] = []
        self.retained: list[SymbolicTensor] = []     # intermediates that retain_grad()
        # A tensor made while tracing is internal (a constant of the graph) unless it
        # aliases the storage of a tensor from before the trace (p.detach(), p.data). The
        # storage the trace itself allocated (factories, eager ops on internal tensors) is
        # recorded as it is made; only a tensor of other storage costs a scan of the heap
        # for the older tensors (once per trace; 20-60 ms with many objects alive).
        self.new_roots: dict[int, np.ndarray] = {}     # held, so that ids stay unique
        self._old_roots: dict[int, np.ndarray] | None = None
        for sym, t in inputs:
            self._add_leaf(sym, t)

    def _add_leaf(self, sym: SymbolicTensor, t: Tensor) -> None:
        self.concrete_of[sym._val] = t
        self.leaf_syms[id(sym)] = sym._val
        self._keep.append(sym)
        if sym._requires_grad:
            self.trace.grad_values.add(sym._val)

    # ------------------------------------------------------------------ tensors

    def is_internal(self, t: Tensor) -> bool:
        if t._capture_owner is not self or id(t._data) in self.written:
            return False
        # Made while tracing, but maybe an alias of older storage (p.detach(), p.data).
        root = id(_root(t._data))
        if root in self.new_roots:
            return True
        if self._old_roots is None:
            self._old_roots = _live_storage(exclude=self)
        return root not in self._old_roots

    def note_made(self, t: Tensor) -> None:
        """``t`` is a new tensor object made while tracing: the trace's, unless its storage
        is older (:meth:`is_internal` decides at its first use)."""
        t._capture_owner = self

    def note_created(self, t: Tensor) -> None:
        """``t`` was made by a factory while tracing: fresh storage, a graph constant."""
        t._capture_owner = self
        self._note_new(t)

    def _note_new(self, t: Tensor) -> None:
        if type(t._data) is np.ndarray:
            root = _root(t._data)
            self.new_roots[id(root)] = root

    def sym_for(self, t: Tensor) -> SymbolicTensor:
        """The symbolic tensor standing for concrete ``t`` in the graph (its current value).

        Captured tensors are keyed by storage, so ``p`` and ``p.detach()`` read the same
        input, and by ``requires_grad``: the detached alias is an input of its own through
        which no gradient flows."""
        hit = self.written.get(id(t._data))
        if hit is not None:
            return hit[1]
        key = (id(t._data), bool(t._requires_grad))
        hit = self.external.get(key)
        if hit is not None:
            return hit[1]
        if self.is_internal(t):
            # The base of a traced view of a tensor made here (a mask made for 64 positions,
            # sliced to a symbolic T): its value becomes the graph's, as a write makes it,
            # so that writes through the view reach later reads of the base.
            sym = SymbolicTensor._make(self.trace.operand(t), self.trace, t._requires_grad)
            self.written[id(t._data)] = (weakref.ref(t), sym, t._data)
            return sym
        value = self.trace._lift(t)
        sym = SymbolicTensor._make(value, self.trace, t._requires_grad)
        self._add_leaf(sym, t)
        self.external[key] = (t, sym, value)
        return sym

    def operand(self, t: Tensor):
        """The graph operand of concrete ``t``, or None for an internal constant."""
        if self.is_internal(t):
            if t._requires_grad and t.grad_fn is not None and is_grad_enabled():
                raise ConcretizationError(
                    f"a tensor {_describe(t)} computed eagerly inside the compiled function "
                    f"from tensors made there that require grad{_at()}: the compiled graph "
                    "cannot differentiate through that eager history. Create the leaf from an "
                    "argument (x.detach().requires_grad_()) or outside the function.")
            return None
        return self.sym_for(t)._value

    def guard_value(self, sym: SymbolicTensor) -> np.ndarray | None:
        """The values of ``sym`` at trace time where it stands for a graph input not written
        so far (an argument, a captured tensor), or None. The entry then holds only for
        calls with equal values (``CaptureInfo.value_guards``)."""
        value = sym._value
        t = self.concrete_of.get(value)
        if t is None:
            return None
        seen = self.value_guards.get(value)
        if seen is None:
            seen = self.value_guards[value] = np.array(t._host(), copy=True)
        return seen

    def internal_leaf(self, t: Tensor, value: Value) -> None:
        """``t``, a leaf made while tracing that requires grad, stands for ``value``: a
        gradient root, whose ``.grad`` backward() accumulates into."""
        if any(v is value for _, v in self.internal_leaves):
            return                          # registered already: one accumulation per leaf
        self.trace.grad_values.add(value)
        ref = t if isinstance(t, SymbolicTensor) else weakref.ref(t)
        self.internal_leaves.append((ref, value))

    def retain(self, t: SymbolicTensor) -> None:
        """``t.retain_grad()`` on a traced tensor: a leaf keeps its gradient anyway; an
        intermediate gets the gradient ``backward()`` computes for it in ``.grad``."""
        if self._leaf(t) is not None or any(v is t._value for _, v in self.internal_leaves):
            return
        if not any(r is t for r in self.retained):
            self.retained.append(t)
        t._retains_grad = True

    def _internal_leaves(self):
        for ref, value in self.internal_leaves:
            t = ref if isinstance(ref, SymbolicTensor) else ref()
            if t is not None:
                yield t, value

    def bind_concrete(self, prim, operands, attrs):
        """A primitive on concrete operands only: eager if they are all internal (and its
        attributes hold no symbolic size: ``arange(T)`` of a traced size is a node)."""
        if all(self.is_internal(op) for op in operands) and \
                not any(holds_symbol(a) for a in attrs.values()):
            saved = pop_capture()
            try:
                out = None
                if primitive._device_apply is not None:     # cuda operands run there
                    out = primitive._device_apply(prim, operands, attrs)
                if out is None:
                    out = primitive._eager_apply(prim, operands, attrs)
            finally:
                push_capture(saved)
            # Fresh storage, or a view of an internal operand's: internal either way.
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                t._capture_owner = self
                self._note_new(t)
            return out
        return self.trace.process_primitive(prim, operands, attrs)

    def assign_concrete(self, x: Tensor, value: Tensor, op: str) -> Tensor:
        """An in-place write to concrete ``x``."""
        if self.is_internal(x) and (value._trace is None and self.is_internal(value)):
            saved = pop_capture()
            try:
                return F.assign_(x, value, op)
            finally:
                push_capture(saved)
        F._check_inplace(x, op)
        if x._base is not None:
            self.refuse(f"{op}: an in-place write to a view of a tensor from outside the "
                        "compiled function")
        if self.is_internal(x):
            sym = SymbolicTensor._make(self.trace.operand(x), self.trace, x._requires_grad)
            # The array is held so that its id stays unique while the trace runs.
            self.written[id(x._data)] = (weakref.ref(x), sym, x._data)
        else:
            sym = self.sym_for(x)
        self.trace.assign(sym, value)
        return x

    def check_concrete(self, t: Tensor, what: str) -> None:
        if not self.is_internal(t):
            raise ConcretizationError(
                f"{what} reads the value of a tensor {_describe(t)} from outside the compiled "
                f"function{_at()}; its value is only known when the compiled function runs. "
                "Keep the computation in tensor ops, pass the value as an argument, or run "
                "this code outside the compiled function.")

    def refuse(self, what: str) -> None:
        raise ConcretizationError(
            f"{what}{_at()} cannot be captured in a compiled function. Run it outside the "
            "compiled function, or compile with fullgraph=False to run this function eagerly.")

    # ------------------------------------------------------------------ .grad slots

    def _leaf(self, t: Tensor) -> Value | None:
        """The graph input whose .grad slot ``t.grad`` is, or None for a non-leaf."""
        if isinstance(t, SymbolicTensor):
            return self.leaf_syms.get(id(t)) if t._tr is self.trace else None
        if self.is_internal(t):
            return None
        self.sym_for(t)
        hit = self.external.get((id(t._data), bool(t._requires_grad)))
        return hit[2] if hit is not None else None

    def get_grad(self, t: Tensor):
        leaf = self._leaf(t)
        if leaf is None:
            return t._grad
        if leaf in self.grads:
            return self.grads[leaf]
        concrete = self.concrete_of[leaf]
        g = concrete._grad
        self.grad_guards[leaf] = None if g is None else (tuple(g.shape), g.dtype)
        if g is None:
            self.grads[leaf] = None
            return None
        sym = self.trace.new_input(f"{leaf.name}_grad", TensorType(tuple(g.shape), g.dtype))
        self.grad_inputs[leaf] = (sym, sym._val)
        self.grads[leaf] = sym
        return sym

    def set_grad(self, t: Tensor, value) -> None:
        leaf = self._leaf(t)
        if leaf is None:
            t._grad = value
            return
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of "
                                f"type {type(value).__name__}")
            if tuple(value.shape) != leaf.type.shape:
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{list(value.shape)} vs {list(leaf.type.shape)}")
            value = self._fresh(value)
        self.grads[leaf] = value

    def _fresh(self, value: Tensor) -> SymbolicTensor:
        """A tensor object of its own for a .grad slot (in-place ops on one grad must not
        rebind another that shares the symbolic object)."""
        return SymbolicTensor._make(self.trace.operand(value), self.trace, value._requires_grad)

    # ------------------------------------------------------------------ backward

    def backward(self, outputs, grad_outputs, create_graph: bool, inputs, accumulate: bool,
                 allow_unused: bool = False):
        """``backward()`` / ``autograd.grad`` on traced ``outputs`` (see module doc)."""
        tr = self.trace
        outputs = list(outputs)
        if grad_outputs is not None and not isinstance(grad_outputs, (list, tuple)):
            grad_outputs = [grad_outputs]
        seeds: dict[Value, SymbolicTensor] = {}
        for k, out in enumerate(outputs):
            if out._trace is not tr:
                raise RuntimeError("backward() of tensors from different compiled functions or "
                                   "of an eager tensor mixed with traced ones")
            if not out._requires_grad:
                raise RuntimeError(f"element {k} of tensors does not require grad and does not "
                                   "have a grad_fn")
            ct = None if grad_outputs is None else grad_outputs[k]
            if ct is None:
                if out.numel() != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                ct = F.ones_like(out)
            elif tuple(ct.shape) != tuple(out.shape):
                raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of "
                                   f"{list(ct.shape)} and output[{k}] has a shape of "
                                   f"{list(out.shape)}.")
            value = out._value
            if innermost_trace((ct,), tr) is tr:
                ct = self.trace_operand_tensor(ct)
            # else a tensor of a trace running inside this one (a vmap over a vjp function,
            # as jacrev does): the VJP rules run on it, through that trace's rules.
            seeds[value] = ct if value not in seeds else seeds[value] + ct
        if not create_graph and not self.retained:
            # Attention chains recorded so far become one primitive with a fused backward
            # (passes/attention.py); a backward that is differentiated keeps the chain, and so
            # does one whose intermediates retain their gradients (the chain has none).
            for packed, y in fuse_attention(tr.graph).items():
                if y in tr.grad_values:
                    tr.grad_values.add(packed)
        env = _Env(tr)
        with enable_grad() if create_graph else no_grad():
            # Checkpointed regions recompute their values, unless this backward is itself
            # differentiated (the recomputation's barriers would stop that derivative).
            cts = _reverse(tr.graph, tr, env, tr.grad_values, env.get, seeds,
                           remat=not create_graph)
        # backward() makes the call a training step, whose outputs carry no history;
        # autograd.grad leaves the outputs differentiable, as eager does.
        self.did_backward |= accumulate
        if not accumulate:
            results = []
            internal = {id(t): v for t, v in self._internal_leaves()}
            for t in inputs:
                if id(t) in internal:
                    v = internal[id(t)]
                elif isinstance(t, SymbolicTensor):
                    v = t._value
                else:       # an internal tensor that is no leaf requiring grad: no value
                    v = None if self.is_internal(t) else self.sym_for(t)._value
                if v is None or v not in tr.grad_values:
                    raise RuntimeError("One of the differentiated Tensors does not require grad")
                g = cts.get(v)
                if g is not None and not isinstance(t, SymbolicTensor):
                    g = _run_hooks(t, g)
                if g is None and not allow_unused:
                    raise RuntimeError("One of the differentiated Tensors appears to not have "
                                       "been used in the graph. Set allow_unused=True if this is "
                                       "the desired behavior.")
                results.append(g)
            return results
        wanted = wanted_ids = None
        if inputs is not None:
            inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
            wanted = {self._leaf(t) for t in inputs}
            wanted_ids = {id(t) for t in inputs}
        accumulated = []
        for leaf in list(self.concrete_of):
            if leaf not in tr.grad_values or (wanted is not None and leaf not in wanted):
                continue
            g = cts.get(leaf)
            if g is None:
                continue
            concrete = self.concrete_of[leaf]
            g = _run_hooks(concrete, g)
            accumulated.append((g, concrete))
            if not concrete.is_leaf:
                raise ConcretizationError(
                    f"backward(){_at()} reached a tensor {_describe(concrete)} that was computed "
                    "outside the compiled function with autograd history: a compiled function "
                    "cannot extend an eager autograd graph. Detach it, or compute it inside.")
            cur = self.get_grad(concrete)
            if cur is None:
                self.grads[leaf] = self._fresh(g)
            elif isinstance(cur, SymbolicTensor) and cur._tr is tr:
                tr.assign(cur, cur + g)         # AccumulateGrad adds in place
            else:
                self.grads[leaf] = self._fresh(cur + g)
        for t, value in self._internal_leaves():
            g = cts.get(value)
            if g is None or (wanted_ids is not None and id(t) not in wanted_ids):
                continue
            cur = t._grad
            if cur is None:
                t._grad = self._fresh(g)
            elif isinstance(cur, SymbolicTensor) and cur._tr is tr:
                tr.assign(cur, cur + g)
            else:
                t._grad = self._fresh(cur + g)
        for t in self.retained:
            g = cts.get(t._value)
            if g is None or (wanted_ids is not None and id(t) not in wanted_ids):
                continue
            t._grad = self._fresh(g if t._grad is None else t._grad + g)
        self._post_accumulate_hooks(accumulated)
        callbacks, self.after_backward = self.after_backward, []
        for callback in callbacks:
            callback()
        return None

    def _post_accumulate_hooks(self, accumulated: list) -> None:
        """Run the leaves' post-accumulate-grad hooks on their traced gradients, in the order
        eager's backward would reach them: by where each gradient is computed in the graph
        (data-parallel training launches its bucket all-reduces from these hooks)."""
        hooked = [(g, t) for g, t in accumulated if t._post_accumulate_grad_hooks]
        if not hooked:
            return
        position = {n.output: i for i, n in enumerate(self.trace.graph.nodes)}
        hooked.sort(key=lambda item: position.get(item[0]._value, -1)
                    if isinstance(item[0]._value, Value) else -1)
        with no_grad():
            for _, t in hooked:
                for hook in list(t._post_accumulate_grad_hooks):
                    _call_hook(hook, t)

    def trace_operand_tensor(self, t: Tensor) -> SymbolicTensor:
        if isinstance(t, SymbolicTensor):
            return t
        return SymbolicTensor._make(self.trace.operand(t), self.trace, False)

    # ------------------------------------------------------------------ optimizers

    def note_module(self, module) -> None:
        """Called by ``Module.__call__`` while tracing: the entry's guard compares this
        module's state, however the function reached it."""
        self.modules[id(module)] = module

    def note_attribute(self, holder: dict, name: str, value, buffer: bool) -> None:
        """Called by ``Module.__setattr__`` while tracing, before it stores the traced tensor
        ``value`` in ``holder`` (a module's ``__dict__`` or buffer dict) as ``name``
        (``self.weights = att`` in a forward): a compiled call stores the value it computes
        there, as eager does, and the trace leaves the attribute as it found it."""
        key = (id(holder), name)
        record = self.attributes.get(key)
        if record is None:
            old = holder.get(name, _MISSING)
            if isinstance(old, SymbolicTensor):
                # a compiled module's buffer: the tensor its graph input stands for, read
                # from the module at each call (so the call stores a new tensor, as eager).
                # Looked up by the placeholder's identity: an in-place write before this
                # assignment (``self.count += 1``) has rebound it to a newer value.
                val = self.leaf_syms.get(id(old), old._val)
                old, buffer = self.concrete_of.get(val, old), False
            self.attributes[key] = [holder, name, old, value, buffer]
        else:
            record[3] = value

    def _restore_attributes(self) -> None:
        for holder, name, old, _value, _buffer in self.attributes.values():
            if old is _MISSING:
                holder.pop(name, None)
            else:
                holder[name] = old

    def enter_optimizer(self, opt) -> list:
        """Called as ``opt.step()`` starts under this capture: guard its state and make its
        float learning rates graph inputs. Returns what :meth:`exit_optimizer` restores."""
        if not any(o is opt for o in self.optimizers):
            self.optimizers.append(opt)
            self._optimizer_snapshots.append(_snapshot(opt))
            # The state the traced step assumes (a first step makes state: the next call
            # then needs a graph of its own).
            self._optimizer_signatures.append(optimizer_signature(opt))
        replaced = []
        for i, group in enumerate(opt.param_groups):
            for key in _graph_hyperparameters(opt, group):
                # Read through the optimizer: a group dict replaced between calls (a copy
                # with another lr, load_state_dict's new groups) is the one read.
                if key == "betas":
                    sym = self.scalar_input("beta1",
                                            lambda o=opt, i=i: o.param_groups[i]["betas"][0])
                    value = (sym, *group["betas"][1:])
                else:
                    sym = self.scalar_input(key, lambda o=opt, i=i, k=key: o.param_groups[i][k])
                    value = sym
                replaced.append((group, key, group[key]))
                group[key] = value
        return replaced

    @staticmethod
    def exit_optimizer(replaced: list) -> None:
        for group, key, value in replaced:
            group[key] = value

    def is_scalar_input(self, value) -> bool:
        """Whether ``value`` is one of the inputs made by :meth:`scalar_input`."""
        return any(value is sym for _getter, sym in self.scalars)

    def scalar_input(self, name: str, getter: Callable[[], Any]) -> SymbolicTensor:
        """A float64 0-d input read with ``getter()`` at each call."""
        sym = self.trace.new_input(name, TensorType((), dtypes.float64))
        self.scalars.append((getter, sym))
        return sym

    def rollback(self) -> None:
        """Undo the Python-level effects of a trace that failed (optimizer state made on a
        first step), so that running the function eagerly next starts from the same state."""
        for opt, snap in zip(self.optimizers, self._optimizer_snapshots):
            _restore(opt, snap)
        self._restore_attributes()

    def check_hyperparameters(self) -> None:
        for opt, snap in zip(self.optimizers, self._optimizer_snapshots):
            for group, saved in zip(opt.param_groups, snap[1]):
                changed = [k for k, v in saved.items() if k != "params" and group.get(k) is not v
                           and group.get(k) != v]
                if changed:
                    raise ConcretizationError(
                        f"the compiled function changed the hyperparameters {changed} of "
                        f"{type(opt).__name__} in Python while it was traced (a scheduler's "
                        "step()?); such changes happen once, at trace time. Call the scheduler "
                        "outside the compiled function: learning rates are read at each call.")

    # ------------------------------------------------------------------ the end

    def finish(self, outputs: list, mutations: list, graph) -> CaptureInfo:
        """Append the outputs that write state back; return how to read and write it."""
        info = CaptureInfo(optimizers=list(self.optimizers), did_backward=self.did_backward,
                           rollback=self.rollback)
        index = {v: i for i, v in enumerate(graph.inputs)}
        mutated_inputs = {i for i, _ in mutations}
        for _t, sym, value in self.external.values():
            i = index[value]
            if sym._value is not value and i not in mutated_inputs:
                mutations.append((i, len(outputs)))
                outputs.append(sym._value)
        for holder, name, old, value, buffer in self.attributes.values():
            if not isinstance(value, SymbolicTensor) or value._trace is not self.trace:
                continue
            if buffer and isinstance(old, Tensor) and old.shape == value.shape and \
                    old.dtype == value.dtype:
                # A buffer reassigned (self.count = self.count + 1) of a module the function
                # reaches: the graph reads that tensor, so it takes the new values at each
                # call, as the parameters of an optimizer step do.
                info.internal_writes.append((old, len(outputs)))
            else:
                info.attribute_writes.append((holder, name, len(outputs)))
            outputs.append(self.trace.operand(value))
        self._restore_attributes()
        for ref, sym, _ in self.written.values():
            t = ref()
            if t is not None:
                info.internal_writes.append((t, len(outputs)))
                outputs.append(sym._value)
        for ref, _ in self.internal_leaves:
            # A leaf made while tracing, alive after it (kept by the function's closure, a
            # module): its traced gradient is filled at each call of this graph.
            t = None if isinstance(ref, SymbolicTensor) else ref()
            if t is not None and isinstance(t._grad, SymbolicTensor):
                g = t._grad
                t._grad = Tensor._wrap(np.zeros(g.shape, g.dtype.np_dtype), g.dtype)
                info.internal_writes.append((t._grad, len(outputs)))
                outputs.append(self.trace.operand(g))
        for opt in self.optimizers:
            # State made from traced values on a first step (SGD's momentum buffer is a clone
            # of the gradient): a tensor of its own, filled at each call of this graph.
            for state in opt.state.values():
                for k, v in list(state.items()):
                    if isinstance(v, SymbolicTensor):
                        t = Tensor._wrap(np.zeros(v.shape, v.dtype.np_dtype), v.dtype)
                        state[k] = t
                        info.internal_writes.append((t, len(outputs)))
                        outputs.append(self.trace.operand(v))
        for leaf, (_sym, value) in self.grad_inputs.items():
            info.grad_inputs.append((index[leaf], index[value]))
        for leaf, g in self.grads.items():
            if g is None:
                info.grad_clears.append(index[leaf])
                continue
            initial = self.grad_inputs.get(leaf)
            value = self.trace.operand(g)
            if initial is not None and value is initial[1]:
                continue                                    # read, never changed
            in_place = initial is not None and g is initial[0]
            info.grad_writes.append((index[leaf], len(outputs), in_place))
            outputs.append(value)
            if leaf not in self.grad_inputs and leaf not in self.grad_guards:
                info.grad_drops.append(index[leaf])
        info.grad_guards = [(index[leaf], sig) for leaf, sig in self.grad_guards.items()]
        info.scalar_inputs = [(getter, index[sym._val], np.float64) for getter, sym in self.scalars]
        info.value_guards = [(index[v], a) for v, a in self.value_guards.items()]
        info.optimizer_signatures = list(self._optimizer_signatures)
        info.modules = list(self.modules.values())
        return info


def _root(a):
    """The array owning ``a``'s memory (``a`` itself for a device array or a base)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def _live_storage(exclude) -> dict[int, np.ndarray]:
    """id -> array for the storage of every concrete tensor alive now but those made while
    capture ``exclude`` traces (held, so that ids stay unique while the trace runs).

    Scanned late, this misses storage whose every older tensor died while tracing and
    that only a tensor made by the trace still holds; such storage is the trace's own from
    then on, and becomes a constant of the graph."""
    # Exact type tests: isinstance() on arbitrary objects can run their __class__ hooks
    # (lazy modules of other libraries warn when touched), and this scan sees every object.
    types_ = _tensor_types()
    out = {}
    for obj in gc.get_objects():
        if type(obj) in types_ and obj._capture_owner is not exclude:
            try:
                data = _DATA_SLOT(obj)
            except AttributeError:           # a tensor still being constructed
                continue
            if type(data) is np.ndarray:
                root = _root(data)
                out[id(root)] = root
    return out


_DATA_SLOT = Tensor._data.__get__


def _tensor_types() -> set:
    """Tensor and its subclasses (Parameter, user subclasses), without the symbolic one."""
    found, todo = set(), [Tensor]
    while todo:
        cls = todo.pop()
        if cls not in found and cls is not SymbolicTensor:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


class _Env(dict):
    """Value -> symbolic tensor, made on first use (the reverse pass reads operands and
    results of any recorded node)."""

    def __init__(self, trace: GraphTrace):
        super().__init__()
        self.trace = trace

    def __missing__(self, v: Value) -> SymbolicTensor:
        t = SymbolicTensor._make(v, self.trace, v in self.trace.grad_values)
        t._fw_grads = self.trace.tangents.get(v)     # forward mode through backward
        self[v] = t
        return t

    def get(self, op):   # noqa: A003 - the reverse pass's operand lookup
        return self[op] if isinstance(op, Value) else literal_tensor(op)


def _run_hooks(t: Tensor, g):
    """``g`` after the hooks of leaf ``t`` (``register_hook``), traced as eager runs them."""
    for hook in list(t._hooks or ()):
        g = hook_result(hook, g, _call_hook(hook, g))
    return g


def _call_hook(hook, arg):
    """``hook(arg)`` while tracing. A user's hook that changes a Python value it reads (a
    list it appends gradients to, a counter) would do so once, when traced, and never at the
    compiled calls: refused (the function then runs eagerly), its changes undone."""
    if (getattr(hook, "__module__", None) or "").startswith("fusegrad"):
        return hook(arg)             # fusegrad's own (data-parallel all-reduce launches)
    guard = ClosureGuard.of(hook)
    out = hook(arg)
    changed = guard.changed()
    if changed is not None:
        guard.restore()
        name = getattr(hook, "__name__", type(hook).__name__)
        raise ConcretizationError(
            f"the gradient hook {name}{_at()} changes a Python value it reads ({changed}); "
            "traced into a compiled backward, it would run once, when the function is traced, "
            "and never at the compiled calls. Keep such state in tensors, or run the step "
            "eagerly")
    return out


def _at() -> str:
    loc = user_location()
    return f" at {loc}" if loc else ""


def _describe(t: Tensor) -> str:
    return f"({t.dtype.short}[{','.join(map(str, t.shape))}])"


def _is_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _graph_hyperparameters(opt, group: dict) -> list[str]:
    """The keys of ``group`` that a compiled step reads at each call (graph inputs), so that
    a scheduler changes them without a recompile: of the optimizer's
    ``graph_hyperparameters``, a float lr, a nonzero float momentum (zero removes the
    momentum buffer: another graph), and ``betas`` with a float beta1."""
    keys = []
    for key in getattr(opt, "graph_hyperparameters", ("lr",)):
        value = group.get(key)
        if key == "betas":
            held = isinstance(value, tuple) and len(value) > 0 and _is_float(value[0])
        else:
            held = _is_float(value) and (key != "momentum" or value != 0)
        if held:
            keys.append(key)
    return keys


def _signature_value(value, key: str, scheduled: list[str]):
    """A group's ``value`` under ``key`` as the signature holds it: a hyperparameter read at
    each call by its type."""
    if key not in scheduled:
        return hashable(value)
    if key == "betas":
        return (type(value[0]), *map(hashable, value[1:]))
    return ("input", type(value))


def optimizer_signature(opt) -> tuple:
    """What a traced optimizer step depends on besides tensor values: hyperparameters other
    than the values of those read at each call (:func:`_graph_hyperparameters`), and per
    parameter which state it has (identity, shape, dtype)."""
    parts = []
    for group in opt.param_groups:
        scheduled = _graph_hyperparameters(opt, group)
        hyper = tuple((k, _signature_value(group[k], k, scheduled)) for k in sorted(group)
                      if k not in ("params", "lr", "param_names"))
        # A float learning rate is an input read at each call; a tensor one is captured, read
        # through the tensor the trace saw: another tensor in its place needs another trace.
        lr = group.get("lr")
        hyper += (("lr", (id(lr), lr._data.shape, lr._dtype) if isinstance(lr, Tensor)
                   else type(lr)),)
        per_param = []
        for p in group["params"]:
            state = opt.state.get(p)
            # In insertion order (each optimizer makes its state in a fixed order).
            items = () if not state else tuple(
                (k, (id(v), v._data.shape, v._dtype) if isinstance(v, Tensor) else hashable(v))
                for k, v in state.items())
            per_param.append((id(p), items))
        parts.append((hyper, tuple(per_param)))
    return tuple(parts)



class OptimizerGuard:
    """Whether an optimizer still has the signature a trace saw (:func:`optimizer_signature`),
    checked at every call of the compiled step.

    Recomputing the signature builds a tuple per parameter (about 180 us per call for the 30
    parameters of a small transformer, after the step has cooled the caches). So the check
    first compares, by identity, the objects the last matching signature was computed from:
    the group list and each group dict, their values, the parameter lists, each parameter's
    state dict and its values. Only when one of them differs is the signature recomputed;
    if it still matches, this call's objects become the reference. The shapes of state
    tensors are not compared here: those a step reads are captured tensors, whose shapes the
    entry's guard checks."""

    def __init__(self, opt, signature: tuple):
        self.opt, self.signature = opt, signature
        self._objects: tuple | None = None

    def holds(self) -> bool:
        if self._objects is not None and self._same(*self._objects):
            return True
        if optimizer_signature(self.opt) != self.signature:
            return False
        self._objects = self._take()
        return True

    def _take(self) -> tuple:
        opt = self.opt
        groups = tuple(opt.param_groups)
        contents = []
        for group in groups:
            params = group["params"]
            states = tuple(map(opt.state.get, params))
            held = [st for st in states if st is not None]
            # each state dict's size and, flat, its values (insertion order)
            contents.append((len(group), tuple((k, v) for k, v in group.items()
                                               if k not in ("params", "lr")),
                             params, tuple(params), states, [len(st) for st in held],
                             [v for st in held for v in st.values()], _lr_ref(group.get("lr"))))
        return opt.param_groups, groups, opt.state, tuple(contents)

    def _same(self, param_groups, groups, state, contents) -> bool:
        opt = self.opt
        same = operator.is_
        if opt.param_groups is not param_groups or opt.state is not state or \
                len(param_groups) != len(groups) or not all(map(same, param_groups, groups)):
            return False
        get = state.get
        for group, (size, values, params, members, states, sizes, items, lr) in \
                zip(groups, contents):
            if len(group) != size or group.get("params") is not params or \
                    len(params) != len(members) or not all(map(same, params, members)) or \
                    _lr_ref(group.get("lr")) is not lr:
                return False
            for k, v in values:
                if group.get(k, _MISSING) is not v:
                    return False
            # Lists built in comprehensions, compared at once: a loop per parameter and
            # state item was most of a transformer step's guard.
            if not all(map(same, list(map(get, members)), states)):
                return False
            held = [st for st in states if st is not None]
            if [len(st) for st in held] != sizes or \
                    not all(map(same, [v for st in held for v in st.values()], items)):
                return False
        return True


_MISSING = object()


def _lr_ref(lr):
    """A float learning rate changes freely (an input); a tensor one is compared by identity."""
    return lr if isinstance(lr, Tensor) else type(lr)


def _snapshot(opt) -> tuple:
    state = {p: dict(s) for p, s in opt.state.items()}
    groups = [dict(g) for g in opt.param_groups]
    return state, groups


def _restore(opt, snap) -> None:
    state, groups = snap
    opt.state.clear()
    for p, s in state.items():
        opt.state[p] = dict(s)
    for group, saved in zip(opt.param_groups, groups):
        group.clear()
        group.update(saved)


class capturing:
    """Context: make ``capture`` the innermost state capture of this thread
    (:func:`fusegrad.tracer.state.current_capture`)."""

    def __init__(self, capture: StateCapture):
        self.capture = capture

    def __enter__(self):
        push_capture(self.capture)
        self.capture.trace.location = USER_LINE
        return self.capture

    def __exit__(self, *exc):
        pop_capture()
        return False
