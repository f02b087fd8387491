"""`auto` runs models that torch.func.vmap cannot batch on the sequential backend, and says so."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError, FedhetWarning
from helpers.tiny import tiny_data


class FusedLSTM(nn.Module):
    """nn.LSTM's fused kernel has no vmap batching rule (vmap would loop over the batch with a warning)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 4, batch_first=True)
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h, _ = self.lstm(x.unsqueeze(-1))
        return self.out(h[:, -1])


def test_a_model_vmap_cannot_batch_falls_back_to_sequential_with_a_warning() -> None:
    torch.manual_seed(0)
    model = FlatModel(FusedLSTM())
    data = tiny_data([5, 6], dim=3)
    with pytest.warns(FedhetWarning, match="vmap cannot batch this model.*sequential"):
        engine = Engine(model, data)
    assert model.vmap_probe is not None and model.vmap_probe.slow is not None
    assert engine.backend_for(100) == "sequential"
    with pytest.warns(FedhetWarning, match="the same numbers, but slower"):  # asked for: it runs, slowly
        assert Engine(model, data, backend="vectorised").backend_for(100) == "vectorised"


class ItemNet(nn.Module):
    """`.item()` inside forward: vmap cannot run it at all."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x) * (1.0 + 0.0 * x.sum().item())


def test_a_model_vmap_cannot_run_is_refused_by_vectorised_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"backend .vectorised. cannot run this model .*item"):
        Engine(FlatModel(ItemNet()), tiny_data([5, 6]), backend="vectorised")


def test_models_vmap_can_batch_are_probed_silently() -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Dropout(0.2), nn.Linear(4, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Engine(model, tiny_data([5, 6]), backend="vectorised")
    assert model.vmap_probe is not None and model.vmap_probe.failure is None and model.vmap_probe.slow is None
