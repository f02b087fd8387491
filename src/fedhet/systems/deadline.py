"""The config's ``deadline`` settings, apart from the clock that applies them (`fedhet.systems.clock`), so that
the config validates without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedhet.registry import Settings

Policy = Literal["drop", "partial", "overselect"]


class Deadline(Settings):
    """A synchronous round's deadline (the config's ``deadline``; none: every round waits for its last client)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    seconds: float | None = Field(None, gt=0, description="seconds after a round starts (none: wait for everyone)")
    policy: Policy = Field("drop", description="drop the late clients, take their partial work, or over-select")
    overselect: float = Field(0.3, ge=0, description="r: overselect selects ⌈(1 + r)·m⌉ clients, keeps the first m")
