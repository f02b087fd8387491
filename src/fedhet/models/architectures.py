"""Clients of different architectures: one composite model that holds every architecture a client may train.

``model: {name: architectures, members: [{name: mlp, hidden: [32]}, {name: cnn_mnist, channels: [8, 16]}]}``
builds a `Composite` whose parameter vector is the concatenation of its members' (member a's coordinates are one
contiguous block). Each member is the zoo model built with ``dim`` outputs, a ReLU, and a linear head to the
classes:

    z = f_a(x) = ReLU(g_a(x)) ∈ R^dim       (the representation, of the same dimension for every member)
    logits = W_a z + b_a                     (the head, W_a ∈ R^{C × dim}: the same shape for every member)

so that methods that share knowledge instead of weights (class prototypes, a global head: FedProto, FedGH) can
compare and combine what different architectures compute. Each client trains one member, chosen by ``assignment``
(``fix``: in ``proportions``; ``system``: by the capacity the system model gives it, against each member's
``levels``); the engine trains a client on its member's coordinates only (`fedhet.engine.architectures`), so its
cost is that of its own architecture. The composite's own forward pass (the members' mean logits) is never used to
train.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, ClassVar, Literal

from pydantic import Field, field_serializer, field_validator, model_validator
from torch import Tensor, nn

from fedhet.models.base import MODELS, ModelSpec
from fedhet.registry import spec_of


class Member(nn.Sequential):
    """One architecture: a body g (a zoo model with ``dim`` outputs), a ReLU, and a linear head (dim → C); a
    sequence of modules, so that the dense and conv backends run it as they run the zoo's MLPs and CNNs."""

    gives_representation = True  # `fedhet.engine.functional.FlatModel.representation`

    def __init__(self, body: nn.Module, dim: int, num_classes: int) -> None:
        super().__init__(OrderedDict(body=body, relu=nn.ReLU(), head=nn.Linear(dim, num_classes)))

    def forward(self, x: Tensor, representation: bool = False) -> Tensor:
        """The logits, or with `representation` the representation z = ReLU(g(x)) (B, dim)."""
        body, relu, head = self  # the modules body, relu and head
        z = relu(body(x))
        return z if representation else head(z)


class Composite(nn.Module):
    """Every member (``members.<a>.*``), one after another in the parameter vector."""

    def __init__(self, members: list[Member], dim: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        """The members' mean logits (an ensemble; the engine trains and scores each client on its own member)."""
        out: Tensor = sum(member(x) for member in self.members)
        return out / len(self.members)


@MODELS.register
class Architectures(ModelSpec):
    """A list of architectures, one per client by capacity (see the module docstring)."""

    name: ClassVar[str] = "architectures"
    description: ClassVar[str] = (
        "clients of different architectures (a list of models, one per client by capacity) that share a "
        "representation dimension: for fedproto, fedgh, local_only"
    )
    members: list[ModelSpec] = Field(
        min_length=1, description="the architectures: model specs, e.g. [{name: mlp, hidden: [32]}, {name: cnn_mnist}]"
    )
    dim: int = Field(32, ge=1, le=65536, description="the representation dimension every member maps an input to")
    assignment: Literal["fix", "system"] = Field(
        "fix",
        description="fix: each client's member drawn in proportions (seeded); system: the largest member whose level "
        "is within the client's capacity (system.capacity)",
    )
    proportions: list[float] | None = Field(None, description="the share of clients of each member (default: equal)")
    levels: list[float] | None = Field(
        None,
        description="each member's capacity level in (0, 1] for assignment: system (default: its parameter count "
        "over the largest member's)",
    )

    @field_validator("members", mode="before")
    @classmethod
    def _members(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        out = []
        for i, spec in enumerate(value):
            if isinstance(spec, ModelSpec):
                out.append(spec)
                continue
            member = MODELS.build(spec, where=f"model.members[{i}]")
            if isinstance(member, Architectures):
                raise ValueError("a member cannot itself be a list of architectures")
            out.append(member)
        return out

    @field_serializer("members")
    def _dump_members(self, value: list[ModelSpec]) -> list[dict[str, Any]]:
        return [spec_of(member) for member in value]

    @model_validator(mode="after")
    def _consistent(self) -> Architectures:
        n = len(self.members)
        if self.proportions is not None and (
            len(self.proportions) != n or min(self.proportions) < 0 or not 0 < sum(self.proportions) < math.inf
        ):
            raise ValueError(f"proportions needs one share (>= 0, not all 0) per member ({n})")
        if self.levels is not None and (len(self.levels) != n or any(not 0 < r <= 1 for r in self.levels)):
            raise ValueError(f"levels needs one capacity level in (0, 1] per member ({n})")
        return self

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        members = [Member(spec.build(input_shape, self.dim), self.dim, num_classes) for spec in self.members]
        return Composite(members, self.dim)
