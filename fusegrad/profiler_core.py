"""The profiler's machinery behind ``torch.profiler`` (:mod:`fusegrad.profiler`) and
``torch.autograd.profiler`` (:mod:`fusegrad.autograd.profiler`): activities, schedules,
:class:`profile` and :class:`record_function`, the events a recording becomes, their tables
and Chrome traces. :mod:`fusegrad.profiling` holds the recorder the hot paths test; this
module reads what it recorded. It sits in the base layer (it imports nothing of fusegrad but
:mod:`fusegrad.profiling`), so that autograd can offer torch's older spelling; what it records
is described in :mod:`fusegrad.profiler`.
"""

from __future__ import annotations

import contextlib
import enum
import gzip
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from fusegrad import profiling

__all__ = ["ProfilerActivity", "ProfilerAction", "profile", "record_function", "schedule",
           "tensorboard_trace_handler", "supported_activities", "register_device_activity",
           "kineto_available", "FunctionEvent", "FunctionEventAvg", "EventList"]


class ProfilerActivity(enum.Enum):
    """What a profiler records (torch's names): ``CPU`` is what fusegrad times."""

    CPU = 0
    XPU = 1
    MTIA = 2
    CUDA = 3
    HPU = 4
    PrivateUse1 = 5


class ProfilerAction(enum.Enum):
    """What a profiler does at a step, as a ``schedule`` says (torch's values)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


# The devices besides the CPU whose activity a profiler records by default, each with its
# "is one present?" query: the runtime registers CUDA's at import (the profiler knows no device).
_DEVICE_ACTIVITIES: list[tuple[ProfilerActivity, Callable[[], bool]]] = []


def register_device_activity(activity: ProfilerActivity, is_available: Callable[[], bool]) -> None:
    """Record ``activity`` by default while ``is_available()``; ``fusegrad.runtime.cuda``
    registers ``ProfilerActivity.CUDA`` with its driver query."""
    _DEVICE_ACTIVITIES.append((activity, is_available))


def supported_activities() -> set[ProfilerActivity]:
    """The activities a profiler records here: the CPU (and CUDA launches where a CUDA
    device is present)."""
    out = {ProfilerActivity.CPU}
    out.update(activity for activity, is_available in _DEVICE_ACTIVITIES if is_available())
    return out


def kineto_available() -> bool:
    """Whether the profiler is available (always: it is fusegrad's own)."""
    return True


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0) -> Callable[[int], ProfilerAction]:
    """A profiler ``schedule``: skip the first ``skip_first`` steps, then cycle through
    ``wait`` steps not recorded, ``warmup`` steps not recorded either (the profiler gets
    ready), and ``active`` recorded steps, the last of which saves the trace (calls
    ``on_trace_ready``); ``repeat`` cycles (0: until the profiler stops). ``skip_first_wait``
    skips the first cycle's wait. As ``torch.profiler.schedule``, step for step."""

    def schedule_fn(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"Step must be non-negative. Got {step}.")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait != 0:
            step += wait
        num_steps = wait + warmup + active
        if repeat > 0 and step / num_steps >= repeat:
            return ProfilerAction.NONE
        mod_step = step % num_steps
        if mod_step < wait:
            return ProfilerAction.NONE
        if mod_step < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if mod_step < num_steps - 1 else \
            ProfilerAction.RECORD_AND_SAVE

    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise AssertionError(
            f"Invalid profiler schedule arguments. Got wait={wait} (need >= 0), warmup={warmup} "
            f"(need >= 0), active={active} (need > 0), repeat={repeat} (need >= 0), "
            f"skip_first={skip_first} (need >= 0).")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results",
                      stacklevel=2)
    return schedule_fn


def _default_schedule(_: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None,
                              use_gzip: bool = False, use_python_export: bool = False):
    """An ``on_trace_ready`` handler that writes each trace to ``dir_name`` as
    ``<worker>.<time_ns>.pt.trace.json`` (``.gz`` with ``use_gzip``), the layout TensorBoard's
    profiler plugin reads; ``worker_name`` defaults to ``<host>_<pid>``."""

    def handler_fn(prof: "profile") -> None:
        nonlocal worker_name
        if not os.path.isdir(dir_name):
            try:
                os.makedirs(dir_name, exist_ok=True)
            except Exception as e:
                raise RuntimeError("Can't create directory: " + dir_name) from e
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        file_name = f"{worker_name}.{time.time_ns()}.pt.trace.json"
        if use_gzip:
            file_name += ".gz"
        prof.export_chrome_trace(os.path.join(dir_name, file_name))
    return handler_fn


