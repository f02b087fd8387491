"""AFL (Mohri et al. 2019) as run by FedMGDA+: simplex projection, descent on w, projected ascent on λ."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize

from fedhet.attacks.base import MaliciousClients
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.afl import AFL, project_simplex
from fedhet.strategies.base import LocalSettings, ServerContext
from helpers.tiny import linear_model, tiny_data


def test_projection_by_hand_and_against_scipy() -> None:
    torch.testing.assert_close(project_simplex(torch.tensor([0.5, 0.5])), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(project_simplex(torch.tensor([1.0, 1.0])), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(project_simplex(torch.tensor([2.0, 0.0])), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(project_simplex(torch.tensor([0.6, 0.2, 0.5])), torch.tensor([0.5, 0.1, 0.4]))
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(size=6) * 2
        ref = minimize(
            lambda x, v=v: np.sum((x - v) ** 2),
            np.full(6, 1 / 6),
            bounds=[(0, None)] * 6,
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
            method="SLSQP",
            options={"ftol": 1e-14},
        ).x
        np.testing.assert_allclose(project_simplex(torch.tensor(v)).numpy(), ref, atol=1e-6)


def context(engine: Engine, m: int, attack: MaliciousClients | None = None, bad: list[bool] | None = None):
    ctx = ServerContext(engine, LocalSettings(2, 0.1, 4), seed=0, clients_per_round=m)
    if attack is not None and bad is not None:
        attack.setup(engine.data.num_clients, 0)
        attack._malicious = torch.tensor(bad)
        ctx.attack = attack
    return ctx


def test_full_participation_step_by_hand() -> None:
    """K = m = 2: w ← w − γ_w Σ λ_k Δ_k with λ = (½, ½); λ ← Proj(λ + γ_λ F)."""
    engine = Engine(linear_model(), tiny_data([4, 8], seed=1))
    strategy = AFL(server_lr=0.1, lambda_lr=0.5)
    strategy.setup(context(engine, 2))
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    strategy.configure(0, clients, w)
    losses = engine.losses_at(w, clients).double()
    updates = torch.stack([torch.ones(len(w)), -3 * torch.ones(len(w))])
    result = LocalResult(clients, w - updates, torch.zeros(2), torch.full((2,), 2), torch.full((2,), 0.1))
    new = strategy.aggregate(0, w, result)
    torch.testing.assert_close(new, w - 0.1 * (0.5 * updates[0] + 0.5 * updates[1]))
    expected = project_simplex(torch.tensor([0.5, 0.5], dtype=torch.float64) + 0.5 * losses)
    torch.testing.assert_close(strategy.mixture, expected)
    assert strategy.round_metrics()["afl_lambda_max"] == float(expected.max())


def test_partial_participation_uses_unbiased_cohort_estimates() -> None:
    engine = Engine(linear_model(), tiny_data([4, 4, 4, 4], seed=2))
    strategy = AFL(server_lr=1.0, lambda_lr=0.01)
    strategy.setup(context(engine, 2))
    w = torch.zeros(engine.model.size)
    clients = torch.tensor([1, 3])
    strategy.configure(0, clients, w)
    losses = engine.losses_at(w, clients).double()
    updates = torch.ones(2, len(w))
    result = LocalResult(clients, w - updates, torch.zeros(2), torch.full((2,), 2), torch.full((2,), 0.1))
    new = strategy.aggregate(0, w, result)
    torch.testing.assert_close(new, -torch.ones(len(w)))  # (K/m) Σ λ_k Δ_k = 2 · (¼ + ¼) · 1
    step = torch.zeros(4, dtype=torch.float64)
    step[clients] = 2 * 0.01 * losses
    torch.testing.assert_close(strategy.mixture, project_simplex(torch.full((4,), 0.25, dtype=torch.float64) + step))


def test_bias_attack_pulls_the_mixture_to_the_attacker() -> None:
    data = tiny_data([6, 6, 6], seed=4)
    engine = Engine(linear_model(), data)
    clients = torch.tensor([0, 1, 2])
    honest, attacked = AFL(lambda_lr=0.5), AFL(lambda_lr=0.5)
    honest.setup(context(engine, 3))
    attacked.setup(context(engine, 3, MaliciousClients(loss_bias=1.0), [False, False, True]))
    for strategy in (honest, attacked):
        w = engine.initial_params()
        for t in range(5):
            plan = strategy.configure(t, clients, w)
            w = strategy.aggregate(t, w, engine.train(w, plan, t))
    assert float(attacked.mixture[2]) == 1.0  # all the weight on the attacker
    assert float(honest.mixture.max()) < 0.9


def test_local_losses_and_state_round_trip() -> None:
    engine = Engine(linear_model(), tiny_data([4, 8], seed=1))
    strategy = AFL(lambda_lr=1.0, loss_at="local")
    strategy.setup(context(engine, 2))
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    result = engine.train(w, strategy.configure(0, clients, w), 0)
    strategy.aggregate(0, w, result)
    expected = project_simplex(torch.tensor([0.5, 0.5], dtype=torch.float64) + result.train_loss.double())
    torch.testing.assert_close(strategy.mixture, expected)
    copy = AFL(lambda_lr=1.0, loss_at="local")
    copy.setup(context(engine, 2))
    copy.load_state_dict(strategy.state_dict())
    torch.testing.assert_close(copy.mixture, strategy.mixture)


def test_reports_the_average_of_its_iterates() -> None:
    """Stochastic-AFL's output w̄_T = (1/T) Σ_{t=1..T} w_t; training continues from the last iterate."""
    engine = Engine(linear_model(), tiny_data([4, 8], seed=1))
    clients = torch.tensor([0, 1])
    averaged, last = AFL(lambda_lr=0.2), AFL(lambda_lr=0.2, output="last")
    for strategy in (averaged, last):
        strategy.setup(context(engine, 2))
    w = engine.initial_params()
    assert torch.equal(averaged.evaluation_params(w), w)  # before any round: the model itself
    iterates = []
    for t in range(3):
        plan = averaged.configure(t, clients, w)
        result = engine.train(w, plan, t)
        last.configure(t, clients, w)
        w_last = last.aggregate(t, w, result)
        w = averaged.aggregate(t, w, result)
        assert torch.equal(w, w_last)  # the output switch does not change training
        iterates.append(w)
    torch.testing.assert_close(averaged.evaluation_params(w), torch.stack(iterates).mean(0))
    assert torch.equal(last.evaluation_params(w), w)
    copy = AFL(lambda_lr=0.2)
    copy.setup(context(engine, 2))
    copy.load_state_dict(averaged.state_dict())
    torch.testing.assert_close(copy.evaluation_params(w), averaged.evaluation_params(w))


