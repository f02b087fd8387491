"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1): personalisation with Moreau envelopes.

Clients run `PFedMeRule`, a local rule (K inner steps on the personal problem, then a step of the local
model towards the personal one); the server takes w ← (1 − β) w + β · (1/|S|) Σ_k w_k, i.e. FedAvg's uniform
step with server learning rate β (``server_lr``, default 1 as in the paper's experiments with β = 1 or 2).

A client's personalised model is θ̂(w) (eq. 7), the personal problem solved from the global model on a mini-batch
of its training data: one step of `PFedMeRule` with learning rate 1/λ, w − (1/λ)·λ(w − θ̂) = θ̂.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.engine.rules import RULES, GradFn, LocalRule, Tree
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@RULES.register
class PFedMeRule(LocalRule):
    """pFedMe's local step (Dinh, Tran, Nguyen 2020, Algorithm 1, eqs. 7–8) on one mini-batch D:

        θ̂ ≈ argmin_θ f(θ; D) + (λ/2)‖θ − w‖²   (K gradient steps of size `inner_lr` from θ = w)
        d = λ (w − θ̂)                           (so SGD takes w ← w − η λ (w − θ̂), η the local learning rate)

    θ starts from the current local model at every step (stateless clients; the authors' code warm-starts it
    from the previous step's θ̂).
    """

    name: ClassVar[str] = "pfedme"
    description: ClassVar[str] = "pFedMe's Moreau-envelope step (set by the pfedme strategy)"
    lam: float
    inner_steps: int
    inner_lr: float

    def direction(self, grad_fn: GradFn, w: Tree) -> tuple[Tree, Tensor]:
        theta, loss = dict(w), None
        for _ in range(self.inner_steps):
            g, value = grad_fn(theta, 0)
            loss = value if loss is None else loss
            theta = {n: theta[n] - self.inner_lr * (g[n] + self.lam * (theta[n] - w[n])) for n in w}
        assert loss is not None
        return {n: self.lam * (w[n] - theta[n]) for n in w}, loss


@STRATEGIES.register
class PFedMe(FedAvg):
    """Local w ← w − η λ (w − θ̂(w)), θ̂ ≈ argmin f(θ; D) + (λ/2)‖θ − w‖² (eqs. 7–8); FedAvg aggregation."""

    name: ClassVar[str] = "pfedme"
    description: ClassVar[str] = "pFedMe: Moreau-envelope personalisation (Dinh et al. 2020)"
    weighting: Literal["samples", "uniform"] = "uniform"
    lam: float = Field(15.0, gt=0, description="λ: regularisation towards the local model")
    inner_steps: int = Field(5, ge=1, description="K: gradient steps on the personal problem")
    inner_lr: float = Field(0.01, gt=0, description="personal learning rate of the inner steps")

    @property
    def rule(self) -> PFedMeRule:
        return PFedMeRule(lam=self.lam, inner_steps=self.inner_steps, inner_lr=self.inner_lr)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), rule=self.rule)

    def personalization(self, clients: Tensor) -> LocalPlan:
        """θ̂(w): the personal problem (eq. 7) solved from the global model on one mini-batch."""
        batch = self.ctx.local.batch_size
        return LocalPlan.uniform(clients, 1, 1 / self.lam, batch, rule=self.rule, stream="personal-eval")
