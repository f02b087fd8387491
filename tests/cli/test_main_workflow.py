"""The researcher's workflow from the command line (issue 36): a regression on a CSV's numeric outcome and a binary
task with AUC and F1 on the dense and sequential backends, own tables that say what was done to them, sweeps
compared as mean ± std bands, piped output, --threads, and a run folder that reruns from any directory."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import fedhet
from fedhet.cli.main import PIPE_WIDTH, UnwrappedConsole, app
from helpers.tables import write_patients

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def table_args(path: Path, label: str, *extra: str) -> list[str]:
    return [
        "--dataset", "table", "--set", f"dataset.path={path}", "--set", f"dataset.label={label}",
        "--set", "dataset.user=site", "--set", "dataset.missing=drop", "--rounds", "4", *extra,
    ]  # fmt: skip


def rows(folder: Path) -> list[dict[str, float]]:
    with (folder / "metrics.csv").open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.mark.parametrize(
    ("label", "task", "columns"),
    [
        ("pressure", "regression", ("test_mae", "test_rmse", "test_r2", "test_rmse_pooled")),
        ("outcome", "binary", ("test_auc", "test_f1", "test_balanced_accuracy", "test_auc_pooled", "test_accuracy")),
    ],
)
def test_a_task_runs_from_the_cli_and_python_with_the_same_numbers_on_dense_and_sequential(
    tmp_path: Path, label: str, task: str, columns: tuple[str, ...]
) -> None:
    path = write_patients(tmp_path / "patients.csv")
    lr = ["--set", "local.lr=0.003"] if task == "regression" else []
    for backend in ("dense", "sequential"):
        code, out = invoke("run", *table_args(path, label, "--set", f"task={task}", *lr, "--backend", backend,
                                              "--out", str(tmp_path / backend)))  # fmt: skip
        assert code == 0, out
        assert f"{backend} backend" in " ".join(out.split()) and all(c in out for c in columns[:3])
    dense, sequential = rows(tmp_path / "dense"), rows(tmp_path / "sequential")
    assert all(c in dense[-1] for c in columns) and (task == "binary") == ("test_accuracy" in dense[-1])
    for a, b in zip(dense, sequential, strict=True):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6, nan_ok=True), key
    assert float(dense[-1]["test_loss"]) < float(dense[0]["test_loss"])  # it learns
    config = (tmp_path / "dense" / "config.yaml").read_text()
    assert f"task:\n  name: {task}\n" in config and "name: natural" in config and "num_clients: 4" in config
    # the same run from Python
    spec = {"name": "table", "path": str(path), "label": label, "user": "site", "missing": "drop"}
    local = {"lr": 0.003} if task == "regression" else {}
    with pytest.warns(fedhet.errors.FedhetNote):
        result = fedhet.run({"dataset": spec, "task": task, "rounds": 4, "backend": "dense", "local": local})
    for key, value in dense[-1].items():
        assert result.final[key] == pytest.approx(value, rel=1e-6, nan_ok=True), key


def test_the_notes_say_what_was_done_to_a_table_and_clients_csv_names_the_sites(tmp_path: Path) -> None:
    path = write_patients(tmp_path / "patients.csv")
    result = runner.invoke(app, ["run", *table_args(path, "outcome"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    notes = " ".join(result.output.split())
    assert "note: table 'patients.csv': left out column 'patient_id'" in notes
    assert "note: table 'patients.csv': dropped 1 of 240 rows with an empty cell (dataset.missing: drop)" in notes
    assert "note: table 'patients.csv': standardised 3 numeric feature columns (zero mean, unit variance" in notes
    assert "note: dataset.user=site: 4 users, so partition natural, one client per user (4 clients, 4 a round)" in notes
    with (tmp_path / "r" / "clients.csv").open() as f:
        assert [row["user"] for row in csv.DictReader(f)] == ["east", "north", "south", "west"]
    assert fedhet.load_run(tmp_path / "r", model=False).clients[0]["user"] == "east"


def test_a_run_folder_reruns_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_patients(tmp_path / "patients.csv")
    (tmp_path / "nets.py").write_text(
        "from torch import nn\n"
        "class Net(nn.Sequential):\n"
        "    def __init__(self, input_shape, num_classes):\n"
        "        super().__init__(nn.Linear(input_shape[0], 8), nn.GELU(), nn.Linear(8, num_classes))\n"
    )
    args = table_args(Path("patients.csv"), "outcome", "--set", "model={name: torch, target: 'nets.py:Net'}")
    assert invoke("run", *args, "--out", "first", "--quiet")[0] == 0
    config = (tmp_path / "first" / "config.yaml").read_text()
    assert f"path: {tmp_path / 'patients.csv'}" in config and f"target: {tmp_path / 'nets.py'}:Net" in config
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = invoke("run", str(tmp_path / "first" / "config.yaml"), "--out", "again", "--quiet")
    assert code == 0, out
    assert (elsewhere / "again" / "metrics.csv").read_text() == (tmp_path / "first" / "metrics.csv").read_text()


def test_compare_and_plot_a_sweep_folder_as_mean_and_std_per_point(tmp_path: Path) -> None:
    sweep = [
        "sweep", "--grid", "local.lr=0.01,0.1", "--seeds", "2", "--workers", "1", "--quiet", "--out",
        str(tmp_path / "sw"), "--set", "rounds=3", "--set", "num_clients=6", "--set", "model.hidden=[8]",
        "--set", "val_fraction=0.2",
    ]  # fmt: skip
    assert invoke(*sweep)[0] == 0
    code, out = invoke("compare", str(tmp_path / "sw"), "--plot", str(tmp_path / "cmp.png"), "--column", "val_loss")
    assert code == 0, out
    text = " ".join(out.split())
    assert "fedavg, lr=0.01" in text and " ± " in text and "mean ± std over 2 seeds per row" in text
    assert "rows ranked by test accuracy (highest first)" in text
    assert "values at each run's best round by val_loss (min)" in text and (tmp_path / "cmp.png").stat().st_size > 1000
    code, out = invoke(
        "plot", str(tmp_path / "sw" / "lr-0.01"), str(tmp_path / "sw" / "lr-0.1"),
        "--label", "slow", "--label", "fast", "-o", str(tmp_path / "p.png"),
    )  # fmt: skip
    assert code == 0 and (tmp_path / "p.png").stat().st_size > 1000, out
    code, out = invoke("plot", str(tmp_path / "sw"), "--label", "a", "--label", "b", "-o", str(tmp_path / "ab.png"))
    assert code == 0, out  # one name per group, in order
    code, out = invoke("plot", str(tmp_path / "sw"), "--label", "a", "--label", "b", "--label", "c")
    assert code == 2 and "3 --label for 1 paths and 2 groups" in out


@pytest.mark.slow
def test_output_that_is_not_a_terminal_is_not_wrapped(tmp_path: Path) -> None:
    console = UnwrappedConsole(file=(tmp_path / "out.txt").open("w"))
    assert console.width == PIPE_WIDTH
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", "list", "metrics"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "test_auc_pooled" in x)
    assert "over all test samples pooled" in line  # one row: not cut at 80 columns


def test_threads(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    code, out = invoke(
        "run", "--rounds", "1", "--set", "num_clients=4", "--threads", "1", "--quiet", "--out", str(tmp_path / "r")
    )
    assert code == 0 and torch.get_num_threads() == before, out
    assert invoke("run", "--threads", "0")[0] == 2
    from fedhet.experiments.executor import Executor

    # one thread per run, serial or in workers: the same numbers either way (issue 43)
    assert Executor(1).threads == 1 and Executor(1, threads=None).threads == 1
    assert Executor(2, threads=None).threads == 1 and Executor(2, threads=2).threads == 2
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "finished"
