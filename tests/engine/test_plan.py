"""`LocalPlan.masks`: per-client sub-models, checked when the plan is made and kept by `rows`."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan


def _plan() -> LocalPlan:
    return LocalPlan.uniform(torch.tensor([3, 5, 7]), 2, 0.1, 4)


def test_rows_keep_each_clients_mask() -> None:
    plan = _plan()
    plan.masks = torch.tensor([[True, False], [False, True], [True, True]])
    LocalPlan.__post_init__(plan)
    assert plan.rows(torch.tensor([2, 0])).masks.tolist() == [[True, True], [True, False]]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("masks", "personal", "message"),
    [
        (torch.ones(2, 4, dtype=torch.bool), None, r"\(3, P\) bool"),
        (torch.ones(3, 4), None, r"\(3, P\) bool"),
        (torch.ones(3, 4, dtype=torch.bool), Personal(), "do not combine"),
    ],
)
def test_bad_masks_are_refused(masks: torch.Tensor, personal: Personal | None, message: str) -> None:
    plan = _plan()
    with pytest.raises(ValueError, match=message):
        LocalPlan(plan.clients, plan.steps, plan.lr, 4, masks=masks, personal=personal)
