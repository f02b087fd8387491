"""The recipe framework: methods × seeds into run folders, the table, resuming, and diverging methods."""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.experiments.executor import Executor, Task
from fedhet.experiments.naming import safe_name
from fedhet.experiments.reproduce import Recipe, deep_merge, mean_std, run_recipe

BASE = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [8]},
    "num_clients": 6,
    "clients_per_round": 3,
    "rounds": 3,
    "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
}


def test_mean_std_counts_missing_seeds() -> None:
    assert mean_std([0.5, 0.7]) == "0.6000 ± 0.1414"
    assert mean_std([0.5, float("nan")]) == "0.5000 (1 of 2 missing)"
    assert mean_std([0.25, 0.5, 0.75], digits=1, scale=100) == "50.0 ± 25.0"
    assert mean_std([float("nan")]) == "n/a (1 of 1 missing)"


def test_a_diverging_method_leaves_a_gap_and_the_rest_of_the_table(tmp_path: Path) -> None:
    recipe = Recipe(
        name="toy",
        description="toy",
        base=BASE,
        methods={"FedAvg": {}, "Exploding": {"local": {"lr": 1e6}, "max_loss": 50.0}},
        columns={"test_accuracy": "acc"},
        seeds=(0, 1),
    )
    said: list[str] = []
    result = run_recipe(recipe, tmp_path, say=said.append)
    assert len(said) == 2 and all("diverged" in line for line in said)
    assert "n/a (2 of 2 missing)" in result.table
    assert all(0 <= v <= 1 for v in result.values["FedAvg"]["test_accuracy"])
    assert (tmp_path / "Exploding" / "seed0" / "config.yaml").is_file()
    index = json.loads((tmp_path / "runs.json").read_text())
    assert [(row["label"], row["status"]) for row in index] == [
        ("FedAvg, seed 0", "finished"),
        ("FedAvg, seed 1", "finished"),
        ("Exploding, seed 0", "diverged"),
        ("Exploding, seed 1", "diverged"),
    ]


def test_rerunning_a_recipe_reuses_its_finished_runs(tmp_path: Path) -> None:
    recipe = Recipe(name="toy", description="toy", base=BASE, methods={"FedAvg": {}}, columns={"test_accuracy": "acc"})
    first = run_recipe(recipe, tmp_path, seeds=(0,))
    stamp = (tmp_path / "FedAvg" / "seed0" / "checkpoint.pt").stat().st_mtime_ns
    again = run_recipe(recipe, tmp_path, seeds=(0,))
    assert again.values == first.values
    assert (tmp_path / "FedAvg" / "seed0" / "checkpoint.pt").stat().st_mtime_ns == stamp  # nothing retrained
    changed = Recipe(**{**recipe.__dict__, "base": deep_merge(BASE, {"rounds": 4})})
    assert run_recipe(changed, tmp_path, seeds=(0,)).runs["FedAvg"][0].rounds == 4


def test_a_study_of_its_own_runs_through_the_executor_and_lists_its_runs(tmp_path: Path) -> None:
    def study(out: Path, quick: bool, seeds: tuple[int, ...], embedded: bool | None, executor: Executor) -> str:
        tasks = [
            Task({**BASE, "seed": s}, out / "grid" / safe_name(f"μ=0.1, seed {s}"), f"μ=0.1, seed {s}") for s in seeds
        ]
        outcomes = executor.run(tasks)
        return " ".join(f"{o.final['test_accuracy']:.4f}" for o in outcomes)

    recipe = Recipe(name="toy", description="toy", base={}, methods={}, columns={}, custom=study)
    result = run_recipe(recipe, tmp_path, seeds=(0, 1))
    assert len(result.table.split()) == 2 and (tmp_path / "table.md").read_text() == result.table
    index = json.loads((tmp_path / "runs.json").read_text())
    assert index == [
        {"label": "μ=0.1, seed 0", "folder": "grid/mu-0.1-seed-0", "status": "finished"},
        {"label": "μ=0.1, seed 1", "folder": "grid/mu-0.1-seed-1", "status": "finished"},
    ]
