"""A regression on the user's own table from the command line (issue 42, "first hour on the user's own data"): a
diabetes-like table of whole-number targets from 25 to 346 trains at the default rate and the documented ones, and
reports its errors in the targets' units; without a task, such a label is refused in one line."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.experiments.config import load_yaml

runner = CliRunner()


def write_diabetes_like(path: Path, n: int = 400) -> Path:
    """Six standardised measurements and a disease-progression score like scikit-learn's diabetes table: whole
    numbers from 25 (to 313 here) around 150, a linear signal and noise (std 30)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)) * 0.05
    target = np.clip(np.round(150 + x[:, :4] @ np.array([900.0, 500.0, -400.0, 200.0]) + rng.normal(0, 30, n)), 25, 346)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["age", "sex", "bmi", "bp", "s1", "s2", "target"])
        for row, t in zip(x, target, strict=True):
            writer.writerow([*(f"{v:.6f}" for v in row), f"{t:.1f}"])
    return path


def run_args(path: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", "--dataset", "table", "--set", f"dataset.path={path}", "--set", "dataset.label=target",
        "--rounds", "20", "--set", "num_clients=5", "--out", str(out), "--quiet", *extra,
    ]  # fmt: skip


def last_row(folder: Path) -> dict[str, float]:
    with (folder / "metrics.csv").open() as f:
        return {k: float(v) for k, v in list(csv.DictReader(f))[-1].items()}


def check_trained(folder: Path) -> dict[str, float]:
    final = last_row(folder)
    assert final["test_r2"] > 0.3 and final["test_r2_pooled"] > 0.3
    assert 15 < final["test_mae"] < 45 and 20 < final["test_rmse"] < 55  # the targets' units (noise std 30)
    assert final["test_loss"] == pytest.approx(final["test_rmse"] ** 2, rel=0.3)  # a squared error in units²
    return final


def test_a_regression_on_a_table_of_large_targets_trains_at_the_default_rate(tmp_path: Path) -> None:
    path = write_diabetes_like(tmp_path / "diabetes.csv")
    result = runner.invoke(app, run_args(path, tmp_path / "diab", "--set", "task=regression"))
    assert result.exit_code == 0, result.output
    check_trained(tmp_path / "diab")
    derived = load_yaml(tmp_path / "diab" / "config.yaml")["derived"]["task"]  # to map the model's outputs back
    assert 140 < derived["target_mean"][0] < 160 and 40 < derived["target_scale"] < 80


@pytest.mark.parametrize("lr", ["0.003", "0.01"])
def test_the_documented_rates_train_too(tmp_path: Path, lr: str) -> None:
    path = write_diabetes_like(tmp_path / "diabetes.csv")
    result = runner.invoke(
        app, run_args(path, tmp_path / "diab", "--set", "task=regression", "--set", f"local.lr={lr}")
    )
    assert result.exit_code == 0, result.output
    check_trained(tmp_path / "diab")


def test_raw_targets_at_an_exploding_rate_are_stopped_naming_the_cause(tmp_path: Path) -> None:
    path = write_diabetes_like(tmp_path / "diabetes.csv")
    args = run_args(path, tmp_path / "raw", "--set", "task=regression", "--set", "task.standardize=false")
    result = runner.invoke(app, [*args, "--set", "local.lr=0.05", "--rounds", "2"])
    assert result.exit_code != 0
    said = " ".join(result.stderr.split())
    assert "training diverged" in said and "lower local.lr (now 0.05)" in said
    assert re.search(r"the targets span 25 to \d+ and task.standardize is off", said)


def test_a_label_of_many_whole_numbers_without_a_task_is_refused_in_one_line(tmp_path: Path) -> None:
    path = write_diabetes_like(tmp_path / "diabetes.csv")
    result = runner.invoke(app, run_args(path, tmp_path / "diab"), env={"COLUMNS": "200"})
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: table '")
    assert (
        "185 different whole numbers from 25 to 313" in " ".join(lines[0].split())
        and "--set task=regression" in lines[0]
    )
    assert not (tmp_path / "diab").exists()
