"""APFL (Deng, Kamani, Mahdavi, 2020, Algorithm 1): adaptive personalised federated learning.

Each client keeps a personal model v and a mixing weight α; its personalised model is the mixture
v̄ = α v + (1 − α) w. In every local step, on the step's mini-batch ξ:

    w ← w − η ∇f(w; ξ)                                   (the local copy of the global model)
    v ← v − η α ∇f(v̄; ξ),   v̄ = α v + (1 − α) w         (∇_v f(v̄) = α ∇f(v̄))
    α ← clip(α − η_α ⟨v − w, ∇f(v̄; ξ)⟩, 0, 1)           (adaptive α, ∇_α f(v̄); with ``adaptive``)

with v̄, the gradients and the α step taken at the step's starting w and v. The server averages the w as FedAvg
does. v and α stay with the client (`APFLRule`'s state); a client's first v is the global model it first
receives (w⁰ under full participation, as in the paper), its first α is ``alpha``. The personalised model that
is evaluated is α v + (1 − α) w with the current global model w.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.engine.rules import RULES, GradFn, LocalRule, Tree
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@RULES.register
class APFLRule(LocalRule):
    """APFL's local step: the direction of w is ∇f(w; ξ); v and α take their own steps (module docstring)."""

    name: ClassVar[str] = "apfl"
    description: ClassVar[str] = "APFL's personal model and mixing weight (set by the apfl strategy)"
    alpha: float = 0.5
    adaptive: bool = True
    alpha_lr: float | None = None  # η_α (default: the local learning rate)

    def state_kinds(self) -> dict[str, str]:
        return {"v": "param", "alpha": "scalar"}

    def initial_state(self, name: str, start: Tensor) -> Tensor:
        return start.clone() if name == "v" else torch.tensor(self.alpha)

    def direction(self, grad_fn: GradFn, w: Tree) -> tuple[Tree, Tensor]:
        return grad_fn(w, 0)

    def step(self, grad_fn: GradFn, w: Tree, state: dict[str, Any], lr: Tensor) -> tuple[Tree, Tensor, dict[str, Any]]:
        g, loss = grad_fn(w, 0)
        v, alpha = state["v"], state["alpha"]
        mixed = {n: alpha * v[n] + (1 - alpha) * w[n] for n in w}
        g_mixed, _ = grad_fn(mixed, 0)
        new_v = {n: v[n] - lr * alpha * g_mixed[n] for n in w}
        if self.adaptive:
            slope = sum((v[n] - w[n]).mul(g_mixed[n]).sum() for n in w)
            alpha = (alpha - (lr if self.alpha_lr is None else self.alpha_lr) * slope).clamp(0.0, 1.0)
        return g, loss, {"v": new_v, "alpha": alpha}


PERSONAL = Personal("apfl.v", fresh="global", mix="apfl.alpha")


@STRATEGIES.register
class APFL(FedAvg):
    """FedAvg of the clients' w; each client also keeps v and α (`APFLRule`), its model α v + (1 − α) w."""

    name: ClassVar[str] = "apfl"
    description: ClassVar[str] = "APFL: a personal model mixed with the global one by an adaptive α (Deng et al. 2020)"
    alpha: float = Field(0.5, ge=0, le=1, description="α: a client's first mixing weight of its personal model")
    adaptive: bool = Field(True, description="learn each client's α by gradient steps (else α stays fixed)")
    alpha_lr: float | None = Field(None, gt=0, description="η_α: α's learning rate (default: local.lr)")

    @property
    def rule(self) -> APFLRule:
        return APFLRule(alpha=self.alpha, adaptive=self.adaptive, alpha_lr=self.alpha_lr)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), rule=self.rule)

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(
            clients, 0, local.lr, local.batch_size, personal=replace(PERSONAL, mix_initial=self.alpha)
        )
