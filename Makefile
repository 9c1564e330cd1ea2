# The README's two commands: `make demo` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of PyTorch (a bare `torch` requirement would pull a multi-GB CUDA build).
# On a GPU machine: make TORCH=torch demo
TORCH  ?= torch==2.13.0

.PHONY: install demo test bench clean

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
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
