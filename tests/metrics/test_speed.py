"""Rounds to a target accuracy, best accuracy and speedup."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.evaluate import ClientScores
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.base import RoundView
from fedhet.metrics.speed import TargetAccuracy, rounds_to_target, speedup
from helpers.tiny import linear_model, tiny_data


def test_rounds_to_target_and_speedup() -> None:
    assert rounds_to_target([5, 10, 15], [0.3, 0.5, 0.4], 0.5) == 10.0
    assert math.isnan(rounds_to_target([5, 10], [0.3, 0.4], 0.5))
    assert speedup(550, 170) == pytest.approx(3.235, abs=1e-3)  # FedGSNR Table 1, FedAvg on Pareto
    assert math.isnan(speedup(float("nan"), 170))


def view(engine: Engine, round_: int, accuracy: list[float], count: list[int]) -> RoundView:
    scores = ClientScores(torch.zeros(len(accuracy)), torch.tensor(accuracy), torch.tensor(count, dtype=torch.float64))
    p = torch.zeros(engine.model.size)
    return RoundView(round_, engine, p, p, None, scores, scores, [])


def test_plugin_reports_first_round_and_best() -> None:
    engine = Engine(linear_model(), tiny_data([2, 6]))
    metric = TargetAccuracy(target=0.5)
    metric.setup(engine, 0)
    out, _ = metric.compute(view(engine, 1, [0.2, 0.6], [2, 6]))  # client mean 0.4
    assert math.isnan(out["rounds_to_target"]) and out["best_test_accuracy"] == pytest.approx(0.4)
    out, _ = metric.compute(view(engine, 2, [0.5, 0.7], [2, 6]))  # 0.6: reached
    assert out["rounds_to_target"] == 2.0
    state = metric.state_dict()
    out, _ = metric.compute(view(engine, 3, [0.1, 0.1], [2, 6]))  # falls back: first round and best are kept
    assert out["rounds_to_target"] == 2.0 and out["best_test_accuracy"] == pytest.approx(0.6)
    resumed = TargetAccuracy(target=0.5)
    resumed.load_state_dict(state)
    assert resumed.compute(view(engine, 3, [0.1, 0.1], [2, 6]))[0]["rounds_to_target"] == 2.0
    pooled = TargetAccuracy(target=0.5, column="test_accuracy_pooled")
    pooled.setup(engine, 0)
    # pooled (2·0.2 + 6·0.6)/8 = 0.5 reaches the target at round 1 while the client mean (0.4) does not
    assert pooled.compute(view(engine, 1, [0.2, 0.6], [2, 6]))[0]["rounds_to_target"] == 1.0


def test_in_a_run_matches_the_history() -> None:
    cfg = parse_config(
        {
            "dataset": "digits",
            "partition": "iid",
            "model": {"name": "mlp", "hidden": [16]},
            "local": {"lr": 0.2},
            "num_clients": 4,
            "clients_per_round": 4,
            "rounds": 6,
            "metrics": [{"name": "target_accuracy", "target": 0.8}],
        }
    )
    state = run(cfg)
    rounds = [row["round"] for row in state.history]
    acc = [row["test_accuracy"] for row in state.history]
    expected = rounds_to_target(rounds, acc, 0.8)
    assert expected > 1  # digits with an MLP passes 80% within 6 rounds (not at round 1)
    assert state.final["rounds_to_target"] == expected
    assert state.final["best_test_accuracy"] == pytest.approx(max(acc))