def test_average_with_the_initial_model() -> None:
    """``average_initial``: (w⁰ + w¹ + … + w^T)/(T + 1) (FLGo's AFL) instead of the default (w¹ + … + w^T)/T;
    training is the same."""
    engine = Engine(linear_model(), tiny_data([4, 8], seed=1))
    clients = torch.tensor([0, 1])
    default, initial = AFL(lambda_lr=0.2), AFL(lambda_lr=0.2, average_initial=True)
    for strategy in (default, initial):
        strategy.setup(context(engine, 2))
    w0 = w = engine.initial_params()
    iterates = []
    for t in range(3):
        result = engine.train(w, default.configure(t, clients, w), t)
        initial.configure(t, clients, w)
        w_initial = initial.aggregate(t, w, result)
        w = default.aggregate(t, w, result)
        assert torch.equal(w, w_initial)
        iterates.append(w)
    stacked = torch.stack(iterates)
    torch.testing.assert_close(default.evaluation_params(w), stacked.mean(0))
    torch.testing.assert_close(initial.evaluation_params(w), (w0 + stacked.sum(0)) / 4)
    resumed = AFL(lambda_lr=0.2, average_initial=True)
    resumed.setup(context(engine, 2))
    resumed.load_state_dict(initial.state_dict())
    result = engine.train(w, resumed.configure(3, clients, w), 3)
    initial.configure(3, clients, w)
    torch.testing.assert_close(resumed.aggregate(3, w, result), initial.aggregate(3, w, result))
    torch.testing.assert_close(resumed.evaluation_params(w), initial.evaluation_params(w))


def test_run_reports_the_averaged_model() -> None:
    base = {
        "dataset": "digits",
        "partition": {"name": "shards", "shards_per_client": 2},
        "model": "logistic",
        "num_clients": 4,
        "clients_per_round": 4,
        "rounds": 3,
        "local": {"steps": 2, "lr": 0.05, "batch_size": 10},
    }
    averaged = run(parse_config({**base, "algorithm": {"name": "afl", "output": "average"}}))
    last = run(parse_config({**base, "algorithm": {"name": "afl", "output": "last"}}))
    assert torch.equal(averaged.params, last.params)  # the same training
    assert averaged.final["test_loss"] != last.final["test_loss"]  # a different reported model
