"""docs/extending.md: every example, written into one plugin file, runs from the command line as shown."""

from __future__ import annotations

import csv
import json
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
    registries += ["PARTITIONERS", "SHIFTS", "AVAILABILITY", "METRIC_PLUGINS", "SYSTEMS", "DEADLINE_POLICIES"]
    registries += ["STALENESS", "MECHANISMS"]
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


def test_the_privacy_mechanism_plugin_is_accounted(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/extending.md's Laplace local DP: a client's ε after n participations is min(n·ε₀, dp-accounting's n
    Laplace releases) with ε₀ = 2/z, in clients.csv, metrics.csv and summary.json; a target ε sets z before the run
    for the client that takes part most often; a target with a noise multiplier is refused in one line."""
    dp = pytest.importorskip("dp_accounting")
    monkeypatch.chdir(plugin)
    args = ["run", "--import", "my_components.py", "--algorithm", "private", "--quiet", "--rounds", "4"]
    args += ["--set", "num_clients=6", "--set", "clients_per_round=3", "--target-epsilon", "6"]
    mechanism = "algorithm.mechanism={name: my_laplace_ldp, clip: 0.01}"
    result = CliRunner().invoke(app, [*args, "--set", mechanism, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    privacy = json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]
    block, z = privacy["my_laplace_ldp"], privacy["my_laplace_ldp"]["noise_multiplier"]
    assert 6.0 * 0.99 <= block["epsilon"] <= 6.0 + 1e-9 and block["epsilon_per_round"] == pytest.approx(2 / z)
    with (tmp_path / "run" / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    for client in clients:
        n = int(client["dp_rounds"])
        rdp = dp.rdp.RdpAccountant().compose(dp.SelfComposedDpEvent(dp.LaplaceDpEvent(z / 2), n)).get_epsilon(1e-5)
        expected = min(n * 2 / z, rdp) if n else 0.0
        assert float(client["dp_my_laplace_ldp_epsilon"]) == pytest.approx(expected, rel=1e-9)
    with (tmp_path / "run" / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    assert float(last["dp_my_laplace_ldp_epsilon"]) == pytest.approx(block["epsilon"])
    both = "algorithm.mechanism={name: my_laplace_ldp, noise_multiplier: 1}"
    refused = CliRunner().invoke(app, [*args, "--set", both, "--out", str(tmp_path / "no")])
    assert refused.exit_code == 2 and not (tmp_path / "no").exists()
    assert refused.stderr.strip().splitlines() == [
        "error: give algorithm.mechanism.noise_multiplier or privacy.target_epsilon, not both"
    ]
    listed = CliRunner().invoke(app, ["list", "mechanisms", "--import", "my_components.py"], env={"COLUMNS": "160"})
    assert "my_laplace_ldp" in listed.output and "dp_sgd" in listed.output
