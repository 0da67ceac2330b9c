#!/usr/bin/env bash
# The GPU check: fusegrad's GPU tests, then a short benchmark table, within 8 minutes.
#
#   bash benchmarks/gpu_check.sh [--quick]        (PYTHON=... picks the interpreter)
#
# Needs an NVIDIA GPU and a driver, NVIDIA's CUDA Python bindings (cuda-bindings) or pycuda,
# and NVRTC (the nvidia-cuda-nvrtc wheel) or nvcc; torch with CUDA is used as the reference
# when it imports. Nothing is downloaded: it runs with what the machine has.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "== environment"
"$PY" - <<'PYEOF' || exit 2
import importlib, sys
import fusegrad as fg
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
    print(f"  driver: {drv.name}, {drv.device_count()} device(s), {getattr(drv, 'arch', '?')}")
except rt.CudaUnavailable as e:
    print("no usable GPU:", e)
    sys.exit(1)
PYEOF

echo "== GPU tests (every kernel family against eager, the MLP step against the CPU)"
timeout 300 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider tests/gpu \
    tests/codegen/test_cuda_codegen.py || status=1

echo "== benchmark"
timeout 240 "$PY" benchmarks/gpu_bench.py "$@" || status=1
exit $status
