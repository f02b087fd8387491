"""Local training alone (FLGo's "standalone" baseline): every client trains its own model and nothing is shared.

Each selected client continues its own model (the model's initialisation the first time) for its local steps;
the models stay on the clients (`fedhet.engine.personal`) and the global model never changes. The personalised
model of a client is its own; a client never selected keeps the initial model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from torch import Tensor

from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, Strategy

PERSONAL = Personal("local")


@STRATEGIES.register
class LocalOnly(Strategy):
    """Each client trains its own model; no aggregation (the global model stays as initialised)."""

    name: ClassVar[str] = "local_only"
    description: ClassVar[str] = "local training alone: each client its own model, nothing shared (a baseline)"
    architectures: ClassVar[bool] = True  # each client may have its own architecture (model: architectures)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), personal=PERSONAL)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        return global_params

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=PERSONAL)
