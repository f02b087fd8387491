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
