"""AdaFed as run in CA-Fed's experiments (Rodio et al. 2023, Sec. V-A; ref. [19], Tan et al. 2022).

The authors' code runs AdaFed in its full-participation branch: every active client trains, with the unbiased
weights normalised over the active set, q_k = (α_k/π_k) / Σ_{h ∈ A_t} α_h/π_h, and a server learning rate of 1
(plain weighted model averaging). AdaFed's adaptive weight optimisation is not implemented there either.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fedhet.methods.cafed.availability_aware import AvailabilityAware, unbiased_weights
from fedhet.strategies.base import STRATEGIES


def normalised_over(q: np.ndarray, members: np.ndarray) -> np.ndarray:
    """q restricted to `members` (bool mask) and scaled to sum to 1 there (zeros if none)."""
    out = np.where(members, q, 0.0)
    total = out.sum()
    return out / total if total > 0 else out


@STRATEGIES.register
class AdaFed(AvailabilityAware):
    """All active clients, q ∝ α/π̂ normalised over A_t; server_lr 1 by default (the paper's setting)."""

    name: ClassVar[str] = "adafed"
    description: ClassVar[str] = "AdaFed (CA-Fed's experiments): alpha/pi weights normalised over the active clients"

    def weights(self, round_: int, active: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
        return normalised_over(unbiased_weights(self.alpha, pi), active)
