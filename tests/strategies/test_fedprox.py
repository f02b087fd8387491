"""FedProx: the proximal gradient is non-zero and equals μ(w − w_global)."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fedprox import FedProx
from helpers.tiny import linear_model, make_context, tiny_data


def test_plan_carries_mu() -> None:
    engine = Engine(linear_model(), tiny_data([4, 4]))
    strategy = FedProx(mu=0.3)
    strategy.setup(make_context(engine))
    plan = strategy.configure(0, torch.tensor([0, 1]), engine.initial_params())
    assert plan.terms == (Proximal(mu=0.3),)


def test_proximal_term_changes_training_by_mu_times_distance() -> None:
    """Two local steps, full batch: the second step of FedProx subtracts lr·μ(w₁ − w₀) more than FedAvg's."""
    data = tiny_data([4])
    model = linear_model()
    w0 = model.initial_params()
    engine = Engine(model, data, backend="sequential")
    lr, mu = 0.5, 0.8
    avg = engine.train(w0, LocalPlan.uniform(torch.tensor([0]), 1, lr, 4), 0).params[0]  # w₁ (same for both)
    two_avg = engine.train(w0, LocalPlan.uniform(torch.tensor([0]), 2, lr, 4), 0).params[0]
    two_prox = engine.train(w0, LocalPlan.uniform(torch.tensor([0]), 2, lr, 4, terms=(Proximal(mu=mu),)), 0).params[0]
    proximal_gradient = mu * (avg - w0)
    assert float(proximal_gradient.abs().max()) > 1e-3
    torch.testing.assert_close(two_avg - two_prox, lr * proximal_gradient)


def test_mu_zero_is_fedavg() -> None:
    data = tiny_data([5, 7, 6])
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    out = []
    for strategy in (FedAvg(), FedProx(mu=0.0)):
        strategy.setup(make_context(engine))
        clients = strategy.select(0, torch.ones(3, dtype=torch.bool))
        result = engine.train(w, strategy.configure(0, clients, w), 0)
        out.append(strategy.aggregate(0, w, result))
    torch.testing.assert_close(out[0], out[1])
