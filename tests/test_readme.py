"""The README's examples run as written."""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_strategy_example_runs_from_the_command_line_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = README.read_text().split("## Writing an algorithm")[1].split("\n## ")[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (commands,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    (tmp_path / "my_trimmed_avg.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    small = ["--rounds", "2", "--quiet", "--set", "num_clients=6", "--set", "clients_per_round=4"]
    for i, command in enumerate(commands.strip().splitlines()):
        args = shlex.split(command, comments=True)[1:]
        result = CliRunner().invoke(app, [*args, *small, "--out", f"run{i}"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "my_trimmed_avg" in (tmp_path / f"run{i}" / "config.yaml").read_text()


def test_every_recipe_the_readme_names_exists() -> None:
    from fedhet.recipes import RECIPES

    named = set(re.findall(r"fedhet reproduce ([a-z0-9-]+)", README.read_text()))
    assert named and named <= set(RECIPES), named - set(RECIPES)


def test_the_own_data_commands_run_as_written_and_say_what_they_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CSV with an id column, a site column and an empty cell (only fewer rounds and a run folder added)."""
    from helpers.tables import write_patients

    section = README.read_text().split("## Your data, your model")[1].split("\n## ")[0]
    (commands,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    tables = [line for line in commands.splitlines() if "--dataset table" in line]
    assert len(tables) == 3
    write_patients(tmp_path / "patients.csv")
    monkeypatch.chdir(tmp_path)
    for i, command in enumerate(tables):
        args = shlex.split(command)[1:]
        result = CliRunner().invoke(app, [*args, "--rounds", "3", "--out", f"run{i}"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        said = " ".join(result.output.split())
        assert "left out column 'patient_id'" in said and "standardised" in said, said
        assert "rows with an empty cell (dataset.missing: drop)" in said or "with its median" in said, said
        assert "dataset.user=site: 4 users, so partition natural, one client per user" in said, said
        with (tmp_path / f"run{i}" / "clients.csv").open() as f:
            assert [row["user"] for row in csv.DictReader(f)] == ["east", "north", "south", "west"]
    summaries = [json.loads((tmp_path / f"run{i}" / "summary.json").read_text()) for i in range(3)]
    assert summaries[0]["selection"]["metric"] == "val_loss" and "test_accuracy" in summaries[0]["selected"]
    assert "test_auc" in summaries[1]["final"] and "test_r2" in summaries[2]["final"]
