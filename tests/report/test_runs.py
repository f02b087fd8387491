"""Run folders read back, and runs named by what distinguishes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedhet.errors import ConfigError
from fedhet.report.runs import RunRecord, common_description, read_groups, run_labels


def rec(name: str, **config: Any) -> RunRecord:
    base: dict[str, Any] = {
        "algorithm": {"name": "fedavg", "server_lr": 1.0},
        "dataset": {"name": "digits"},
        "local": {"lr": 0.05, "steps": 10},
        "seed": 0,
        "rounds": 20,
    }
    base.update(config)
    return RunRecord(Path("runs") / name, {}, [], base)


def test_labels_name_the_algorithm_its_differing_parameters_and_the_seed() -> None:
    runs = [
        rec("a"),
        rec("b", algorithm={"name": "fedprox", "server_lr": 1.0, "mu": 0.01}),
        rec("c", algorithm={"name": "fedprox", "server_lr": 1.0, "mu": 0.1}, seed=1),
    ]
    assert run_labels(runs) == ["fedavg, seed 0", "fedprox mu=0.01, seed 0", "fedprox mu=0.1, seed 1"]
    assert common_description(runs) == "dataset digits, 20 rounds"


def test_labels_of_other_keys_components_and_equal_configs() -> None:
    lr = [rec("a"), rec("b", local={"lr": 0.1, "steps": 10})]
    assert run_labels(lr) == ["local.lr=0.05", "local.lr=0.1"]
    assert common_description(lr) == "fedavg, dataset digits, 20 rounds, seed 0"
    data = [rec("a"), rec("b", dataset={"name": "mnist"})]
    assert run_labels(data) == ["dataset digits", "dataset mnist"]
    same = [rec("x"), rec("y")]
    assert run_labels(same) == ["x", "y"]  # nothing differs: the folder names
    twice = [rec("x"), rec("y"), rec("z", seed=1)]
    assert run_labels(twice) == ["seed 0 (x)", "seed 0 (y)", "seed 1"]
    unknown = [RunRecord(Path("p"), {}, []), RunRecord(Path("q"), {}, [])]
    assert run_labels(unknown) == ["p", "q"]
    assert run_labels([rec("only")]) == ["fedavg, seed 0"]


def write_run(folder: Path, config: dict[str, Any], accuracy: list[float], selected_round: int | None = None) -> None:
    """A run folder as fedhet writes it (the files `read_run` reads)."""
    import csv
    import json

    import yaml

    folder.mkdir(parents=True)
    rows = [{"round": float(i + 1), "test_accuracy": a, "val_loss": 1 - a} for i, a in enumerate(accuracy)]
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary: dict[str, Any] = {"rounds": len(rows), "status": "finished", "final": rows[-1]}
    if selected_round is not None:
        summary["selection"] = {"metric": "val_loss", "mode": "min", "round": selected_round}
        summary["selected"] = rows[selected_round - 1]
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.yaml").write_text(yaml.safe_dump(config))


def sweep_folder(root: Path) -> Path:
    """Two points (local.lr 0.1 and 0.5) × three seeds, as `fedhet sweep` lays them out."""
    for lr, shift in ((0.1, 0.0), (0.5, 0.1)):
        for seed in range(3):
            config = {"algorithm": {"name": "fedavg"}, "local": {"lr": lr}, "seed": seed, "rounds": 3}
            accuracy = [0.2 + shift + 0.01 * seed, 0.5 + shift + 0.02 * seed, 0.4 + shift]
            write_run(root / f"lr-{lr}" / f"seed{seed}", config, accuracy, selected_round=2)
    (root / "sweep.json").write_text("{}")
    return root


def test_a_sweep_folder_is_one_group_per_point_over_its_seeds(tmp_path: Path) -> None:
    groups = read_groups([sweep_folder(tmp_path / "sweep")])
    assert [g.label for g in groups] == ["local.lr=0.1", "local.lr=0.5"] and [g.seeds for g in groups] == [3, 3]
    assert groups[0].selection == "val_loss (min)"
    assert [r.selected["test_accuracy"] for r in groups[0].runs] == [0.5, 0.52, 0.54]  # round 2: the selected one
    named = read_groups([tmp_path / "sweep" / "lr-0.1", tmp_path / "sweep" / "lr-0.5"], ["slow", "fast"])
    assert [g.label for g in named] == ["slow", "fast"]
    with pytest.raises(ConfigError, match="1 --label for 2 paths"):
        read_groups([tmp_path / "sweep" / "lr-0.1", tmp_path / "sweep" / "lr-0.5"], ["slow"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no run folder"):
        read_groups([tmp_path / "empty"])


def test_runs_of_distinct_configs_stay_one_line_each(tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        write_run(tmp_path / name, {"algorithm": {"name": name}, "seed": seed, "rounds": 3}, [0.1, 0.2, 0.3])
    groups = read_groups([tmp_path / "a", tmp_path / "b"])
    assert [g.label for g in groups] == ["a, seed 0", "b, seed 1"] and all(g.seeds == 1 for g in groups)


def test_a_run_reaches_a_target_at_its_first_round_and_simulated_time() -> None:
    rows = [
        {"round": 1.0, "test_accuracy": 0.5, "test_loss": 1.0, "time_s": 3.0},
        {"round": 2.0, "test_accuracy": 0.81, "test_loss": 0.4, "time_s": 7.5},
        {"round": 3.0, "test_accuracy": 0.79, "test_loss": 0.3, "time_s": 9.0},
    ]
    record = RunRecord(Path("r"), {}, rows)
    assert record.reaches("test_accuracy", 0.8) == {"round": 2.0, "time_s": 7.5}
    assert record.reaches("test_loss", 0.35) == {"round": 3.0, "time_s": 9.0}  # losses reach downwards
    missed = record.reaches("test_accuracy", 0.9)
    assert missed["round"] != missed["round"]  # NaN: never
    assert record.curve("test_accuracy", "time_s") == ([3.0, 7.5, 9.0], [0.5, 0.81, 0.79])
