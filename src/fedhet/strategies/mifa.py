"""MIFA (Gu, Huang, Zhang, Huang, NeurIPS 2021, Algorithm 1): memory-augmented impatient federated averaging.

Clients drop in and out arbitrarily (any availability process). The server remembers each client's latest update
Δ_k = w_τ − w_k (from the last round τ it took part in) and steps along the average of the remembered updates of
*all* clients that have taken part so far, w ← w − η_g (1/N) Σ_k Δ_k, instead of the average of this round's only:
an unavailable client keeps contributing its last update, so clients that are rarely online are not forgotten.
The paper averages over every client (N: all of them, updates of clients not yet seen count as 0); with
``warm_start`` the average runs over the clients seen so far. Memory: one update of the model's size per client.

With a decaying local learning rate (``schedules.local_lr``), Algorithm 1 remembers each update divided by the
learning rate η_τ it was made with, G_k = Δ_k / η_τ, and steps along η_t times their average: a remembered update
counts as Δ_k · η_t / η_τ, so a stale one shrinks with the schedule as a fresh one does (with a constant rate the
factor is 1 and the update is the remembered Δ_k itself).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import STRATEGIES, Strategy


@STRATEGIES.register
class MIFA(Strategy):
    """w ← w − η_g · mean over clients of each one's latest update (kept for clients offline this round)."""

    name: ClassVar[str] = "mifa"
    description: ClassVar[str] = "the average of every client's latest update, offline ones too (Gu et al. 2021)"
    warm_start: bool = Field(False, description="average over the clients seen so far instead of all of them")
    _memory: Tensor | None = PrivateAttr(None)  # (K, P) each client's latest update (0 before its first)
    _seen: Tensor | None = PrivateAttr(None)  # (K,) bool
    _lrs: Tensor | None = PrivateAttr(None)  # (K,) float64: the local learning rate of each remembered update

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        k = self.ctx.num_clients
        if self._memory is None or self._seen is None or self._lrs is None:
            self._memory = torch.zeros(k, len(global_params))
            self._seen = torch.zeros(k, dtype=torch.bool)
            self._lrs = torch.full((k,), float("nan"), dtype=torch.float64)
        lr = self.ctx.local.lr  # η_t, the round's (scheduled) local learning rate
        self._memory[result.clients] = result.updates(global_params)
        self._seen[result.clients] = True
        self._lrs[result.clients] = lr
        count = int(self._seen.sum()) if self.warm_start else int(self.ctx.engine.data.seen.sum())
        scale = torch.where(torch.isnan(self._lrs), 1.0, lr / self._lrs)  # η_t / η_τ (1 for clients not seen)
        direction = scale.to(self._memory.dtype) @ self._memory / max(count, 1)
        return self.server_step(global_params, direction)

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        if self._memory is not None and self._seen is not None:
            out["memory"], out["seen"], out["lrs"] = self._memory, self._seen, self._lrs
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "memory" in state:
            self._memory, self._seen = state["memory"].clone(), state["seen"].clone()
            lrs = state.get("lrs")  # a checkpoint from before the rescaling: the updates count as they are
            self._lrs = lrs.clone() if lrs is not None else torch.full((len(self._seen),), float("nan"))
