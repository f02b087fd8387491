"""GM-appeal (strict), preferred-model accuracy, requirements and appeal-driven participation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.errors import ConfigError
from fedhet.methods.maxfl.metrics import gm_appeal, preferred_accuracy
from fedhet.methods.maxfl.participation import AppealParticipation
from fedhet.requirements import ClientRequirements, Requirements, RequirementsConfig, compute_requirements
from helpers.tiny import linear_model, tiny_data


def test_gm_appeal_is_strict() -> None:
    assert gm_appeal(torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 1.0, 1.0])) == pytest.approx(1 / 3)


def test_preferred_accuracy_picks_the_appealing_model() -> None:
    value = preferred_accuracy(torch.tensor([0.9, 0.2]), torch.tensor([0.5, 0.8]), torch.tensor([True, False]))
    assert value == pytest.approx((0.9 + 0.8) / 2)


def test_requirements_from_local_training_constant_and_file(tmp_path: Path) -> None:
    data = tiny_data([10, 10, 10], seed=3)
    engine = Engine(linear_model(), data)
    req = compute_requirements(engine, RequirementsConfig(steps=30, lr=0.3, batch_size=5))
    initial = engine.losses_at(engine.initial_params(), torch.arange(3))
    assert bool((req.rho < initial).all())  # solo training lowers each client's own loss
    assert req.local_params is not None and req.local_params.shape == (3, engine.model.size)
    assert torch.equal(compute_requirements(engine, RequirementsConfig(constant=0.4)).rho, torch.full((3,), 0.4))
    f = tmp_path / "rho.csv"
    f.write_text("0.1\n0.2\n0.3\n")
    torch.testing.assert_close(
        compute_requirements(engine, RequirementsConfig(file=str(f))).rho, torch.tensor([0.1, 0.2, 0.3])
    )
    f.write_text("0.1\n")
    with pytest.raises(ConfigError, match="expected one per client"):
        compute_requirements(engine, RequirementsConfig(file=str(f)))


def test_pool_is_everyone_before_the_mandatory_rounds_then_appealing_clients_only() -> None:
    data = tiny_data([6, 6, 6, 6])
    engine = Engine(linear_model(), data)
    w = engine.initial_params()
    losses = engine.scores(w, "train").loss
    rho = losses.clone()
    rho[[0, 2]] += 0.1  # the model appeals to clients 0 and 2 only; client 1 sits exactly at ρ (not appealing)
    req = given_requirements(engine, rho)
    process = AppealParticipation(mandatory_rounds=2)
    process.use_requirements(req)
    process.setup(4, seed=0)
    for t in range(4):
        mask = process.available(t)
        if t < 2:
            assert bool(mask.all())
        else:
            assert mask.tolist() == [True, False, True, False]
        process.observe(t, engine, w)
    state = process.state_dict()
    other = AppealParticipation(mandatory_rounds=2)
    other.setup(4, seed=0)
    other.load_state_dict(state)
    assert torch.equal(other.available(5), process.available(5))


def given_requirements(engine: Engine, rho: torch.Tensor) -> ClientRequirements:
    """The run's requirements with ρ set to `rho` (no solo training)."""
    return ClientRequirements(engine, RequirementsConfig(), Requirements(rho, None, None))
