"""Run folders read back, and runs named by what distinguishes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhet.report.runs import RunRecord, common_description, run_labels


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
