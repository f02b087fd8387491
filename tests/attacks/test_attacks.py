"""Malicious clients: chosen attackers, inflated losses (bias and scaling attacks), corrupted updates, and
attackers that take part in every round."""

from __future__ import annotations

import pytest
import torch

from fedhet.attacks.base import ATTACKS, MaliciousClients, NoAttack
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.fedavg import FedAvg
from helpers.tiny import linear_model, make_context, tiny_data


def attack(k: int = 5, seed: int = 0, **fields: object) -> MaliciousClients:
    a = MaliciousClients(**fields)  # type: ignore[arg-type]
    a.setup(k, seed)
    return a


def test_attackers_chosen_by_fraction_or_by_id() -> None:
    a, b = attack(20, seed=3, fraction=0.25), attack(20, seed=3, fraction=0.25)
    assert int(a.malicious.sum()) == 5 and torch.equal(a.malicious, b.malicious)  # round(0.25 · 20), seeded
    chosen = attack(4, clients=[1, 3])
    assert chosen.malicious.tolist() == [False, True, False, True]
    with pytest.raises(ConfigError, match=r"client ids in 0\.\.3"):
        attack(4, clients=[4])
    honest = NoAttack()
    honest.setup(4, 0)
    assert not bool(honest.malicious.any())


def test_bias_then_scale_only_on_attackers() -> None:
    a = attack(4, clients=[2], loss_bias=3.0, loss_scale=2.0)
    losses = torch.tensor([1.0, 1.0, 0.5])
    torch.testing.assert_close(a.report_losses(torch.tensor([0, 1, 2]), losses), torch.tensor([1.0, 1.0, 7.0]))


def plan_for(clients: list[int], lr: float = 0.1, steps: int = 1, batch: int = 100) -> LocalPlan:
    return LocalPlan.uniform(torch.tensor(clients), steps, lr, batch)


def test_scaling_attack_scales_the_attackers_learning_rate() -> None:
    a = attack(4, clients=[1], loss_scale=10.0)
    plan = a.corrupt_plan(plan_for([0, 1, 3]), 0)
    torch.testing.assert_close(plan.lr, torch.tensor([0.1, 1.0, 0.1]))
    untouched = plan_for([0, 1, 3])
    assert attack(4, clients=[1], loss_scale=10.0, scale_training=False).corrupt_plan(untouched, 0) is untouched
    assert attack(4, clients=[1], loss_bias=5.0).corrupt_plan(untouched, 0) is untouched
    assert attack(4, clients=[2], loss_scale=10.0).corrupt_plan(untouched, 0) is untouched  # attacker not in cohort


def test_scaling_attack_with_one_full_batch_step_multiplies_the_update() -> None:
    """f ← s·f with one gradient step: the attacker's update is exactly s times its honest one."""
    engine = Engine(linear_model(), tiny_data([6, 6, 6], seed=2))
    w = engine.initial_params()
    honest = engine.train(w, plan_for([0, 1, 2]), 0).updates(w)
    a = attack(3, clients=[1], loss_scale=7.0)
    attacked = engine.train(w, a.corrupt_plan(plan_for([0, 1, 2]), 0), 0).updates(w)
    torch.testing.assert_close(attacked[1], 7.0 * honest[1])
    torch.testing.assert_close(attacked[[0, 2]], honest[[0, 2]])


def result_from(clients: list[int], w: torch.Tensor, updates: torch.Tensor) -> LocalResult:
    m = len(clients)
    return LocalResult(torch.tensor(clients), w - updates, torch.zeros(m), torch.ones(m), torch.ones(m))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("scale", [1.0, 4.0, 1.0]), ("sign_flip", [1.0, -4.0, 1.0])],
)
def test_update_scaling_and_sign_flip(kind: str, expected: list[float]) -> None:
    a = attack(3, clients=[1], update=kind, factor=4.0)
    w = torch.zeros(2)
    out = a.corrupt_updates(result_from([0, 1, 2], w, torch.ones(3, 2)), w, 0)
    torch.testing.assert_close(out.updates(w)[:, 0], torch.tensor(expected))


