"""Unbiased aggregation: q = α/π makes p = π ⊙~ q equal α; every active client trains."""

from __future__ import annotations

import numpy as np
import torch

from fedhet.availability.markov import Markov
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.methods.cafed.availability_aware import biased_importance, target_importance, unbiased_weights
from fedhet.methods.cafed.unbiased import Unbiased
from helpers.tiny import linear_model, make_context, tiny_data


def test_unbiased_weights_give_p_equal_alpha() -> None:
    alpha = target_importance(np.array([2, 6, 12]))
    np.testing.assert_allclose(alpha, [0.1, 0.3, 0.6])
    np.testing.assert_allclose(target_importance(np.array([2, 6, 12]), "uniform"), [1 / 3] * 3)
    pi = np.array([0.9, 0.5, 0.1])
    q = unbiased_weights(alpha, pi)
    np.testing.assert_allclose(q, [0.1 / 0.9, 0.6, 6.0])
    np.testing.assert_allclose(biased_importance(pi, q), alpha)
    np.testing.assert_allclose(biased_importance(pi, np.zeros(3)), 0.0)


def test_empirical_importance_matches_alpha_on_a_chain() -> None:
    engine = Engine(linear_model(), tiny_data([2, 6, 12]))
    strategy = Unbiased(oracle={"name": "markov", "pi": [0.9, 0.5, 0.25], "lam": 0.3})
    strategy.setup(make_context(engine))
    process = Markov(pi=[0.9, 0.5, 0.25], lam=0.3)
    process.setup(3, seed=4)
    for t in range(2500):
        mask = process.available(t)
        chosen = strategy.select(t, mask)
        np.testing.assert_array_equal(chosen.numpy(), np.flatnonzero(mask.numpy()))  # all active clients
    weights = strategy.participation_log()["weights"]
    np.testing.assert_allclose(weights.sum(0) / weights.sum(), [0.1, 0.3, 0.6], atol=0.05)
    np.testing.assert_allclose(weights.sum(1).mean(), 1.0, atol=0.06)  # E Σ_{k∈A_t} q_k = Σ α_k = 1


def test_bayesian_estimates_are_used_without_an_oracle() -> None:
    engine = Engine(linear_model(), tiny_data([3, 3]))
    strategy = Unbiased()
    strategy.setup(make_context(engine))
    strategy.select(0, torch.tensor([True, False]))
    # after one round with Beta(1, 1) priors: π̂ = (1 + 1)/(1 + 2) and (0 + 1)/(1 + 2); α = (1/2, 1/2)
    np.testing.assert_allclose(strategy._q, [0.5 / (2 / 3), 0.5 / (1 / 3)])


def test_server_momentum_is_heavy_ball_on_the_weighted_update() -> None:
    engine = Engine(linear_model(), tiny_data([4, 4]))
    strategy = Unbiased(
        oracle={"name": "markov", "pi": [0.5, 0.5], "lam": 0.0},
        server_optimizer={"name": "momentum", "beta": 0.5},
        server_lr=0.1,
    )
    strategy.setup(make_context(engine))
    w = torch.zeros(engine.model.size)
    clients = strategy.select(0, torch.tensor([True, True]))  # q = (1/2)/(1/2) = 1 each
    local = torch.stack([w + 1.0, w + 3.0])  # Σ q_k (w − w_k) = −4: v = −4, w ← w − 0.1 v = 0.4
    w1 = strategy.aggregate(0, w, LocalResult(clients, local, torch.zeros(2), torch.ones(2), torch.ones(2)))
    torch.testing.assert_close(w1, torch.full_like(w, 0.4))
    strategy.select(1, torch.tensor([True, True]))
    local = torch.stack([w1 + 1.0, w1 + 1.0])  # g = −2: v = 0.5·(−4) − 2 = −4, w ← 0.4 + 0.4 = 0.8
    saved = strategy.state_dict()
    w2 = strategy.aggregate(1, w1, LocalResult(clients, local, torch.zeros(2), torch.ones(2), torch.ones(2)))
    torch.testing.assert_close(w2, torch.full_like(w, 0.8))
    strategy.load_state_dict(saved)  # the velocity is part of the state
    again = strategy.aggregate(1, w1, LocalResult(clients, local, torch.zeros(2), torch.ones(2), torch.ones(2)))
    torch.testing.assert_close(again, w2)
