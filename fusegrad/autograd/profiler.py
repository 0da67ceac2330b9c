"""``torch.autograd.profiler``: the older spelling of :mod:`fusegrad.profiler`, on the same
machinery (:mod:`fusegrad.profiler_core`).

``with torch.autograd.profiler.profile() as prof: ...`` then ``prof.key_averages().table()``,
``prof.table()``, ``prof.function_events``; ``record_function`` is the same as
``torch.profiler.record_function``.
"""

from __future__ import annotations

from fusegrad import profiler_core as _profiler
from fusegrad.profiler_core import (
    EventList,
    FunctionEvent,
    FunctionEventAvg,
    ProfilerActivity,
    kineto_available,
    record_function,
)

__all__ = ["profile", "record_function", "EventList", "FunctionEvent", "FunctionEventAvg",
           "ProfilerActivity", "kineto_available"]


class profile(_profiler.profile):
    """``torch.autograd.profiler.profile``: records while entered when ``enabled`` (nothing
    otherwise); no schedule."""

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False, use_device=None,
                 record_shapes: bool = False, with_flops: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_modules: bool = False, use_kineto: bool = False, use_cpu: bool = True,
                 experimental_config=None, acc_events: bool = False,
                 custom_trace_id_callback=None, post_processing_timeout_s=None,
                 activity_filters=None):
        activities = {ProfilerActivity.CPU} if use_cpu else set()
        if use_cuda or use_device == "cuda":
            activities.add(ProfilerActivity.CUDA)
        super().__init__(activities=activities, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack,
                         with_flops=with_flops, with_modules=with_modules, acc_events=acc_events)
        self.enabled = enabled

    def __enter__(self) -> "profile":
        if self.enabled:
            self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        if self.enabled:
            self.stop()

    def table(self, sort_by: str | None = None, row_limit: int = 100, **kwargs) -> str:
        """The table of every event (not averaged), as ``prof.function_events.table``."""
        return self.events().table(sort_by=sort_by, row_limit=row_limit, **kwargs)

    def total_average(self) -> FunctionEventAvg:
        return self.events().total_average()

    @property
    def self_cpu_time_total(self) -> float:
        return self.events().self_cpu_time_total