def test_gaussian_and_replaced_updates_are_seeded_noise() -> None:
    w, updates = torch.zeros(4000), torch.ones(2, 4000)
    noisy = attack(2, clients=[0], update="gaussian", noise_std=2.0)
    out = noisy.corrupt_updates(result_from([0, 1], w, updates), w, 5).updates(w)
    again = attack(2, clients=[0], update="gaussian", noise_std=2.0).corrupt_updates(
        result_from([0, 1], w, updates), w, 5
    )
    assert torch.equal(out, again.updates(w))  # (seed, round, client) stream
    torch.testing.assert_close(out[1], updates[1])
    noise = out[0] - 1.0
    assert abs(float(noise.mean())) < 0.15 and abs(float(noise.std()) - 2.0) < 0.1
    replaced = attack(2, clients=[0], update="replace", noise_std=2.0).corrupt_updates(
        result_from([0, 1], w, updates), w, 5
    )
    torch.testing.assert_close(replaced.updates(w)[0], noise)  # the same draw, without the honest update


def test_always_participate_puts_the_attacker_in_every_cohort() -> None:
    a = attack(10, seed=1, clients=[7], always_participate=True)
    everyone = torch.ones(10, dtype=torch.bool)
    unchanged = torch.tensor([1, 7, 9])
    assert torch.equal(a.cohort(unchanged, everyone, 0), unchanged)
    replaced = [a.cohort(torch.tensor([0, 2, 5]), everyone, t) for t in range(30)]
    for cohort in replaced:
        assert len(cohort) == 3 and 7 in cohort.tolist() and set(cohort.tolist()) - {7} < {0, 2, 5}
    assert len({tuple(c.tolist()) for c in replaced}) > 1  # the dropped member is drawn at random
    assert torch.equal(a.cohort(torch.tensor([0, 2, 5]), everyone, 4), replaced[4])  # seeded per round
    offline = everyone.clone()
    offline[7] = False
    assert torch.equal(a.cohort(torch.tensor([0, 2, 5]), offline, 0), torch.tensor([0, 2, 5]))
    assert torch.equal(attack(10, clients=[7]).cohort(torch.tensor([0, 2]), everyone, 0), torch.tensor([0, 2]))


def test_runner_applies_cohort_plan_and_update_attacks() -> None:
    """An attacker that always takes part and trains on 50·f: with FedAvg over a cohort of one it is the only
    client that ever trains, and the run differs from the honest one."""
    base = {
        "dataset": "digits",
        "partition": {"name": "shards", "shards_per_client": 2},
        "model": "logistic",
        "num_clients": 6,
        "clients_per_round": 1,
        "rounds": 3,
        "local": {"steps": 2, "lr": 0.05, "batch_size": 10},
        "algorithm": {"name": "fedavg", "weighting": "uniform"},
    }
    alone = run(parse_config({**base, "attack": {"name": "malicious", "clients": [4], "always_participate": True}}))
    assert alone.final["participants"] == 1.0
    scaled = {"name": "malicious", "clients": [4], "always_participate": True, "loss_scale": 50.0}
    attacked = run(parse_config({**base, "attack": scaled}))
    assert not torch.allclose(attacked.params, alone.params)


def test_maxfl_byzantine_settings_still_build() -> None:
    """MaxFL's Byzantine clients: a fraction that reports +10 loss and adds N(0, 1) noise; training untouched."""
    spec = {"name": "malicious", "fraction": 0.1, "update": "gaussian", "noise_std": 1.0, "loss_bias": 10.0}
    a = ATTACKS.build(spec, where="attack")
    a.setup(20, 0)
    assert int(a.malicious.sum()) == 2
    plan = plan_for(list(range(20)))
    assert a.corrupt_plan(plan, 0) is plan and torch.equal(
        a.cohort(torch.arange(5), torch.ones(20, dtype=torch.bool), 0), torch.arange(5)
    )
    bad = int(torch.nonzero(a.malicious)[0])
    assert float(a.report_losses(torch.tensor([bad]), torch.tensor([0.5]))) == 10.5


def test_fedavg_ignores_the_bias_attack() -> None:
    """The bias attack changes no gradient: strategies that do not read losses train exactly as without it."""
    engine = Engine(linear_model(), tiny_data([5, 5, 5], seed=1))
    w = engine.initial_params()
    strategy = FedAvg()
    strategy.setup(make_context(engine, m=3))
    plan = strategy.configure(0, torch.tensor([0, 1, 2]), w)
    a = attack(3, clients=[0], loss_bias=100.0)
    torch.testing.assert_close(engine.train(w, a.corrupt_plan(plan, 0), 0).params, engine.train(w, plan, 0).params)
