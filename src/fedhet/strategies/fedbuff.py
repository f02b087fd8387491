"""FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, AISTATS 2022, Algorithm 1): buffered
asynchronous aggregation.

The server keeps C clients training; each arriving update Δ_k = w_τ − w_k (from the version τ it started from) is
scaled by s(t − τ) = 1/√(1 + t − τ) and added to a buffer, and once K updates are in it the server takes
w ← w − η_g (1/K) Σ_k s_k Δ_k and empties it. With K = C = m and every client as fast as every other (no
staleness), a round is FedAvg's with uniform weights.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, model_validator
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.asynchronous import AsynchronousStrategy, buffered_mean
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.staleness import SquareRoot, StalenessFunction, build_staleness


@STRATEGIES.register
class FedBuff(AsynchronousStrategy):
    """w ← w − η_g (1/K) Σ s(t − τ_k) Δ_k each time K updates have arrived; C clients train at once."""

    name: ClassVar[str] = "fedbuff"
    description: ClassVar[str] = "buffered asynchronous aggregation: a step every K updates (Nguyen et al. 2022)"
    concurrency: int = Field(100, ge=1, description="C: clients training at once (the paper: 100 to 1,000)")
    buffer_size: int = Field(10, ge=1, description="K: updates per server step (the paper's default: 10)")
    staleness_scaling: str | dict[str, Any] = Field(
        "sqrt",
        description="s(t − τ): sqrt = 1/√(1 + t − τ) (Algorithm 1), none = 1, or a staleness function (fedhet list "
        "staleness) of the version lag",
    )
    _function: StalenessFunction = PrivateAttr(default_factory=SquareRoot)

    @model_validator(mode="after")
    def _staleness_function(self) -> FedBuff:
        scaling = "constant" if self.staleness_scaling == "none" else self.staleness_scaling
        self._function = build_staleness(scaling, "algorithm.staleness_scaling")
        return self

    @property
    def buffer(self) -> int:
        return self.buffer_size

    def aggregate_buffer(
        self, version: int, global_params: Tensor, result: LocalResult, starts: Tensor, staleness: Tensor
    ) -> Tensor:
        updates = starts - result.params
        weights = self._function.weight(staleness)
        return self.server_step(global_params, buffered_mean(updates, weights))
