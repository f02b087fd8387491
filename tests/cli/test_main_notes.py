"""A sweep says each of its notes once, on one line without a source path, also from its worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from helpers.tables import write_patients

runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sweeps_notes_are_said_once(workers: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_patients(tmp_path / "patients.csv")
    settings = [f"dataset.path={path}", "dataset.label=outcome", "dataset.user=site", "dataset.missing=drop"]
    args = ["sweep", "--set", "dataset.name=table", *(a for s in settings for a in ("--set", s)), "--set", "rounds=2"]
    args += ["--grid", "local.lr=0.01,0.1", "--workers", workers, "--quiet", "--out", str(tmp_path / "sweep")]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(said) == len(set(said)) == 4, result.stderr  # id column, empty cell, standardised, partition
    assert any("dataset.user=site: 4 users" in line for line in said)  # a note of the runs, from the workers
    raw = capfd.readouterr().err  # what the worker processes printed themselves
    assert "FedhetNote" not in raw and "note:" not in raw