# --------------------------------------------------------------------------- events


class Interval:
    """An event's time range in microseconds (torch's ``time_range``)."""

    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end

    def elapsed_us(self) -> float:
        return self.end - self.start


class FunctionEvent:
    """One recorded event: ``name``, ``time_range`` (microseconds), ``thread``,
    ``input_shapes``, ``stack``, its ``cpu_parent`` and ``cpu_children`` (the events inside it
    on its thread), and the times torch reports: ``cpu_time_total`` (its duration) and
    ``self_cpu_time_total`` (less its children's)."""

    def __init__(self, id: int, name: str, category: str, start_us: float, end_us: float,
                 thread: int, input_shapes=None, stack=None, nbytes: int = 0,
                 args: dict | None = None):
        # A schedule's step ranges are one row of the table, "ProfilerStep*", as in torch;
        # the trace keeps each step's own name ("ProfilerStep#3").
        self.trace_name = name
        self.name = "ProfilerStep*" if name.startswith("ProfilerStep#") else name
        self.id, self.category = id, category
        self.time_range = Interval(start_us, end_us)
        self.thread = thread
        self.input_shapes = input_shapes if input_shapes is not None else []
        self.stack = list(stack) if stack else []
        self.args = args or {}
        self.cpu_children: list[FunctionEvent] = []
        self.cpu_parent: FunctionEvent | None = None
        self.self_cpu_memory_usage = nbytes
        self.count = 1
        self.is_async = False
        self.is_user_annotation = category == "user_annotation"
        self.use_device = None
        self.node_id = -1
        self.overload_name = ""

    key = property(lambda self: self.name)
    cpu_time_total = property(lambda self: self.time_range.elapsed_us())
    cpu_time = cpu_time_total
    device_time_total = self_device_time_total = device_time = property(lambda self: 0.0)
    cuda_time_total = self_cuda_time_total = device_time_total

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_memory_usage(self) -> int:
        return self.self_cpu_memory_usage + sum(c.cpu_memory_usage for c in self.cpu_children)

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} cpu_time={_format_time(self.cpu_time_total)} "
                f"self_cpu_time={_format_time(self.self_cpu_time_total)} "
                f"input_shapes={self.input_shapes}>")


class FunctionEventAvg:
    """The events of one key summed (``key_averages``): ``count``, ``cpu_time_total``,
    ``self_cpu_time_total`` and their average ``cpu_time``."""

    def __init__(self, key: str, input_shapes=None, stack=None):
        self.key = key
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.input_shapes = input_shapes
        self.stack = stack or []
        self.is_async = False
        self.is_user_annotation = False
        self.use_device = None
        self.node_id = -1
        self.overload_name = ""
        self.device_time_total = self.self_device_time_total = 0.0
        self.cuda_time_total = self.self_cuda_time_total = 0.0
        self.cpu_parent: FunctionEvent | None = None

    def add(self, event) -> "FunctionEventAvg":
        if self.count == 0:
            self.cpu_parent = getattr(event, "cpu_parent", None)     # torch's: the first's
        self.count += event.count
        self.cpu_time_total += event.cpu_time_total
        self.self_cpu_time_total += event.self_cpu_time_total
        self.cpu_memory_usage += event.cpu_memory_usage
        self.self_cpu_memory_usage += event.self_cpu_memory_usage
        self.is_user_annotation = event.is_user_annotation
        return self

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / max(self.count, 1)

    device_time = cuda_time = property(lambda self: 0.0)

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={_format_time(self.self_cpu_time_total)} "
                f"cpu_time={_format_time(self.cpu_time)} input_shapes={self.input_shapes}>")


