"""TiFL (Chai, Ali, Zawad, Truex, Anwar, Baracaldo, Zhou, Ludwig, Yan, Cheng, HPDC 2020): tier-based selection.

The server groups the clients into ``tiers`` of similar speed, from their profiled round time (here: the system
model's, a round of the run's local steps and the model's traffic, `fedhet.systems`), fastest tier first, and
each round picks one tier and m clients uniformly from its available members, so a round waits for clients of
one speed only. Tiers are picked with equal probability (TiFL's static policy), or adaptively (TiFL §4.3): every
``interval`` rounds each tier's probability is set in proportion to its clients' mean loss under the global model
(a tier the model serves worse is picked more often), and a tier is picked at most ``credits`` times (then the
others share its turns). Aggregation is FedAvg's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import FedAvg
from fedhet.systems.clock import FLOAT_BYTES


def speed_tiers(seconds: Tensor, tiers: int) -> Tensor:
    """Each client's tier (K,): clients sorted by `seconds`, cut into `tiers` groups as equal as they can be
    (tier 0 the fastest; ties in order of id)."""
    order = torch.argsort(seconds, stable=True)
    tier = torch.empty(len(seconds), dtype=torch.long)
    for t, block in enumerate(np.array_split(order.numpy(), tiers)):
        tier[torch.as_tensor(block, dtype=torch.long)] = t
    return tier


@STRATEGIES.register
class TiFL(FedAvg):
    """Clients grouped by speed; each round one tier (static or adaptive choice), m of its available clients."""

    name: ClassVar[str] = "tifl"
    description: ClassVar[str] = "tier-based selection: each round clients of one speed tier (Chai et al. 2020)"
    tiers: int = Field(5, ge=1, description="groups of clients of similar speed (the paper: 5)")
    adaptive: bool = Field(False, description="pick tiers by their clients' loss (TiFL's adaptive policy)")
    interval: int = Field(10, ge=1, description="rounds between two updates of the adaptive probabilities")
    credits: int | None = Field(None, ge=1, description="times a tier may be picked (adaptive; none: no limit)")
    _tier: Tensor | None = PrivateAttr(None)
    _probs: Tensor | None = PrivateAttr(None)
    _used: Tensor | None = PrivateAttr(None)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._tier = speed_tiers(self.round_seconds(), self.tiers)
        self._probs = torch.full((self.tiers,), 1.0 / self.tiers, dtype=torch.float64)
        self._used = torch.zeros(self.tiers, dtype=torch.long)

    def round_seconds(self) -> Tensor:
        """Each client's profiled round: its local steps' samples and the model both ways (equal for all clients
        without a system model: one tier then holds the lowest ids)."""
        ctx = self.ctx
        k = ctx.num_clients
        if not ctx.system.simulates_time:
            return torch.zeros(k, dtype=torch.float64)
        profiles = ctx.system.profiles(0)
        sizes = ctx.train_sizes
        samples = ctx.local.plan(torch.arange(k), sizes).steps * torch.minimum(
            sizes, torch.tensor(ctx.local.batch_size)
        )
        payload = float(FLOAT_BYTES * ctx.engine.model.size)
        down, compute, up = profiles.durations(torch.arange(k), samples, payload, payload)
        return down + compute + up

    def select(self, round_: int, available: Tensor) -> Tensor:
        assert self._tier is not None and self._probs is not None and self._used is not None
        if self.adaptive and round_ % self.interval == 0 and self.ctx.params is not None:
            self._probs = self._adapt(self.ctx.params)
        probs = self._probs.clone()
        open_tiers = torch.as_tensor([bool((available & (self._tier == t)).any()) for t in range(self.tiers)])
        if self.credits is not None:
            open_tiers &= self._used < self.credits
        if not bool(open_tiers.any()):
            return super().select(round_, available)  # every tier empty or spent: any available clients
        probs = torch.where(open_tiers, probs, torch.zeros_like(probs))
        probs = probs / probs.sum() if float(probs.sum()) > 0 else open_tiers.double() / open_tiers.sum()
        tier = int(numpy_rng(self.ctx.seed, "tifl-tier", round_).choice(self.tiers, p=probs.numpy()))
        self._used[tier] += 1
        return super().select(round_, available & (self._tier == tier))

    def _adapt(self, params: Tensor) -> Tensor:
        """Tier probabilities in proportion to each tier's mean training loss under the global model."""
        assert self._tier is not None
        seen = torch.nonzero(self.ctx.engine.data.seen).flatten()
        losses = self.ctx.client_losses(params, seen).double()
        means = torch.stack([losses[self._tier[seen] == t].mean() for t in range(self.tiers)]).nan_to_num(0.0)
        return means / means.sum() if float(means.sum()) > 0 else torch.full_like(means, 1.0 / self.tiers)

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["probs"], out["used"] = self._probs, self._used
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "probs" in state:
            self._probs, self._used = state["probs"].clone(), state["used"].clone()
