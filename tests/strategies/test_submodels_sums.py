"""`masked_average`'s per-group sums over the masks' spans (`_group_sums`) against the matrix product."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fedhet.strategies.submodels as submodels
from fedhet.engine.functional import FlatModel
from fedhet.strategies.submodels import masked_average, unit_mask


def _groups(model: FlatModel, layers: list[str], sets: list[list[bool]], sizes: list[int]) -> list[submodels.Group]:
    out, start = [], 0
    for units, size in zip(sets, sizes, strict=True):
        out.append((torch.arange(start, start + size), unit_mask(model, layers, [torch.tensor(units)])))
        start += size
    return out


@pytest.mark.parametrize("gap", [submodels.SPAN_GAP, 1])  # 1: every run a span, the third mask's 41: the product
def test_group_sums_equal_the_matrix_product(monkeypatch: pytest.MonkeyPatch, gap: int) -> None:
    monkeypatch.setattr(submodels, "SPAN_GAP", gap)
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)))
    layers = ["0", "2"]
    sets = [[True] * 16, [True] * 8 + [False] * 8, [True, False] * 8]
    groups = _groups(model, layers, sets, [2, 3, 2])
    params = torch.randn(7, model.size)
    p = torch.rand(7)
    share = torch.zeros(len(groups), 7)
    for g, (rows, _) in enumerate(groups):
        share[g, rows] = p[rows]
    sums = submodels._group_sums(params, groups, share)
    for (_, mask), got, want in zip(groups, sums, share @ params, strict=True):
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-6, atol=1e-6)  # outside: masked off later
    masks = torch.stack([mask for rows, mask in groups for _ in rows])
    w = torch.randn(model.size)
    torch.testing.assert_close(masked_average(w, params, masks, p, groups), masked_average(w, params, masks, p))
