"""The compile front as stages: every graph a compiled function compiles goes through one
pipeline string that the PassManager runs and ``FUSEGRAD_DEBUG=1`` prints, and
``CompiledFunction.__call__`` and ``_run`` read as the sequence of stages."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.ir.parser import parse
from fusegrad.passes.autodiff import vjp_graph
from fusegrad.passes.manager import PassManager, PipelineError, parse_pipeline
from fusegrad.passes.partition import partition_joint
from fusegrad.tracer.compile import CompiledFunction
from fusegrad.tracer.pipeline import DEFAULT_PIPELINE

PREFIX = "[fusegrad] pipeline of "


def _debug(monkeypatch, dump_dir=None):
    monkeypatch.setenv("FUSEGRAD_DEBUG", "1")
    if dump_dir is not None:
        monkeypatch.setenv("FUSEGRAD_DUMP_DIR", str(dump_dir))
    fg_config.reload()


def _pipelines(err: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in err.splitlines() if line.startswith(PREFIX)]


def scale(x):
    return (x * 2).exp() + 1


def test_debug_prints_the_pipeline_that_ran_once_per_compile(monkeypatch, capsys, tmp_path):
    _debug(monkeypatch, tmp_path)
    f = fg.compile(scale)
    x = fg.tensor(np.arange(3, dtype=np.float32))
    f(x)
    f(x)
    (pipeline,) = _pipelines(capsys.readouterr().err)
    assert pipeline == DEFAULT_PIPELINE + ",fuse"
    # The passes that ran, in order: the manager dumps the graph after each.
    ran = [name.rsplit(".", 3)[2] for name in sorted(os.listdir(tmp_path))]
    assert ran == [p.name for p in parse_pipeline(pipeline)]


def test_debug_prints_a_custom_pipeline_and_the_interpreter_s(monkeypatch, capsys):
    _debug(monkeypatch)
    x = fg.tensor(np.arange(3, dtype=np.float32))
    fg.compile(scale, pipeline="cse,dce")(x)
    fg.compile(scale, backend="interpreter")(x)
    assert _pipelines(capsys.readouterr().err) == ["cse,dce,fuse", DEFAULT_PIPELINE]


def test_debug_prints_the_pipelines_a_backward_builds(monkeypatch, capsys):
    _debug(monkeypatch)
    f = fg.compile(lambda x: scale(x).sum())
    x = fg.tensor(np.arange(3, dtype=np.float32), requires_grad=True)
    f(x).backward()
    f(x).backward()                           # built once, by the first call
    program = DEFAULT_PIPELINE + ",fuse"
    assert _pipelines(capsys.readouterr().err) == [
        program, "fuse-attention,partition{wrt=0}", program, program]
    np.testing.assert_allclose(x.grad.numpy(), 2 * 2 * np.exp(2 * np.arange(3)), rtol=1e-5)


def test_call_and_run_read_as_stages():
    for method in (CompiledFunction.__call__, CompiledFunction._run):
        assert len(inspect.getsource(method).splitlines()) < 30, method.__name__


_SQUARES = """graph @f(%x: f32[3], %w: f32[3]) -> (f32[], f32[3]) {
  %0 = mul %x, %w : f32[3]
  %1 = sum %0 {axes=[0]} : f32[]
  %2 = mul %x, %x : f32[3]
  return %1, %2
}"""


def test_vjp_pass_seeds_only_the_outputs_listed():
    g = parse(_SQUARES)
    got = PassManager("vjp{wrt=1,outputs=0},dce", verify=True).run(g)
    assert got.name == "f_backward"
    assert [str(v.type) for v in got.inputs] == ["f32[3]", "f32[3]", "f32[]"]
    assert len(got.outputs) == 1 and len(g.outputs) == 2          # the input is unchanged
    forward = parse(_SQUARES)
    forward.set_outputs(forward.outputs[:1])
    assert len(vjp_graph(forward, [1]).outputs) == 2               # the output, then dw
    with pytest.raises(PipelineError, match="output positions"):
        PassManager("vjp{outputs=a}").run(g)


def test_partition_pass_keeps_the_partition_and_takes_free_inputs():
    g = parse(_SQUARES)
    fwd = PassManager("partition{wrt=0+1,free=1}", verify=True).run(g)
    expected = partition_joint(g, wrt=[0, 1], free_inputs=[1])
    assert fwd.partition.forward is fwd
    assert [s.name for s in fwd.partition.saved] == [s.name for s in expected.saved]
