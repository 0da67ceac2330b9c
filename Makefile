PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,examples]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) examples/train_digits.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PY) -m pip install --quiet ruff && $(VENV)/bin/ruff check fusegrad tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
