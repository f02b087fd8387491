"""`fedhet run --estimate` and `fedhet reproduce --estimate` as a user types them: a table, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_run_estimate_prints_the_projection_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = invoke(
        "run", "--dataset", "digits", "--rounds", "500", "--set", "num_clients=6", "--set", "model.hidden=[8]",
        "--estimate",
    )  # fmt: skip
    assert code == 0, out
    assert "projected" in out and "500 × 1" in out and "nothing was written" in out
    assert "local steps" not in out
    assert os.listdir(tmp_path) == []


def test_run_estimate_says_when_rounds_were_timed_with_fewer_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("fedhet.experiments.estimate.MAX_TIMED_STEPS", 3)
    code, out = invoke(
        "run", "--dataset", "digits", "--rounds", "50", "--set", "num_clients=6", "--set", "model.hidden=[8]",
        "--set", "local.steps=9", "--estimate",
    )  # fmt: skip
    assert code == 0, out
    assert "run: rounds timed with 3 of their 9 local steps, local training scaled" in out


@pytest.mark.slow
def test_reproduce_estimate_uses_stand_ins_without_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no data folder here: the recipe's datasets are stood in for
    code, out = invoke("reproduce", "fedmgda-bias-attack", "--seeds", "1", "--estimate", "--quiet")
    assert code == 0, out
    assert "stand-in data" in out and "total" in out
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on the CI machines)")
def test_reproduce_estimate_on_a_gpu_reports_its_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = invoke("reproduce", "fedmgda-bias-attack", "--seeds", "1", "--estimate", "--quiet", "--device", "cuda")
    assert code == 0, out
    assert "GPU peak MB" in out and " on cuda" in out and "total" in out
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "maxfl-table1", "--estimate", "--quick"], "leave out --quick and --embedded"),
        (["run", "--estimate", "--engine", "flower"], "--estimate times the native engine"),
        (["run", "--resume", "somewhere", "--estimate"], "leave out --estimate"),
        (["reproduce", "maxfl-table1", "--device", "gpu0"], "'gpu0' is not a torch device"),
    ],
)
def test_estimate_with_a_flag_it_cannot_honour_is_one_line(args: list[str], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2 and message in out, out
    assert len(out.strip().splitlines()) == 1, out
