"""MaxFL (Algorithm 1): weights q_k, the update sign and the adaptive server step, by hand."""

from __future__ import annotations

import math

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.methods.maxfl.strategy import MaxFL, maxfl_direction, maxfl_weights
from fedhet.requirements import ClientRequirements, Requirements, RequirementsConfig
from helpers.tiny import linear_model, make_context, tiny_data


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_weights_bell_peak_symmetry_and_sigmoid_switch() -> None:
    rho = torch.zeros(5)
    gaps = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    q = maxfl_weights(gaps, rho)
    assert float(q[2]) == 0.25  # maximum at F_k = ρ_k
    torch.testing.assert_close(q[0], q[4])
    torch.testing.assert_close(q[1], torch.tensor(sig(1) * (1 - sig(1))))
    assert abs(float(q[3]) - 0.1966) < 1e-4  # the note's table
    plain = maxfl_weights(gaps, rho, "sigmoid")
    torch.testing.assert_close(plain[3], torch.tensor(sig(1.0)))
    assert float(plain[4]) > float(plain[0])  # plain σ rewards large losses


def test_server_step_by_hand() -> None:
    w = torch.tensor([1.0, 1.0])
    updates = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # Δ_k = w − w_k
    q = torch.tensor([0.2, 0.05])
    new = w - 0.5 * maxfl_direction(updates, q, eps=0.25)
    # η_g / (Σq + ε) = 0.5 / 0.5 = 1; Σ q Δ = [0.2, 0.1]
    torch.testing.assert_close(new, torch.tensor([0.8, 0.9]))
    # ε → 0: a q-weighted average of the local models with server_lr 1
    local = w - updates
    avg = w - maxfl_direction(updates, q, eps=1e-12)
    torch.testing.assert_close(avg, (q[0] * local[0] + q[1] * local[1]) / q.sum())


def test_update_sign_descends_the_local_loss() -> None:
    data = tiny_data([8, 8], seed=2)
    engine = Engine(linear_model(), data)
    req = given_requirements(engine, torch.zeros(2))  # ρ = 0: every loss is above it
    strategy = MaxFL(eps=1e-6)
    strategy.use_requirements(req)
    strategy.setup(make_context(engine, steps=5, lr=0.2, batch=8, m=2))
    w = engine.initial_params()
    clients = torch.tensor([0, 1])
    plan = strategy.configure(0, clients, w)
    losses = engine.losses_at(w, clients)
    torch.testing.assert_close(strategy._q, maxfl_weights(losses, torch.zeros(2)))  # every client is in the cohort
    new = strategy.aggregate(0, w, engine.train(w, plan, 0))
    assert float(engine.losses_at(new, clients).mean()) < float(losses.mean())
    assert strategy.round_metrics()["maxfl_q_sum"] > 0


def test_inflated_reported_losses_shrink_the_weight() -> None:
    from fedhet.attacks.base import MaliciousClients

    data = tiny_data([8, 8, 8, 8], seed=1)
    engine = Engine(linear_model(), data)
    req = given_requirements(engine, torch.full((4,), 0.7))
    attack = MaliciousClients(fraction=0.5, loss_bias=10.0)
    attack.setup(4, seed=0)
    ctx = make_context(engine, m=4)
    ctx.attack = attack
    strategy = MaxFL()
    strategy.use_requirements(req)
    strategy.setup(ctx)
    q = strategy.client_weights(0, torch.arange(4), engine.initial_params())
    assert float(q[attack.malicious].max()) < 1e-3 < float(q[~attack.malicious].min())


def test_fedavg_and_maxfl_aggregate_results_the_same_way_for_equal_q() -> None:
    engine = Engine(linear_model(), tiny_data([3, 3]))
    strategy = MaxFL(eps=1e-12)
    strategy.setup(make_context(engine))
    strategy._q = torch.tensor([0.1, 0.1])  # q_k by client id
    p = engine.model.size
    w = torch.zeros(p)
    result = LocalResult(
        torch.tensor([0, 1]),
        torch.stack([torch.ones(p), 3 * torch.ones(p)]),
        torch.zeros(2),
        torch.tensor([1, 1]),
        torch.tensor([0.1, 0.1]),
    )
    torch.testing.assert_close(strategy.aggregate(0, w, result), torch.full((p,), 2.0))


def test_byzantine_clients_are_drawn_among_the_clients_that_train() -> None:
    from fedhet.attacks.base import MaliciousClients

    seen = torch.tensor([True, False, True, True, False, True, False, True])  # 5 seen, 3 unseen
    for seed in range(5):
        attack = MaliciousClients(fraction=0.4)
        attack.setup(8, seed, eligible=seen)
        assert int(attack.malicious.sum()) == 2  # round(0.4 · 5 seen clients)
        assert not bool((attack.malicious & ~seen).any())
    everyone = MaliciousClients(fraction=0.4)
    everyone.setup(8, 3)
    same = MaliciousClients(fraction=0.4)
    same.setup(8, 3, eligible=torch.ones(8, dtype=torch.bool))
    assert torch.equal(everyone.malicious, same.malicious)  # no mask: the draw is unchanged


def given_requirements(engine: Engine, rho: torch.Tensor) -> ClientRequirements:
    """The run's requirements with ρ set to `rho` (no solo training)."""
    return ClientRequirements(engine, RequirementsConfig(), Requirements(rho, None, None))
