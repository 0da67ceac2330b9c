"""``torch.profiler``: where the time of a program goes, op by op and kernel by kernel.

::

    from fusegrad.profiler import profile, record_function, ProfilerActivity

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("forward"):
            loss = model(x, y)
        loss.backward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")      # chrome://tracing or ui.perfetto.dev

What is recorded, each as one event with its start and end on its thread:

- eager ops: one event per primitive call, ``aten::<primitive>`` (torch's namespace for its
  operators; fusegrad's primitive names are mostly aten's: ``aten::add``, ``aten::matmul``,
  ``aten::sum``), and one per composite op (``aten::softmax``, ``aten::layer_norm``,
  ``aten::cross_entropy``) with its primitives, or its eager kernels, inside it;
- autograd: one event per backward node run (``MulBackward0``), its ops inside;
- optimizers: ``Optimizer.step#AdamW.step`` and ``Optimizer.zero_grad#AdamW.zero_grad``;
- ``record_function`` ranges, and ``ProfilerStep#<n>`` around each step under a schedule;
- a compiled function's call: ``Torch-Compiled Region: <function>`` (as torch names it), its
  self time what the call spends around its programs (guards, arguments, write-backs; the
  trace and compile of a first call);
- compiled programs: ``compiled::<program>`` around each run of one, and inside it one event
  per kernel launch, named ``<program>::`` and the kernel as the kernel listing describes it
  (``step::k24[reduction 512x100](max,reshape,eq,...)``), category ``kernel``; the steps that
  are not generated code name how they run after the kernel's index: ``k14.blas`` (numpy's
  BLAS product of a matmul kernel; its fused epilogue is the ``k14`` launch after it),
  ``k14.gemm`` (the generated GEMM), ``k20.native``, ``k9.numpy`` (extern steps), category
  ``extern``. Their self times are the time of the kernels themselves, timed around the
  same call an unprofiled run makes (two clock reads a step; the events are built when the
  profile is read): a kernel split over the thread pool is one event on the calling thread,
  from handing its parts to the pool to the end of the last part, the wall time it adds to
  a step. A program's own self time is what the runtime spends around them (binding
  buffers).

``record_function`` ranges inside a compiled function are not part of its program (fusion
moves work across them): they time the tracing, on a call that compiles, and a steady call
shows the program's kernels instead.

The times are CPU wall times (``time.perf_counter_ns``). The kernels of programs compiled
for CUDA are events as the CPU's are, timed from the host with the device synchronized before
and after each while a profiler records (so each includes its launch); the table keeps
torch's CPU columns. ``profile_memory`` records the bytes of each eager op's result (its "CPU
Mem" column); what compiled programs allocate is not counted.
"""

from __future__ import annotations

from fusegrad.profiler_core import (  # noqa: F401  (_build_events: the tests build events)
    EventList,
    FunctionEvent,
    FunctionEventAvg,
    Interval,
    ProfilerAction,
    ProfilerActivity,
    _build_events,
    kineto_available,
    profile,
    record_function,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["ProfilerActivity", "ProfilerAction", "profile", "record_function", "schedule",
           "tensorboard_trace_handler", "supported_activities", "kineto_available",
           "FunctionEvent", "FunctionEventAvg", "EventList"]


def __getattr__(name: str):
    raise _missing_attribute("torch.profiler", "fusegrad.profiler", name)
