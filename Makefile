PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench bench-training lint clean fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,examples,mpi]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

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

lint: $(STAMP)
	$(PY) -m pip install --quiet ruff && $(VENV)/bin/ruff check fusegrad tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
