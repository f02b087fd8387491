"""Ditto: FedAvg for the global model, personal models pulled towards it (Li et al. 2021, Algorithm 1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedhet.engine.optimizers import SGD, Adam
from fedhet.engine.personal import parameter_mask
from fedhet.engine.schedules import SCHEDULES
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.ditto import Ditto, stable_pull
from helpers.personal import STEPS, TOL, personal_models, run_round, setup, sgd, weighted


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_two_rounds_match_the_hand_computed_updates(backend: str) -> None:
    lam = 0.5
    strategy = Ditto(lam=lam)
    engine = setup(strategy, backend)
    model = engine.model
    w0 = model.initial_params()
    v = [w0, w0]  # a client's first personal model is the model's initialisation
    w = w0
    for t in range(2):
        expected_w = weighted([sgd(model, w, k, STEPS) for k in range(2)])
        anchor = w
        v = [sgd(model, v[k], k, STEPS, extra=lambda u, a=anchor: lam * (u - a)) for k in range(2)]
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, expected_w, **TOL)
        torch.testing.assert_close(personal_models(strategy, engine, w, t + 1), torch.stack(v), **TOL)


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_the_personal_model_takes_its_own_learning_rate_and_steps(backend: str) -> None:
    """Algorithm 1's η and s for v_k (here 0.03 and 5) while w_k keeps local.lr and local.steps (0.1 and 2)."""
    lam, eta, s = 0.5, 0.03, 5
    strategy = Ditto(lam=lam, personal_lr=eta, personal_steps=s)
    engine = setup(strategy, backend)
    model = engine.model
    w = model.initial_params()
    v = [w, w]
    for t in range(2):
        expected_w = weighted([sgd(model, w, k, STEPS) for k in range(2)])
        v = [sgd(model, v[k], k, s, lr=eta, extra=lambda u, a=w: lam * (u - a)) for k in range(2)]
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, expected_w, **TOL)
        torch.testing.assert_close(personal_models(strategy, engine, w, t + 1), torch.stack(v), **TOL)


@pytest.mark.parametrize("backend", ["dense", "sequential"])
def test_a_personal_head_is_pulled_with_the_body_frozen_at_the_global_model(backend: str) -> None:
    """``personal: [head]``: v_k is the head only; its steps start from (w's body, v_k) with the body frozen, and
    the client keeps the head's bytes alone."""
    lam = 0.5
    strategy = Ditto(lam=lam, personal=["head"])
    engine = setup(strategy, backend)
    model = engine.model
    head = parameter_mask(model, ["head"], "head")
    w = model.initial_params()
    heads = [w[head], w[head]]
    for t in range(2):
        expected_w = weighted([sgd(model, w, k, STEPS) for k in range(2)])
        for k in range(2):
            start = torch.where(head, torch.zeros_like(w).masked_scatter(head, heads[k]), w)
            heads[k] = sgd(model, start, k, STEPS, extra=lambda u, a=w: lam * (u - a), frozen=~head)[head]
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, expected_w, **TOL)
        mine = torch.stack([w.masked_scatter(head, heads[k]) for k in range(2)])
        torch.testing.assert_close(personal_models(strategy, engine, w, t + 1), mine, **TOL)
    rows = engine.client_state.latest("ditto", torch.tensor([0, 1]), 99)
    assert [row.numel() if row is not None else 0 for row in rows] == [int(head.sum())] * 2
    assert "personal" not in Ditto().model_dump() and Ditto(personal=["head"]).model_dump()["personal"] == ["head"]


def test_the_personal_learning_rate_follows_the_local_schedule() -> None:
    strategy = Ditto(personal_lr=0.02)
    engine = setup(strategy, "sequential")
    strategy.ctx.local_schedule, strategy.ctx.rounds = SCHEDULES.build({"name": "exponential", "gamma": 0.5}), 4
    strategy.ctx.start_round(2)
    plan = strategy.personal_plan(strategy.configure(2, torch.tensor([0, 1]), engine.model.initial_params()))
    assert plan.lr.tolist() == pytest.approx([0.005, 0.005])  # 0.02 · 0.5²
    assert plan.steps.tolist() == [STEPS, STEPS]  # s defaults to the global model's steps


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"lam": 20.0}, "algorithm.lam 20 × local.lr 0.1 = 2"),  # η·λ = 2: v − w never shrinks
        ({"lam": 1e30}, "use lam < 20"),
        ({"lam": 1.0, "personal_lr": 3.0}, "algorithm.personal_lr 3"),
    ],
)
def test_a_pull_that_would_overshoot_is_refused(params: dict[str, float], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        setup(Ditto(**params), "sequential")
    setup(Ditto(lam=19.0), "sequential")  # η·λ = 1.9 < 2: accepted
    with pytest.raises(ConfigError, match="finite number"):
        STRATEGIES.build({"name": "ditto", "lam": float("inf")}, where="algorithm")


def _config(algorithm: object) -> dict[str, object]:
    return {
        "algorithm": algorithm,
        "model": "logistic",
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 3,
        "local": {"steps": 3, "lr": 0.05, "batch_size": 8},
        "personal_eval": {"appeal": False},
        "seed": 2,
    }


def _column(folder: Path, name: str) -> list[float]:
    lines = (folder / "clients.csv").read_text().splitlines()
    at = lines[0].split(",").index(name)
    return [float(line.split(",")[at]) for line in lines[1:]]


def test_ditto_without_its_pull_is_local_training_alone(tmp_path: Path) -> None:
    ditto = run(parse_config(_config({"name": "ditto", "lam": 0.0})), tmp_path / "ditto")
    alone = run(parse_config(_config("local_only")), tmp_path / "alone")
    for key in ("personal_test_accuracy", "personal_test_loss"):
        assert ditto.final[key] == pytest.approx(alone.final[key], rel=1e-6)
        assert _column(tmp_path / "ditto", key) == pytest.approx(_column(tmp_path / "alone", key), rel=1e-6)
    pulled = run(parse_config(_config({"name": "ditto", "lam": 1.0})), tmp_path / "pulled")
    assert pulled.final["personal_test_loss"] != pytest.approx(alone.final["personal_test_loss"], rel=1e-4)


def test_the_bound_on_the_pull_follows_the_client_optimiser() -> None:
    """v − w shrinks by 1 − ηλ per plain SGD step; heavy ball is stable up to ηλ < 2(1 + μ), Nesterov
    2(1 + μ)/(1 + 2μ); Adam's steps are bounded by η whatever λ."""
    assert stable_pull(SGD()) == 2
    assert stable_pull(SGD(momentum=0.5)) == pytest.approx(3)
    assert stable_pull(SGD(momentum=0.5, nesterov=True)) == pytest.approx(1.5)
    assert stable_pull(Adam()) is None
