"""FjORD (Horváth, Laskaridis, Almeida, Leontiadis, Venieris, Lane, NeurIPS 2021): ordered dropout.

A client of capacity p_max ∈ (0, 1] trains, in each round, the sub-model of the first ⌈p·d⌉ units of every hidden
layer (ordered dropout, §3), p drawn uniformly from the levels ``levels`` that are at most p_max (the paper's
U_{p_max}(D), §3.2). The paper draws p for every local mini-batch; here p is drawn once per client per round (the
engine's sub-model masks hold for a whole local training), seeded by (seed, round, client). Aggregation: each
coordinate is averaged over the clients that trained it (`fedhet.strategies.submodels.masked_average`, as FjORD's
§3.3 aggregates the sub-models). Not implemented: FjORD's self-distillation.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.submodels import SubModels


@STRATEGIES.register
class FjORD(SubModels):
    """Ordered dropout: each round a client trains the first ⌈p·d⌉ units, p drawn from the levels ≤ its
    capacity."""

    name: ClassVar[str] = "fjord"
    description: ClassVar[str] = "FjORD: ordered dropout, p <= capacity drawn each round (Horvath et al. 2021)"

    def trained_levels(self, round_: int, clients: Tensor) -> Tensor:
        """(m,) p of each of `clients` in round `round_`: uniform over the levels at most its capacity p_max (one
        draw per client of the federation, so that a client's p does not depend on the others in the cohort)."""
        capacity = self.capacity(round_)
        levels = torch.tensor(sorted(self.levels))
        u = torch.as_tensor(numpy_rng(self.ctx.seed, "fjord/p", round_).random(len(capacity)))
        allowed = (levels.unsqueeze(0) <= capacity.unsqueeze(1)).sum(1)  # the levels ≤ p_max are levels[:allowed]
        pick = (u * allowed).long().clamp_max(allowed - 1)
        return levels[pick][clients]
