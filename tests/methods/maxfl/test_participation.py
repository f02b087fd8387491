"""Appeal-driven participation with attackers that opt in honestly (default) or always (`opt_in: always`)."""

from __future__ import annotations

import torch

from fedhet.attacks.base import MaliciousClients, NoAttack
from fedhet.engine.engine import Engine
from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import deep_merge
from fedhet.experiments.runner import run
from fedhet.methods.maxfl.participation import AppealParticipation
from fedhet.recipes.maxfl import EMBEDDED, METHODS, PAPER
from fedhet.requirements import ClientRequirements, Requirements, RequirementsConfig
from helpers.tiny import linear_model, tiny_data


def pool_after(attack: MaliciousClients | NoAttack) -> list[bool]:
    """The pool after round 2 (mandatory_rounds = 1) when the model appeals to clients 0 and 2 only."""
    engine = Engine(linear_model(), tiny_data([6, 6, 6, 6]))
    w = engine.initial_params()
    rho = engine.scores(w, "train").loss.clone()
    rho[[0, 2]] += 0.1
    attack.setup(4, 0)
    process = AppealParticipation(mandatory_rounds=1)
    process.use_requirements(ClientRequirements(engine, RequirementsConfig(), Requirements(rho, None, None)))
    process.setup(4, seed=0)
    process.always_in(attack.opted_in())
    for t in range(2):
        process.observe(t, engine, w)
    return process.available(2).tolist()


def test_attackers_that_always_opt_in_are_in_the_pool_whatever_their_loss() -> None:
    assert pool_after(NoAttack()) == [True, False, True, False]
    honest = MaliciousClients(clients=[1, 2])
    assert pool_after(honest) == [True, False, True, False]  # attacker 1 is not appealed to: it stays out
    always = MaliciousClients(clients=[1, 2], opt_in="always")
    assert pool_after(always) == [True, True, True, False]
    assert always.opted_in().tolist() == [False, True, True, False]
    assert not bool(honest.opted_in().any()) and honest.opted_in().shape == (4,)


def test_byzantine_clients_that_always_opt_in_take_part_in_every_round() -> None:
    """A small MaxFL run: with `opt_in: always` the pool never holds fewer clients than there are attackers,
    and the attackers' cohort slots change the run; honest opt-in (the default) is the paper's run."""
    small = {
        "rounds": 10,
        "num_clients": 10,
        "unseen_clients": 4,
        "clients_per_round": 4,
        "availability": {"name": "appeal", "mandatory_rounds": 3},
        "requirements": {"steps": 20},
        "metrics": [],
    }
    raw = deep_merge(deep_merge(deep_merge(PAPER, EMBEDDED), small), METHODS["MW-Fed"])
    spec = {"name": "malicious", "fraction": 0.3, "update": "gaussian", "noise_std": 1.0, "loss_bias": 10.0}
    honest = run(parse_config({**raw, "attack": spec}))
    always = run(parse_config({**raw, "attack": {**spec, "opt_in": "always"}}))
    attackers = round(0.3 * 10)
    late = [row["available"] for row in always.history if row["round"] > 3]
    assert min(late) >= attackers
    assert min(row["available"] for row in honest.history if row["round"] > 3) < attackers  # they dropped out
    assert not torch.equal(honest.params, always.params)