class EventList(list):
    """A list of events with torch's views of them: :meth:`table`, :meth:`key_averages`,
    :meth:`export_chrome_trace`, :attr:`self_cpu_time_total`."""

    def __init__(self, events=(), profile_memory: bool = False):
        super().__init__(events)
        self._profile_memory = profile_memory

    @property
    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self)

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_src_column_width: int = 75, max_name_column_width: int | None = 55,
              max_shapes_column_width: int | None = 80, header: str | None = None,
              top_level_events_only: bool = False, time_unit: str | None = None) -> str:
        """The events as torch's table: one row each, sorted by ``sort_by`` (an attribute:
        ``cpu_time_total``, ``self_cpu_time_total``, ``cpu_time``, ``count``,
        ``cpu_memory_usage``, ``self_cpu_memory_usage``; largest first), at most
        ``row_limit`` rows; names longer than ``max_name_column_width`` are cut (pass None
        for whole kernel names)."""
        return _build_table(self, sort_by, header, row_limit, max_src_column_width,
                            max_name_column_width, max_shapes_column_width,
                            self._profile_memory, top_level_events_only, time_unit)

    def key_averages(self, group_by_input_shapes: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> "EventList":
        """One :class:`FunctionEventAvg` per name (and input shapes, and the innermost
        ``group_by_stack_n`` stack frames, when asked), in order of first appearance."""
        groups: dict[tuple, FunctionEventAvg] = {}
        for e in self:
            key = [e.key]
            if group_by_input_shapes:
                key.append(str(e.input_shapes))
            if group_by_stack_n > 0:
                key += e.stack[:group_by_stack_n]
            avg = groups.get(tuple(key))
            if avg is None:
                avg = groups[tuple(key)] = FunctionEventAvg(
                    e.key, e.input_shapes if group_by_input_shapes else None,
                    e.stack[:group_by_stack_n] if group_by_stack_n > 0 else None)
            avg.add(e)
        return EventList(groups.values(), profile_memory=self._profile_memory)

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg("Total")
        for e in self:
            total.add(e)
        return total

    def export_chrome_trace(self, path: str) -> None:
        """Write the events as Chrome trace-event JSON (``chrome://tracing``, Perfetto)."""
        _write_trace(path, _chrome_trace(self, os.path.basename(path), True))


def _build_events(raw: list[tuple], origin_ns: int) -> list[FunctionEvent]:
    """FunctionEvents from a recorder's tuples, each linked to the innermost event that
    contains it on its thread (events of one thread nest: each is a call within a call)."""
    order = sorted(range(len(raw)), key=lambda i: (raw[i][4], raw[i][2], -raw[i][3], i))
    events: list[FunctionEvent | None] = [None] * len(raw)
    stacks: dict[int, list[tuple[int, FunctionEvent]]] = {}
    for n, i in enumerate(order):
        name, category, start, end, tid, shapes, stack, nbytes, args = raw[i]
        e = FunctionEvent(n, name, category, (start - origin_ns) / 1e3, (end - origin_ns) / 1e3,
                          tid, shapes, stack, nbytes, args)
        open_ = stacks.setdefault(tid, [])
        while open_ and open_[-1][0] < end:
            open_.pop()
        if open_:
            e.cpu_parent = open_[-1][1]
            e.cpu_parent.cpu_children.append(e)
        open_.append((end, e))
        events[i] = e
    return sorted(events, key=lambda e: (e.time_range.start, -e.time_range.end, e.id))


# --------------------------------------------------------------------------- the profiler


class profile:
    """Record what a program runs (see the module's docstring) while it is entered, or
    between :meth:`start` and :meth:`stop`.

    ``schedule`` (from :func:`schedule`) decides per :meth:`step` whether to record; a
    recording cycle's trace is handed to ``on_trace_ready(prof)`` when it ends (and at
    stop); without a schedule every step is recorded and ``on_trace_ready`` runs at stop.
    ``record_shapes``: keep each op's input shapes (``key_averages(group_by_input_shape=
    True)``, the trace's "Input Dims"); ``with_stack``: keep the user's Python stack of each
    event; ``profile_memory``: the bytes of each eager op's result."""

    def __init__(self, *, activities: Iterable[ProfilerActivity] | None = None,
                 schedule: Callable[[int], ProfilerAction] | None = None,
                 on_trace_ready: Callable[..., Any] | None = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config=None,
                 execution_trace_observer=None, acc_events: bool = False,
                 use_cuda: bool | None = None, custom_trace_id_callback=None,
                 post_processing_timeout_s: float | None = None):
        chosen = set(activities) if activities is not None else supported_activities()
        for a in chosen:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"profile: activities must be ProfilerActivity values, got {a!r}")
        if use_cuda is not None:
            warnings.warn("`use_cuda` is deprecated, use `activities` argument instead",
                          FutureWarning, stacklevel=2)
            chosen = chosen | {ProfilerActivity.CUDA} if use_cuda else \
                chosen - {ProfilerActivity.CUDA}
        if not chosen:
            raise AssertionError("No valid profiler activities found")
        for flag, what in ((with_flops, "with_flops"), (with_modules, "with_modules"),
                           (execution_trace_observer is not None, "execution_trace_observer")):
            if flag:
                warnings.warn(f"fusegrad's profiler does not record {what}; it is ignored",
                              UserWarning, stacklevel=2)
        self.activities = chosen
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.acc_events = acc_events
        self.custom_trace_id_callback = custom_trace_id_callback
        self.record_steps = schedule is not None
        self.schedule = schedule if schedule is not None else _default_schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self._recorder: profiling.Recorder | None = None     # the cycle being prepared/recorded
        self._events: EventList | None = None                # the last finished cycle's
        self._raw: list[tuple] = []
        self._step_range: record_function | None = None
        self._origin_ns = time.perf_counter_ns()
        self._origin_wall_ns = time.time_ns()
        self.trace_id = None

    # The transitions of torch's profiler, (previous, current) -> actions.
    def _transit_action(self, prev: ProfilerAction | None, current: ProfilerAction | None) -> None:
        A = ProfilerAction
        warm, rec, save, none = A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE
        actions = {
            (none, warm): [self._prepare_trace],
            (none, rec): [self._prepare_trace, self._start_trace],
            (none, save): [self._prepare_trace, self._start_trace],
            (warm, none): [lambda: warnings.warn("Incorrect schedule: WARMUP followed by NONE",
                                                 stacklevel=3),
                           self._start_trace, self._stop_trace],
            (warm, rec): [self._start_trace],
            (warm, save): [self._start_trace],
            (rec, none): [lambda: warnings.warn("Incorrect schedule: RECORD followed by NONE",
                                                stacklevel=3), self._stop_trace],
            (rec, warm): [lambda: warnings.warn("Incorrect schedule: RECORD followed by WARMUP",
                                                stacklevel=3), self._stop_trace],
            (save, none): [self._stop_trace, self._trace_ready],
            (save, warm): [self._stop_trace, self._trace_ready, self._prepare_trace],
            (save, rec): [self._stop_trace, self._trace_ready, self._prepare_trace,
                          self._start_trace],
            (save, save): [self._stop_trace, self._trace_ready, self._prepare_trace,
                           self._start_trace],
            (warm, None): [self._start_trace, self._stop_trace],
            (rec, None): [self._stop_trace, self._trace_ready],
            (save, None): [self._stop_trace, self._trace_ready],
        }
        for action in actions.get((prev, current), ()):
            action()

    def _prepare_trace(self) -> None:
        self._recorder = profiling.Recorder(self.record_shapes, self.with_stack,
                                            self.profile_memory)
        if self.custom_trace_id_callback is not None:
            self.trace_id = self.custom_trace_id_callback()

    def _start_trace(self) -> None:
        if profiling.recorder is not None:
            raise RuntimeError("profile: another profiler is recording already; fusegrad "
                               "records one profiler at a time (stop the other one first)")
        if self._recorder is None:
            self._prepare_trace()
        self._recorder.start_ns = time.perf_counter_ns()
        profiling.recorder = self._recorder

    def _stop_trace(self) -> None:
        rec = self._recorder
        if rec is None:
            return
        if profiling.recorder is rec:
            profiling.recorder = None
        rec.closed = True
        self._raw = (self._raw + rec.all_events()) if self.acc_events else rec.all_events()
        self._events = None
        self._recorder = None

    def _trace_ready(self) -> None:
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def start(self) -> None:
        """Start profiling (what entering the ``with`` block does)."""
        self._transit_action(ProfilerAction.NONE, self.current_action)
        if self.record_steps:
            self._step_range = record_function(f"ProfilerStep#{self.step_num}")
            self._step_range.__enter__()

    def stop(self) -> None:
        """Stop profiling; a recording cycle's trace goes to ``on_trace_ready``."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        self._transit_action(self.current_action, None)

    def step(self) -> None:
        """Tell the profiler that the next step starts: the schedule decides what it does."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit_action(prev, self.current_action)
        if self.record_steps:
            self._step_range = record_function(f"ProfilerStep#{self.step_num}")
            self._step_range.__enter__()

    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.stop()

    # ------------------------------------------------------------------ results

    def events(self) -> EventList:
        """Every event of the last recorded cycle, in start order, nested on their threads."""
        if self._events is None:
            self._events = EventList(_build_events(self._raw, self._origin_ns),
                                     profile_memory=self.profile_memory)
        return self._events

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """The events summed per name (and per input shapes, stack): ``.table()`` prints it."""
        if group_by_input_shape and not self.record_shapes:
            raise AssertionError("Please set record_shapes=True to use "
                                 "group_by_input_shape")
        if group_by_stack_n > 0 and not self.with_stack:
            raise AssertionError("Please set with_stack=True to use group_by_stack_n")
        return self.events().key_averages(group_by_input_shape, group_by_stack_n,
                                          group_by_overload_name)

    def export_chrome_trace(self, path: str, use_python_export: bool = False) -> None:
        """Write the last recorded cycle as Chrome trace-event JSON (``.gz``: compressed):
        complete ("X") events with ``ts`` and ``dur`` in microseconds, ``pid``, ``tid`` and
        ``args`` (input shapes as "Input Dims"), which ``chrome://tracing`` and
        ``ui.perfetto.dev`` open."""
        trace = _chrome_trace(self.events(), os.path.basename(path), self.record_shapes,
                              self._origin_ns, self._origin_wall_ns, self.trace_id)
        _write_trace(path, trace)

    @property
    def profiler(self) -> "profile":
        """torch's ``prof.profiler``: the object with ``function_events``."""
        return self

    @property
    def function_events(self) -> EventList:
        return self.events()


