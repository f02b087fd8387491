"""Per-FedAvg: the plan carries the MAML rule; aggregation is FedAvg's over the MAML-trained models."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.perfedavg import PerFedAvg, PerFedAvgRule
from helpers.tiny import linear_model, make_context, tiny_data


def test_plan_carries_the_rule_and_the_round_averages_maml_models() -> None:
    engine = Engine(linear_model(), tiny_data([6, 10]))
    strategy = PerFedAvg(alpha=0.3, hessian_free=True, delta=1e-2)
    strategy.setup(make_context(engine, steps=2, lr=0.2, batch=4, m=2))
    w = engine.initial_params()
    plan = strategy.configure(0, torch.tensor([0, 1]), w)
    assert plan.rule == PerFedAvgRule(alpha=0.3, hessian_free=True, delta=1e-2)
    result = engine.train(w, plan, 0)
    sgd = engine.train(w, LocalPlan.uniform(plan.clients, 2, 0.2, 4), 0)
    assert float((result.params - sgd.params).abs().max()) > 1e-4  # the MAML step is not plain SGD
    torch.testing.assert_close(strategy.aggregate(0, w, result), result.params.mean(0))  # uniform (Algorithm 1)
    strategy.weighting = "samples"
    expected = w - (6 * (w - result.params[0]) + 10 * (w - result.params[1])) / 16
    torch.testing.assert_close(strategy.aggregate(0, w, result), expected)


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        STRATEGIES.build({"name": "perfedavg", "alpha": -1})


def test_the_personalised_model_is_one_step_of_size_alpha_from_the_global_model() -> None:
    from helpers.personal import BATCH, gradient, setup

    strategy = PerFedAvg(alpha=0.3)
    engine = setup(strategy, "sequential")
    w = engine.model.initial_params() + 0.01
    plan = strategy.personalization(torch.tensor([0, 1]))
    scores = engine.personal_scores(w, plan, 4)  # a batch larger than the clients' data: a full-batch step
    assert plan.batch_size == BATCH and plan.steps.tolist() == [1, 1]
    tuned = torch.stack([w - 0.3 * gradient(engine.model, w, k) for k in range(2)])
    expected = engine.own_scores(tuned, torch.tensor([0, 1]))
    torch.testing.assert_close(scores.loss, expected.loss)
    torch.testing.assert_close(scores.accuracy, expected.accuracy)
