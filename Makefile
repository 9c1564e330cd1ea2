# The README's two commands: `make demo` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of PyTorch (a bare `torch` requirement would pull a multi-GB CUDA build).
# On a GPU machine: make TORCH=torch demo
TORCH  ?= torch==2.13.0
# throughput.py's Ray side runs from its own venv, so Ray never enters the test environment.
BENCH_VENV ?= .venv-bench

.PHONY: install demo test bench bench-ray clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/gpulayer demo

test: install
	$(BIN)/pytest

bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/throughput.py   # skips the Ray side: see bench-ray

bench-ray:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q "$(TORCH)"
	$(BENCH_VENV)/bin/pip install -q -e '.[bench,bench-ray]'
	$(BENCH_VENV)/bin/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .hypothesis
