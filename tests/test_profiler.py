"""fusegrad.profiler (torch.profiler): what is recorded, the table, schedules, Chrome traces."""

import json
import os
import sys
import time
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import profiling
from fusegrad.profiler import (
    ProfilerAction,
    ProfilerActivity,
    _build_events,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

HEADERS = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg",
           "# of Calls"]


def _eager_program():
    x = fg.randn(16, 8, requires_grad=True)
    w = fg.randn(8, 4)
    with record_function("forward"):
        y = fg.nn.functional.softmax(x @ w, dim=-1).sum()
    with record_function("backward"):
        y.backward()


def _rows(table: str) -> list[str]:
    """The body rows of a table: between the second and the third separator line."""
    lines = table.splitlines()
    seps = [i for i, line in enumerate(lines) if line.startswith("---")]
    return lines[seps[1] + 1:seps[2]]


# Synthetic events with known times: (name, start us, end us, thread); nested by their times.
SYNTHETIC = [("outer", 0, 1000, 1), ("aten::mul", 100, 300, 1), ("aten::add", 400, 450, 1),
             ("inner", 500, 900, 1), ("aten::mul", 600, 700, 1), ("aten::mul", 2000, 2100, 1),
             ("other thread", 50, 60, 2)]


def _synthetic(shapes: bool = False):
    raw = [(name, "cpu_op", int(s * 1000), int(e * 1000), tid,
            [[2, i + 1]] if shapes else None, None, 0, None)
           for i, (name, s, e, tid) in enumerate(SYNTHETIC)]
    return fg.profiler.EventList(_build_events(raw, 0))


# --------------------------------------------------------------------------- events and times


def test_self_and_total_times_of_nested_events():
    events = {(e.name, e.time_range.start): e for e in _synthetic()}
    outer, inner = events[("outer", 0)], events[("inner", 500)]
    assert outer.cpu_time_total == 1000
    # outer holds mul (200), add (50) and inner (400, which holds a mul of 100)
    assert outer.self_cpu_time_total == 1000 - 200 - 50 - 400
    assert inner.self_cpu_time_total == 300
    assert events[("aten::mul", 600)].cpu_parent is inner
    assert events[("aten::mul", 2000)].cpu_parent is None
    assert events[("other thread", 50)].cpu_parent is None      # another thread's: not a child
    avg = {a.key: a for a in _synthetic().key_averages()}
    assert avg["aten::mul"].count == 3
    assert avg["aten::mul"].cpu_time_total == 400
    assert avg["aten::mul"].cpu_time == pytest.approx(400 / 3)


def test_record_function_nesting_self_vs_total():
    x = fg.ones(4)
    with profile() as prof:
        with record_function("outer"):
            with record_function("inner"):
                x + 1
            x * 2
    events = prof.events()
    outer = next(e for e in events if e.name == "outer")
    inner = next(e for e in events if e.name == "inner")
    assert inner.cpu_parent is outer
    assert [c.name for c in inner.cpu_children] == ["aten::add"]
    assert [c.name for c in outer.cpu_children] == ["inner", "aten::mul"]
    assert outer.time_range.start <= inner.time_range.start <= inner.time_range.end \
        <= outer.time_range.end
    assert outer.self_cpu_time_total == pytest.approx(
        outer.cpu_time_total - inner.cpu_time_total - outer.cpu_children[1].cpu_time_total)
    assert inner.category == "user_annotation"


def test_record_function_as_decorator_and_outside_a_profiler():
    @record_function("my_loss")
    def loss(x):
        return (x * x).sum()

    loss(fg.ones(3))                         # no profiler: nothing recorded, nothing raised
    with profile() as prof:
        loss(fg.ones(3))
        loss(fg.ones(3))
    avg = {a.key: a for a in prof.key_averages()}
    assert avg["my_loss"].count == 2
    assert {c.name for e in prof.events() if e.name == "my_loss" for c in e.cpu_children} == \
        {"aten::mul", "aten::sum"}


def test_eager_ops_autograd_nodes_and_optimizer_are_named_as_torch_names_them():
    lin = fg.nn.Linear(8, 4)
    opt = fg.optim.SGD(lin.parameters(), lr=0.1)
    x = fg.randn(16, 8)
    with profile() as prof:
        opt.zero_grad()
        loss = fg.nn.functional.softmax(lin(x), dim=-1).sum()
        loss.backward()
        opt.step()
    names = {e.name for e in prof.events()}
    assert {"aten::softmax", "aten::sum", "SumBackward0",
            "Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad"} <= names
    assert any(n.endswith("Backward0") and n != "SumBackward0" for n in names)


