"""MIFA: the average of every client's latest update, offline clients' too (Gu et al. 2021)."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.engine.schedules import SCHEDULES
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


def test_remembered_updates_are_rescaled_by_the_decaying_local_rate() -> None:
    """Algorithm 1 keeps G_k = Δ_k / η_τ and steps along η_t · mean G: under schedules.local_lr an update made at
    η_0 = 0.1 counts as Δ_k · η_1 / η_0 = Δ_k / 2 in round 1, where η_1 = 0.05."""
    engine = Engine(linear_model(dim=1, classes=2), tiny_data([3, 3, 3], dim=1))  # P = 4, K = 3
    strategy = MIFA()
    ctx = make_context(engine, m=2, lr=0.1)
    ctx.local_schedule, ctx.rounds = SCHEDULES.build({"name": "exponential", "gamma": 0.5}), 3
    strategy.setup(ctx)
    w = torch.zeros(4)
    ctx.start_round(0)
    w1 = strategy.aggregate(0, w, _result([0, 1], torch.stack([torch.full((4,), -3.0), torch.full((4,), -6.0)])))
    torch.testing.assert_close(w1, torch.full((4,), -3.0))  # round 0: Δ0 = 3, Δ1 = 6 as made, (3 + 6) / 3
    ctx.start_round(1)
    w2 = strategy.aggregate(1, w1, _result([2], torch.full((1, 4), -4.0)))  # Δ2 = −3 − (−4) = 1, made at η_1
    torch.testing.assert_close(w2, w1 - (3 / 2 + 6 / 2 + 1) / 3)  # the stale Δ0, Δ1 halved with η
    again = MIFA()
    again.setup(ctx)
    again.load_state_dict(strategy.state_dict())
    ctx.start_round(2)  # η_2 = 0.025: Δ0, Δ1 at a quarter, Δ2 at a half, client 1's new Δ1 = 2 as made
    got = again.aggregate(2, w2, _result([1], (w2 - 2).unsqueeze(0)))
    torch.testing.assert_close(got, w2 - (3 / 4 + 2 + 1 / 2) / 3)
