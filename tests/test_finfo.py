"""finfo / iinfo limits and the kernel thread count."""

import os

import ml_dtypes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.config import config


@pytest.mark.parametrize("dtype,np_dtype,resolution", [
    (fg.float16, np.float16, 1e-3), (fg.float32, np.float32, 1e-6),
    (fg.float64, np.float64, 1e-15), (fg.bfloat16, ml_dtypes.bfloat16, 1e-2)])
def test_finfo(dtype, np_dtype, resolution):
    info = fg.finfo(dtype)
    ref = ml_dtypes.finfo(np_dtype)
    assert info.bits == 8 * np.dtype(np_dtype).itemsize and info.dtype == dtype.name
    assert info.eps == float(ref.eps) and info.max == float(ref.max) and info.min == -info.max
    assert info.tiny == info.smallest_normal == float(ref.smallest_normal)
    assert info.resolution == resolution
    # eps is the gap above 1.0
    one = np.array(1.0, np_dtype)
    assert float(np.nextafter(one, np.array(2.0, np_dtype))) - 1.0 == info.eps


def test_finfo_known_values_and_default():
    assert fg.finfo(fg.bfloat16).eps == 2.0 ** -7
    assert fg.finfo(fg.float16).max == 65504.0
    assert fg.finfo() == fg.finfo(fg.get_default_dtype())
    with pytest.raises(TypeError, match="requires a floating point input type"):
        fg.finfo(fg.int32)


@pytest.mark.parametrize("dtype", [fg.uint8, fg.int8, fg.int16, fg.int32, fg.int64])
def test_iinfo(dtype):
    info = fg.iinfo(dtype)
    ref = np.iinfo(dtype.np_dtype)
    assert (info.bits, info.min, info.max, info.dtype) == (ref.bits, ref.min, ref.max, dtype.name)


def test_iinfo_errors():
    with pytest.raises(TypeError, match="requires an integer input type"):
        fg.iinfo(fg.float32)
    with pytest.raises(TypeError, match="not supported by torch.iinfo"):
        fg.iinfo(fg.bool)


def test_set_num_threads_resizes_the_kernel_pool():
    from fusegrad.runtime import cpu
    saved = fg.get_num_threads()
    try:
        fg.set_num_threads(3)
        assert fg.get_num_threads() == 3 == config.num_threads
        assert cpu.thread_pool()._max_workers == 2
        fg.set_num_threads(5)
        assert cpu.thread_pool()._max_workers == 4
        with pytest.raises(RuntimeError, match="positive integer"):
            fg.set_num_threads(0)
    finally:
        fg.set_num_threads(saved)


def test_num_threads_from_environment(monkeypatch):
    from fusegrad import config as config_module
    saved = fg.get_num_threads()
    monkeypatch.setenv("FUSEGRAD_NUM_THREADS", "7")
    try:
        config_module.reload()
        assert fg.get_num_threads() == 7
    finally:
        monkeypatch.undo()
        config_module.reload()
        fg.set_num_threads(saved)


def test_set_num_threads_sets_the_blas_threads_too():
    """torch.set_num_threads also sets the threads of the BLAS the products run on: numpy's
    BLAS here (a product asked to run on one thread must not start a second)."""
    from fusegrad.runtime.threads import blas_threads
    before = blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not one whose thread count can be set (OpenBLAS, MKL)")
    saved = fg.get_num_threads()
    try:
        fg.set_num_threads(1)
        assert blas_threads() == 1
        fg.set_num_threads(2)
        assert blas_threads() == 2
    finally:
        fg.set_num_threads(saved)


def test_fusegrad_num_threads_at_start_up_sets_the_blas_threads():
    import subprocess
    import sys

    from fusegrad.runtime.threads import blas_threads
    if blas_threads() is None:
        pytest.skip("numpy's BLAS is not one whose thread count can be set (OpenBLAS, MKL)")
    code = ("import fusegrad\nfrom fusegrad.runtime.threads import blas_threads\n"
            "print(blas_threads())")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["FUSEGRAD_NUM_THREADS"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "1"
