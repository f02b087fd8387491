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
    assert run_labels(lr) == ["fedavg, lr=0.05", "fedavg, lr=0.1"]  # the method, the key by its last part
    assert common_description(lr) == "fedavg, dataset digits, 20 rounds, seed 0"
    data = [rec("a"), rec("b", dataset={"name": "mnist"})]
    assert run_labels(data) == ["fedavg, dataset digits", "fedavg, dataset mnist"]
    same = [rec("x"), rec("y")]
    assert run_labels(same) == ["x", "y"]  # nothing differs: the folder names
    twice = [rec("x"), rec("y"), rec("z", seed=1)]
    assert run_labels(twice) == ["fedavg, seed 0 (x)", "fedavg, seed 0 (y)", "fedavg, seed 1"]
    unknown = [RunRecord(Path("p"), {}, []), RunRecord(Path("q"), {}, [])]
    assert run_labels(unknown) == ["p", "q"]
    assert run_labels([rec("only")]) == ["fedavg, seed 0"]


def test_labels_name_at_most_two_keys_that_tell_the_runs_apart_and_never_absent_ones() -> None:
    # a recipe's methods: only FedAvg has personal_eval keys; the method alone tells them apart
    runs = [
        rec("a", personal_eval={"enabled": True, "finetune_steps": 0, "every": 1}),
        rec("b", algorithm={"name": "ditto", "server_lr": 1.0, "lam": 0.1}),
        rec("c", algorithm={"name": "fedavg_ft", "server_lr": 1.0}),
    ]
    assert run_labels(runs) == ["fedavg", "ditto", "fedavg_ft"]
    # a 2 × 2 grid that also changes a third key with the first: two keys, short names and values
    grid = [
        rec(f"p{i}", local={"lr": lr, "steps": 10, "batch_size": 10 * (1 + (lr > 0.05))}, partition=part)
        for i, (lr, part) in enumerate(
            (lr, part) for lr in (0.05, 0.1) for part in ({"name": "iid"}, {"name": "dirichlet", "alpha": 0.1})
        )
    ]
    assert run_labels(grid) == [
        "fedavg, lr=0.05, partition iid",
        "fedavg, lr=0.05, partition dirichlet",
        "fedavg, lr=0.1, partition iid",
        "fedavg, lr=0.1, partition dirichlet",
    ]
    # a key only one run has is named on that run alone, and only when nothing else tells it apart
    tuned = [rec("a"), rec("b", personal_eval={"finetune_steps": 5})]
    assert run_labels(tuned) == ["fedavg", "fedavg, finetune_steps=5"]
    # long values are cut; an algorithm's parameter sits with its name
    long = [rec("a", model={"name": "mlp", "hidden": [256, 256, 256, 256]}), rec("b", model={"name": "mlp"})]
    assert run_labels(long) == ["fedavg, hidden=[256,256,256,25…", "fedavg"]
    prox = [rec("a", algorithm={"name": "fedprox", "mu": m}, local={"lr": m, "steps": 1}) for m in (0.1, 1.0)]
    assert run_labels(prox) == ["fedprox mu=0.1", "fedprox mu=1"]  # one key is enough
    assert run_labels([rec("a", algorithm="fedavg"), rec("b", algorithm="scaffold")]) == ["fedavg", "scaffold"]


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
    assert [g.label for g in groups] == ["fedavg, lr=0.1", "fedavg, lr=0.5"] and [g.seeds for g in groups] == [3, 3]
    assert groups[0].selection == "val_loss (min)"
    assert [r.selected["test_accuracy"] for r in groups[0].runs] == [0.5, 0.52, 0.54]  # round 2: the selected one
    named = read_groups([tmp_path / "sweep" / "lr-0.1", tmp_path / "sweep" / "lr-0.5"], ["slow", "fast"])
    assert [g.label for g in named] == ["slow", "fast"]
    with pytest.raises(ConfigError, match="1 --label for 2 paths and 2 groups"):
        read_groups([tmp_path / "sweep" / "lr-0.1", tmp_path / "sweep" / "lr-0.5"], ["slow"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no run folder"):
        read_groups([tmp_path / "empty"])


def test_label_renames_groups_inside_a_sweep_by_name_folder_or_order(tmp_path: Path) -> None:
    sweep = sweep_folder(tmp_path / "sweep")
    renamed = read_groups([sweep], ["fedavg, lr=0.1=slow", "lr-0.5=fast"])  # OLD: a group's name or its folder's
    assert [g.label for g in renamed] == ["slow", "fast"] and all(r.label == "slow" for r in renamed[0].runs)
    assert [g.label for g in read_groups([sweep], ["fedavg, lr=0.5=fast"])] == ["fedavg, lr=0.1", "fast"]
    assert [g.label for g in read_groups([sweep], ["slow", "fast"])] == ["slow", "fast"]  # one per group, in order
    assert [g.label for g in read_groups([sweep], ["all"])] == ["all: fedavg, lr=0.1", "all: fedavg, lr=0.5"]
    with pytest.raises(ConfigError, match=r"3 --label for 1 paths and 2 groups: .*'fedavg, lr=0.1', 'fedavg, lr=0.5'"):
        read_groups([sweep], ["a", "b", "c"])
    with pytest.raises(ConfigError, match="OLD=NEW --label renames"):
        read_groups([sweep], ["lr-0.7=x", "b", "c"])  # a typo in OLD: not a rename, and the count is off
    with pytest.raises(ConfigError, match="not both"):
        read_groups([sweep], ["lr-0.5=fast", "slow"])
    with pytest.raises(ConfigError, match="two groups would be called 'same'"):
        read_groups([sweep], ["lr-0.5=same", "lr-0.1=same"])
    with pytest.raises(ConfigError, match="cannot be empty"):
        read_groups([sweep], ["", "b"])


def recipe_folder(root: Path, methods: dict[str, str]) -> Path:
    """A recipe's folder: one folder per method (its shell-safe name) of two seeds, and runs.json naming them."""
    import json

    index = []
    for i, (method, algorithm) in enumerate(methods.items()):
        folder = method.replace(" ", "-").replace("+", "")
        for seed in range(2):
            config = {"algorithm": {"name": algorithm}, "seed": seed, "rounds": 2, "personal_eval": {"every": i}}
            write_run(root / folder / f"seed{seed}", config, [0.3, 0.6 + 0.1 * i])
            index.append({"label": f"{method}, seed {seed}", "folder": f"{folder}/seed{seed}", "status": "finished"})
    (root / "runs.json").write_text(json.dumps(index))
    return root


def test_recipe_folders_keep_their_method_names(tmp_path: Path) -> None:
    recipe = recipe_folder(tmp_path / "labels", {"FedAvg": "fedavg", "FedAvg + FT": "fedavg", "Ditto": "ditto"})
    groups = read_groups([recipe])
    assert sorted(g.label for g in groups) == ["Ditto", "FedAvg", "FedAvg + FT"] and {g.seeds for g in groups} == {2}
    other = recipe_folder(tmp_path / "dirichlet", {"FedAvg": "fedavg"})
    (other / "FedAvg" / "seed0" / "config.yaml").write_text("{algorithm: {name: fedavg}, seed: 0, rounds: 3}\n")
    (other / "FedAvg" / "seed1" / "config.yaml").write_text("{algorithm: {name: fedavg}, seed: 1, rounds: 3}\n")
    both = read_groups([recipe, other])  # the same name in two recipe folders: the path tells them apart
    assert "FedAvg (labels)" in {g.label for g in both} and "FedAvg (dirichlet)" in {g.label for g in both}
    renamed = read_groups([recipe], ["FedAvg + FT=fine-tuned"])
    assert "fine-tuned" in {g.label for g in renamed}
    (recipe / "runs.json").write_text("[{]")  # damaged: the runs are named from their configs
    assert sorted(g.label for g in read_groups([recipe])) == ["ditto, every=2", "fedavg, every=0", "fedavg, every=1"]


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


def test_a_recipe_name_drops_the_seed_whatever_the_recipe_separates_it_with(tmp_path: Path) -> None:
    import json

    from fedhet.report.runs import given_name

    for label, name in (("FedAvg, seed 0", "FedAvg"), ("col | row | seed 12", "col | row"), ("seedless", "seedless")):
        folder = tmp_path / "r" / "m" / "seed0"
        folder.mkdir(parents=True, exist_ok=True)
        (tmp_path / "r" / "runs.json").write_text(json.dumps([{"label": label, "folder": "m/seed0"}]))
        assert given_name(folder, {}) == name
    (tmp_path / "r" / "sweep.json").write_text("{}")  # a sweep's points are named from their values
    assert given_name(folder, {}) is None
