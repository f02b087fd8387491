# Two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned so that pip takes the CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH := torch==2.13.0

.PHONY: install demo test lint bench clean

$(BIN)/fedhet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]' $(TORCH)
	touch $(BIN)/fedhet

install: $(BIN)/fedhet

demo: install
	$(BIN)/fedhet run --algorithm fedavg --dataset digits --rounds 30 --seed 1 --out runs/demo --overwrite

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: install
	$(BIN)/fedhet bench --quick --json runs/bench.json

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
