"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1): fair and robust federated learning through
personalisation.

Each selected client k updates the global model as FedAvg does (w_k from w^t) and, from the same w^t, its own
personal model v_k by as many steps of

    v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t))      (Algorithm 1, line 7; the objective h_k of eq. 2)

kept on the client (`fedhet.engine.personal`; a client's first v_k is the model's initialisation). The server
averages the w_k. λ = 0 is local training alone; λ → ∞ is FedAvg's global model. The personalised model of a
client is its v_k.

Both trainings of a round draw the same mini-batches (the same stream: the paper does not say whether v_k's
mini-batches are w_k's), so the dense backend's second training reuses what the first computed from them
(`fedhet.engine.reuse`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.engine.objective import Proximal
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, Train
from fedhet.strategies.fedavg import FedAvg

PERSONAL = Personal("ditto")


@STRATEGIES.register
class Ditto(FedAvg):
    """FedAvg for w; each selected client also takes v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w)) steps (eq. 2)."""

    name: ClassVar[str] = "ditto"
    description: ClassVar[str] = "Ditto: a personal model per client, pulled towards the global one (Li et al. 2021)"
    lam: float = Field(0.1, ge=0, description="λ: how strongly each personal model is pulled towards the global")

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        plan = self.configure(round_, clients, global_params)
        result = train(plan)
        own = tuple(t for t in plan.terms if t.name != Proximal.name)  # λ's pull replaces any proximal term
        train(replace(plan, terms=(*own, Proximal(mu=self.lam)), personal=PERSONAL, phase=1))
        return result

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=PERSONAL)
