"""pFedMe: the plan carries the Moreau-envelope rule; the server step is (1 − β) w + β · mean of local models."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.strategies.pfedme import PFedMe, PFedMeRule
from helpers.tiny import linear_model, make_context, tiny_data


def test_server_step_mixes_with_beta() -> None:
    engine = Engine(linear_model(), tiny_data([8, 8]))
    strategy = PFedMe(lam=4.0, inner_steps=2, inner_lr=0.05, server_lr=0.5)
    strategy.setup(make_context(engine, steps=3, lr=0.1, batch=4, m=2))
    w = engine.initial_params()
    plan = strategy.configure(0, torch.tensor([0, 1]), w)
    assert plan.rule == PFedMeRule(lam=4.0, inner_steps=2, inner_lr=0.05)
    result = engine.train(w, plan, 0)
    assert float((result.params - w).abs().max()) > 1e-4
    torch.testing.assert_close(strategy.aggregate(0, w, result), 0.5 * w + 0.5 * result.params.mean(0))


def test_the_personalised_model_solves_the_personal_problem_from_the_global_model() -> None:
    """θ̂(w): K steps of θ ← θ − η_in (∇f(θ) + λ(θ − w)) from θ = w (eq. 7), on a full batch here."""
    from helpers.personal import gradient, setup

    strategy = PFedMe(lam=2.0, inner_steps=3, inner_lr=0.05)
    engine = setup(strategy, "vectorised")
    w = engine.model.initial_params() + 0.01
    scores = engine.personal_scores(w, strategy.personalization(torch.tensor([0, 1])), 2)
    thetas = []
    for k in range(2):
        theta = w.clone()
        for _ in range(3):
            theta = theta - 0.05 * (gradient(engine.model, theta, k) + 2.0 * (theta - w))
        thetas.append(theta)
    expected = engine.own_scores(torch.stack(thetas), torch.tensor([0, 1]))
    torch.testing.assert_close(scores.loss, expected.loss, atol=1e-6, rtol=1e-5)
