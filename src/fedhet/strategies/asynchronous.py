"""Asynchronous strategies: the server keeps C clients training and updates its model as their updates arrive,
without waiting for a cohort (`fedhet.experiments.asynchronous` runs them on the simulated clock).

A client dispatched when the server's model was version τ sends Δ_k = w_τ − w_k; when it arrives the server is at
version t ≥ τ, and t − τ is its *staleness* (a version lag: 0 for a fresh update; FedAsync's paper counts one
more, `fedhet.strategies.fedasync`). The server updates its model each time its buffer holds ``buffer``
updates (`aggregate_buffer`), so "rounds" of such a run count server updates.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import Strategy
from fedhet.strategies.staleness import build_staleness

Staleness = Literal["constant", "polynomial", "hinge"]


def staleness_weight(staleness: Tensor, kind: Staleness, a: float, b: float) -> Tensor:
    """s(t − τ) of FedAsync (Xie, Koyejo, Gupta 2019, §5.2) at `staleness` = the paper's t − τ (≥ 1: a version lag
    plus one, see `fedhet.strategies.fedasync`): constant 1; polynomial (t − τ + 1)^(−a); hinge 1 for t − τ ≤ b,
    else 1 / (a (t − τ − b) + 1) (the registered functions of `fedhet.strategies.staleness`)."""
    return build_staleness(kind, "staleness", a=a, b=b).weight(staleness)


class AsynchronousStrategy(Strategy):
    """Base of asynchronous strategies: ``concurrency`` clients train at once; the server takes a step each time
    ``buffer`` updates have arrived (`aggregate_buffer`)."""

    asynchronous: ClassVar[bool] = True
    concurrency: int = Field(10, ge=1, description="C: clients training at once")

    @property
    def buffer(self) -> int:
        """K: updates the server waits for before it steps."""
        raise NotImplementedError

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        raise TypeError(f"'{self.name}' is asynchronous: its updates arrive one by one (aggregate_buffer)")

    def aggregate_buffer(
        self, version: int, global_params: Tensor, result: LocalResult, starts: Tensor, staleness: Tensor
    ) -> Tensor:
        """The server's next model (version + 1) from the buffered updates: `result` rows are the clients' local
        models in arrival order, `starts` (K, P) the models they started from, `staleness` (K,) t − τ."""
        raise NotImplementedError


def buffered_mean(updates: Tensor, weights: Tensor) -> Tensor:
    """(1/K) Σ_k s_k Δ_k (FedBuff's scaled mean of K updates)."""
    return (weights.to(updates.dtype) @ updates) / max(len(updates), 1)
