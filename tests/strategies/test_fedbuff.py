"""FedBuff: a server step every K updates, each scaled by its staleness (Nguyen et al. 2022, Algorithm 1)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhet.engine.plan import LocalResult
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.fedbuff import FedBuff

BASE: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},  # every client has more than a batch
    "model": "logistic",
    "num_clients": 8,
    "clients_per_round": 4,
    "rounds": 4,
    "local": {"steps": 3, "lr": 0.05, "batch_size": 10},
    "seed": 2,
}


def test_the_buffer_step_scales_each_update_by_its_staleness() -> None:
    strategy = FedBuff(buffer_size=2, server_lr=0.5)
    w = torch.tensor([1.0, 2.0])
    starts = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # the second client started from an older model
    local = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    result = LocalResult(torch.tensor([3, 5]), local, torch.zeros(2), torch.ones(2), torch.ones(2))
    new = strategy.aggregate_buffer(4, w, result, starts, torch.tensor([0, 3]))
    # Δ = starts − local = [1, 1] and [−1, −1], scaled by 1/√1 and 1/√4; mean over K = 2; w − 0.5 × mean
    expected = w - 0.5 * (torch.tensor([1.0, 1.0]) + 0.5 * torch.tensor([-1.0, -1.0])) / 2
    torch.testing.assert_close(new, expected)
    plain = FedBuff(buffer_size=2, server_lr=0.5, staleness_scaling="none")
    torch.testing.assert_close(plain.aggregate_buffer(4, w, result, starts, torch.tensor([0, 3])), w)


def test_fedbuff_with_the_cohort_as_buffer_and_no_staleness_is_fedavg() -> None:
    """K = C = m and clients that all take the same time: every update arrives fresh, all together, and the server
    steps once per cohort from FedAvg's cohorts (uniform weights)."""
    buff = run(parse_config({**BASE, "algorithm": {"name": "fedbuff", "concurrency": 4, "buffer_size": 4}}))
    avg = run(parse_config({**BASE, "algorithm": {"name": "fedavg", "weighting": "uniform"}}))
    torch.testing.assert_close(buff.params, avg.params, atol=1e-6, rtol=1e-5)
    for a, b in zip(buff.history, avg.history, strict=True):
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
        assert a["staleness"] == 0.0 and a["participants"] == 4
