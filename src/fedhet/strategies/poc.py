"""Power-of-Choice (Cho, Wang, Joshi, 2020, "Client Selection in Federated Learning", Algorithm 1: π_pow-d).

Each round the server samples a candidate set of d clients without replacement, with probabilities proportional to
their data sizes p_k, asks each for its local loss F_k(w) at the current model, and selects the m with the highest
loss (ties: the lower id). The selected clients train as in FedAvg and the server averages their models with equal
weights (the paper's aggregation for pow-d). ``loss_batch`` > 0 estimates each loss on that many of the
candidate's samples instead of all of them (the paper's cpow-d). d defaults to 2m; the paper requires m ≤ d ≤ K,
so a d below m is refused (with d = m the candidates are the cohort: sampled by data size, no loss asked). Where
fewer than d clients are available, all of them are candidates (all are selected where at most m are).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import FedAvg


def highest_losses(candidates: Tensor, losses: Tensor, m: int) -> Tensor:
    """The m candidates with the highest loss (sorted ids; ties broken towards the lower id)."""
    order = sorted(range(len(candidates)), key=lambda i: (-float(losses[i]), int(candidates[i])))
    return candidates[torch.as_tensor(order[:m], dtype=torch.long)].sort().values


@STRATEGIES.register
class PowerOfChoice(FedAvg):
    """Candidates ∝ data size, then the m with the highest local loss; equal-weight averaging."""

    name: ClassVar[str] = "poc"
    description: ClassVar[str] = "Power-of-Choice: of d candidates, the m with the highest loss (Cho et al. 2020)"
    weighting: Literal["samples", "uniform"] = "uniform"
    d: int | None = Field(None, ge=1, description="candidates per round (default 2m; at most the available)")
    loss_batch: int = Field(0, ge=0, description="estimate each loss on this many samples (cpow-d; 0: all)")

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        m = ctx.clients_per_round
        if self.d is not None and self.d < m:
            raise ConfigError(
                f"algorithm.d ({self.d}) is less than clients_per_round ({m}): Power-of-Choice selects the m clients "
                f"with the highest loss among d candidates, so it needs d ≥ m; use d ≥ {m} (default 2m = {2 * m})"
            )

    def select(self, round_: int, available: Tensor) -> Tensor:
        pool = torch.nonzero(available).flatten()
        m = min(self.ctx.selects, len(pool))
        d = min(self.d if self.d is not None else 2 * m, len(pool))
        if len(pool) <= m:
            return pool
        sizes = self.ctx.train_sizes[pool].double().numpy()
        p = sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(pool), 1 / len(pool))
        picked = numpy_rng(self.ctx.seed, "poc-candidates", round_).choice(len(pool), size=d, replace=False, p=p)
        candidates = pool[torch.as_tensor(np.sort(picked), dtype=torch.long)]
        if d == m:
            return candidates  # every candidate is selected: their losses would not change the choice
        params = self.ctx.params if self.ctx.params is not None else self.ctx.engine.initial_params()
        if self.loss_batch:
            honest = self.ctx.engine.sampled_losses(params, candidates, self.loss_batch, round_, "poc-losses")
            losses = self.ctx.attack.report_losses(candidates, honest)
        else:
            losses = self.ctx.client_losses(params, candidates)
        return highest_losses(candidates, losses, m)
