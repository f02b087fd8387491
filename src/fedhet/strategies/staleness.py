"""Staleness functions s(·): how much an update that trained on an old model counts (asynchronous strategies).

Each is a registered component (`STALENESS`), so a plugin adds one in a file (``@STALENESS.register``) and an
algorithm's ``staleness`` key names it or gives it with its parameters (``{name: hinge, a: 10, b: 4}``). Its
argument is the staleness as the strategy's paper counts it: FedBuff passes the version lag t − τ (0 for a fresh
update), FedAsync its t − τ, one more (`fedhet.strategies.fedasync`).

- ``constant``: s = 1 (no discount);
- ``polynomial``: s = (x + 1)^(−a) (FedAsync, Xie, Koyejo, Gupta 2019, §5.2; the paper's a = 0.5);
- ``hinge``: s = 1 for x ≤ b, else 1 / (a (x − b) + 1) (§5.2; the paper's a = 10, b = 4);
- ``sqrt``: s = 1 / √(1 + x) (FedBuff, Nguyen et al. 2022, Algorithm 1).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.registry import Component, Registry


class StalenessFunction(Component):
    """s(x) for a tensor of staleness values x ≥ 0 (float64 weights, 1 for a fresh update where the paper says so)."""

    def weight(self, staleness: Tensor) -> Tensor:
        raise NotImplementedError


STALENESS: Registry[StalenessFunction] = Registry("staleness function")


@STALENESS.register
class Constant(StalenessFunction):
    name: ClassVar[str] = "constant"
    description: ClassVar[str] = "s = 1: every update counts fully"

    def weight(self, staleness: Tensor) -> Tensor:
        return torch.ones_like(staleness, dtype=torch.float64)


@STALENESS.register
class Polynomial(StalenessFunction):
    name: ClassVar[str] = "polynomial"
    description: ClassVar[str] = "s = (x + 1)^(-a) (FedAsync §5.2)"
    a: float = Field(0.5, ge=0, description="a: the decay's exponent (paper: 0.5)")

    def weight(self, staleness: Tensor) -> Tensor:
        return (staleness.double() + 1).pow(-self.a)


@STALENESS.register
class Hinge(StalenessFunction):
    name: ClassVar[str] = "hinge"
    description: ClassVar[str] = "s = 1 while x <= b, then 1 / (a (x - b) + 1) (FedAsync §5.2)"
    a: float = Field(10.0, ge=0, description="a: the decay's slope after b (paper: 10)")
    b: float = Field(4.0, ge=0, description="b: no discount while x <= b (paper: 4)")

    def weight(self, staleness: Tensor) -> Tensor:
        s = staleness.double()
        return torch.where(s <= self.b, torch.ones_like(s), 1.0 / (self.a * (s - self.b) + 1.0))


@STALENESS.register
class SquareRoot(StalenessFunction):
    name: ClassVar[str] = "sqrt"
    description: ClassVar[str] = "s = 1 / sqrt(1 + x) (FedBuff, Algorithm 1)"

    def weight(self, staleness: Tensor) -> Tensor:
        return 1.0 / torch.sqrt(1.0 + staleness.double())


def build_staleness(value: Any, where: str, **named: float) -> StalenessFunction:
    """The staleness function of a strategy's ``staleness`` key: a component, a name (with `named` parameters that
    the named function has: FedAsync's a and b), or ``{name: ..., ...}``."""
    if isinstance(value, StalenessFunction):
        return value
    if isinstance(value, str):
        fields = STALENESS.get(value).model_fields if value in STALENESS.names() else {}
        value = {"name": value, **{k: v for k, v in named.items() if k in fields}}
    return STALENESS.build(value, where=where)