class record_function(contextlib.ContextDecorator):
    """Label a block (``with record_function("forward"):``) or a function
    (``@record_function("loss")``): while a profiler records, it becomes one event of that
    name, the ops it runs inside it."""

    def __init__(self, name: str, args: str | None = None):
        self.name = name
        self.args = args
        self._rec: profiling.Recorder | None = None

    def __enter__(self) -> "record_function":
        rec = self._rec = profiling.recorder
        if rec is not None:
            self._stack = rec.stack()
            self._start = time.perf_counter_ns()
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.add(self.name, "user_annotation", self._start, time.perf_counter_ns(),
                    None, self._stack, 0, {"args": self.args} if self.args else None)
        return False

    def _recreate_cm(self):
        # A decorated function entered twice at once (recursion, threads) needs one state
        # per call.
        return record_function(self.name, self.args)


# --------------------------------------------------------------------------- table


def _format_time(time_us: float) -> str:
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def _format_time_share(time_us: float, total_us: float) -> str:
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def _format_memory(nbytes: int) -> str:
    kb, mb, gb = 1024, 1024 ** 2, 1024 ** 3
    if abs(nbytes) >= gb:
        return f"{nbytes / gb:.2f} Gb"
    if abs(nbytes) >= mb:
        return f"{nbytes / mb:.2f} Mb"
    if abs(nbytes) >= kb:
        return f"{nbytes / kb:.2f} Kb"
    return f"{nbytes} b"


