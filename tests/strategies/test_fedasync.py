"""FedAsync: each update mixed in as it arrives, discounted by its staleness (Xie et al. 2019)."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.plan import LocalResult
from fedhet.strategies.asynchronous import staleness_weight
from fedhet.strategies.fedasync import FedAsync, fedasync_step


def test_the_staleness_functions_are_the_paper_s() -> None:
    s = torch.tensor([0, 1, 4, 5, 9])
    assert staleness_weight(s, "constant", 0.5, 4).tolist() == [1.0] * 5
    assert staleness_weight(s, "polynomial", 0.5, 4).tolist() == pytest.approx([1, 2**-0.5, 5**-0.5, 6**-0.5, 0.1**0.5])
    assert staleness_weight(s, "hinge", 10, 4).tolist() == pytest.approx([1, 1, 1, 1 / 11, 1 / 51])


def test_a_fresh_update_has_the_paper_s_staleness_one() -> None:
    """Algorithm 1: x_t ← (1 − α_t) x_{t−1} + α_t x_new, α_t = α s(t − τ); an update trained from x_{t−1} (a version
    lag of 0) has t − τ = 1, one with a lag of 3 has t − τ = 4."""
    w, local = torch.tensor([1.0, 1.0]), torch.tensor([[3.0, -1.0]])
    result = LocalResult(torch.tensor([2]), local, torch.zeros(1), torch.ones(1), torch.ones(1))
    constant = FedAsync(alpha=0.6, staleness="constant")
    fresh = constant.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([0]))
    torch.testing.assert_close(fresh, torch.tensor([0.4 + 1.8, 0.4 - 0.6]))  # (1 − α) w + α w_k
    polynomial = FedAsync(alpha=0.6, staleness="polynomial", a=0.5)
    fresh = polynomial.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([0]))
    torch.testing.assert_close(fresh, fedasync_step(w, local[0], 0.6 / 2**0.5))  # α s(1) = 0.6 (1 + 1)^(−1/2)
    stale = polynomial.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([3]))
    torch.testing.assert_close(stale, fedasync_step(w, local[0], 0.6 / 5**0.5))  # α s(4) = 0.6 (4 + 1)^(−1/2)
    hinge = FedAsync(alpha=0.6, staleness="hinge", a=10, b=4)
    at_b = hinge.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([3]))
    torch.testing.assert_close(at_b, fedasync_step(w, local[0], 0.6))  # t − τ = 4 ≤ b: no discount
    past_b = hinge.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([4]))
    torch.testing.assert_close(past_b, fedasync_step(w, local[0], 0.6 / 11))  # 1 / (10 (5 − 4) + 1)
