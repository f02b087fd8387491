"""FedNova: ‖a_i‖₁ for SGD and proximal local solvers, the normalised server step, equal steps = FedAvg."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fednova import FedNova, fednova_direction, fednova_norms
from helpers.tiny import linear_model, make_context, tiny_data


def test_norms_sgd_and_proximal() -> None:
    torch.testing.assert_close(
        fednova_norms(torch.tensor([3, 0]), torch.tensor([0.1, 0.1]), 0.0),
        torch.tensor([3.0, 0.0], dtype=torch.float64),
    )
    # α = ημ = 0.5, τ = 2: a = ((1 − α), 1), ‖a‖₁ = 1.5 = (1 − 0.5²)/0.5
    assert float(fednova_norms(torch.tensor([2]), torch.tensor([0.5]), 1.0)[0]) == pytest.approx(1.5)


def test_proximal_norm_matches_the_local_recursion() -> None:
    """u ← (1 − ημ) u − η G with a constant G gives u_τ = −η G ‖a‖₁."""
    eta, mu, tau, g = 0.1, 2.0, 7, 3.0
    u = 0.0
    for _ in range(tau):
        u = (1 - eta * mu) * u - eta * g
    assert -u / (eta * g) == pytest.approx(float(fednova_norms(torch.tensor([tau]), torch.tensor([eta]), mu)[0]))


def test_server_step_by_hand() -> None:
    x = torch.zeros(1)
    updates = torch.tensor([[2.0], [3.0]])  # Δ_i = x − y_i, τ = (2, 1), η = 1
    p = torch.tensor([0.5, 0.5])
    norms = torch.tensor([2.0, 1.0], dtype=torch.float64)
    # d = (1, 3), Σ p d = 2, τ_eff = 1.5 → x − 3 (FedAvg would give x − 2.5)
    torch.testing.assert_close(x - fednova_direction(updates, p, torch.ones(2), norms), torch.tensor([-3.0]))
    # a client with no steps is left out, the others' weights re-normalised
    norms0 = torch.tensor([2.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(x - 0.5 * fednova_direction(updates, p, torch.ones(2), norms0), torch.tensor([-1.0]))


def test_equal_steps_reduce_to_fedavg() -> None:
    data = tiny_data([4, 6, 8], seed=5)
    engine = Engine(linear_model(), data)
    ctx = make_context(engine, steps=3, lr=0.2, batch=2, m=3)
    nova, avg = FedNova(), FedAvg()
    nova.setup(ctx)
    avg.setup(ctx)
    w = engine.initial_params()
    result = engine.train(w, nova.configure(0, torch.arange(3), w), 0)
    torch.testing.assert_close(nova.aggregate(0, w, result), avg.aggregate(0, w, result))


def test_unequal_steps_are_normalised() -> None:
    data = tiny_data([4, 4], seed=1)
    engine = Engine(linear_model(), data)
    nova = FedNova(weighting="uniform")
    nova.setup(make_context(engine, m=2))
    p = engine.model.size
    x = torch.zeros(p)
    y = torch.stack([torch.full((p,), -4.0), torch.full((p,), -2.0)])
    result = LocalResult(torch.tensor([0, 1]), y, torch.zeros(2), torch.tensor([4, 1]), torch.tensor([0.5, 0.5]))
    # Δ = x − y = (4, 2); d = Δ/(η τ) = (4/2, 2/0.5) = (2, 4); Σ p η τ = 0.5·(2 + 0.5) = 1.25 → x − 1.25·3
    torch.testing.assert_close(nova.aggregate(0, x, result), torch.full((p,), -3.75))  # FedAvg: −3


def test_epochs_give_steps_proportional_to_the_data() -> None:
    from fedhet.strategies.fednova import epoch_steps

    assert epoch_steps(torch.tensor([5, 40, 64, 1]), 8, 2.0).tolist() == [1, 10, 16, 1]  # round(2·n/8), at least 1
    data = tiny_data([4, 16], seed=1)
    engine = Engine(linear_model(), data)
    nova = FedNova(epochs=1.0)
    nova.setup(make_context(engine, steps=3, batch=4, m=2))
    assert nova.configure(0, torch.arange(2), engine.initial_params()).steps.tolist() == [1, 4]
    assert FedNova().model_copy().epochs == 0.0  # default: the run's local steps (FedNova = FedAvg then)