_TIME_UNITS = {"s": 1e6, "ms": 1e3, "us": 1.0}


def _build_table(events, sort_by, header, row_limit, max_src_column_width, max_name_column_width,
                 max_shapes_column_width, profile_memory, top_level_events_only,
                 time_unit) -> str:
    """torch's profiler table (``torch.autograd.profiler_util._build_table``), the CPU
    columns: same headers, widths, sorting, truncation and footer."""
    if len(events) == 0:
        return ""
    if time_unit is not None and time_unit not in _TIME_UNITS:
        raise ValueError(f"time_unit must be one of s, ms, us, got {time_unit!r}")

    def fmt_time(us: float) -> str:
        if time_unit is None:
            return _format_time(us)
        return f"{us / _TIME_UNITS[time_unit]:.3f}{time_unit}"

    if sort_by is not None:
        attr = sort_by.replace("cuda", "device").replace("xpu", "device")
        if not hasattr(events[0], attr):
            raise AttributeError(f"sort_by: events have no attribute {sort_by!r} (valid: "
                                 "cpu_time, cpu_time_total, self_cpu_time_total, count, "
                                 "cpu_memory_usage, self_cpu_memory_usage)")
        events = sorted(events, key=lambda e: getattr(e, attr), reverse=True)
    has_shapes = any(e.input_shapes for e in events)
    stacks = [e.stack for e in events if e.stack]
    name_width = max(len(e.key) for e in events) + 4
    if max_name_column_width is not None:
        name_width = min(name_width, max_name_column_width)
    shapes_width = max(len(str(e.input_shapes)) for e in events) + 4
    if max_shapes_column_width is not None:
        shapes_width = min(shapes_width, max_shapes_column_width)
    src_width = None
    if stacks:
        src_width = max(len(s) for st in stacks for s in st) + 4
        if max_src_column_width is not None:
            src_width = min(src_width, max_src_column_width)

    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if profile_memory:
        headers += ["CPU Mem", "Self CPU Mem"]
    headers.append("# of Calls")
    widths = [(name_width, ">")] + [(12, ">")] * (len(headers) - 1)
    if has_shapes:
        headers.append("Input Shapes")
        widths.append((shapes_width, ">"))
    if stacks:
        headers.append("Source Location")
        widths.append((src_width, "<"))
    row_format = "".join("{: " + align + str(w) + "}  " for w, align in widths)
    header_sep = "".join("-" * w + "  " for w, _ in widths)
    line_length = sum(w + 2 for w, _ in widths) - 2

    def trim_path(path: str) -> str:
        if len(path) > src_width:
            path = path[len(path) - src_width:]
            if len(path) > 3:
                path = "..." + path[3:]
        return path

    total = sum(e.self_cpu_time_total for e in events)
    out: list[str] = []
    if header is not None:
        out += ["=" * line_length, header]
    if top_level_events_only:
        out += ["=" * line_length, "This report only display top-level ops statistics"]
    out += [header_sep, row_format.format(*headers), header_sep]
    shown = 0
    for e in events:
        if shown == row_limit:
            break
        if top_level_events_only and getattr(e, "cpu_parent", None) is not None:
            continue
        shown += 1
        name = e.key
        if max_name_column_width is not None and len(name) >= max_name_column_width - 3:
            name = name[:max_name_column_width - 3] + "..."
        row = [name, _format_time_share(e.self_cpu_time_total, total),
               fmt_time(e.self_cpu_time_total), _format_time_share(e.cpu_time_total, total),
               fmt_time(e.cpu_time_total), fmt_time(e.cpu_time)]
        if profile_memory:
            row += [_format_memory(e.cpu_memory_usage), _format_memory(e.self_cpu_memory_usage)]
        row.append(e.count)
        if has_shapes:
            row.append(str(e.input_shapes)[:shapes_width])
        if stacks:
            row.append(trim_path(e.stack[0]) if e.stack else "")
        out.append(row_format.format(*row))
        if stacks:
            blank = [""] * (len(headers) - 1)
            for entry in e.stack[1:]:
                out.append(row_format.format(*blank, trim_path(entry)))
            out.append(row_format.format(*blank, ""))
    out += [header_sep, f"Self CPU time total: {fmt_time(total)}"]
    return "".join(line + "\n" for line in out)


