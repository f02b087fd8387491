"""The README's examples run as written."""

from __future__ import annotations

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
