"""FedAsync (Xie, Koyejo, Gupta, 2019, Algorithm 1): asynchronous federated optimisation.

Each update is applied as soon as it arrives: x_t ← (1 − α_t) x_{t−1} + α_t x_new with α_t = α · s(t − τ)
(Algorithm 1, the updater), where x_new is the client's local model trained from x_τ and s a staleness function
(`fedhet.strategies.staleness`: constant, polynomial (t − τ + 1)^(−a), hinge, or a plugin's). C clients train at
once. The paper's
settings: α ∈ {0.6, 0.8, 0.9}, polynomial a = 0.5, hinge a = 10, b = 4.

The paper's t is the version the update *makes*, so t − τ = lag + 1, where the lag (what metrics.csv's
``staleness`` reports, `fedhet.strategies.asynchronous`) counts the versions made while the client trained: a
fresh update (lag 0) has t − τ = 1 and is mixed in with α s(1) (polynomial: α / 2^a), not α.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, model_validator
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.asynchronous import AsynchronousStrategy
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.staleness import Polynomial, StalenessFunction, build_staleness


def fedasync_step(global_params: Tensor, local: Tensor, alpha: float) -> Tensor:
    """(1 − α) w + α w_k (FedAsync's update with mixing weight α = α_t)."""
    return (1 - alpha) * global_params + alpha * local


@STRATEGIES.register
class FedAsync(AsynchronousStrategy):
    """w ← (1 − α s(t − τ)) w + α s(t − τ) w_k for each update as it arrives (t − τ = its lag + 1)."""

    name: ClassVar[str] = "fedasync"
    description: ClassVar[str] = "asynchronous: each update mixed in on arrival, by staleness (Xie et al. 2019)"
    concurrency: int = Field(10, ge=1, description="C: clients training at once")
    alpha: float = Field(0.6, gt=0, le=1, description="α: the mixing weight of a fresh update")
    staleness: str | dict[str, Any] = Field(
        "polynomial", description="s: constant, polynomial, hinge (fedhet list staleness), or {name: ..., ...}"
    )
    a: float = Field(
        0.5, ge=0, allow_inf_nan=False, description="a of the polynomial (t − τ + 1)^(−a) or hinge s (paper: 0.5; 10)"
    )
    b: float = Field(
        4.0, ge=0, allow_inf_nan=False, description="b of the hinge: no discount while t − τ ≤ b (paper: 4)"
    )
    _function: StalenessFunction = PrivateAttr(default_factory=Polynomial)

    @model_validator(mode="after")
    def _staleness_function(self) -> FedAsync:
        """s as a component: a named polynomial or hinge takes this strategy's a and b."""
        self._function = build_staleness(self.staleness, "algorithm.staleness", a=self.a, b=self.b)
        return self

    @property
    def buffer(self) -> int:
        return 1

    def aggregate_buffer(
        self, version: int, global_params: Tensor, result: LocalResult, starts: Tensor, staleness: Tensor
    ) -> Tensor:
        lag = staleness[:1]
        alpha = self.alpha * float(self._function.weight(lag + 1)[0])  # s(t − τ)
        return fedasync_step(global_params, result.params[0], alpha)
