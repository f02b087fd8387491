"""F3AST as run in CA-Fed's experiments (Rodio et al. 2023, Sec. V-A; ref. [18], Ribero et al. 2022).

With the oracle availability, the authors' code smooths it with the current activity,
π̃_k = (1 − s) π_k + s 1{k ∈ A_t} with s = 1/T, keeps the K active clients with the largest α_k²/π̃_k²
(all of them when at most K are active) and weights them by q_k = α_k/π̃_k (un-normalised). K is the run's
``clients_per_round`` (12 in the paper's setting).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from fedhet.methods.cafed.availability_aware import AvailabilityAware, descending, unbiased_weights
from fedhet.strategies.base import STRATEGIES


def top_k_active(scores: np.ndarray, active: np.ndarray, k: int) -> np.ndarray:
    """Mask of the (at most) `k` active clients with the largest `scores` (ties by id)."""
    order = [int(i) for i in descending(np.where(active, scores, -np.inf)) if active[i]]
    mask = np.zeros(len(scores), dtype=bool)
    mask[order[:k]] = True
    return mask


@STRATEGIES.register
class F3AST(AvailabilityAware):
    """Top-K active clients by α²/π̃², weighted α/π̃ with π̃ = (1 − s)π̂ + s·1_{A_t}."""

    name: ClassVar[str] = "f3ast"
    description: ClassVar[str] = "F3AST (CA-Fed's experiments): top-K active clients by alpha^2/pi^2, weights alpha/pi"
    smoothing: float = Field(1 / 150, ge=0, le=1, description="s: π̃ = (1 − s)π + s·1{active} (the code's 1/T)")

    def weights(self, round_: int, active: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
        smoothed = (1 - self.smoothing) * np.asarray(pi) + self.smoothing * active
        q = unbiased_weights(self.alpha, smoothed)
        chosen = top_k_active(q**2, active, self.ctx.selects)
        return np.where(chosen, q, 0.0)
