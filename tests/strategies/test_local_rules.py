"""Per-FedAvg and pFedMe local rules against a direct autograd computation, and across backends."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.functional import hvp

from fedhet.engine.engine import Engine
from fedhet.engine.objective import WeightDecay
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.strategies.perfedavg import PerFedAvgRule
from fedhet.strategies.pfedme import PFedMeRule
from helpers.tiny import linear_model, tiny_data


def _full_batch_grad(engine: Engine, w: torch.Tensor) -> torch.Tensor:
    """∇F_0(w) over client 0's whole training set (every mini-batch of size n is the full set)."""
    data = engine.data.train
    x, y = data.x[: int(data.offsets[1])], data.y[: int(data.offsets[1])]
    w = w.detach().requires_grad_(True)
    loss = engine.model.batch_loss(w, x, y, torch.ones(len(y)))
    (g,) = torch.autograd.grad(loss, w)
    return g


def _one_step(engine: Engine, rule: PerFedAvgRule | PFedMeRule, lr: float, n: int) -> torch.Tensor:
    plan = LocalPlan.uniform(torch.tensor([0]), 1, lr, n, rule=rule)
    return engine.train(engine.initial_params(), plan, 0).params[0]


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_perfedavg_first_order_step(backend: str) -> None:
    engine = Engine(linear_model(), tiny_data([6]), backend=backend)  # type: ignore[arg-type]
    w0, alpha, beta = engine.initial_params(), 0.7, 0.3
    expected = w0 - beta * _full_batch_grad(engine, w0 - alpha * _full_batch_grad(engine, w0))
    got = _one_step(engine, PerFedAvgRule(alpha=alpha), beta, 6)
    assert float((got - w0).abs().max()) > 1e-3
    torch.testing.assert_close(got, expected)


def test_perfedavg_hessian_free_step_matches_the_exact_hessian() -> None:
    engine = Engine(linear_model(), tiny_data([6]), backend="sequential")
    w0, alpha, beta = engine.initial_params(), 0.7, 0.3
    v = _full_batch_grad(engine, w0 - alpha * _full_batch_grad(engine, w0))
    data = engine.data.train
    x, y = data.x[:6], data.y[:6]
    _, hv = hvp(lambda w: engine.model.batch_loss(w, x, y, torch.ones(6)), w0, v)
    expected = w0 - beta * (v - alpha * hv)
    got = _one_step(engine, PerFedAvgRule(alpha=alpha, hessian_free=True, delta=1e-3), beta, 6)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    first_order = _one_step(engine, PerFedAvgRule(alpha=alpha), beta, 6)
    assert float((got - first_order).abs().max()) > 1e-4  # the Hessian term is not negligible here


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_pfedme_step(backend: str) -> None:
    engine = Engine(linear_model(), tiny_data([6]), backend=backend)  # type: ignore[arg-type]
    w0, lam, k, inner, eta = engine.initial_params(), 2.0, 3, 0.2, 0.1
    theta = w0.clone()
    for _ in range(k):
        theta = theta - inner * (_full_batch_grad(engine, theta) + lam * (theta - w0))
    expected = w0 - eta * lam * (w0 - theta)
    got = _one_step(engine, PFedMeRule(lam=lam, inner_steps=k, inner_lr=inner), eta, 6)
    assert float((got - w0).abs().max()) > 1e-3
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "rule", [PerFedAvgRule(alpha=0.1, hessian_free=True), PFedMeRule(lam=5.0, inner_steps=2, inner_lr=0.05)]
)
def test_backends_agree_with_minibatches_and_unequal_steps(rule: PerFedAvgRule | PFedMeRule) -> None:
    data = tiny_data([9, 5, 12])
    plan = LocalPlan(
        torch.tensor([0, 1, 2]), torch.tensor([3, 0, 5]), torch.full((3,), 0.2), 4, (WeightDecay(lam=0.01),), rule=rule
    )
    out = [
        Engine(linear_model(), data, backend=b).train(linear_model().initial_params(), plan, 2)
        for b in ("sequential", "vectorised")
    ]  # type: ignore[arg-type]
    torch.testing.assert_close(out[0].params, out[1].params)
    torch.testing.assert_close(out[0].train_loss, out[1].train_loss, equal_nan=True)
    assert torch.equal(out[0].params[1], linear_model().initial_params())  # zero steps: the received model


def test_the_dense_backend_refuses_a_rule_in_one_line() -> None:
    engine = Engine(linear_model(), tiny_data([4]), backend="dense")
    plan = LocalPlan.uniform(torch.tensor([0]), 1, 0.1, 4, rule=PFedMeRule(lam=1.0, inner_steps=1, inner_lr=0.1))
    with pytest.raises(ConfigError, match="backend 'dense' cannot run this local objective"):
        engine.train(engine.initial_params(), plan, 0)
