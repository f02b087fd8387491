"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg whose clients take MAML steps (Algorithm 1).

The local step is `fedhet.engine.rules.PerFedAvgRule` (first-order or Hessian-free). The server averages the
local models uniformly, w ← (1/|S|) Σ_k w_k (Algorithm 1; ``weighting: samples`` weighs them by size). The
global model is what is evaluated; its personalised version is one step of size α from it, which the
fine-tuning metrics (``ft_*``) measure with the plain local step.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.engine.rules import PerFedAvgRule
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@STRATEGIES.register
class PerFedAvg(FedAvg):
    """Local w ← w − β ∇f(w − α∇f(w; D); D') (FO) or its Hessian-free correction; β is ``local.lr``."""

    name: ClassVar[str] = "perfedavg"
    description: ClassVar[str] = "Per-FedAvg: MAML local steps, first-order or Hessian-free (Fallah et al. 2020)"
    weighting: Literal["samples", "uniform"] = "uniform"
    alpha: float = Field(0.01, gt=0, description="α: step size of the personalisation step")
    hessian_free: bool = Field(False, description="HF variant (finite-difference Hessian-vector product), else FO")
    delta: float = Field(1e-3, gt=0, description="δ of the finite difference (HF only)")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        plan.rule = PerFedAvgRule(self.alpha, self.hessian_free, self.delta)
        return plan
