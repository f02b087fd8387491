"""Client optimisers: how a client turns its local direction d (the gradient of its objective) into a step.

Each is a coordinate-wise function of the weights, the direction and its own state, so every backend applies it to
whatever slice of the parameters it holds (like the objective's parameter terms). State kinds: ``"param"`` (a
vector of the model's size per client, e.g. a momentum buffer) and ``"count"`` (one number per client, e.g. Adam's
step count).

State lifetime: by default (``persistent: false``) a client starts every round with fresh state, as most FL code
re-creates its optimiser each round; with ``persistent: true`` the client keeps it between the rounds it takes
part in (stored with the other client-side state, checkpointed, and kept on the Flower node that holds the client).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedhet.registry import Component, Registry

StateKind = Literal["param", "count"]


class ClientOptimizer(Component):
    """Base of client optimisers; ``step`` is pure (returns new weights and state).

    A ``"count"`` state is the same for every slice of the parameters: backends pass each slice the count before
    the step and keep the count that the step returns once."""

    persistent: bool = Field(False, description="keep the optimiser state between a client's rounds (else reset)")

    def state_kinds(self) -> dict[str, StateKind]:
        """The state the optimiser keeps per client, by name."""
        return {}

    @property
    def plain(self) -> bool:
        """True for w ← w − η d with no state (backends may fuse it into the gradient computation)."""
        return not self.state_kinds()

    def step(self, w: Tensor, d: Tensor, state: dict[str, Tensor], lr: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The new weights and state after one step along direction `d` with learning rate `lr` (broadcastable)."""
        raise NotImplementedError

    def state_key(self, name: str) -> str:
        return f"optimizer.{self.name}.{name}"


OPTIMIZERS: Registry[ClientOptimizer] = Registry("optimizer")


@OPTIMIZERS.register
class SGD(ClientOptimizer):
    """SGD, with heavy-ball or Nesterov momentum as PyTorch's ``torch.optim.SGD`` (dampening 0):
    b ← μ b + d;  w ← w − η (d + μ b) with Nesterov, else w ← w − η b. With μ = 0: w ← w − η d."""

    name: ClassVar[str] = "sgd"
    description: ClassVar[str] = "SGD, optionally with (Nesterov) momentum"
    momentum: float = Field(0.0, ge=0, lt=1, description="momentum μ (0: plain SGD)")
    nesterov: bool = Field(False, description="Nesterov momentum")

    def state_kinds(self) -> dict[str, StateKind]:
        return {"momentum": "param"} if self.momentum else {}

    def step(self, w: Tensor, d: Tensor, state: dict[str, Tensor], lr: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        if self.momentum == 0:
            return w - lr * d, state
        buffer = self.momentum * state["momentum"] + d
        move = d + self.momentum * buffer if self.nesterov else buffer
        return w - lr * move, {"momentum": buffer}


@OPTIMIZERS.register
class Adam(ClientOptimizer):
    """Adam (Kingma & Ba 2015) as ``torch.optim.Adam``: m ← β₁m + (1−β₁)d, v ← β₂v + (1−β₂)d², t ← t + 1,
    w ← w − η (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)."""

    name: ClassVar[str] = "adam"
    description: ClassVar[str] = "Adam with bias correction (as torch.optim.Adam)"
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)

    def state_kinds(self) -> dict[str, StateKind]:
        return {"m": "param", "v": "param", "count": "count"}

    def step(self, w: Tensor, d: Tensor, state: dict[str, Tensor], lr: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        count = state["count"] + 1
        m = self.beta1 * state["m"] + (1 - self.beta1) * d
        v = self.beta2 * state["v"] + (1 - self.beta2) * d * d
        m_hat = m / (1 - torch.pow(torch.as_tensor(self.beta1, dtype=count.dtype), count))
        v_hat = v / (1 - torch.pow(torch.as_tensor(self.beta2, dtype=count.dtype), count))
        return w - lr * m_hat / (v_hat.sqrt() + self.eps), {"m": m, "v": v, "count": count}
