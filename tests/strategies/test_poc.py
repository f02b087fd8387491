"""Power-of-Choice: the m candidates with the highest local loss (Cho, Wang, Joshi 2020)."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.errors import ConfigError
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


def test_d_equal_to_m_samples_the_cohort_by_size_and_d_below_m_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(linear_model(), tiny_data([1, 1, 1, 1, 1, 95], seed=4))
    strategy = PowerOfChoice(d=2)
    strategy.setup(make_context(engine, m=2))
    monkeypatch.setattr(engine, "losses_at", lambda *a: pytest.fail("d = m needs no loss"))
    chosen = [strategy.select(t, torch.ones(6, dtype=torch.bool)).tolist() for t in range(20)]
    assert all(len(c) == 2 and 5 in c for c in chosen)  # ∝ data size: client 5 holds 95% of the samples
    available = torch.tensor([False, True, False, False, False, True])
    assert strategy.select(0, available).tolist() == [1, 5]  # no more available than m: all of them
    with pytest.raises(ConfigError, match=r"algorithm.d \(1\) is less than clients_per_round \(2\)"):
        PowerOfChoice(d=1).setup(make_context(engine, m=2))
