"""The `Strategy` interface: what an algorithm decides, while the engine does the training.

A round, driven by `fedhet.experiments.runner`:

1. ``select``     — which available clients take part (default: m uniformly without replacement);
2. ``configure``  — a `LocalPlan` for them (steps, learning rates, proximal term, correction, statistics);
3. the engine trains the cohort and returns a `LocalResult`;
4. ``aggregate``  — the new global model from the local ones.

Strategies keep their state (control variates, estimates) in private attributes and expose it through
``state_dict``/``load_state_dict`` so that checkpoints resume exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.attacks.base import Attack, NoAttack
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings

__all__ = ["STRATEGIES", "LocalSettings", "ServerContext", "Strategy", "weighted_update"]
from fedhet.registry import Component, Registry
from fedhet.seeding import numpy_rng


@dataclass
class ServerContext:
    """What a strategy may use: the engine (to score models), client sizes, local settings, the seed."""

    engine: Engine
    local: LocalSettings
    seed: int
    clients_per_round: int
    attack: Attack = field(default_factory=NoAttack)

    def client_losses(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "train") -> Tensor:
        """The losses F_k(params) that `clients` report to the server (malicious ones may lie)."""
        return self.attack.report_losses(clients, self.engine.losses_at(params, clients, split))

    @property
    def num_clients(self) -> int:
        return self.engine.data.num_clients

    @property
    def train_sizes(self) -> Tensor:
        return self.engine.data.train.sizes


class Strategy(Component):
    """Base class of every algorithm; subclasses set ``name``/``description`` and override hooks."""

    model_config = ConfigDict(extra="forbid", frozen=False, arbitrary_types_allowed=True)
    server_lr: float = Field(1.0, gt=0, description="global (server) learning rate η_g")

    _ctx: ServerContext | None = PrivateAttr(None)

    @property
    def ctx(self) -> ServerContext:
        if self._ctx is None:
            raise RuntimeError(f"strategy '{self.name}' used before setup()")
        return self._ctx

    def setup(self, ctx: ServerContext) -> None:
        """Called once before the first round (and again before a resumed run loads its state)."""
        self._ctx = ctx

    def select(self, round_: int, available: Tensor) -> Tensor:
        """Sample ``min(m, #available)`` of the available clients uniformly without replacement."""
        pool = torch.nonzero(available).flatten()
        m = min(self.ctx.clients_per_round, len(pool))
        rng = numpy_rng(self.ctx.seed, "select", round_)
        chosen = rng.choice(len(pool), size=m, replace=False)
        return pool[torch.as_tensor(chosen, dtype=torch.long)].sort().values

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        """Local-training instructions; default: the run's local settings for every client."""
        local = self.ctx.local
        return LocalPlan.uniform(clients, local.steps, local.lr, local.batch_size, weight_decay=local.weight_decay)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """The next global model."""
        raise NotImplementedError

    def evaluation_params(self, params: Tensor) -> Tensor:
        """The model that is evaluated and reported after a round (default: the current global model; AFL
        reports the average of its iterates)."""
        return params

    def round_metrics(self) -> dict[str, float]:
        """Extra per-round numbers to log (e.g. the sum of MaxFL's weights)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


STRATEGIES: Registry[Strategy] = Registry("algorithm")


def weighted_update(updates: Tensor, weights: Tensor) -> Tensor:
    """Σ_k p_k Δ_k for weights p (m,) and updates Δ (m, P)."""
    return weights.to(updates.dtype) @ updates
