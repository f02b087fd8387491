# Two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned so that pip takes the CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH := torch==2.13.0

.PHONY: install demo test test-slow lint docs bench bench-quick clean flower-venv test-flower flower-demo test-ray test-trackers

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
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The default suite (under 5 minutes on 2 cores); the longer end-to-end and paper-claim tests are marked slow and
# run by `make test-slow` (.ci/run runs both).
test: lint
	$(BIN)/pytest -m "not slow"

test-slow: install
	$(BIN)/pytest -m slow

# The documentation site (mkdocs.yml) into site/, strict: a broken link or reference fails the build.
$(BIN)/mkdocs: $(BIN)/fedhet
	$(BIN)/pip install -q -e '.[dev,docs]' $(TORCH)
	touch $(BIN)/mkdocs

docs: $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The full benchmark (the table of benchmarks/README.md) with the comparators of benchmarks/comparators (the naive
# reference, pfl where installed, Flower), so it runs from the Flower venv:
# runs/bench.json and its Markdown tables in runs/bench.md.
bench: flower-venv
	$(FLOWER_BIN)/python benchmarks/full_bench.py --json runs/bench.json
	$(FLOWER_BIN)/python -m fedhet.bench.report runs/bench.json > runs/bench.md

bench-quick: install
	$(BIN)/fedhet bench --quick --json runs/bench-quick.json

# Flower (docs/flower.md) lives in its own venv so that the core venv, and `make test`, never see flwr.
FLOWER_VENV := .venv-flower
FLOWER_BIN := $(FLOWER_VENV)/bin

$(FLOWER_BIN)/flwr: pyproject.toml
	$(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_BIN)/pip install -q --upgrade pip
	$(FLOWER_BIN)/pip install -q $(TORCH)
	$(FLOWER_BIN)/pip install -q -e '.[dev,flower]' $(TORCH)
	touch $(FLOWER_BIN)/flwr

flower-venv: $(FLOWER_BIN)/flwr

# The Flower tests: FEDHET_FLOWER_TESTS=1 makes a missing flwr an error instead of an ignored folder.
test-flower: flower-venv
	FEDHET_FLOWER_TESTS=1 $(FLOWER_BIN)/pytest tests/flower

# The Ray tests (docs/sweeps.md, docs/performance.md: sweeps and --actors): a local Ray head on loopback; FEDHET_RAY_TESTS=1 makes a missing Ray an
# error instead of a skip.
test-ray: install
	$(BIN)/pip install -q -e '.[dev,ray]' $(TORCH)
	FEDHET_RAY_TESTS=1 $(BIN)/pytest tests/experiments/test_executor_ray.py tests/experiments/test_actors_ray.py

# The trackers' tests with TensorBoard, MLflow and W&B (offline) installed: FEDHET_TRACKER_TESTS=1 makes a missing
# tracker an error instead of a skip.
test-trackers: install
	$(BIN)/pip install -q -e '.[dev,tensorboard,mlflow,wandb]' $(TORCH)
	FEDHET_TRACKER_TESTS=1 $(BIN)/pytest tests/experiments/test_tracking.py tests/cli/test_main.py

# MaxFL on a local SuperLink with 3 SuperNodes (loopback); the run folder is runs/flower-demo.
flower-demo: flower-venv
	scripts/flower_local.sh demo scripts/flower-maxfl.yaml runs/flower-demo 3

clean:
	rm -rf $(VENV) $(FLOWER_VENV) runs site .pytest_cache .mypy_cache .ruff_cache
