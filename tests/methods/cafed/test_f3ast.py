"""F3AST (as in CA-Fed's experiments): top-K active clients by α²/π̃², weights α/π̃."""

from __future__ import annotations

import numpy as np
import torch

from fedhet.engine.engine import Engine
from fedhet.methods.cafed.f3ast import F3AST, top_k_active
from helpers.tiny import linear_model, make_context, tiny_data


def test_top_k_active_by_hand() -> None:
    scores = np.array([5.0, 9.0, 1.0, 7.0, 7.0])
    active = np.array([True, False, True, True, True])
    np.testing.assert_array_equal(top_k_active(scores, active, 1), [False, False, False, True, False])  # tie: id
    np.testing.assert_array_equal(top_k_active(scores, active, 3), [True, False, False, True, True])
    np.testing.assert_array_equal(top_k_active(scores, active, 10), active)


def test_f3ast_keeps_the_least_available_active_clients() -> None:
    engine = Engine(linear_model(), tiny_data([4] * 4))
    strategy = F3AST(oracle={"name": "markov", "pi": [0.9, 0.1, 0.5, 0.3], "lam": 0.0}, smoothing=0.1)
    strategy.setup(make_context(engine, m=2))  # K = clients_per_round = 2
    chosen = strategy.select(0, torch.tensor([True, True, True, False]))
    np.testing.assert_array_equal(chosen.numpy(), [1, 2])  # π̃ = 0.9·π + 0.1: (0.91, 0.19, 0.55, 0.27)
    np.testing.assert_allclose(strategy._q, [0.0, 0.25 / 0.19, 0.25 / 0.55, 0.0])
    assert strategy.round_metrics()["excluded"] == 1
