"""FedProx (Li et al., MLSys 2020, eq. 2): FedAvg whose local objective adds (μ/2)‖w − w_global‖²."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@STRATEGIES.register
class FedProx(FedAvg):
    """Local gradient ∇F_k(w) + μ (w − w_global); aggregation as FedAvg."""

    name: ClassVar[str] = "fedprox"
    description: ClassVar[str] = "FedAvg with a proximal term mu/2 ||w - w_global||^2 (Li et al. 2020)"
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return super().configure(round_, clients, global_params).with_terms(Proximal(mu=self.mu))
