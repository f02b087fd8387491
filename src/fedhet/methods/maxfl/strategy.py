"""MaxFL (Cho et al., TMLR, Algorithm 1): maximise global-model appeal.

Clients weigh their update by q_k = σ(F_k(w) − ρ_k)(1 − σ(F_k(w) − ρ_k)) (eq. 4; plain σ as in Algorithm 1's
line 8 is the ``weight: sigmoid`` switch), computed at the received model on the full local training set,
and the server takes w ← w − η_g / (Σ_k q_k + ε) · Σ_k q_k Δ_k (eq. 6) with Δ_k = w − w_k (line 11's sign).
Clients are stateless. With ``finetune_steps > 0`` the loss is measured after that many local steps from
w (MaxFL + fine-tuning, §3), and those tuned models are the clients' personalised models (``personal_eval``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.requirements import UsesRequirements
from fedhet.strategies.base import STRATEGIES, Strategy, by_client, weighted_update


def maxfl_weights(losses: Tensor, rho: Tensor, kind: Literal["bell", "sigmoid"] = "bell") -> Tensor:
    """q_k from the appeal gap F_k − ρ_k: σ(1 − σ) (eq. 4, default) or σ (Algorithm 1, line 8)."""
    s = torch.sigmoid(losses.double() - rho.double())
    return (s * (1 - s) if kind == "bell" else s).float()


def maxfl_direction(updates: Tensor, q: Tensor, eps: float) -> Tensor:
    """Σ q_k Δ_k / (Σ q_k + ε): the server takes w − η_g times this (eq. 6)."""
    return weighted_update(updates, q) / (float(q.sum()) + eps)


@STRATEGIES.register
class MaxFL(Strategy, UsesRequirements):
    """Weights clients near their requirement most; adaptive server step η_g / (Σq + ε)."""

    name: ClassVar[str] = "maxfl"
    description: ClassVar[str] = "maximise global-model appeal with sigmoid-gap weights (Cho et al., MaxFL)"
    eps: float = Field(1e-3, gt=0, description="ε in the adaptive server learning rate η_g / (Σ q_k + ε)")
    weight: Literal["bell", "sigmoid"] = "bell"
    finetune_steps: int = Field(0, ge=0, description="local steps before measuring F_k (MaxFL + fine-tuning)")

    _q: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0))  # (K,) q_k of this round's cohort, else NaN
    _cohort: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def client_weights(self, round_: int, clients: Tensor, global_params: Tensor) -> Tensor:
        """q_k of `clients` at the received model (losses as the clients report them)."""
        rho = self.requirements.rho[clients]
        if self.finetune_steps == 0:
            losses = self.ctx.client_losses(global_params, clients)
        else:
            plan = self.finetuning(clients, "maxfl-ft")
            honest = self.ctx.engine.personal_scores(global_params, plan, round_, "train").loss
            losses = self.ctx.attack.report_losses(clients, honest)
        return maxfl_weights(losses, rho, self.weight)

    def finetuning(self, clients: Tensor, stream: str) -> LocalPlan:
        """``finetune_steps`` local SGD steps from the global model (MaxFL + fine-tuning, §3)."""
        local = self.ctx.local
        return LocalPlan.uniform(clients, self.finetune_steps, local.lr, local.batch_size, stream=stream)

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        return self.finetuning(clients, "personal-eval") if self.finetune_steps else None

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        self._q = by_client(self.client_weights(round_, clients, global_params), clients, self.ctx.num_clients)
        self._cohort = clients
        return super().configure(round_, clients, global_params)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        self._cohort = result.clients  # the clients that answered (a lost Flower node drops some)
        q = self._q[result.clients]
        return self.server_step(global_params, maxfl_direction(result.updates(global_params), q, self.eps))

    def aggregation_weights(self, round_: int, result: LocalResult) -> Tensor:
        """q_k / (Σ q + ε): eq. (6)'s weights of the updates in the direction."""
        q = self._q[result.clients]
        return q / (float(q.sum()) + self.eps)

    def round_metrics(self) -> dict[str, float]:
        return {"maxfl_q_sum": float(self._q[self._cohort].sum())} if len(self._cohort) else {}
