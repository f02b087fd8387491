"""docs/extending.md: every example, written into one plugin file, runs from the command line as shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
TEXT = PAGE.read_text()
CODE = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
COMMANDS = [
    line
    for block in re.findall(r"```bash\n(.*?)```", TEXT, flags=re.S)
    for line in block.splitlines()
    if line.startswith("fedhet run --import my_components.py")
]
SMALL = ["--rounds", "2", "--quiet", "--set", "num_clients=6", "--set", "clients_per_round=3"]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "my_components.py").write_text("\n\n".join(CODE))
    return folder


def test_every_component_kind_has_an_example() -> None:
    registries = ["STRATEGIES", "TERMS", "OPTIMIZERS", "SERVER_OPTIMIZERS", "RULES", "MODELS", "DATASETS"]
    registries += ["PARTITIONERS", "SHIFTS", "AVAILABILITY", "METRIC_PLUGINS", "SYSTEMS"]
    for registry in registries:
        assert f"@{registry}.register" in TEXT, registry
    assert len(COMMANDS) >= 9


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.split("--import my_components.py ")[1][:40])
def test_the_command_runs_as_written(
    command: str, plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(plugin)
    args = shlex.split(command, comments=True)[1:]
    result = CliRunner().invoke(app, [*args, *SMALL, "--out", str(tmp_path / "run")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 3  # header and two evaluated rounds


def test_listing_shows_where_plugins_come_from(plugin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(plugin)
    result = CliRunner().invoke(app, ["list", "terms", "--import", "my_components.py"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    assert "my_l1" in result.output and "my_components.py" in result.output and "fedhet" in result.output