def test_nothing_is_recorded_when_not_profiling():
    assert profiling.recorder is None
    with profile() as prof:
        fg.ones(3) + 1
    assert profiling.recorder is None
    n = len(prof.events())
    fg.ones(3) + 1
    with record_function("after"):
        fg.ones(3) * 2
    assert len(prof.events()) == n
    with pytest.raises(ZeroDivisionError):
        with profile():
            raise ZeroDivisionError
    assert profiling.recorder is None          # an exception stops the profiler too


def test_one_profiler_at_a_time():
    with profile():
        with pytest.raises(RuntimeError, match="another profiler is recording"):
            with profile():
                pass


def test_record_shapes():
    a, b = fg.ones(2, 3), fg.ones(3, 5)
    with profile(record_shapes=True) as prof:
        a @ b
        a @ fg.ones(3, 1)
    mm = [e for e in prof.events() if e.name == "aten::matmul"]
    assert [e.input_shapes for e in mm] == [[[2, 3], [3, 5]], [[2, 3], [3, 1]]]
    groups = prof.key_averages(group_by_input_shape=True)
    assert sorted(str(g.input_shapes) for g in groups if g.key == "aten::matmul") == \
        ["[[2, 3], [3, 1]]", "[[2, 3], [3, 5]]"]
    assert "Input Shapes" in groups.table()
    with profile() as prof2:
        a @ b
    assert prof2.events()[0].input_shapes == []
    with pytest.raises(AssertionError, match="record_shapes=True"):
        prof2.key_averages(group_by_input_shape=True)


def test_with_stack_names_the_users_line():
    x = fg.ones(3)
    with profile(with_stack=True) as prof:
        x + 1
    (add,) = [e for e in prof.events() if e.name == "aten::add"]
    assert os.path.basename(__file__) in add.stack[0]
    assert "fusegrad" + os.sep not in add.stack[0]
    assert "Source Location" not in prof.key_averages().table()        # as torch's
    table = prof.key_averages(group_by_stack_n=1).table()
    assert "Source Location" in table and os.path.basename(__file__) in table


def test_profile_memory_counts_eager_results():
    with profile(profile_memory=True) as prof:
        fg.ones(64, 64) + 1
    table = prof.key_averages().table()
    assert "CPU Mem" in table and "Self CPU Mem" in table
    (add,) = [e for e in prof.events() if e.name == "aten::add"]
    assert add.self_cpu_memory_usage == 64 * 64 * 4


# --------------------------------------------------------------------------- the table


def test_table_columns_rows_and_footer():
    with profile() as prof:
        _eager_program()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=5)
    lines = table.splitlines()
    assert lines[0].startswith("---") and lines[2].startswith("---")
    assert lines[1].split("  ") and [h.strip() for h in lines[1].split("  ") if h.strip()] == \
        HEADERS
    assert len(_rows(table)) == 5
    assert lines[-1].startswith("Self CPU time total: ")
    total = prof.key_averages().table(row_limit=-1)
    assert len(_rows(total)) == len(prof.key_averages())


def test_table_sorting():
    events = _synthetic().key_averages()
    for key in ("cpu_time_total", "self_cpu_time_total", "count", "cpu_time"):
        names = [r.split()[0] for r in _rows(events.table(sort_by=key))]
        want = [e.key for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)]
        assert [n.split()[0] for n in want] == names
    assert _rows(events.table(sort_by="count"))[0].split()[0] == "aten::mul"
    with pytest.raises(AttributeError, match="sort_by"):
        events.table(sort_by="cpu_tme_total")


def test_table_percentages_and_units():
    table = _synthetic().key_averages().table(sort_by="cpu_time_total", row_limit=1)
    # outer: 1000 us total over a self total of 1000 + 100 (a mul outside) + 10 (the thread)
    (row,) = _rows(table)
    assert row.split()[1:6] == ["31.53%", "350.000us", "90.09%", "1.000ms", "1.000ms"]
    assert table.splitlines()[-1] == "Self CPU time total: 1.110ms"
    assert "0.350ms" in _synthetic().key_averages().table(time_unit="ms")


