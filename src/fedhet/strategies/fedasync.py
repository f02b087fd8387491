"""FedAsync (Xie, Koyejo, Gupta, 2019, Algorithm 1): asynchronous federated optimisation.

Each update is applied as soon as it arrives: w ← (1 − α_t) w + α_t w_k with α_t = α · s(t − τ), where w_k is the
client's local model trained from version τ and s a staleness function (`staleness_weight`: constant,
polynomial (t − τ + 1)^(−a), or hinge). C clients train at once. The paper's settings: α ∈ {0.6, 0.8, 0.9},
polynomial a = 0.5, hinge a = 10, b = 4.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.asynchronous import AsynchronousStrategy, Staleness, staleness_weight
from fedhet.strategies.base import STRATEGIES


def fedasync_step(global_params: Tensor, local: Tensor, alpha: float) -> Tensor:
    """(1 − α) w + α w_k (FedAsync's update with mixing weight α = α_t)."""
    return (1 - alpha) * global_params + alpha * local


@STRATEGIES.register
class FedAsync(AsynchronousStrategy):
    """w ← (1 − α s(t − τ)) w + α s(t − τ) w_k for each update as it arrives."""

    name: ClassVar[str] = "fedasync"
    description: ClassVar[str] = "asynchronous: each update mixed in on arrival, by staleness (Xie et al. 2019)"
    concurrency: int = Field(10, ge=1, description="C: clients training at once")
    alpha: float = Field(0.6, gt=0, le=1, description="α: the mixing weight of a fresh update")
    staleness: Staleness = Field("polynomial", description="s: constant, polynomial or hinge")
    a: float = Field(0.5, ge=0, description="a of the polynomial (t − τ + 1)^(−a) or hinge s (paper: 0.5; 10)")
    b: float = Field(4.0, ge=0, description="b of the hinge: no discount up to this staleness (paper: 4)")

    @property
    def buffer(self) -> int:
        return 1

    def aggregate_buffer(
        self, version: int, global_params: Tensor, result: LocalResult, starts: Tensor, staleness: Tensor
    ) -> Tensor:
        alpha = self.alpha * float(staleness_weight(staleness[:1], self.staleness, self.a, self.b)[0])
        return fedasync_step(global_params, result.params[0], alpha)
