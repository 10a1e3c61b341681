# Setup is part of every target: a venv in .venv with torch installed first, then lmforge (editable) + extras.
VENV ?= .venv
PY := $(VENV)/bin/python
# On a CPU-only machine the local CPU wheel of torch 2.13.0 is used; set TORCH_SPEC for another build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint bench clean

$(VENV)/.setup-done: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.setup-done

demo: setup
	$(VENV)/bin/lmforge pretrain demo
	$(VENV)/bin/lmforge finetune demo-sentiment --init runs/demo
	$(VENV)/bin/lmforge eval runs/demo-sentiment

# One worker per core (at most 4), one thread each: the tests are small and mostly single-threaded.
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -n auto --maxprocesses=4

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
