"""MOON's model-contrastive term: zero at the first round, then a data-space term on the autograd backends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.moon import Moon
from helpers.tiny import make_context, tiny_data


def model() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)))


def two_rounds(strategy: FedAvg, backend: str) -> list[torch.Tensor]:
    engine = Engine(model(), tiny_data([7, 9, 5], dim=4, classes=3, seed=1), backend=backend)  # type: ignore[arg-type]
    strategy.setup(make_context(engine, steps=3, lr=0.3, batch=4, m=3))
    w, out = engine.initial_params(), []
    for t in range(2):
        clients = torch.arange(3)
        w = strategy.aggregate(t, w, engine.train(w, strategy.configure(t, clients, w), t))
        out.append(w)
    return out


def test_the_first_round_is_fedavg_and_later_rounds_differ() -> None:
    """At the first round the previous model is the global one: both similarities match and ℓ_con is constant."""
    moon, fedavg = two_rounds(Moon(mu=5.0), "sequential"), two_rounds(FedAvg(), "sequential")
    torch.testing.assert_close(moon[0], fedavg[0], atol=1e-6, rtol=1e-6)
    assert float((moon[1] - fedavg[1]).abs().max()) > 1e-4


def test_sequential_and_vectorised_agree_and_dense_refuses() -> None:
    seq, vec = two_rounds(Moon(), "sequential"), two_rounds(Moon(), "vectorised")
    for a, b in zip(seq, vec, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="backend 'dense' cannot run this local objective"):
        two_rounds(Moon(), "dense")
