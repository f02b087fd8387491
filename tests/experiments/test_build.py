"""Building a run (`fedhet.experiments.build`): a regression's targets standardised by the training samples, on
every backend, with every loss and metric reported in the targets' units."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fedhet
from fedhet.datasets import from_arrays
from fedhet.models.zoo import ToImage


def _targets(n: int = 160, image: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Features and targets around 200 ± 50 (a linear signal and noise): raw, they would need a tiny rate."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 1, 4, 4) if image else (n, 6)).astype(np.float32)
    signal = x.reshape(n, -1)[:, :4] @ np.array([30.0, -20.0, 15.0, 10.0])
    return x, np.round(200 + signal + rng.normal(0, 10, n))


def _run(data: Any, model: Any, backend: str) -> fedhet.RunResult:
    config = {
        "dataset": data,
        "model": model,
        "num_clients": 4,
        "clients_per_round": 4,
        "rounds": 3,
        "backend": backend,
        "local": {"steps": 4, "batch_size": 8},
        "personal_eval": {"finetune_steps": 2},
    }
    return fedhet.run(config)


CONV = nn.Sequential(
    ToImage((1, 4, 4)), nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 1)
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("image", "model", "backends"),
    [
        (False, {"name": "mlp", "hidden": [8]}, ("dense", "vectorised", "sequential")),
        (True, CONV, ("conv", "sequential")),
    ],
)
def test_every_backend_trains_standardised_targets_and_reports_in_their_units(
    image: bool, model: Any, backends: tuple[str, ...]
) -> None:
    x, y = _targets(image=image)
    data = from_arrays(x, y, task="regression")
    runs = [_run(data, model, backend) for backend in backends]
    first = runs[0].final
    assert 3 < first["test_mae"] < 80 and (image or first["test_r2"] > 0.2)  # in the targets' units (spread ~40)
    assert first["test_rmse"] ** 2 == pytest.approx(first["test_loss"], rel=0.5)  # a squared error, not / s²
    assert first["personal_test_loss"] > 10 and first["local_loss"] > 10
    for other in runs[1:]:
        for key, value in first.items():
            assert other.final[key] == pytest.approx(value, rel=1e-4, abs=1e-5, nan_ok=True), key


def test_standardize_false_trains_on_the_raw_targets() -> None:
    x, y = _targets()
    data = from_arrays(x, y, task="regression")
    config: dict[str, Any] = {"dataset": data, "num_clients": 4, "rounds": 2, "local": {"lr": 1e-4}}
    raw = fedhet.run({**config, "task": {"name": "regression", "standardize": False}})
    scaled = fedhet.run({**config, "task": "regression"})
    assert raw.final["test_mae"] > 150 > 60 > scaled.final["test_mae"]  # barely moved from 0 at a rate of 1e-4
    assert torch.isfinite(torch.tensor(raw.final["test_loss"]))
