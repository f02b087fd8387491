"""MW-Fed adaptation: multiplicative weights and scaled local steps, by hand."""

from __future__ import annotations

import math

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.methods.maxfl.mwfed import MWFed, multiplicative_update, scaled_steps
from fedhet.requirements import ClientRequirements, Requirements, RequirementsConfig
from helpers.tiny import linear_model, make_context, tiny_data


def test_multiplicative_update_and_steps() -> None:
    v = multiplicative_update(torch.tensor([1.0, 2.0]), torch.tensor([True, False]), 0.5)
    torch.testing.assert_close(v, torch.tensor([math.exp(0.5), 2.0]))
    assert scaled_steps(10, torch.tensor([1.0, 3.0]), 3.0).tolist() == [5, 15]
    assert scaled_steps(10, torch.tensor([1.0, 100.0]), 3.0).tolist() == [1, 20]


def test_round_weights_unmet_clients_more() -> None:
    data = tiny_data([6, 6])
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    losses = engine.losses_at(w, torch.tensor([0, 1]))
    req = given_requirements(engine, torch.stack([losses[0] + 1, losses[1] - 1]))  # 1 unmet
    strategy = MWFed(rate=0.5, server_lr=1.0)
    strategy.use_requirements(req)
    strategy.setup(make_context(engine, m=2))
    plan = strategy.configure(0, torch.tensor([0, 1]), w)
    assert plan.steps.tolist() == [5, 5]  # equal weights at the start
    p = engine.model.size
    local = torch.stack([torch.full((p,), 1.0), torch.full((p,), 3.0)])
    result = LocalResult(torch.tensor([0, 1]), local, torch.zeros(2), plan.steps, plan.lr)
    new = strategy.aggregate(0, torch.zeros(p), result)
    torch.testing.assert_close(new, torch.full((p,), 2.0))  # equal weights this round
    torch.testing.assert_close(strategy.state_dict()["weights"], torch.tensor([1.0, math.exp(0.5)]))
    plan = strategy.configure(1, torch.tensor([0, 1]), new)
    assert plan.steps[1] > plan.steps[0]


def given_requirements(engine: Engine, rho: torch.Tensor) -> ClientRequirements:
    """The run's requirements with ρ set to `rho` (no solo training)."""
    return ClientRequirements(engine, RequirementsConfig(), Requirements(rho, None, None))
