"""Unbiased aggregation (Rodio et al. 2023, Sec. III-B and V-A): every active client trains with weight
q_k = α_k/π_k (un-normalised), so that the biased importance p = π ⊙~ q equals the target α."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fedhet.methods.cafed.availability_aware import AvailabilityAware, unbiased_weights
from fedhet.strategies.base import STRATEGIES


@STRATEGIES.register
class Unbiased(AvailabilityAware):
    """All active clients, q_k = α_k / π̂_k."""

    name: ClassVar[str] = "unbiased"
    description: ClassVar[str] = "all active clients, weighted by alpha_k / pi_k (unbiased in expectation)"

    def weights(self, round_: int, active: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
        return unbiased_weights(self.alpha, pi)
