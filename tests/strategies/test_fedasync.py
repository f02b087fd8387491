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


def test_a_fresh_update_is_mixed_in_with_alpha_and_a_stale_one_with_less() -> None:
    w, local = torch.tensor([1.0, 1.0]), torch.tensor([[3.0, -1.0]])
    result = LocalResult(torch.tensor([2]), local, torch.zeros(1), torch.ones(1), torch.ones(1))
    strategy = FedAsync(alpha=0.6, staleness="polynomial", a=0.5)
    fresh = strategy.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([0]))
    torch.testing.assert_close(fresh, torch.tensor([0.4 + 1.8, 0.4 - 0.6]))  # (1 − α) w + α w_k
    stale = strategy.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([3]))
    torch.testing.assert_close(stale, fedasync_step(w, local[0], 0.6 * 0.5))  # α s(3) = 0.6 / √4
