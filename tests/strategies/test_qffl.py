"""q-FFL / q-FedAvg (Li et al. 2020, Algorithm 3): the server step by hand, q = 0 ↔ FedAvg, reported losses."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.attacks.base import MaliciousClients
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import LocalSettings, ServerContext
from fedhet.strategies.qffl import QFFL, qffl_objective, qffl_step
from helpers.tiny import linear_model, tiny_data


def test_step_by_hand() -> None:
    """F = (1, 2), q = 1, L = 1, Δw = e1, e2: Δ = (e1, 2 e2), h = (1 + 1, 1 + 2) → direction (1, 2) / 5."""
    w = torch.zeros(2)
    updates = torch.eye(2)
    direction = qffl_step(w, updates, torch.tensor([1.0, 2.0]), q=1.0, lipschitz=1.0)
    torch.testing.assert_close(direction, torch.tensor([0.2, 0.4]))
    # q = 2, L = 2: Δw = 2 e_k, Δ = (2 e1, 8 e2), h = (2·1·4 + 2, 2·2·4 + 8) = (10, 24)
    direction = qffl_step(w, updates, torch.tensor([1.0, 2.0]), q=2.0, lipschitz=2.0)
    torch.testing.assert_close(direction, torch.tensor([2 / 34, 8 / 34]))


@pytest.mark.parametrize("lipschitz", [0.1, 1.0, 10.0])
def test_q_zero_is_local_model_averaging(lipschitz: float) -> None:
    torch.manual_seed(0)
    w, updates = torch.randn(5), torch.randn(3, 5)
    direction = qffl_step(w, updates, torch.tensor([0.3, 2.0, 7.0]), q=0.0, lipschitz=lipschitz)
    torch.testing.assert_close(w - direction, (w - updates).mean(0))


def test_large_q_follows_the_worst_client() -> None:
    w, updates = torch.zeros(2), torch.eye(2)
    direction = qffl_step(w, updates, torch.tensor([0.5, 1.0]), q=10.0, lipschitz=1.0)
    assert float(direction[1]) > 100 * float(direction[0])


def test_objective() -> None:
    assert qffl_objective(torch.tensor([1.0, 2.0]), q=1.0) == pytest.approx((0.5 * 1 + 0.5 * 4) / 2)
    assert qffl_objective(torch.tensor([1.0, 3.0]), q=0.0, weights=torch.tensor([0.25, 0.75])) == 2.5


def context(engine: Engine, attack: MaliciousClients | None = None, batch: int = 4) -> ServerContext:
    ctx = ServerContext(engine, LocalSettings(3, 0.1, batch), seed=0, clients_per_round=2)
    if attack is not None:
        attack.setup(engine.data.num_clients, 0)
        attack._malicious = torch.tensor([False, True])  # client 1 is the attacker
        ctx.attack = attack
    return ctx


def test_strategy_uses_reported_losses_and_the_bias_attack_reaches_them() -> None:
    data = tiny_data([6, 10], seed=3)
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    honest = engine.losses_at(w, clients)
    strategy = QFFL(q=2.0, lipschitz=5.0)
    strategy.setup(context(engine))
    plan = strategy.configure(0, clients, w)
    torch.testing.assert_close(strategy._losses, honest)
    result = engine.train(w, plan, 0)
    expected = w - qffl_step(w, result.updates(w), honest, 2.0, 5.0)
    torch.testing.assert_close(strategy.aggregate(0, w, result), expected)

    attacked = QFFL(q=2.0, lipschitz=5.0)
    attacked.setup(context(engine, MaliciousClients(loss_bias=3.0)))
    attacked.configure(0, clients, w)
    torch.testing.assert_close(attacked._losses, honest + torch.tensor([0.0, 3.0]))


def test_default_lipschitz_is_the_inverse_local_learning_rate() -> None:
    """Li et al.'s L = 1/η_l when none is given (η_l = 0.1 here: L = 10); an explicit L is used as given."""
    data = tiny_data([6, 10], seed=3)
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    steps = {}
    for lipschitz in (None, 1.0, 10.0):
        strategy = QFFL(q=1.0, lipschitz=lipschitz)
        strategy.setup(context(engine))  # local lr 0.1
        result = engine.train(w, strategy.configure(0, clients, w), 0)
        steps[lipschitz] = w - strategy.aggregate(0, w, result)
        expected_l = 10.0 if lipschitz is None else lipschitz
        assert strategy.lipschitz_constant == pytest.approx(expected_l)
        losses = engine.losses_at(w, clients)
        torch.testing.assert_close(steps[lipschitz], qffl_step(w, result.updates(w), losses, 1.0, expected_l))
    torch.testing.assert_close(steps[None], steps[10.0])
    assert float((steps[None] - steps[1.0]).abs().max()) > 1e-4  # with q > 0 the choice of L moves the step
    fast = QFFL(q=1.0)
    fast.setup(ServerContext(engine, LocalSettings(3, 0.5, 4), seed=0, clients_per_round=2))
    assert fast.lipschitz_constant == pytest.approx(2.0)


def test_batch_sum_losses_and_bias_on_the_total() -> None:
    data = tiny_data([6, 10], seed=3)
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    mean = engine.losses_at(w, clients).double()
    batches = torch.tensor([math.ceil(6 / 4), math.ceil(10 / 4)], dtype=torch.float64)
    strategy = QFFL(loss="batch_sum")
    strategy.setup(context(engine, MaliciousClients(loss_bias=1000.0), batch=4))
    strategy.configure(0, clients, w)
    torch.testing.assert_close(strategy._losses, mean * batches + torch.tensor([0.0, 1000.0], dtype=torch.float64))
    assert strategy.round_metrics()["qffl_loss_max"] > 1000


def test_server_lr_scales_the_step() -> None:
    data = tiny_data([4, 4], seed=1)
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    result = LocalResult(torch.tensor([0, 1]), w - torch.ones(2, len(w)), torch.zeros(2), torch.ones(2), torch.ones(2))
    steps = []
    for lr in (1.0, 0.5):
        s = QFFL(q=0.0, server_lr=lr)
        s.setup(context(engine))
        s.configure(0, result.clients, w)
        steps.append(w - s.aggregate(0, w, result))
    torch.testing.assert_close(steps[0], torch.ones(len(w)))
    torch.testing.assert_close(steps[1], 0.5 * torch.ones(len(w)))
