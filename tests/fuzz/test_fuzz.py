"""The differential fuzzer: a fixed-seed run of random programs, and the fuzzer's own parts.

``test_random_programs`` draws programs with hypothesis (derandomized: the same programs on
every run) and runs each eagerly, in the IR interpreter after several pipelines and with the
LLVM backend, values and gradients (see ``fusegrad.testing.fuzz``). A failure is shrunk by
hypothesis to a small program and printed as fusegrad code with its IR. Mismatches that a
reported defect explains are filtered by ``KNOWN``; when a fix lands, delete its entry there
and this test checks the fix on every program it draws.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad.testing import fuzz
from fusegrad.testing import nvcc as nvcc_module
from fusegrad.testing.fuzz import (
    KNOWN,
    Known,
    Mismatch,
    Settings,
    SymbolicRun,
    check_program,
    explain,
    nvcc_check,
    program_for,
    report,
    resized,
    shrink,
    symbol_candidates,
)
from fusegrad.testing.nvcc import NvccReport, find_nvcc
from fusegrad.testing.programs import (
    HypothesisChoices,
    Input,
    Op,
    Program,
    RandomChoices,
    ReplayChoices,
    generate,
    make_array,
)
from fusegrad.testing.tolerance import compare

# (The symbolic stage runs in its own tests below, and in the slow longer run.)
FAST = Settings(pipelines=(" ", "simplify,cse,dce", "fold,simplify,cse,dce"), symbolic=False)
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def _check(program: Program, options: Settings) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            result = check_program(program, options)
    assert not result.unexplained, "\n" + report(result)


# 100 programs: about 0.1 s of CPU each (a few LLVM compiles), well under a minute alone.
@settings(max_examples=100, derandomize=True, deadline=None, database=None,
          suppress_health_check=HEALTH)
@given(st.data())
def test_random_programs(data):
    _check(generate(HypothesisChoices(data)), FAST)


@pytest.mark.slow
@settings(max_examples=80, derandomize=True, deadline=None, database=None,
          suppress_health_check=HEALTH)
@given(st.data())
def test_random_programs_longer(data):
    # Longer programs, every interpreter pipeline and a second LLVM pipeline.
    _check(generate(HypothesisChoices(data), max_ops=14), Settings())


# --------------------------------------------------------------------------- the parts


def test_programs_are_deterministic_and_print_as_code():
    a, drawn = program_for(3, 17)
    b, _ = program_for(3, 17)
    assert a.source() == b.source() and a.inputs == b.inputs
    # Replaying the recorded draws rebuilds the same program.
    assert generate(ReplayChoices(drawn)).source() == a.source()
    assert a.source().startswith("def program(") and "return " in a.source()
    for x, y in zip(a.arrays(), b.arrays()):
        np.testing.assert_array_equal(x, y)


def test_generated_programs_run_eagerly():
    # Programs are valid by construction: eager runs them (with their input values).
    kinds = set()
    for index in range(40):
        program, _ = program_for(0, index)
        kinds |= program.op_kinds()
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            program.function()(*[fg.from_numpy(a) for a in program.arrays()])
    assert len(kinds) > 30


def test_special_values_cover_the_float_range():
    a = make_array(Input((400,), "float32", "special", seed=1))
    assert np.isnan(a).any() and np.isposinf(a).any() and np.isneginf(a).any()
    assert (np.signbit(a) & (a == 0)).any()                       # -0.0
    finite = np.abs(a[np.isfinite(a) & (a != 0)])
    assert finite.min() < np.finfo(np.float32).tiny                 # denormals
    assert finite.max() > 1e37
    plain = make_array(Input((400,), "float32", "normal", seed=1))
    assert np.isfinite(plain).all()


def test_compare_semantics():
    t = fg.tensor
    nan, inf = float("nan"), float("inf")
    assert compare(t([1.0, nan, -inf]), t([1.0 + 1e-7, nan, -inf]), 1e-5, 0.0) is None
    assert "differ" in compare(t([1.0, 2.0]), t([1.0, nan]), 1e-5, 0.0)     # NaN positions
    assert "differ" in compare(t([inf]), t([-inf]), 1e-5, 0.0)             # Inf signs
    assert "differ" in compare(t([1.0]), t([1.1]), 1e-5, 0.0)
    assert compare(t([1.0]), t([1.1]), 1e-5, 0.2) is None                  # atol
    assert "differ" in compare(t([3]), t([4]), 0.0, 0.0)                  # ints are exact
    assert "dtype" in compare(t([1.0]), t([1.0], dtype=fg.float64), 1e-5, 0.0)
    assert "shape" in compare(t([1.0]), t([[1.0]]), 1e-5, 0.0)


def test_products_that_overflow_on_the_way_compare_loosely():
    # seed 3, program 373: a bfloat16 product of huge and tiny values is inf in one order of
    # multiplication and NaN (inf * 0) in another; finite elements are still compared.
    from fusegrad.testing.tolerance import _product_overflows
    t = fg.tensor
    nan, inf = float("nan"), float("inf")
    assert _product_overflows(t([1e30, 1e-30, 2.0], dtype=fg.bfloat16))
    assert not _product_overflows(t([3.0, 0.5, -2.0]))
    assert compare(t([nan, 0.0, 2.0]), t([inf, -1e-3, 2.0]), 1e-5, 0.0, unordered=True) is None
    assert "differ" in compare(t([nan, 3.0]), t([inf, -2.0]), 1e-5, 0.0, unordered=True)
    assert "differ" in compare(t([nan]), t([inf]), 1e-5, 0.0)


def assert_explained(seed: int, index: int, **draw) -> None:
    """Program ``index`` of ``seed`` runs every way with no unexplained mismatch (a fuzzer
    finding whose tolerance rule is now in place)."""
    program, _ = program_for(seed, index, **draw)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = check_program(program, Settings(finite_differences=False))
    assert not result.unexplained, report(result)


def test_products_that_pass_through_the_subnormals_compare_by_sign():
    # seed 20261203, program 1247: the bfloat16 product of [2.2e-35, 2.9e32, 3.5e-3, 2.8e-11,
    # 2.5e-8] is 1.63e-23 multiplied in order; the simulated CUDA kernel's shuffle tree makes
    # 2.2e-35 * 2.5e-8 * 3.5e-3 first, 1.4 times the smallest float32 subnormal, rounded to 1:
    # its result is 1.16e-23. Only the sign of such a product is order-independent.
    assert_explained(20261203, 1247)
    t = fg.tensor
    assert compare(t([1.16e-23]), t([1.63e-23]), 1e-2, 0.0, unordered=True) is None
    assert "differ" in compare(t([-1.16e-23]), t([1.63e-23]), 1e-2, 0.0, unordered=True)
    assert "differ" in compare(t([1.16e-23]), t([1.63e-23]), 1e-2, 0.0)


def test_integer_outputs_of_order_dependent_products_are_not_compared():
    # isnan (or a cast) of a product that overflows on the way: NaN or inf by the order of
    # its terms, so the bools differ with it; they are still compared exactly otherwise.
    t = fg.tensor
    assert compare(t([True, False]), t([False, False]), 0.0, 0.0, unordered=True) is None
    assert "differ" in compare(t([True, False]), t([False, False]), 0.0, 0.0)
    assert "differ" in compare(t([3, 4]), t([3, 5]), 0.0, 0.0)


@pytest.mark.parametrize("seed,index", [(20261202, 70), (20261202, 2176), (20261203, 4396)])
def test_matmul_terms_that_overflow_compare_loosely(seed, index):
    # `x @ x.mT` of float64 values near 1e295. A BLAS that fuses each term into an FMA gives
    # -inf where the simulated CUDA kernel (separate multiplies and adds) adds an overflowed
    # +inf term to -inf: NaN. Which infinity or NaN is order-dependent, and so is a bool
    # computed from it (seed 20261203, program 4396: `isnan` of the product).
    assert_explained(seed, index)
    from fusegrad.testing.tolerance import _overflows_on_the_way
    values = [fg.tensor([[1e200, -1e200]], dtype=fg.float64), fg.tensor([[1e150], [1e150]],
                                                                           dtype=fg.float64)]
    assert _overflows_on_the_way(Op("matmul", (0, 1)), values)
    assert not _overflows_on_the_way(Op("matmul", (0,)), [fg.tensor([[1e100, 3.0]],
                                                                     dtype=fg.float64)])


def test_products_whose_large_factors_overflow_together_compare_loosely():
    # Seed 1202, program 1533: a float32 prod of 32 values holding 9.2e18, 9.2e18, -9.2e17,
    # -9.2e17 and a zero. No two factors overflow together, but the four do: eager's order
    # reaches the zero first (0), the CUDA kernel's tree meets inf * 0 (NaN).
    assert_explained(1202, 1533, max_ops=14)
    from fusegrad.testing.tolerance import _overflows_on_the_way
    x = fg.tensor([[9e18, 9e18, 9e18, 0.0], [1.0, 2.0, 3.0, 4.0]])
    assert _overflows_on_the_way(Op("reduce", (0,), ("prod", None, False, None)), [x])
    assert _overflows_on_the_way(Op("reduce", (0,), ("prod", (1,), False, None)), [x])
    # Over the other axis no slice holds two large factors: compared as usual.
    assert not _overflows_on_the_way(Op("reduce", (0,), ("prod", (0,), False, None)), [x])


def _pole_after(name: str, scale: float | None = None) -> bool:
    """Whether ``_at_a_pole`` flags the unary op ``name`` of a layer norm's sum (0 up to
    rounding) or, with ``scale``, of a normal input times it."""
    from fusegrad.testing.tolerance import _all_values, _at_a_pole, _summed
    first = Op("scalar", (0,), ("*", scale, False)) if scale is not None else \
        Op("layer_norm", (0,), (1,))
    nodes = [Input((4,), "float32", "normal", 0), first]
    if scale is None:
        nodes.append(Op("reduce", (1,), ("sum", None, False, None)))
    nodes.append(Op("unary", (len(nodes) - 1,), (name,)))
    program = Program(nodes, [len(nodes) - 1])
    values = _all_values(program, program.arrays())
    return _at_a_pole(program, values, _summed(program, values), len(nodes) - 1)


@pytest.mark.parametrize("seed,index,name", [(31415, 2070, "log"), (20261207, 372, "sqrt")])
def test_a_pole_or_comparison_at_cancellation_noise_compares_loosely(seed, index, name):
    # Seed 31415, program 2070: the mean of a layer norm's output is 0 up to rounding; in
    # ``where(mean > 0, mean, y)`` its sign picks a side, and it is 2e-9 in eager's order of
    # summation and below 0 in the CUDA kernel's. Reduced: ``log`` of the same sum is -17.3
    # in one order and -inf in another. Seed 20261207, program 372: ``sqrt`` of a layer
    # norm's output, 0 in eager's order and just below 0 (NaN) in the simulated CUDA
    # kernel's: sqrt's domain ends at 0, so it counts as a pole.
    assert_explained(seed, index, max_ops=16)
    assert _pole_after(name)
    # The same op of an input near 0 (no cancelling op before it) is compared as usual.
    assert not _pole_after(name, scale=1e-3)


def test_sine_of_a_large_argument_compares_with_the_arguments_magnitude():
    # Seed 20261205, program 3509: sin(-7 ** layer_norm(x)) with arguments up to 158. One ulp
    # of the argument is 1.5e-5 of the result, which the simulated CUDA kernels' order of
    # summation (in the layer norm) moved; sin is compared as a cancelling op now.
    assert_explained(20261205, 3509, max_ops=16)


def test_cancellation_error_scaled_by_a_product_compares_with_the_product():
    # Seed 20261211, program 680: log_softmax's -0.0009 is 1e-4 off in relative terms between
    # eager's order of summation and the simulated CUDA kernel's (an ulp of its log(sum) near
    # 1), and a 1e32 input multiplies it: the absolute error it may carry is scaled by that.
    assert_explained(20261211, 680, max_ops=18)
    from fusegrad.testing.tolerance import _all_values, _magnitude
    nodes = [Input((4,), "float32", "normal", 0), Input((4,), "float32", "normal", 1),
             Op("binary", (0, 1), ("sub",)), Op("scalar", (2,), ("*", 1e6, False)),
             Op("scalar", (2,), ("*", 1e-3, False))]
    program = Program(nodes, [3, 4])
    values = _all_values(program, program.arrays())
    sub = _magnitude(program, values, 2, {})
    assert sub > 0 and _magnitude(program, values, 3, {}) == sub * 1e6
    assert _magnitude(program, values, 4, {}) == sub       # never below the sum's own


def test_a_compiled_function_is_checked():
    # A program the compiled path gets right has no mismatches; its gradients are checked
    # (compiled against eager, eager float64 against central differences).
    program = Program([Input((3, 4), "float32", "normal", 5, True),
                       Op("unary", (0,), ("tanh",)), Op("reduce", (1,), ("sum", (1,), True, None)),
                       Op("binary", (2, 0), ("mul",))], [3])
    result = check_program(program)
    assert result.invalid is None and result.mismatches == [], report(result)


def test_known_filter_names_an_issue_item(monkeypatch):
    # Every defect the list named is fixed (KNOWN is empty on main); an entry added for a new
    # defect explains the mismatches it recognises and nothing else.
    assert all(k.item for k in KNOWN.values())
    entry = Known("2", "compiled sin loses its range reduction",
                  lambda p, m: m.stage.startswith("llvm") and "sin" in p.op_kinds())
    monkeypatch.setitem(KNOWN, "sin-huge", entry)
    sin_huge = Program([Input((30,), "float32", "wide", 1), Op("unary", (0,), ("sin",))], [1])
    m = Mismatch("llvm", "out[0]", "1 of 30 differ")
    assert explain(sin_huge, m) == "sin-huge"
    assert explain(sin_huge, Mismatch("grad:llvm", "grad v0", "1 of 30 differ")) is None
    plain = Program([Input((3,), "float32", "normal", 1), Op("unary", (0,), ("exp",))], [1])
    assert explain(plain, m) is None


def test_shrink_finds_a_minimal_program():
    # Whatever program first uses `exp` reduces to a single exp over one small input.
    index = next(i for i in range(200) if "exp" in program_for(0, i)[0].op_kinds())
    _, drawn = program_for(0, index)
    small = shrink(drawn, lambda p: "exp" in p.op_kinds(), budget_s=30)
    assert [op.params for op in small.ops] == [("exp",)]


def test_random_choices_record_what_they_draw():
    c = RandomChoices(5)
    values = [c.integer(3, 9) for _ in range(20)]
    assert ReplayChoices(c.drawn).integer(3, 9) == values[0]
    assert all(3 <= v <= 9 for v in values)


@pytest.mark.slow
def test_command_line_runs_programs_in_workers():
    out = subprocess.run([sys.executable, "-m", "fusegrad.testing.fuzz", "--programs", "4",
                          "--seed", "1", "--jobs", "1", "--chunk", "2", "--no-shrink"],
                         capture_output=True, text=True, timeout=300)
    assert "summary: 4 programs run" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_command_line_compiles_the_cuda_kernels_with_nvcc():
    # Program 6 of seed 0 has empty tensors: its kernels once looped `i < 0u`, which nvcc
    # refuses as a warning made an error; program 2's cosine has a stack frame, not a spill.
    out = subprocess.run([sys.executable, "-m", "fusegrad.testing.fuzz", "--programs", "8",
                          "--jobs", "1", "--no-shrink", "--no-fd", "--nvcc", "sm_80,sm_90",
                          "--nvcc-batch", "4"], capture_output=True, text=True, timeout=300)
    assert "nvcc (sm_80,sm_90): 8 programs" in out.stdout, out.stdout + out.stderr
    assert "0 programs failed to compile, 0 spilled" in out.stdout, out.stdout
    assert out.returncode == 0, out.stdout


def test_nvcc_failures_are_found_by_halving_a_batch(monkeypatch):
    calls = []

    def fake_compile(kernels, archs):
        calls.append(sorted(kernels))
        bad = any(name.startswith("p3_") for name in kernels)
        return NvccReport([], "error: p3" if bad else "")
    monkeypatch.setattr(nvcc_module, "compile_kernels", fake_compile)
    lk = SimpleNamespace(name="k0")
    programs = [(i, [lk]) for i in range(5)]
    monkeypatch.setattr(nvcc_module.dataclasses, "replace", lambda k, name: SimpleNamespace(name=name))
    event = nvcc_check(programs, ("sm_90",))
    assert event["failures"] == {"3": "error: p3"}
    assert event["kernels"] == 5 and len(calls) < 10


def test_an_integer_step_at_an_inexact_value_is_not_a_mismatch():
    # seed 4, program 664: int32 1 -> exp -> log is 0.99999994 in eager (1.0 within 1 ulp
    # compiled), and .to(int32) gives 0 and 1. Only values that close to a step are excused.
    from fusegrad.testing.tolerance import _all_values, _scales
    near = Program([Input((), "int32", "normal", 0), Op("unary", (0,), ("exp",)),
                    Op("unary", (1,), ("log",)), Op("cast", (2,), ("int32",))], [3])
    arrays = [np.array(1, np.int32)]
    assert _scales(near, _all_values(near, arrays))[0].jump
    far = Program([Input((), "int32", "normal", 0), Op("unary", (0,), ("exp",)),
                   Op("cast", (1,), ("int32",))], [2])                  # e = 2.718...
    assert not _scales(far, _all_values(far, arrays))[0].jump
    exact = Program([Input((), "float32", "normal", 0), Op("cast", (0,), ("int32",))], [1])
    assert not _scales(exact, _all_values(exact, [np.array(1.0, np.float32)]))[0].jump


def test_a_variance_that_overflows_compares_loosely():
    # seed 1207, program 662: layer_norm over a float32 window holding 2**127; its squares
    # overflow, rstd is 0, and the gradient is 0 in eager but NaN compiled (and in torch).
    from fusegrad.testing.tolerance import _all_values, _scales
    program = Program([Input((3, 3), "float32", "normal", 0), Op("layer_norm", (0,), (2,))],
                      [1])
    x = np.ones((3, 3), np.float32)
    assert not _scales(program, _all_values(program, [x]))[0].unordered
    x[1, 1] = 2.0 ** 127
    assert _scales(program, _all_values(program, [x]))[0].unordered


def test_a_remainder_keeps_the_absolute_error_of_its_dividend():
    # seed 20261206, program 2097: cos(0.6794) % 0.001 is 9.4655e-4 in eager and 9.4661e-4
    # compiled: the two cos values are 1 ulp apart (6e-8), 6e-5 of the remainder. The
    # dividend's magnitude sets the absolute tolerance, as for a subtraction.
    from fusegrad.testing.tolerance import _all_values, _scales, tolerance
    program = Program([Input((), "float32", "normal", 0), Op("unary", (0,), ("cos",)),
                       Op("scalar", (1,), ("%", 0.001, False))], [2])
    x = [np.array(0.67940515, np.float32)]
    scale = _scales(program, _all_values(program, x))[0]
    assert scale.magnitude >= 0.77
    rtol, atol = tolerance("float32", scale.n_ops, scale.n_summed, scale.magnitude)
    eager, compiled = np.float32(0.00094655447), np.float32(0.00094661408)
    assert abs(compiled - eager) <= atol + rtol * abs(eager)
    assert not scale.jump


def test_a_remainder_by_an_inexact_divisor_at_a_huge_quotient_is_excused():
    # seed 4, program 1282: remainder(x, pow(gelu(1), x)) with x / divisor ~ 1e8: one ulp
    # of the divisor moves the remainder by more than its size.
    from fusegrad.testing.tolerance import _all_values, _scales
    program = Program([Input((), "float32", "normal", 0), Op("unary", (0,), ("exp",)),
                       Op("binary", (0, 1), ("remainder",))], [2])
    huge = [np.array(30.0, np.float32)]                      # 30 / e**30: tiny quotient
    assert not _scales(program, _all_values(program, huge))[0].jump
    program = Program(program.nodes[:2] + [Op("binary", (1, 0), ("remainder",))], [2])
    assert _scales(program, _all_values(program, huge))[0].jump   # e**30 / 30 ~ 3.5e11


def test_a_gradient_that_cancels_far_below_its_terms_is_compared_to_its_terms():
    # seed 5, program 2515: layer_norm over 2 elements has a gradient of about 5e-6 made of
    # terms near 1; float32 rounding of those terms is 3e-8, 0.6% of the gradient.
    program = Program([Input((2, 1), "float32", "normal", 21030, True),
                       Op("layer_norm", (0,), (2,))], [1])
    result = check_program(program)
    assert result.invalid is None and not result.unexplained, report(result)


@pytest.mark.parametrize("index", [1513, 1843, 7679])
def test_ill_conditioned_gradients_of_seed_6_are_not_mismatches(index):
    # 1513: log2 of a layer_norm output near 0 gives a cotangent of 1e17, which the
    # layer_norm VJP cancels to 22 (float64: one ulp of 1e17 is 16). 1843: cos of a float32
    # matmul result of magnitude 1e5 in the VJP (eager float32 is as far from float64).
    # 7679: a float64 input's gradient is a float32 log's value (x * log(n)).
    # Without cuda-sim: 1513's forward log2 is of that layer_norm residue of 1e-17, rounding
    # noise that the GPU lowering's sums (in tree order) leave at exactly 0 (-inf).
    program, _ = program_for(6, index)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = check_program(program, Settings(finite_differences=False, cuda_sim=False))
    assert not result.unexplained, report(result)


def test_the_ill_conditioning_rules_still_catch_a_wrong_gradient():
    # A well-conditioned program: 1% off is a mismatch whichever rule is asked.
    from fusegrad.testing.fuzz import Result, _check_grads
    from fusegrad.testing.tolerance import _all_values, _scales
    program = Program([Input((3, 4), "float32", "normal", 5, True),
                       Op("unary", (0,), ("sin",)), Op("reduce", (1,), ("sum", (1,), True, None)),
                       Op("binary", (2, 0), ("mul",))], [3])
    arrays = program.arrays()
    x = fg.from_numpy(arrays[0].copy()).requires_grad_()
    out = program.function()(x)
    w = fg.from_numpy(np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32))
    want, = fg.autograd.grad([out], [x], [w])
    values = _all_values(program, arrays)
    result = Result(program)
    _check_grads(program, "grad:llvm", [want * 1.01], [want], result,
                 _scales(program, values), values, arrays)
    assert [m.where for m in result.mismatches] == ["grad v0"]


def test_a_gradient_reading_a_float32_value_gets_float32_tolerance():
    from fusegrad.testing.fuzz import _path_dtype
    from fusegrad.testing.tolerance import _all_values
    program, _ = program_for(6, 7679)
    i = next(i for i, s in zip(program.input_ids, program.inputs) if s.dtype == "float64")
    assert _path_dtype(program, _all_values(program, program.arrays()), i) == "float32"


def test_no_finite_differences_next_to_huge_integers():
    # seed 9, program 642: int32 extremes minus a float64 input. Next to 2**31 a step of 1e-6
    # moves the difference by two float64 ulps or none: central differences measure rounding.
    program, _ = program_for(9, 642)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = check_program(program)
    assert not result.unexplained, report(result)


# --------------------------------------------------------------------------- symbolic stage

SYMBOLIC_ONLY = Settings(symbolic_only=True, finite_differences=False)


def test_symbolic_stage_compiles_once_for_three_sizes():
    # The leading size (3, shared by both inputs: one symbol) is varied to 2 and 5 (4 is
    # another dim's size); values and gradients match eager at each, from one compile.
    program = Program([Input((3, 4), "float32", "normal", 5, True),
                       Op("unary", (0,), ("tanh",)), Input((3, 1), "float32", "normal", 6),
                       Op("binary", (1, 2), ("mul",)),
                       Op("reduce", (3,), ("sum", (0,), False, None))], [4, 3])
    assert symbol_candidates(program)[0] == (3, (2, 5))
    assert resized(program, 3, 5).inputs[1].shape == (5, 1)
    result = check_program(program, SYMBOLIC_ONLY)
    assert result.mismatches == [], report(result)
    assert result.symbolic == SymbolicRun(sizes=(3, 2, 5), compiles=1)


def test_symbolic_stage_on_the_cuda_backend_compiles_once_for_three_sizes():
    # --symbolic-cuda: one program of the GPU lowering, its kernels reading the size at run
    # time on the simulated driver, equal to eager at 3, 2 and 5.
    program = Program([Input((3, 4), "float32", "normal", 5, True),
                       Op("unary", (0,), ("tanh",)), Input((3, 1), "float32", "normal", 6),
                       Op("binary", (1, 2), ("mul",)),
                       Op("reduce", (3,), ("sum", (0,), False, None))], [4, 3])
    result = check_program(program, dataclasses.replace(SYMBOLIC_ONLY, symbolic_backend="cuda"))
    assert result.mismatches == [], report(result)
    assert result.symbolic == SymbolicRun(sizes=(3, 2, 5), compiles=1)


def test_symbolic_stage_explains_a_literal_bound():
    # x[2:3] of a symbolic dim is empty at 2 and one long from 3: the trace guards s0 < 3,
    # and the calls at 3 and 4 compile for their sizes; a recorded, legitimate reason.
    program = Program([Input((2, 5), "float32", "normal", 1),
                       Op("slice", (0,), (((2, 3, 1), (None, None, 1)),))], [1])
    result = check_program(program, SYMBOLIC_ONLY)
    assert result.unexplained == [], report(result)
    sym = result.symbolic
    assert sym.sizes == (2, 3, 4) and sym.compiles == 3 and sym.reason == "literal-bound"
    assert "assumed v0.size(0) (s0) < 3, but v0.size(0) (s0) is 3" in sym.detail


def test_an_unexplained_specialization_is_a_mismatch(monkeypatch):
    monkeypatch.setattr(fuzz, "SPECIALIZATIONS", {})
    program = Program([Input((2, 5), "float32", "normal", 1),
                       Op("slice", (0,), (((2, 3, 1), (None, None, 1)),))], [1])
    bad = check_program(program, SYMBOLIC_ONLY).unexplained
    assert [(m.stage, m.where) for m in bad] == [("symbolic", "compiles")]
    assert bad[0].message.startswith("3 compiles for sizes [2, 3, 4]: the symbolic trace")


def test_symbolic_stage_says_why_it_did_not_run():
    scalar = Program([Input((1, 1), "float32"), Op("unary", (0,), ("exp",))], [1])
    assert check_program(scalar, SYMBOLIC_ONLY).symbolic.skipped == "no input dim of size >= 2"
    fixed = Program([Input((2, 3), "float32"), Op("reshape", (0,), ((3, 2),))], [1])
    assert "eager rejects every other size" in check_program(fixed, SYMBOLIC_ONLY).symbolic.skipped


# A handful of seeded programs through the stage (the slow test below runs 300): each one
# found a defect or specializes for a reason of its own.
@pytest.mark.parametrize("seed,index", [(0, 0), (0, 24), (0, 66), (0, 87), (0, 120), (0, 197),
                                        (0, 264), (3, 6)])
def test_symbolic_stage_on_seeded_programs(seed, index):
    result = check_program(program_for(seed, index)[0], SYMBOLIC_ONLY)
    assert not result.unexplained, "\n" + report(result)


@pytest.mark.slow
def test_symbolic_stage_on_300_programs():
    for index in range(300):
        result = check_program(program_for(3, index)[0], SYMBOLIC_ONLY)
        assert not result.unexplained, "\n" + report(result)
