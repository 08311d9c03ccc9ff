# placer: `make demo` runs the main job end to end on a tiny model; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install test demo bench bench-gpu lint clean

install: $(STAMP)

# torch first, pinned: 2.13.0 is the CPU build on disk here; any other spec pulls a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

test: install
	$(PY) -m pytest

demo: install
	$(PY) examples/demo.py --out demo-out

bench: install
	$(PY) benchmarks/run_all.py

bench-gpu: install
	$(PY) benchmarks/bench_gpu.py

lint: install
	$(VENV)/bin/ruff check placer traces solvers tests benchmarks examples

clean:
	rm -rf demo-out bench-out .pytest_cache
