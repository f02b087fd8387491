"""Who can take part in a round: the availability interface and the simple processes."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import ConfigDict, Field, PrivateAttr, field_validator
from torch import Tensor

from fedhet.engine.protocol import EngineProtocol
from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry
from fedhet.seeding import RunAware


class Availability(Component, RunAware):
    """A process over rounds that says which clients are online.

    ``available(round_)`` is called once per round, in order; stateful processes (Markov chains) keep their
    state in private attributes and expose it through ``state_dict`` for exact resumption. After `setup`,
    `num_clients` and `seed` are the run's, and ``self.rng(purpose, round_)`` draws from the run's seed.
    """

    model_config = ConfigDict(extra="forbid", frozen=False)
    _num_clients: int | None = PrivateAttr(None)
    _seed: int | None = PrivateAttr(None)

    def setup(self, num_clients: int, seed: int) -> None:
        """Called once before the first round (an override calls ``super().setup(num_clients, seed)`` first)."""
        self._num_clients, self._seed = num_clients, seed

    def available(self, round_: int) -> Tensor:
        """A (K,) bool mask of the clients online in `round_`."""
        raise NotImplementedError

    def always_in(self, clients: Tensor) -> None:
        """Clients (a (K,) bool mask) that are in the pool of every round whatever the process would say:
        attackers that always opt in (`fedhet.attacks`), for processes whose pool clients join themselves
        (MaxFL's appeal-driven participation). Default: ignored."""
        del clients

    def observe(self, round_: int, engine: EngineProtocol, params: Tensor) -> None:
        """Told the global model after round `round_` (0-based); processes whose availability depends on
        the model (MaxFL's appeal-driven opt-in/out) update themselves here."""

    def saved_arrays(self) -> dict[str, np.ndarray]:
        """Per-client arrays that describe the process (its true parameters), saved in the run folder's
        ``availability.npz`` beside the strategy's participation log; default: none."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


AVAILABILITY: Registry[Availability] = Registry("availability")


@AVAILABILITY.register
class Always(Availability):
    """Every client is online in every round."""

    name: ClassVar[str] = "always"
    description: ClassVar[str] = "every client is available in every round"

    def available(self, round_: int) -> Tensor:
        return torch.ones(self.num_clients, dtype=torch.bool)


@AVAILABILITY.register
class Bernoulli(Availability):
    """Client k is online independently in each round with probability p_k (one p for all, or a list)."""

    name: ClassVar[str] = "bernoulli"
    description: ClassVar[str] = "each client is online independently with probability p each round"
    p: float | list[float] = Field(0.5, description="probability of being online (scalar or one per client)")

    @field_validator("p")
    @classmethod
    def _in_unit_interval(cls, p: float | list[float]) -> float | list[float]:
        values = p if isinstance(p, list) else [p]
        if not all(0.0 <= v <= 1.0 for v in values):  # also refuses NaN
            raise ValueError("every probability must lie in [0, 1]")
        return p

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        if isinstance(self.p, list) and len(self.p) != num_clients:
            raise ConfigError(
                f"availability.p has {len(self.p)} probabilities; give one, or one per client ({num_clients})"
            )

    def _probabilities(self) -> Tensor:
        p = torch.as_tensor(self.p, dtype=torch.float64).expand(self.num_clients)
        if len(p) != self.num_clients or bool(((p < 0) | (p > 1)).any()):
            raise ValueError(f"availability.p needs {self.num_clients} probabilities in [0, 1]")
        return p

    def available(self, round_: int) -> Tensor:
        u = torch.rand(self.num_clients, generator=self.torch_rng("availability", round_), dtype=torch.float64)
        return u < self._probabilities()
