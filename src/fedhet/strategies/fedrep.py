"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Algorithm 1): a shared representation and a
personal head per client, trained in turn.

Each selected client first fits its head h_k to the received representation φ^t (τ_h steps, the body frozen),
then updates the representation with its new head fixed (τ steps, the head frozen); the server averages the
representations. The heads stay on the clients (`fedhet.engine.personal`): a client's first head is the model's
initial one. τ is the run's local steps (or epochs); τ_h = ``head_factor`` · τ (the paper's experiments: 10
epochs for the head, 1 for the representation). With no personal parameters FedRep is FedAvg.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.personal import Personal, parameter_names
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Train
from fedhet.strategies.fedavg import FedAvg

MAX_HEAD_FACTOR = 1000.0  # τ_h / τ at most (the paper's experiments: 10)


@STRATEGIES.register
class FedRep(FedAvg):
    """Per client: τ_h head steps (body frozen), then τ body steps (head frozen); FedAvg of the bodies."""

    name: ClassVar[str] = "fedrep"
    description: ClassVar[str] = "FedRep: a shared representation, personal heads trained first (Collins et al. 2021)"
    personal: list[str] = Field(
        default_factory=lambda: ["head"], description="the personal parameters (the head): names or patterns"
    )
    head_factor: float = Field(
        10.0, gt=0, le=MAX_HEAD_FACTOR, allow_inf_nan=False, description="τ_h / τ: head steps per representation step"
    )

    @property
    def spec(self) -> Personal:
        return Personal(self.name, tuple(self.personal))

    def setup(self, ctx: ServerContext) -> None:
        """Refuse, before anything runs, personal parameters the model does not have and head steps that are too
        many (τ_h = ⌈head_factor · τ⌉ for the cohort at once)."""
        super().setup(ctx)
        if self.personal:
            self._heads()
            ctx.check_steps(
                f"algorithm.head_factor {self.head_factor:g} × the local steps",
                math.ceil(ctx.most_local_steps() * self.head_factor),
                ctx.clients_per_round,
            )

    def _heads(self) -> list[str]:
        return parameter_names(self.ctx.engine.model, self.personal, f"algorithm.personal of {self.name}")

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        body = self.configure(round_, clients, global_params)
        if not self.personal:
            return train(body)
        heads = self._heads()
        shared = tuple(n for n in self.ctx.engine.model.names if n not in heads)
        head_steps = torch.ceil(body.steps.double() * self.head_factor).long()
        train(replace(body, steps=head_steps, personal=self.spec, frozen=shared, stream="fedrep-head"))
        return train(replace(body, personal=self.spec, frozen=tuple(heads), phase=1))

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        if not self.personal:
            return None
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=self.spec)
