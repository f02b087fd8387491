"""AdaFed (as in CA-Fed's experiments): α/π weights normalised over the active clients."""

from __future__ import annotations

import numpy as np
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.methods.cafed.adafed import AdaFed, normalised_over
from helpers.tiny import linear_model, make_context, tiny_data


def test_normalised_over_active_by_hand() -> None:
    q = np.array([1.0, 3.0, 4.0])
    np.testing.assert_allclose(normalised_over(q, np.array([True, True, False])), [0.25, 0.75, 0.0])
    np.testing.assert_allclose(normalised_over(q, np.zeros(3, dtype=bool)), 0.0)


def test_adafed_is_weighted_model_averaging() -> None:
    engine = Engine(linear_model(), tiny_data([4, 4, 4]))
    strategy = AdaFed(oracle={"name": "markov", "pi": [0.8, 0.2, 0.5], "lam": 0.0})
    strategy.setup(make_context(engine))
    chosen = strategy.select(0, torch.tensor([True, True, False]))
    np.testing.assert_array_equal(chosen.numpy(), [0, 1])
    # α/π = (1/3)/0.8, (1/3)/0.2 → normalised (0.2, 0.8)
    np.testing.assert_allclose(strategy._q, [0.2, 0.8, 0.0])
    w = torch.zeros(engine.model.size)
    local = torch.stack([torch.full_like(w, 1.0), torch.full_like(w, 6.0)])
    new = strategy.aggregate(0, w, LocalResult(chosen, local, torch.zeros(2), torch.ones(2), torch.ones(2)))
    torch.testing.assert_close(new, torch.full_like(w, 0.2 * 1 + 0.8 * 6))  # server_lr 1: the weighted average
