"""MIFA (Gu, Huang, Zhang, Huang, NeurIPS 2021, Algorithm 1): memory-augmented impatient federated averaging.

Clients drop in and out arbitrarily (any availability process). The server remembers each client's latest update
Δ_k = w_τ − w_k (from the last round τ it took part in) and steps along the average of the remembered updates of
*all* clients that have taken part so far, w ← w − η_g (1/N) Σ_k Δ_k, instead of the average of this round's only:
an unavailable client keeps contributing its last update, so clients that are rarely online are not forgotten.
The paper averages over every client (N: all of them, updates of clients not yet seen count as 0); with
``warm_start`` the average runs over the clients seen so far. Memory: one update of the model's size per client.
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

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        k = self.ctx.num_clients
        if self._memory is None or self._seen is None:
            self._memory = torch.zeros(k, len(global_params))
            self._seen = torch.zeros(k, dtype=torch.bool)
        self._memory[result.clients] = result.updates(global_params)
        self._seen[result.clients] = True
        count = int(self._seen.sum()) if self.warm_start else int(self.ctx.engine.data.seen.sum())
        direction = self._memory.sum(0) / max(count, 1)
        return self.server_step(global_params, direction)

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        if self._memory is not None and self._seen is not None:
            out["memory"], out["seen"] = self._memory, self._seen
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "memory" in state:
            self._memory, self._seen = state["memory"].clone(), state["seen"].clone()
