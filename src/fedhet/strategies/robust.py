"""Byzantine-robust aggregation rules, as comparison points for FedMGDA+'s robustness (they are only cited there).

All three replace FedAvg's weighted mean of the updates Δ_k = w − w_k by a robust statistic, then step
w ← w − η_g · agg(Δ):

- ``krum`` (Blanchard et al., NeurIPS 2017): the update whose summed squared distance to its n − f − 2 nearest
  other updates is smallest; ``multi > 1`` averages the `multi` best-scored updates (Multi-Krum).
- ``median`` (Yin et al., ICML 2018): the coordinate-wise median (mean of the two middle values for even n).
- ``trimmed_mean`` (Yin et al. 2018): per coordinate, drop the ⌊β n⌋ largest and ⌊β n⌋ smallest values and
  average the rest.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import STRATEGIES, Strategy

__all__ = ["CoordinateMedian", "Krum", "TrimmedMean", "coordinate_median", "krum_scores", "trimmed_mean"]


def krum_scores(updates: Tensor, byzantine: int) -> Tensor:
    """Krum score of each row: Σ of squared distances to its n − f − 2 nearest other rows (at least one)."""
    n = len(updates)
    if n == 1:
        return torch.zeros(1, dtype=torch.float64)
    u = updates.double()
    distances = torch.cdist(u, u).pow(2)
    neighbours = min(max(n - byzantine - 2, 1), n - 1)
    others = distances + torch.diag(torch.full((n,), float("inf"), dtype=torch.float64))
    return others.sort(dim=1).values[:, :neighbours].sum(dim=1)


def coordinate_median(updates: Tensor) -> Tensor:
    """Coordinate-wise median; the mean of the two middle values when the number of rows is even."""
    ordered = updates.sort(dim=0).values
    n = len(updates)
    middle = ordered[(n - 1) // 2 : n // 2 + 1]
    return middle.mean(dim=0)


def trimmed_mean(updates: Tensor, beta: float) -> Tensor:
    """Coordinate-wise β-trimmed mean: drop ⌊β n⌋ values at each end (Yin et al. 2018, Definition 2)."""
    n = len(updates)
    cut = int(beta * n)
    if 2 * cut >= n:
        raise ValueError(f"trimming {cut} of {n} values at each end leaves nothing to average")
    return updates.sort(dim=0).values[cut : n - cut].mean(dim=0)


@STRATEGIES.register
class Krum(Strategy):
    name: ClassVar[str] = "krum"
    description: ClassVar[str] = "Krum / Multi-Krum: the update(s) closest to their neighbours (Blanchard et al.)"
    byzantine: int = Field(1, ge=0, description="f: number of Byzantine clients tolerated per round")
    multi: int = Field(1, ge=1, description="average of the `multi` best-scored updates (1: Krum)")

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        updates = result.updates(global_params)
        best = krum_scores(updates, self.byzantine).argsort()[: min(self.multi, len(updates))]
        return self.server_step(global_params, updates[best].mean(dim=0))


@STRATEGIES.register
class CoordinateMedian(Strategy):
    name: ClassVar[str] = "median"
    description: ClassVar[str] = "coordinate-wise median of the client updates (Yin et al. 2018)"

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        return self.server_step(global_params, coordinate_median(result.updates(global_params)))


@STRATEGIES.register
class TrimmedMean(Strategy):
    name: ClassVar[str] = "trimmed_mean"
    description: ClassVar[str] = "coordinate-wise trimmed mean of the client updates (Yin et al. 2018)"
    trim: float = Field(0.1, ge=0, lt=0.5, description="β: share of values dropped at each end per coordinate")

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        return self.server_step(global_params, trimmed_mean(result.updates(global_params), self.trim))
