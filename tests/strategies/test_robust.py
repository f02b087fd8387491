"""Krum, coordinate-wise median and trimmed mean, by hand, and their resistance to one corrupted update."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import Strategy
from fedhet.strategies.robust import CoordinateMedian, Krum, TrimmedMean, coordinate_median, krum_scores, trimmed_mean
from helpers.tiny import linear_model, make_context, tiny_data


def test_krum_scores_by_hand() -> None:
    u = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    # n = 4, f = 1: each row sums its n − f − 2 = 1 nearest squared distance
    torch.testing.assert_close(krum_scores(u, 1), torch.tensor([1.0, 1.0, 4.0, 49.0], dtype=torch.float64))
    # f = 0: the 2 nearest
    torch.testing.assert_close(krum_scores(u, 0), torch.tensor([10.0, 5.0, 13.0, 130.0], dtype=torch.float64))


def test_median_and_trimmed_mean_by_hand() -> None:
    u = torch.tensor([[1.0, 5.0], [2.0, -1.0], [100.0, 0.0], [3.0, 2.0]])
    torch.testing.assert_close(coordinate_median(u), torch.tensor([2.5, 1.0]))
    torch.testing.assert_close(coordinate_median(u[:3]), torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(trimmed_mean(u, 0.25), torch.tensor([2.5, 1.0]))  # drop 1 at each end
    torch.testing.assert_close(trimmed_mean(u, 0.0), u.mean(0))
    with pytest.raises(ValueError):
        trimmed_mean(torch.zeros(2, 1), 0.5)


def result_from(w: torch.Tensor, updates: torch.Tensor) -> LocalResult:
    m = len(updates)
    return LocalResult(torch.arange(m), w - updates, torch.zeros(m), torch.ones(m), torch.ones(m))


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (Krum(byzantine=1), 1.0),  # the honest cluster's member with the closest neighbours
        (Krum(byzantine=1, multi=3), 1.0),
        (CoordinateMedian(), 1.0),
        (TrimmedMean(trim=0.2), 1.0),
    ],
)
def test_one_outlier_is_ignored(strategy: Strategy, expected: float) -> None:
    engine = Engine(linear_model(), tiny_data([3] * 5))
    strategy.setup(make_context(engine, m=5))
    size = engine.model.size
    updates = torch.ones(5, size)
    updates[1] += 0.01
    updates[3] -= 0.01
    updates[4] = 1000.0  # a scaled / replaced update
    new = strategy.aggregate(0, torch.zeros(size), result_from(torch.zeros(size), updates))
    torch.testing.assert_close(new, -torch.full((size,), expected), atol=0.011, rtol=0)


def test_server_lr_and_single_client() -> None:
    engine = Engine(linear_model(), tiny_data([3]))
    size = engine.model.size
    for strategy in (Krum(server_lr=0.5), CoordinateMedian(server_lr=0.5), TrimmedMean(server_lr=0.5, trim=0.3)):
        strategy.setup(make_context(engine, m=1))
        new = strategy.aggregate(0, torch.zeros(size), result_from(torch.zeros(size), torch.full((1, size), 2.0)))
        torch.testing.assert_close(new, -torch.ones(size))
