"""`ClientData`: the clients' rows by offsets, and the gather of a cohort's rows."""

from __future__ import annotations

import torch

from fedhet.data.dataset import ClientData


def test_select_gathers_the_cohort_in_its_order_from_the_offsets() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # client 0: rows 0-1, client 1: row 2, client 2: rows 3-5
    data = ClientData(x, torch.arange(6), torch.tensor([0, 2, 3, 6]))
    assert data.sizes.tolist() == [2, 1, 3] and data.sizes is data.sizes  # worked out once
    cohort = data.select(torch.tensor([2, 0]))
    assert cohort.offsets.tolist() == [0, 3, 5] and cohort.sizes.tolist() == [3, 2]
    assert cohort.y.tolist() == [3, 4, 5, 0, 1] and torch.equal(cohort.x, x[[3, 4, 5, 0, 1]])
    assert data.select(torch.tensor([1])).x.tolist() == [[4.0, 5.0]]
