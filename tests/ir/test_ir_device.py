"""Tensor types carry a device; the IR text names it only when it is not the CPU."""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.ir.parser import parse
from fusegrad.ops.primitive import TensorType

CUDA_TEXT = """graph @f(%x: f32[2,3]@cuda, %y: f32[3]@"cuda:1") -> (f32[2,3]@cuda) {
  %0 = exp %x : f32[2,3]@cuda
  %1 = add %0, %y : f32[2,3]@cuda
  return %1
}"""


def test_cpu_types_print_as_before():
    t = TensorType((4, 8), dtypes.float32)
    assert t.device == "cpu" and str(t) == "f32[4,8]"
    g = parse("graph @f(%x: f32[2]) -> (f32[2]) {\n  %0 = exp %x : f32[2]\n  return %0\n}")
    assert "@cuda" not in str(g) and g.inputs[0].type.device == "cpu"


def test_device_round_trips_and_results_inherit_it():
    g = parse(CUDA_TEXT)
    assert [v.type.device for v in g.inputs] == ["cuda", "cuda:1"]
    assert [n.output.type.device for n in g.nodes] == ["cuda", "cuda"]
    assert str(parse(str(g))) == str(g)


def test_device_is_part_of_the_type():
    a = TensorType((2,), dtypes.float32)
    assert a != TensorType((2,), dtypes.float32, "cuda")
    assert str(TensorType((2,), dtypes.float32, "cuda:1")) == 'f32[2]@"cuda:1"'
