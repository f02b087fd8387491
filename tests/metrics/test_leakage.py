"""The ``mia`` and ``dlg`` metric plugins in a run: their columns in metrics.csv, the PNGs in the run folder."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.leakage import DeepLeakage, MembershipInference


def config(metrics: list[Any], rounds: int = 2, dataset: str = "digits") -> Any:
    return parse_config(
        {
            "dataset": dataset,
            "model": {"name": "mlp", "hidden": [16]},
            "num_clients": 4,
            "clients_per_round": 2,
            "rounds": rounds,
            "local": {"steps": 2, "lr": 0.1, "batch_size": 10},
            "metrics": metrics,
        }
    )


@pytest.mark.slow  # a run folder: ~2-6 s
def test_mia_and_dlg_in_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(config([{"name": "mia", "samples": 200}, {"name": "dlg", "round": 2, "method": "idlg", "iterations": 50}]), out)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2
    for row in rows:
        for column in ("mia_auc", "mia_calibrated_auc"):
            assert 0.3 < float(row[column]) < 0.7  # two rounds of FedAvg barely fit: no leakage to speak of
        assert 0.0 <= float(row["mia_tpr_at_1fpr"]) <= 1.0
    assert rows[0]["dlg_psnr"] == ""  # the attack is on the model that starts round 2
    assert float(rows[1]["dlg_psnr"]) > 25.0  # iDLG recovers the single image
    assert float(rows[1]["dlg_label_accuracy"]) == 1.0
    assert (out / "dlg_truth_0.png").is_file()
    assert (out / "dlg_reconstruction_0.png").is_file()


def test_dlg_with_dp_noise_recovers_noise() -> None:
    dlg = {"name": "dlg", "method": "idlg", "iterations": 50, "clip": 1.0, "noise_multiplier": 1.0}
    state = run(config([dlg, {"name": "mia", "samples": 100}], 1))
    assert state.history[0]["dlg_psnr"] < 10.0
    assert 0.0 <= state.history[0]["mia_auc"] <= 1.0


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ({"name": "dlg", "client": 4}, "client 4 is not a client id"),
        ({"name": "dlg", "noise_multiplier": 1.0}, "noise_multiplier needs clip"),
    ],
)
def test_dlg_refuses_what_it_cannot_attack(plugin: dict[str, Any], message: str, tmp_path: Path) -> None:
    """Each refusal is one line on stderr, exit code 2, before the run folder is written."""
    with pytest.raises(ConfigError, match=message):
        run(config([plugin], 1))
    cfg, out = tmp_path / "c.yaml", tmp_path / "out"
    cfg.write_text(
        f"dataset: digits\nnum_clients: 4\nclients_per_round: 2\nrounds: 1\nmetrics: [{json.dumps(plugin)}]\n"
    )
    out.mkdir()
    result = CliRunner().invoke(app, ["run", str(cfg), "--out", str(out), "--threads", "1"])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert list(out.iterdir()) == []  # refused before anything was written


def test_without_samples_the_plugins_write_nan() -> None:
    """A Flower run's server holds the clients' sizes but no samples: NaN, not an error."""
    offsets = torch.tensor([0, 5, 10])
    part = ClientData(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), offsets)
    engine = SimpleNamespace(data=FederatedData("remote", part, part, 2, torch.ones(2, dtype=torch.bool)))
    view = SimpleNamespace(engine=engine, round=1, params=torch.zeros(3), previous=torch.zeros(3))
    for plugin in (MembershipInference(), DeepLeakage()):
        plugin.setup(engine, 0)
        row, _ = plugin.compute(view)  # type: ignore[arg-type]
        assert set(row) == set(plugin.columns())
        assert all(math.isnan(v) for v in row.values())


def test_dlg_refuses_samples_that_are_not_images() -> None:
    with pytest.raises(ConfigError, match="attacks images"):
        run(config([{"name": "dlg"}], 1, dataset="breast_cancer"))  # 30 features
