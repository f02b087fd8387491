"""`auto` runs models that torch.func.vmap cannot batch on the sequential backend, and says so."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from conftest import tiny_data
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError, FedhetWarning


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
    with pytest.warns(FedhetWarning, match="vmap cannot run this model"):
        engine = Engine(model, data)
    assert model.vmap_failure is not None and engine.backend_for(100) == "sequential"
    with pytest.raises(ConfigError, match="backend 'vectorised' cannot run this model"):
        Engine(model, data, backend="vectorised")


def test_models_vmap_can_batch_are_probed_silently() -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Dropout(0.2), nn.Linear(4, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Engine(model, tiny_data([5, 6]), backend="vectorised")
    assert model.vmap_failure is None
