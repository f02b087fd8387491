"""The config's ``deadline`` and its policies: what a synchronous round does with the clients its deadline catches.

A policy is a registered component (`DEADLINE_POLICIES`; a plugin adds one with ``@DEADLINE_POLICIES.register``),
named by ``deadline.policy`` or given with its parameters (``policy: {name: overselect, r: 0.5}``). The clock
(`fedhet.systems.clock.RoundClock`) asks it how many clients to select, how many steps each client takes given
how many fit before the deadline, and whether the round keeps only the first to finish. Torch is imported by the
methods the clock calls, so that the config validates without it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field, field_validator

from fedhet.registry import Component, Registry, Settings

if TYPE_CHECKING:
    from torch import Tensor


class DeadlinePolicy(Component):
    """What a round does with the clients that cannot finish by its deadline."""

    drops_clients: ClassVar[bool] = True
    """Whether the deadline can leave a selected client out of a round (what client-level DP's sampling sees)."""
    cuts_at_deadline: ClassVar[bool] = True
    """Whether the deadline cuts the clients' work: a round that left someone out then lasts the deadline."""

    def cohort(self, m: int) -> int:
        """Clients the server selects for the run's m updates a round."""
        return m

    def keep(self, m: int) -> int | None:
        """How many of the selected clients' updates the round keeps, the first to arrive (None: all in time)."""
        return None

    def steps(self, planned: Tensor, fits: Tensor) -> Tensor:
        """The steps each client takes when `planned` were asked of it and `fits` fit before the deadline (0:
        left out of the round)."""
        raise NotImplementedError


DEADLINE_POLICIES: Registry[DeadlinePolicy] = Registry("deadline policy")


@DEADLINE_POLICIES.register
class Drop(DeadlinePolicy):
    name: ClassVar[str] = "drop"
    description: ClassVar[str] = "clients that cannot finish in time are left out (they do no work)"

    def steps(self, planned: Tensor, fits: Tensor) -> Tensor:
        import torch

        return torch.where(fits >= planned, planned, torch.zeros_like(planned))


@DEADLINE_POLICIES.register
class Partial(DeadlinePolicy):
    name: ClassVar[str] = "partial"
    description: ClassVar[str] = "each client takes the steps that fit before the deadline (none fit: left out)"
    drops_clients: ClassVar[bool] = False

    def steps(self, planned: Tensor, fits: Tensor) -> Tensor:
        import torch

        return torch.minimum(planned, fits)


@DEADLINE_POLICIES.register
class Overselect(DeadlinePolicy):
    name: ClassVar[str] = "overselect"
    description: ClassVar[str] = "select (1 + r)·m clients, keep the m that finish first (Bonawitz et al. 2019)"
    cuts_at_deadline: ClassVar[bool] = False
    r: float = Field(0.3, ge=0, description="r: select ⌈(1 + r)·m⌉ clients")

    def cohort(self, m: int) -> int:
        return math.ceil((1 + self.r) * m)

    def keep(self, m: int) -> int | None:
        return m

    def steps(self, planned: Tensor, fits: Tensor) -> Tensor:
        return planned


class Deadline(Settings):
    """A synchronous round's deadline (the config's ``deadline``; none: every round waits for its last client)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    seconds: float | None = Field(None, gt=0, description="seconds after a round starts (none: wait for everyone)")
    policy: str | dict[str, Any] = Field(
        "drop", description="drop the late clients, take their partial work, or overselect (fedhet list deadlines)"
    )
    overselect: float = Field(0.3, ge=0, description="r: overselect selects ⌈(1 + r)·m⌉ clients, keeps the first m")

    @field_validator("policy")
    @classmethod
    def _known(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        DEADLINE_POLICIES.build(value, where="deadline.policy")  # an unknown name or parameter: refused here
        return value

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else str(self.policy.get("name"))

    @property
    def rule(self) -> DeadlinePolicy:
        """The policy as a component (a named ``overselect`` takes its r from ``deadline.overselect``)."""
        if self.policy == "overselect":
            return Overselect(r=self.overselect)
        return DEADLINE_POLICIES.build(self.policy, where="deadline.policy")
