"""FedGSNR recipes end to end on small embedded runs: table layouts, run folders, contribution.csv, figures."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from fedhet.recipes import RECIPES
from fedhet.recipes.fedgsnr import (
    IID,
    PARTITIONS,
    RunSummary,
    fig5_study,
    figures_study,
    format_rounds,
    label_correlation,
    paired_speedups,
    speed_table,
    table1_study,
    table2_study,
)

TINY = {
    "num_clients": 6,
    "clients_per_round": 6,
    "rounds": 3,
    "model": {"name": "mlp", "hidden": [8]},
    "local": {"steps": 4, "lr": 0.1, "batch_size": 8},
    "metrics": [{"name": "target_accuracy", "target": 0.3, "column": "test_accuracy_pooled"}],
}


def summary(rounds: float) -> RunSummary:
    return RunSummary(history=[], final={"rounds_to_target": rounds, "best_test_accuracy": 0.5})


def test_speed_table_pairs_seeds_and_marks_unreached() -> None:
    nan = float("nan")
    assert paired_speedups([10, 20, nan], [5, 10, 4]) == [2.0, 2.0]
    assert format_rounds([nan, nan], 60) == ">60"
    assert format_rounds([10.0, nan], 60) == "10.0 [1/2 reached]"
    results = {
        ("A", "p"): [summary(12), summary(18)],
        ("G", "p"): [summary(6), summary(12)],
    }
    table, finite = speed_table(results, ["A", "G"], ["p"], lambda r: "A", 60)
    assert "| A | 15.0 ± 4.2 (1.0×) |" in table
    assert "| G | 9.0 ± 4.2 (1.75×) |" in table  # mean of 12/6 and 18/12
    assert finite == [pytest.approx(1.75)]


def test_recipes_are_registered() -> None:
    assert {"fedgsnr-table1", "fedgsnr-table2", "fedgsnr-figures", "fedgsnr-fig5"} <= set(RECIPES)


def test_label_correlation() -> None:
    history = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 1.1]], dtype=torch.float64)  # scores 0.2, 0.6, 1.0
    labels = torch.tensor([[5.0, 0, 0], [3, 3, 0], [1, 1, 1]])  # 1, 2, 3 classes
    run = RunSummary([], {}, contribution=history, label_counts=labels)
    assert label_correlation(run) == pytest.approx(1.0)
    flat = RunSummary([], {}, contribution=history, label_counts=torch.ones(3, 3))
    assert math.isnan(label_correlation(flat))


def test_fig5_falls_back_to_digits(tmp_path: Path) -> None:
    text = fig5_study(tmp_path, False, (0,), embedded=True, changes=TINY, bases={"FedAvg": "fedavg"})
    assert "the cifar100 files are missing" in text and "| FedGSNR with FedAvg |" in text
    assert "Spearman correlation" in text
    assert (tmp_path / "contribution_pareto.png").stat().st_size > 5_000
    assert (tmp_path / "pareto" / "fedgsnr-with-fedavg" / "seed0" / "contribution.csv").is_file()


def test_table1_layout_and_run_folders(tmp_path: Path) -> None:
    parts = {"α = 0.1": PARTITIONS["α = 0.1"], "Label 2": PARTITIONS["Label 2"]}
    text = table1_study(
        tmp_path, False, (0,), embedded=True, changes=TINY, partitions=parts, bases={"FedAvg": "fedavg"}
    )
    assert "| Algorithms | α = 0.1 | Label 2 |" in text
    assert "| FedGSNR with FedAvg |" in text and "(1.0×)" in text
    assert "The paper's Table 1" in text and "550 (1.0×)" in text
    run = tmp_path / "alpha-0.1" / "fedgsnr-with-fedavg" / "seed0"
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and "gsnr_entropy" in rows[0] and "rounds_to_target" in rows[0]
    assert all(float(r["gsnr_steps_total"]) == 6 * 4 for r in rows)  # N·E_const each round
    assert (tmp_path / "accuracy_label-2.png").stat().st_size > 5_000
    assert (tmp_path / "results.csv").read_text().count("\n") == 1 + 4


def test_table2_varies_active_clients(tmp_path: Path) -> None:
    changes = {**TINY, "num_clients": 10, "partition": {"name": "nonbalance"}}
    text = table2_study(tmp_path, False, (0,), embedded=True, changes=changes, fractions={"20%": 0.2, "100%": 1.0})
    assert "| Algorithms | 20% | 100% |" in text and "| FedNova |" in text
    with (tmp_path / "20" / "fedgsnr-with-fedavg" / "seed0" / "metrics.csv").open() as f:
        assert {float(r["participants"]) for r in csv.DictReader(f)} == {2.0}


@pytest.mark.slow
def test_figures_write_entropy_contribution_and_flip(tmp_path: Path) -> None:
    parts = {"α = 0.1": PARTITIONS["α = 0.1"], "Pareto": PARTITIONS["Pareto"]}
    text = figures_study(tmp_path, False, (0,), embedded=True, changes=TINY, partitions=parts, flip_partitions=("IID",))
    assert IID["name"] == "iid" and "| IID |" in text
    assert "rank (1 = lowest)" in text and "Spearman(GSNR, classes)" in text and "same client, true labels" in text
    assert "fell below its true-label score in" in text
    assert (tmp_path / "true-labels" / "iid" / "fedavg" / "seed0" / "metrics.csv").is_file()
    for name in ("entropy.png", "gsnr_partitions.png", "contribution_pareto.png"):
        assert (tmp_path / name).stat().st_size > 5_000, name
    folder = tmp_path / "label-flip" / "iid" / "fedgsnr-with-fedavg" / "seed0"
    with (folder / "contribution.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 6 and list(rows[0]) == ["round", "client", "gsnr", "n_opt"]  # every round and client
    assert all(not math.isnan(float(v)) for row in rows for v in row.values())
    assert (folder / "contribution.png").stat().st_size > 5_000
