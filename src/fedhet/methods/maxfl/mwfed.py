"""MW-Fed, after Blum et al. (ICML 2021), adapted to neural-network FL as MaxFL's baseline (§5).

The MaxFL paper describes MW-Fed only as "clients sending higher weights to the server and performing more
local updates" to incentivise participation, with no further detail. Our adaptation (documented choice):
the server keeps a multiplicative weight v_k per client (v_k = 1 at the start); after a round, each participant
whose requirement is unmet (reported F_k(w) ≥ ρ_k at the received model) has v_k ← v_k · exp(η_mw). The cohort
is aggregated with p_k = v_k / Σ_{j∈S} v_j, and, with ``scale_steps``, client k takes
τ_k = clip(round(τ · v_k / mean_{j∈S} v_j), 1, max_step_factor · τ) local steps.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.requirements import UsesRequirements
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, by_client, weighted_update


def multiplicative_update(weights: Tensor, unmet: Tensor, rate: float) -> Tensor:
    """v_k ← v_k · exp(rate · 𝕀[unmet_k])."""
    return weights * torch.exp(rate * unmet.float())


def scaled_steps(steps: int, weights: Tensor, max_factor: float) -> Tensor:
    """τ_k = clip(round(τ · v_k / mean v), 1, max_factor · τ)."""
    raw = torch.round(steps * weights / weights.mean()).long()
    return raw.clamp(1, max(1, int(max_factor * steps)))


@STRATEGIES.register
class MWFed(Strategy, UsesRequirements):
    name: ClassVar[str] = "mwfed"
    description: ClassVar[str] = "multiplicative weights for clients with unmet requirements (after Blum et al. 2021)"
    rate: float = Field(0.1, ge=0, description="η_mw: log-weight gained per round with an unmet requirement")
    scale_steps: bool = True
    max_step_factor: float = Field(3.0, ge=1)

    _weights: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0))

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._weights = torch.ones(ctx.num_clients)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        if self.scale_steps and len(clients):
            plan.steps = scaled_steps(self.ctx.local.steps, self._weights[clients], self.max_step_factor)
        losses = self.ctx.client_losses(global_params, clients)
        self._unmet = by_client(losses >= self.requirements.rho[clients], clients, self.ctx.num_clients)
        return plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        v = self._weights[result.clients]
        new = self.server_step(global_params, weighted_update(result.updates(global_params), v / v.sum()))
        self._weights[result.clients] = multiplicative_update(v, self._unmet[result.clients], self.rate)
        return new

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "weights": self._weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._weights = state["weights"]
