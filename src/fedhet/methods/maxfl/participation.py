"""Appeal-driven participation (MaxFL §5, "flexible participation").

During the first ``mandatory_rounds`` every client is available. After that a client is in the pool only if
the current global model appeals to it (F_k(w) < ρ_k, on its training data by default), re-checked after every
round, so clients opt out and back in. The server then samples m clients from the pool; when fewer than m are
in it, all of them train (the cohort is smaller, nobody is drafted from outside the pool); when none is, the round
trains nobody and the model stays as it is. An empty pool is therefore final: the model no longer changes, so no
client's appeal changes either, and the run goes on to its last round with the model it had (``available`` and
``participants`` are 0 in metrics.csv). The pool size is logged every round (``available``).

Malicious clients opt in like everyone else, on their honest training loss (they lie only in the losses they
report), unless the attack says ``opt_in: always``: then they are in the pool after every round whatever their
loss (`fedhet.attacks.base.Attack.opted_in`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.availability.base import AVAILABILITY, Availability
from fedhet.engine.protocol import EngineProtocol
from fedhet.requirements import UsesRequirements


@AVAILABILITY.register
class AppealParticipation(Availability, UsesRequirements):
    name: ClassVar[str] = "appeal"
    description: ClassVar[str] = "all clients for the first rounds, then only those the global model appeals to"
    mandatory_rounds: int = Field(10, ge=0)
    split: Literal["train", "test"] = "train"

    _pool: Tensor | None = PrivateAttr(None)
    _always: Tensor | None = PrivateAttr(None)  # clients in the pool whatever their loss (attackers)

    def available(self, round_: int) -> Tensor:
        if round_ < self.mandatory_rounds or self._pool is None:
            return torch.ones(self.num_clients, dtype=torch.bool)
        return self._pool.clone()

    def observe(self, round_: int, engine: EngineProtocol, params: Tensor) -> None:
        if round_ + 1 >= self.mandatory_rounds:
            losses = engine.scores(params, self.split).loss
            self._pool = losses < self.requirements.rho
            if self._always is not None and bool(self._always.any()):
                self._pool = self._pool | self._always.to(self._pool.device)

    def always_in(self, clients: Tensor) -> None:
        self._always = clients.clone() if bool(clients.any()) else None

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self._pool}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pool = state["pool"]
