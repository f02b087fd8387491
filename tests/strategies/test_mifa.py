"""MIFA: the average of every client's latest update, offline clients' too (Gu et al. 2021)."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.mifa import MIFA
from helpers.tiny import linear_model, make_context, tiny_data


def _result(clients: list[int], models: torch.Tensor) -> LocalResult:
    m = len(clients)
    return LocalResult(torch.tensor(clients), models, torch.zeros(m), torch.ones(m), torch.ones(m))


def test_an_offline_client_keeps_contributing_its_last_update() -> None:
    engine = Engine(linear_model(dim=1, classes=2), tiny_data([3, 3, 3], dim=1))  # P = 4, K = 3
    strategy = MIFA()
    strategy.setup(make_context(engine, m=2))
    w = torch.zeros(4)
    w1 = strategy.aggregate(0, w, _result([0, 1], torch.stack([torch.full((4,), -3.0), torch.full((4,), -6.0)])))
    torch.testing.assert_close(w1, torch.full((4,), -3.0))  # w − (Δ0 + Δ1 + 0) / 3 with Δ = w − w_k = 3 and 6
    w2 = strategy.aggregate(1, w1, _result([2], torch.full((1, 4), 0.0)))  # client 2 alone: Δ2 = −3 − 0
    torch.testing.assert_close(w2, w1 - (3 + 6 - 3) / 3)  # clients 0 and 1, offline, still count
    again = MIFA()
    again.setup(make_context(engine, m=2))
    again.load_state_dict(strategy.state_dict())
    torch.testing.assert_close(again.aggregate(2, w2, _result([1], w2.unsqueeze(0))), w2 - (3 + 0 - 3) / 3)
    warm = MIFA(warm_start=True)
    warm.setup(make_context(engine, m=2))
    first = warm.aggregate(0, w, _result([0, 1], torch.stack([torch.full((4,), -3.0), torch.full((4,), -6.0)])))
    torch.testing.assert_close(first, torch.full((4,), -4.5))  # over the two clients seen so far
