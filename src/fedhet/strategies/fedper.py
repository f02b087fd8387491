"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, 2019) and LG-FedAvg (Liang et al., 2020): a model split into
a shared part the server averages and a personal part each client keeps.

FedPer shares the base layers and keeps the personalisation layers (the head, by default) on the clients; every
client trains all its layers together in each round from (shared part of w^t, its own personal part), and the
server averages the shared part as FedAvg does (`fedhet.engine.personal`: the personal coordinates come back
unchanged). LG-FedAvg is the mirror image: local representations (the body), a global head.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.engine.personal import Personal, parameter_names
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import FedAvg


@STRATEGIES.register
class FedPer(FedAvg):
    """FedAvg on the shared parameters; the ``personal`` ones stay on each client."""

    name: ClassVar[str] = "fedper"
    description: ClassVar[str] = "FedPer: shared base layers, a personal head per client (Arivazhagan et al. 2019)"
    personal: list[str] = Field(
        default_factory=lambda: ["head"],
        min_length=1,
        description="the personal parameters: names or patterns ('head': the last layer, 'body': the others)",
    )

    @property
    def spec(self) -> Personal:
        return Personal(self.name, tuple(self.personal))

    def setup(self, ctx: ServerContext) -> None:
        """Refuse personal parameters the model does not have before anything runs (or is written)."""
        super().setup(ctx)
        parameter_names(ctx.engine.model, self.personal, f"algorithm.personal of {self.name}")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), personal=self.spec)

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=self.spec)


@STRATEGIES.register
class LGFedAvg(FedPer):
    """FedPer with the body personal and the head shared (Liang et al. 2020)."""

    name: ClassVar[str] = "lg_fedavg"
    description: ClassVar[str] = "LG-FedAvg: personal representations, a shared head (Liang et al. 2020)"
    personal: list[str] = Field(default_factory=lambda: ["body"], min_length=1, description="the personal parameters")
