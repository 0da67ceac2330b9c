#!/usr/bin/env bash
# The GPU check: fusegrad's GPU tests, then the benchmark table (benchmarks/gpu_bench.py:
# GB/s and TFLOP/s against the card's copy bandwidth, torch eager and torch.compile on the
# same card), within 8 minutes. Exits non-zero when a test fails or a benchmark's result is
# wrong.
#
#   bash benchmarks/gpu_check.sh [--quick]        (PYTHON=... picks the interpreter)
#   bash benchmarks/gpu_check.sh --simulate       (no GPU: the simulated driver's tests of the
#                                                  CUDA runtime, and the benchmark's plumbing)
#
# Needs an NVIDIA GPU and a driver, NVIDIA's CUDA Python bindings (cuda-bindings) or pycuda,
# NVRTC (the nvidia-cuda-nvrtc wheel) or nvcc, and for matmuls cuBLASLt (the nvidia-cublas
# wheel; without it the generated kernel runs them); torch with CUDA is used as the reference
# when it imports. Nothing is downloaded: it runs with what the machine has.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

if [[ "${1:-}" == "--simulate" ]]; then
    echo "== simulated driver: the CUDA runtime's tests (cuBLASLt stand-in, CUDA graphs)"
    timeout 240 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider tests/runtime/test_cublas.py \
        tests/runtime/test_cuda_graphs.py tests/runtime/test_cuda_runtime.py || status=1
    echo "== benchmark plumbing (simulated: the times mean nothing)"
    timeout 200 "$PY" benchmarks/gpu_bench.py --simulate || status=1
    exit $status
fi

echo "== environment"
"$PY" - <<'PYEOF' || exit 2
import importlib, sys
import fusegrad as fg
from fusegrad.runtime import cublas
from fusegrad.runtime import cuda as rt
print("python", sys.version.split()[0], "| fusegrad", fg.__version__)
for name in ("cuda.bindings", "pycuda", "torch", "cupy", "llvmlite", "numpy"):
    try:
        mod = importlib.import_module(name)
        print(f"  {name}: {getattr(mod, '__version__', 'present')}")
    except Exception as e:
        print(f"  {name}: missing ({type(e).__name__})")
print("  nvrtc:", rt.find_nvrtc(), rt.nvrtc_version())
try:
    drv = rt.driver()
    print(f"  driver: {drv.name}, {drv.device_count()} device(s), {getattr(drv, 'arch', '?')}, "
          f"CUDA {drv.driver_version() if hasattr(drv, 'driver_version') else '?'}")
except rt.CudaUnavailable as e:
    print("no usable GPU:", e)
    sys.exit(1)
print("  cublasLt:", cublas.find_cublaslt(),
      "(loaded)" if cublas.cublaslt_for(drv) is not None else "(not usable: matmuls run the "
      "generated kernel)")
PYEOF

echo "== GPU tests (every kernel family against eager, the MLP step against the CPU)"
timeout 180 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider tests/gpu \
    tests/codegen/test_cuda_codegen.py || status=1

echo "== benchmark"
timeout 270 "$PY" benchmarks/gpu_bench.py "$@" || status=1
exit $status