def test_long_names_are_cut_as_torch_cuts_them():
    raw = [("k" * 80, "kernel", 0, 1000, 1, None, None, 0, None)]
    events = fg.profiler.EventList(_build_events(raw, 0))
    (row,) = _rows(events.table())
    assert row.split()[0] == "k" * 52 + "..."
    (row,) = _rows(events.table(max_name_column_width=None))
    assert row.split()[0] == "k" * 80


@pytest.mark.parametrize("sort_by", [None, "cpu_time_total", "self_cpu_time_total", "count"])
@pytest.mark.parametrize("shapes", [False, True])
def test_table_is_torchs_table(sort_by, shapes):
    """The same events in torch's EventList print the same text."""
    pytest.importorskip("torch")
    from torch.autograd import profiler_util as pu
    ours = _synthetic(shapes)
    # torch nests them itself (_build_tree), from their times and threads
    theirs = pu.EventList([pu.FunctionEvent(e.id, e.name, e.thread, e.time_range.start,
                                            e.time_range.end,
                                            input_shapes=e.input_shapes if shapes else None,
                                            stack=[])
                           for e in ours])
    theirs._build_tree()
    assert [[c.id for c in e.cpu_children] for e in theirs] == \
        [[c.id for c in e.cpu_children] for e in ours]
    assert ours.table(sort_by=sort_by, row_limit=4) == theirs.table(sort_by=sort_by, row_limit=4)
    assert ours.key_averages(shapes).table(sort_by=sort_by) == \
        theirs.key_averages(shapes).table(sort_by=sort_by)


# --------------------------------------------------------------------------- schedules


SCHEDULES = [dict(wait=1, warmup=1, active=2), dict(wait=1, warmup=1, active=2, repeat=2),
             dict(wait=0, warmup=2, active=1, repeat=1, skip_first=3),
             dict(wait=2, warmup=1, active=3, repeat=0, skip_first=1),
             dict(wait=3, warmup=1, active=1, repeat=2, skip_first=2, skip_first_wait=1)]


def test_schedule_known_values():
    s = schedule(wait=1, warmup=1, active=2, repeat=2)
    A = ProfilerAction
    assert [s(i) for i in range(10)] == [A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE,
                                         A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE,
                                         A.NONE, A.NONE]
    with pytest.warns(UserWarning, match="won't be using warmup"):
        schedule(wait=1, warmup=0, active=1)
    with pytest.raises(AssertionError, match="Invalid profiler schedule arguments"):
        schedule(wait=1, warmup=1, active=0)


@pytest.mark.parametrize("args", SCHEDULES)
def test_schedule_is_torchs(args):
    torch = pytest.importorskip("torch")
    ours, theirs = schedule(**args), torch.profiler.schedule(**args)
    assert [ours(i).name for i in range(40)] == [theirs(i).name for i in range(40)]


