"""Power-of-Choice: the m candidates with the highest local loss (Cho, Wang, Joshi 2020)."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.strategies.poc import PowerOfChoice, highest_losses
from helpers.tiny import linear_model, make_context, tiny_data


def test_the_highest_losses_win_and_ties_go_to_the_lower_id() -> None:
    candidates = torch.tensor([7, 2, 9, 4])
    assert highest_losses(candidates, torch.tensor([0.5, 2.0, 0.5, 1.0]), 2).tolist() == [2, 4]
    assert highest_losses(candidates, torch.tensor([0.5, 2.0, 0.5, 0.1]), 2).tolist() == [2, 7]


def test_selection_asks_the_candidates_for_their_loss_at_the_global_model() -> None:
    engine = Engine(linear_model(), tiny_data([5, 9, 3, 7, 6, 8], seed=4))
    strategy = PowerOfChoice(d=6)
    strategy.setup(make_context(engine, m=2))
    w = engine.initial_params() + 0.3
    strategy.ctx.params = w
    chosen = strategy.select(0, torch.ones(6, dtype=torch.bool))
    losses = engine.losses_at(w, torch.arange(6))
    assert chosen.tolist() == sorted(torch.argsort(losses, descending=True)[:2].tolist())  # d = all: the worst two
    few = PowerOfChoice(d=2)  # d ≤ m: uniform selection, as FedAvg's
    few.setup(make_context(engine, m=2))
    assert len(few.select(0, torch.ones(6, dtype=torch.bool))) == 2