# --------------------------------------------------------------------------- chrome trace


def _chrome_trace(events, name: str, record_shapes: bool, origin_ns: int | None = None,
                  origin_wall_ns: int | None = None, trace_id=None) -> dict:
    """The Chrome trace-event JSON object of ``events``: metadata ("M") events naming the
    process and its threads, then one complete ("X") event per event, ``ts`` and ``dur`` in
    microseconds (from the profiler's origin, whose wall-clock time is
    ``baseTimeNanoseconds``)."""
    pid = os.getpid()
    main = threading.main_thread().native_id
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
         "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "ts": 0,
         "args": {"labels": "CPU"}}]
    for tid in sorted({e.thread for e in events}):
        label = "python" if tid == main else "worker"
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                    "args": {"name": f"thread {tid} ({label})"}})
    for n, e in enumerate(events):
        args: dict[str, Any] = {"External id": n + 1}
        args.update(getattr(e, "args", {}) or {})
        if record_shapes and e.input_shapes:
            args["Input Dims"] = e.input_shapes
        if e.stack:
            args["Call stack"] = ";".join(e.stack)
        out.append({"ph": "X", "cat": e.category, "name": e.trace_name,
                    "pid": pid, "tid": e.thread, "ts": e.time_range.start,
                    "dur": e.time_range.elapsed_us(), "args": args})
    trace = {"schemaVersion": 1, "deviceProperties": [], "record_shapes": int(record_shapes),
             "displayTimeUnit": "ms", "traceEvents": out, "traceName": name}
    if origin_wall_ns is not None:
        trace["baseTimeNanoseconds"] = origin_wall_ns
    if trace_id is not None:
        trace["trace_id"] = trace_id
    return trace


def _write_trace(path: str, trace: dict) -> None:
    text = json.dumps(trace)
    if path.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

