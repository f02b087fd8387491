"""The ``mia`` and ``dlg`` metric plugins in a run: their columns in metrics.csv, the PNGs in the run folder."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.leakage import DeepLeakage, MembershipInference, personal_losses


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


class LinearLosses:
    """A model whose per-sample loss is w[0] + x[:, 0]: which model scored a sample can be read off its loss."""

    def sample_losses(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return flat[0] + x[:, 0]


def test_personal_losses_score_each_sample_by_its_owners_model() -> None:
    """Three clients with two samples each; the plan makes models for clients 0 and 2 only (client 1 not evaluated:
    NaN). Cluster starts (IFCA) and stored personal parts (Ditto) give each sample its owner's row."""
    part = ClientData(torch.arange(6.0).view(6, 1), torch.zeros(6, dtype=torch.long), torch.tensor([0, 2, 4, 6]))
    starts = torch.tensor([[10.0], [30.0]])
    engine = SimpleNamespace(model=LinearLosses(), personal_starts=lambda params, plan, round_: plan.starts * 2)
    rows = torch.tensor([0, 3, 5])  # owners 0, 1, 2
    plan = LocalPlan.uniform(torch.tensor([0, 2]), 0, 0.1, 1)
    clustered = replace(plan, starts=starts)
    losses = personal_losses(engine, torch.zeros(1), clustered, 1, part, rows)  # type: ignore[arg-type]
    assert losses is not None
    assert losses[0] == 10.0 + 0.0 and losses[2] == 30.0 + 5.0 and math.isnan(losses[1])
    global_only = personal_losses(engine, torch.tensor([7.0]), plan, 1, part, rows)  # type: ignore[arg-type]
    assert global_only is not None and global_only[0] == 7.0 and global_only[2] == 12.0
    tuned = replace(plan, steps=torch.tensor([1, 1]))
    assert personal_losses(engine, torch.zeros(1), tuned, 1, part, rows) is None  # type: ignore[arg-type]


@pytest.mark.slow  # a few seconds of local-only training
def test_mia_on_personal_models_sees_overfitting() -> None:
    """Local-only models trained long on 25 samples each leak membership (AUC well above 0.5); the global model of
    local-only is never trained, so the calibrated attack measures the personal models alone."""
    cfg = parse_config(
        {
            "dataset": "digits",
            "algorithm": "local_only",
            "model": {"name": "mlp", "hidden": [64]},
            "num_clients": 40,
            "clients_per_round": 40,
            "rounds": 2,
            "partition": "iid",
            "local": {"steps": 60, "lr": 0.2, "batch_size": 10},
            "metrics": [{"name": "mia", "samples": 400, "target": "both"}],
        }
    )
    last = run(cfg).history[-1]
    assert last["mia_personal_auc"] > 0.65
    assert last["mia_personal_calibrated_auc"] > 0.65
    assert 0.4 < last["mia_auc"] < 0.6  # the untrained global model tells nothing


def test_mia_on_personal_models_refuses_a_run_without_them(tmp_path: Path) -> None:
    plugin = {"name": "mia", "target": "personal"}
    with pytest.raises(ConfigError, match="keeps none"):
        run(config([plugin], 1))
    cfg, out = tmp_path / "c.yaml", tmp_path / "out"
    cfg.write_text(
        f"dataset: digits\nnum_clients: 4\nclients_per_round: 2\nrounds: 1\nmetrics: [{json.dumps(plugin)}]\n"
    )
    out.mkdir()
    result = CliRunner().invoke(app, ["run", str(cfg), "--out", str(out), "--threads", "1"])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(out.iterdir()) == []
