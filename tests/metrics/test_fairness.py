"""The improved-users share (FedMGDA+ footnote 5) and the accuracy percentiles ("Worst/Best 5%")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.evaluate import ClientScores
from fedhet.engine.plan import LocalResult
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.base import RoundView
from fedhet.metrics.clients import distribution
from fedhet.metrics.fairness import AccuracyPercentiles, ImprovedUsers, improved_share
from helpers.tiny import linear_model


def two_label_engine() -> Engine:
    """Client 0 holds only label 0, client 1 only label 1, client 2 both."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 3, generator=gen) for _ in range(3)]
    ys = [torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long), torch.tensor([0, 1] * 3)]
    part = ClientData.from_parts(xs, ys)
    return Engine(linear_model(), FederatedData("two", part, part, 2, torch.ones(3, dtype=torch.bool)))


def view(engine: Engine, previous: torch.Tensor, params: torch.Tensor, clients: list[int] | None) -> RoundView:
    scores = engine.scores(params, "test")
    result = None
    if clients is not None:
        m = len(clients)
        result = LocalResult(torch.tensor(clients), params.repeat(m, 1), torch.zeros(m), torch.ones(m), torch.ones(m))
    return RoundView(1, engine, params, previous, result, scores, engine.scores(params, "train"), [])


def test_improved_share_counts_ties_as_improved() -> None:
    assert improved_share(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 2.0, 3.5])) == 2 / 3
    assert math.isnan(improved_share(torch.zeros(0), torch.zeros(0)))


def test_improved_users_by_hand() -> None:
    engine = two_label_engine()
    size = engine.model.size  # weight (2 × 3) then bias (2)
    previous = torch.zeros(size)  # every loss is ln 2
    params = torch.zeros(size)
    params[-2:] = torch.tensor([1.0, -1.0])  # favours label 0: client 0 improves, client 1 gets worse
    metric = ImprovedUsers()
    assert metric.compute(view(engine, previous, params, [0, 1]))[0]["improved_users"] == 0.5
    assert metric.compute(view(engine, previous, params, [0]))[0]["improved_users"] == 1.0
    assert metric.compute(view(engine, previous, params, [1, 2]))[0]["improved_users"] == 0.0
    assert metric.compute(view(engine, previous, previous, [0, 1, 2]))[0]["improved_users"] == 1.0
    assert math.isnan(metric.compute(view(engine, previous, params, None))[0]["improved_users"])


def test_smoothed_share_is_an_exponentially_weighted_mean() -> None:
    engine = two_label_engine()
    size = engine.model.size
    previous, params = torch.zeros(size), torch.zeros(size)
    params[-2:] = torch.tensor([1.0, -1.0])
    metric = ImprovedUsers(span=3)  # weight 1 − 2/(3 + 1) = ½ on the past
    shares = [metric.compute(view(engine, previous, params, c))[0] for c in ([0], [1], [0, 1])]
    assert [s["improved_users"] for s in shares] == [1.0, 0.0, 0.5]
    # pandas ewm(span=3, adjust=True): (x_t + ½ x_{t−1} + ¼ x_{t−2}) / (1 + ½ + ¼)
    assert shares[1]["improved_users_ewm"] == pytest.approx(0.5 / 1.5)
    assert shares[2]["improved_users_ewm"] == pytest.approx((0.5 + 0.0 + 0.25) / 1.75)
    copy = ImprovedUsers(span=3)
    copy.load_state_dict(metric.state_dict())
    assert copy.compute(view(engine, previous, previous, [0]))[0]["improved_users_ewm"] == pytest.approx(
        (1.0 + 0.5 * 0.5 + 0.25 * 0.0 + 0.125 * 1.0) / 1.875
    )


def test_accuracy_percentiles_match_numpy() -> None:
    engine = two_label_engine()
    v = view(engine, torch.zeros(engine.model.size), torch.zeros(engine.model.size), [0])
    acc = torch.tensor([0.1, 0.5, 0.9])
    v.test = ClientScores(torch.zeros(3), acc, torch.ones(3))
    out, _ = AccuracyPercentiles().compute(v)
    assert out["test_accuracy_p5"] == pytest.approx(float(np.percentile(acc.double().numpy(), 5)))
    assert out["test_accuracy_p95"] == pytest.approx(float(np.percentile(acc.double().numpy(), 95)))
    assert out["test_accuracy_p5"] < 0.2 and out["test_accuracy_p95"] > 0.8


def test_plugins_in_a_run() -> None:
    cfg = parse_config(
        {
            "dataset": "digits",
            "partition": {"name": "shards", "shards_per_client": 2},
            "model": "logistic",
            "num_clients": 6,
            "clients_per_round": 3,
            "rounds": 3,
            "local": {"steps": 2, "lr": 0.05, "batch_size": 10},
            "metrics": ["improved_users", "accuracy_percentiles"],
        }
    )
    state = run(cfg)
    assert len(state.history) == 3
    for row in state.history:
        assert 0.0 <= row["improved_users"] <= 1.0
        assert row["improved_users"] * 3 == round(row["improved_users"] * 3)  # a share of 3 participants
        assert row["test_accuracy_p5"] <= row["test_accuracy"] <= row["test_accuracy_p95"]


def test_average_std_and_ten_percent_tails_by_hand() -> None:
    """The fairness table's columns: mean over users, population std, mean of the worst and best 10% of users."""
    acc = torch.tensor([0.9, 0.1, 0.5, 0.7, 0.3, 0.6, 0.8, 0.2, 0.4, 1.0, 0.0, 0.55])  # 12 users
    out = distribution(acc, "test_accuracy")
    assert out["test_accuracy"] == pytest.approx(float(acc.double().mean()))
    assert out["test_accuracy_std"] == pytest.approx(float(np.std(acc.double().numpy())))  # ddof = 0
    assert out["test_accuracy_worst10"] == pytest.approx((0.0 + 0.1) / 2)  # ⌈0.1 · 12⌉ = 2 users
    assert out["test_accuracy_best10"] == pytest.approx((1.0 + 0.9) / 2)
    single = distribution(torch.tensor([0.4]), "acc")
    assert single["acc_worst10"] == single["acc_best10"] == pytest.approx(0.4) and single["acc_std"] == 0.0
