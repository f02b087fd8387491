"""Learning-rate schedules over the rounds: η_t = η · factor(t, T) for round t = 0, 1, ..., T − 1 of T planned rounds.

A run schedules its local learning rate (``schedules.local_lr``: every client's ``local.lr`` in round t) and its
server learning rate (``schedules.server_lr``: ``algorithm.server_lr``); the default is the constant 1. A
schedule of one's own is a registered `Schedule` subclass (docs/workflow.md).

* ``constant``:     1
* ``step``:         γ^⌊t / every⌋ (FedMGDA+'s decaying global step, §6.1, is this schedule)
* ``exponential``:  γ^t
* ``cosine``:       f_min + (1 − f_min) · ½ (1 + cos(π t / T))   (Loshchilov & Hutter's annealing, no restarts)
* ``warmup``:       linear from `start` to 1 over the first W rounds (as torch's ``LinearLR``), then `then` over the
  remaining T − W rounds, from its own round 0

Every factor lies in [0, 1] (a warm-up's start, a decay's γ and a cosine's f_min are at most 1), so a scheduled
rate never exceeds the configured one; `local.lr` and `algorithm.server_lr` set the peak. A warm-up may wrap another
warm-up, at most `MAX_NESTING` deep.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, field_serializer, field_validator

from fedhet.registry import Component, Registry, spec_of

MAX_NESTING = 16  # schedules inside schedules (a warm-up's `then`): deeper is a generated config, not a schedule


class Schedule(Component):
    """A learning rate's multiplier in round `round_` (0-based) of `rounds` planned rounds."""

    model_config = ConfigDict(allow_inf_nan=False)

    def factor(self, round_: int, rounds: int) -> float:
        raise NotImplementedError


SCHEDULES: Registry[Schedule] = Registry("schedule")


@SCHEDULES.register
class Constant(Schedule):
    """The same learning rate every round."""

    name: ClassVar[str] = "constant"
    description: ClassVar[str] = "the same learning rate every round"

    def factor(self, round_: int, rounds: int) -> float:
        return 1.0


@SCHEDULES.register
class Step(Schedule):
    """γ^⌊t / every⌋: the rate times γ every `every` rounds."""

    name: ClassVar[str] = "step"
    description: ClassVar[str] = "times gamma every `every` rounds (FedMGDA+'s decay)"
    every: int = Field(100, ge=1, description="rounds between two decays")
    gamma: float = Field(0.1, gt=0, le=1, description="the factor applied at each decay (at most 1: a decay)")

    def factor(self, round_: int, rounds: int) -> float:
        return self.gamma ** (round_ // self.every)


@SCHEDULES.register
class Exponential(Schedule):
    """γ^t: the rate times γ every round."""

    name: ClassVar[str] = "exponential"
    description: ClassVar[str] = "times gamma every round"
    gamma: float = Field(0.99, gt=0, le=1, description="the factor applied each round (at most 1: a decay)")

    def factor(self, round_: int, rounds: int) -> float:
        return self.gamma**round_


@SCHEDULES.register
class Cosine(Schedule):
    """Cosine annealing from 1 to `min_factor` over the run's T rounds (or `period`)."""

    name: ClassVar[str] = "cosine"
    description: ClassVar[str] = "cosine annealing from 1 to min_factor over the rounds"
    min_factor: float = Field(0.0, ge=0, le=1, description="f_min: the factor reached at the end")
    period: int | None = Field(None, ge=1, description="rounds of the annealing (default: the run's rounds)")

    def factor(self, round_: int, rounds: int) -> float:
        span = self.period or rounds
        t = min(round_, span)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t / span))


@SCHEDULES.register
class Warmup(Schedule):
    """A linear warm-up from `start` to 1 over `rounds` rounds, then another schedule (`then`)."""

    name: ClassVar[str] = "warmup"
    description: ClassVar[str] = "linear warm-up from start to 1 over `rounds` rounds, then another schedule"
    rounds: int = Field(5, ge=1, description="W: rounds of the warm-up")
    start: float = Field(0.1, gt=0, le=1, description="the factor of the first round")
    then: Schedule = Field(default_factory=Constant, description="the schedule after the warm-up (from its round 0)")

    @field_validator("then", mode="before")
    @classmethod
    def _then(cls, value: Any) -> Any:
        if isinstance(value, Schedule):
            return value
        depth, inner = 1, value
        while isinstance(inner, dict) and "then" in inner:  # counted before building: no recursion on deep input
            depth, inner = depth + 1, inner["then"]
            if depth > MAX_NESTING:
                raise ValueError(f"schedules are nested more than {MAX_NESTING} deep (a warm-up's then in a then ...)")
        return SCHEDULES.build(value, where="then")

    @field_serializer("then")
    def _dump_then(self, value: Schedule) -> dict[str, Any]:
        return spec_of(value)

    def factor(self, round_: int, rounds: int) -> float:
        if round_ < self.rounds:
            return self.start + (1 - self.start) * round_ / self.rounds
        return self.then.factor(round_ - self.rounds, max(rounds - self.rounds, 1))
