"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1): personalisation with Moreau envelopes.

Clients run `fedhet.engine.rules.PFedMeRule` (K inner steps on the personal problem, then a step of the local
model towards the personal one); the server takes w ← (1 − β) w + β · (1/|S|) Σ_k w_k, i.e. FedAvg's uniform
step with server learning rate β (``server_lr``, default 1 as in the paper's experiments with β = 1 or 2).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.engine.rules import PFedMeRule
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@STRATEGIES.register
class PFedMe(FedAvg):
    """Local w ← w − η λ (w − θ̂(w)), θ̂ ≈ argmin f(θ; D) + (λ/2)‖θ − w‖² (eqs. 7–8); FedAvg aggregation."""

    name: ClassVar[str] = "pfedme"
    description: ClassVar[str] = "pFedMe: Moreau-envelope personalisation (Dinh et al. 2020)"
    weighting: Literal["samples", "uniform"] = "uniform"
    lam: float = Field(15.0, gt=0, description="λ: regularisation towards the local model")
    inner_steps: int = Field(5, ge=1, description="K: gradient steps on the personal problem")
    inner_lr: float = Field(0.01, gt=0, description="personal learning rate of the inner steps")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        plan.rule = PFedMeRule(self.lam, self.inner_steps, self.inner_lr)
        return plan
