PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-portable demo bench bench-training lint clean fuzz fuzz-symbolic

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,examples,mpi]'
	touch $(STAMP)

# The layering first (import-linter's contracts in pyproject.toml), then the suite, which
# records the source of every CUDA kernel its tests make (they run on a simulated driver that
# never compiles them); then, where nvcc is installed, every recorded kernel is compiled to
# machine code for sm_80 and sm_90 (warnings are errors, and a kernel that spills fails).
CUDA_KERNELS := build/cuda-kernels

test: $(STAMP)
	$(VENV)/bin/lint-imports
	rm -rf $(CUDA_KERNELS)
	FUSEGRAD_CUDA_COLLECT=$(CURDIR)/$(CUDA_KERNELS) $(PY) -m pytest
	$(PY) -m fusegrad.testing.nvcc $(CUDA_KERNELS)

# The suite as another machine runs it: numpy's BLAS picks its own kernels (OPENBLAS_CORETYPE
# and OPENBLAS_L2_SIZE unset), products use numpy's BLAS as on a CPU without AVX-512 (no
# generated GEMM), and kernels run on one thread. The heaviest cases (marked slow), which do
# not depend on these settings, run in `make test` only.
PORTABLE_ENV := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE FUSEGRAD_NATIVE_GEMM=off \
	FUSEGRAD_NUM_THREADS=1

test-portable: $(STAMP)
	$(PORTABLE_ENV) $(PY) -m pytest -m "not slow"

demo: $(STAMP)
	$(PY) examples/train_digits.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py
	$(PY) benchmarks/bench_training.py

# Training steps only (MLP and char transformer; torch and jax when installed).
bench-training: $(STAMP)
	$(PY) benchmarks/bench_training.py

# A long differential fuzzing run (docs/fuzzing.md): 10,000 random programs or 30 minutes.
fuzz: $(STAMP)
	$(PY) -m fusegrad.testing.fuzz --programs 10000 --budget 1800

# The symbolic stage alone (docs/fuzzing.md): each program compiled once, called at three sizes.
fuzz-symbolic: $(STAMP)
	$(PY) -m fusegrad.testing.fuzz --programs 2800 --symbolic-only --no-fd

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pip install --quiet ruff && $(VENV)/bin/ruff check fusegrad tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