def _run_schedule(prof_mod, profile_cls, args, steps=14):
    """(the steps each on_trace_ready call saw recorded, ...): ProfilerStep#n events."""
    seen = []

    def ready(p):
        seen.append(sorted(int(e.trace_name.split("#")[1]) for e in p.events()
                           if e.name == "ProfilerStep*"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile_cls(activities=[prof_mod.ProfilerActivity.CPU],
                         schedule=prof_mod.schedule(**args), on_trace_ready=ready) as p:
            for _ in range(steps):
                p.step()
    return seen


def test_schedule_records_its_active_steps():
    # wait 1, warmup 1, active 2, twice: steps 2-3 and 6-7 are recorded, each pair saved.
    assert _run_schedule(fg.profiler, profile, dict(wait=1, warmup=1, active=2, repeat=2)) == \
        [[2, 3], [6, 7]]
    # No repeat limit: a cycle still recording at stop is handed over at stop.
    assert _run_schedule(fg.profiler, profile, dict(wait=1, warmup=1, active=2), steps=6) == \
        [[2, 3], [6]]


@pytest.mark.parametrize("args", SCHEDULES)
def test_schedule_steps_as_torch_counts_them(args):
    torch = pytest.importorskip("torch")
    assert _run_schedule(fg.profiler, profile, args) == \
        _run_schedule(torch.profiler, torch.profiler.profile, args)


def test_tensorboard_trace_handler_writes_one_trace_per_cycle(tmp_path):
    handler = tensorboard_trace_handler(str(tmp_path / "log"), worker_name="w")
    with profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
                 on_trace_ready=handler) as p:
        for _ in range(5):
            fg.ones(2) + 1
            p.step()
    files = sorted(os.listdir(tmp_path / "log"))
    assert len(files) == 2 and all(f.startswith("w.") and f.endswith(".pt.trace.json")
                                   for f in files)
    trace = json.loads((tmp_path / "log" / files[0]).read_text())
    assert any(e["name"] == "ProfilerStep#1" for e in trace["traceEvents"])


def test_start_stop_without_with():
    x = fg.ones(2)
    prof = profile()
    prof.start()
    x + 1
    prof.stop()
    assert [e.name for e in prof.events()] == ["aten::add"]


# --------------------------------------------------------------------------- chrome trace


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    with profile(record_shapes=True) as prof:
        _eager_program()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(prof.events())
    for e in events:
        assert {"ph", "name", "pid", "tid", "ts"} <= set(e)
    for e in complete:
        assert {"cat", "dur", "args"} <= set(e)
        assert isinstance(e["ts"], float) and e["dur"] >= 0
    assert any(e["args"].get("Input Dims") == [[16, 8], [8, 4]] for e in complete)
    # Events of one thread nest: each lies inside the innermost that contains its start.
    eps = 1e-3        # one nanosecond
    by_thread: dict = {}
    for e in sorted(complete, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        open_ = by_thread.setdefault(e["tid"], [])
        while open_ and open_[-1] <= e["ts"]:
            open_.pop()
        if open_:
            assert e["ts"] + e["dur"] <= open_[-1] + eps
        open_.append(e["ts"] + e["dur"])
    assert trace["displayTimeUnit"] == "ms" and trace["traceName"] == "trace.json"


def test_chrome_trace_gzip(tmp_path):
    import gzip
    with profile() as prof:
        fg.ones(2) + 1
    prof.export_chrome_trace(str(tmp_path / "t.json.gz"))
    with gzip.open(tmp_path / "t.json.gz", "rt") as f:
        assert json.load(f)["traceEvents"][-1]["name"] == "aten::add"


# --------------------------------------------------------------------------- aliases, API


def test_torch_autograd_profiler_aliases():
    x = fg.ones(2)
    with fg.autograd.profiler.profile(record_shapes=True) as prof:
        with fg.autograd.profiler.record_function("label"):
            x + 1
    assert "label" in prof.key_averages().table()
    assert [e.name for e in prof.function_events] == ["label", "aten::add"]
    assert "aten::add" in prof.table()
    with fg.autograd.profiler.profile(enabled=False) as off:
        fg.ones(2) + 1
    assert len(off.function_events) == 0
    assert fg.autograd.profiler.record_function is record_function


def test_activities_are_checked():
    with pytest.raises(TypeError, match="ProfilerActivity"):
        profile(activities=["cpu"])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        pass
    assert ProfilerActivity.CPU in fg.profiler.supported_activities()


def test_names_match_torch():
    torch = pytest.importorskip("torch")
    for name in ("profile", "record_function", "ProfilerActivity", "ProfilerAction", "schedule",
                 "tensorboard_trace_handler", "supported_activities"):
        assert hasattr(torch.profiler, name) and hasattr(fg.profiler, name)
    assert [a.name for a in ProfilerActivity] == list(torch.profiler.ProfilerActivity.__members__)
    assert [a.name for a in ProfilerAction] == \
        [a.name for a in torch.profiler.ProfilerAction][:len(ProfilerAction)]


# --------------------------------------------------------------------------- compiled programs


def _mlp_step():
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.ReLU(), fg.nn.Linear(64, 10))
    opt = fg.optim.Adam(model.parameters(), lr=1e-3)
    F = fg.nn.functional

    def step(x, y):
        opt.zero_grad()
        with record_function("forward"):
            loss = F.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        return loss
    return fg.compile(step, fullgraph=True)


def test_profiled_compiled_training_step(capsys):
    """The ordinary user program: a compiled step, profiled, its table printed."""
    step = _mlp_step()
    x, y = fg.randn(8, 32), fg.randint(0, 10, (8,))
    step(x, y)
    step(x, y)                      # compiled: the first call and the steady step
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            step(x, y)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    out = capsys.readouterr().out
    assert "Self CPU time total" in out
    events = prof.events()
    (program,) = {e.name for e in events if e.category == "compiled"}
    assert program.startswith("compiled::")
    regions = [e for e in events if e.name == "Torch-Compiled Region: step"]
    assert len(regions) == 3
    assert all(e.cpu_parent in regions for e in events if e.name == program)
    kernels = [e for e in events if e.category in ("kernel", "extern")]
    lowered = step.lower(x, y).kernels
    # every step of the program, each launch an event inside the program's run
    assert {e.name.split("::", 1)[1].split("[")[0].split(".")[0] for e in kernels} == \
        {k.split("[")[0] for k in lowered}
    assert all(e.cpu_parent is not None and e.cpu_parent.name == program for e in kernels)
    assert len(kernels) % 3 == 0
    names = {e.name.split("::", 1)[1] for e in kernels if e.category == "kernel"}
    assert names <= set(lowered)
    runs = [e for e in events if e.name == program]
    assert len(runs) == 3
    inside = sum(e.cpu_time_total for e in kernels)
    assert inside <= sum(e.cpu_time_total for e in runs)


def test_nothing_is_timed_without_a_profiler(monkeypatch):
    """With no profiler, no code path records or times: an event added, or a program's
    timed loop entered, would raise here."""
    from fusegrad.runtime.cpu import Program
    step = _mlp_step()
    x, y = fg.randn(8, 32), fg.randint(0, 10, (8,))
    step(x, y)
    step(x, y)

    def fail(*args, **kwargs):
        raise AssertionError("recorded without a profiler")
    monkeypatch.setattr(profiling.Recorder, "add", fail)
    monkeypatch.setattr(profiling.Span, "__enter__", fail)
    monkeypatch.setattr(Program, "_run_steps_timed", fail)
    step(x, y)
    w = fg.randn(4, 4, requires_grad=True)
    with record_function("label"):
        fg.nn.functional.softmax(x[:, :4] @ w, -1).sum().backward()
    opt = fg.optim.SGD([w], lr=0.1)
    opt.step()
    opt.zero_grad()


@pytest.mark.slow
def test_char_transformer_step_kernel_times_add_up_to_the_step():
    """The profile of the compiled char transformer step accounts for its time: the self
    times of its kernel launches and extern steps sum to 80-110% of the wall time of the
    profiled steps (the rest is the Python around them: argument checks, binding buffers,
    the optimizer's state write-back; at most 110%: the kernels run inside the steps)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    model = make_model(fg, vocab=100, block=32, n_embd=64, n_head=4, n_layer=2)
    opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.integers(0, 100, (16, 32)))
    y = fg.tensor(rng.integers(0, 100, (16, 32)))
    fn = fg.compile(step, fullgraph=True)
    for _ in range(3):
        fn(x, y)
    wall = 0
    with profile() as prof:
        for _ in range(5):
            start = time.perf_counter_ns()
            fn(x, y)
            wall += time.perf_counter_ns() - start
    events = prof.events()
    kernels = [e for e in events if e.category in ("kernel", "extern")]
    n_kernels = len(fn.lower(x, y).kernels)
    assert len({e.name for e in kernels}) >= n_kernels
    covered = sum(e.self_cpu_time_total for e in kernels) / (wall / 1e3)
    print(f"kernels {len(kernels) // 5} per step, {covered:.1%} of {wall / 5e6:.2f} ms")
    assert 0.8 <= covered <= 1.1


def test_cuda_program_kernels_are_events(monkeypatch):
    """A program compiled for CUDA (here on the simulated driver) records each kernel as the
    CPU runtime does, timed from the host with the device synchronized around it."""
    from fusegrad.runtime import cuda as rt
    from fusegrad.testing.simulated_cuda import SimulatedDriver
    drv = SimulatedDriver()
    syncs = []
    monkeypatch.setattr(drv, "synchronize", lambda: syncs.append(1), raising=False)
    rt.set_driver(drv)
    try:
        f = fg.compile(lambda x, w: fg.nn.functional.softmax(x @ w, -1).sum(0), backend="cuda")
        x, w = fg.randn(6, 5), fg.randn(5, 7)
        f(x, w)
        launches = len(drv.launches)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            f(x, w)
        launched = len(drv.launches) - launches
    finally:
        rt.set_driver(None)
    events = prof.events()
    (program,) = [e for e in events if e.category == "compiled"]
    kernels = [e for e in events if e.category in ("kernel", "extern")]
    assert program.cpu_parent.name == "Torch-Compiled Region: <lambda>"
    assert all(e.cpu_parent is program and e.args["Device"] == "cuda:0" for e in kernels)
    assert len([e for e in kernels if e.category == "kernel"]) == launched
    assert len(syncs) == len(kernels) + 1
    assert {e.name.split("::")[1] for e in kernels} <= set(f.lower(x, w).kernels) | \
        {e.name.split("::")[1] for e in kernels if ".host[" in e.name}


def test_a_program_run_is_recorded_as_its_steps_clock_readings():
    """A program's run is kept as its clock readings, two per step, and becomes one event per
    step, named then, when read; a run cut short by a step that raised keeps the steps that
    ran."""
    rec = profiling.Recorder()
    steps = [("p::k0", "kernel", {"Step": "LaunchStep"}), ("p::k1.blas", "extern", None),
             ("p::k2", "kernel", None)]
    rec.add_steps(lambda: steps, [10, 20, 25, 40, 41, 50])
    rec.add_steps(lambda: steps, [60, 70, 71])           # k1 raised
    rec.add("user", "user_annotation", 0, 100)
    rec.closed = True
    rec.add_steps(lambda: steps, [200, 210])             # after the window: dropped
    events = rec.all_events()
    assert [(e[0], e[1], e[2], e[3], e[8]) for e in events] == [
        ("user", "user_annotation", 0, 100, None),
        ("p::k0", "kernel", 10, 20, {"Step": "LaunchStep"}), ("p::k1.blas", "extern", 25, 40, None),
        ("p::k2", "kernel", 41, 50, None), ("p::k0", "kernel", 60, 70, {"Step": "LaunchStep"})]
    assert len({e[4] for e in events}) == 1


def test_a_step_that_raises_keeps_the_steps_before_it_in_the_profile():
    """An index out of range raises in the compiled program's range check; the profile
    still has the program's run and the two kernels that ran before the check."""
    f = fg.compile(lambda x, t: x.exp()[t * 2].sum())
    x = fg.randn(8, 5)
    f(x, fg.tensor([0, 1, 2, 3]))
    with profile() as prof:
        with pytest.raises(IndexError, match="index 14 is out of bounds"):
            f(x, fg.tensor([0, 1, 2, 7]))
    events = prof.events()
    (program,) = [e for e in events if e.category == "compiled"]
    steps = [e for e in events if e.category in ("kernel", "extern")]
    assert [e.name for e in steps] == ["lambda::k0[elementwise 8x5](exp)",
                                       "lambda::k1[elementwise 4](mul)"]
    assert all(e.cpu_parent is program for e in steps)


def test_debug_level_two_prints_each_step_with_its_time(monkeypatch, capsys):
    """``FUSEGRAD_DEBUG=2`` times a program's steps as the profiler does and prints one line
    per step: the kernel as the listing describes it, how it runs, its time."""
    from fusegrad.config import config
    f = fg.compile(lambda x: (x.exp() @ x.t()).sum(-1))
    x = fg.randn(6, 5)
    f(x)
    monkeypatch.setattr(config, "debug", 2)
    f(x)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.endswith(" us")]
    kernels = f.lower(x).kernels
    assert len(lines) >= len(kernels)
    assert all(line.startswith("[fusegrad] k") for line in lines)
    assert {line[len("[fusegrad] "):].rsplit(" ", 3)[0] for line in lines} == set(kernels)


def test_steps_are_named_when_the_profile_is_read_not_in_the_profiled_call(monkeypatch):
    """Naming a program's steps (describing each kernel: milliseconds for a training step)
    happens when the profile is read, not inside the first profiled call it would slow."""
    from fusegrad.runtime.cpu import Program
    calls = []
    step_names = Program.step_names
    monkeypatch.setattr(Program, "step_names",
                        lambda self: calls.append(profiling.recorder) or step_names(self))
    f = fg.compile(lambda x: (x.exp() @ x.t()).sum(-1))
    x = fg.randn(6, 5)
    f(x)
    with profile() as prof:
        f(x)
        f(x)
    assert calls and all(rec is None for rec in calls)
    kernels = [e.name for e in prof.events() if e.category in ("kernel", "extern")]
    names = [name for name, _, _ in step_names(f.lower(x).program)]
    assert kernels == 2 * names and len(names) == 3
