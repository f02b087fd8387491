"""Server optimisers: how a strategy's aggregate direction d becomes the next global model.

A strategy computes d (for FedAvg d = Σ_k p_k (w − w_k), the "pseudo-gradient") and calls
``self.server_step(w, d)``; the strategy's ``server_optimizer`` (``algorithm: {name: fedavg, server_optimizer:
{name: adam}}``) turns it into a step with learning rate η = ``server_lr``:

* ``sgd``      — w ← w − η d (plain FedAvg, the default);
* ``momentum`` — v ← β v + d, w ← w − η v (FedAvgM, Hsu et al. 2019; Nesterov: w ← w − η (d + β v));
  both take ``weight_decay`` λ as ``torch.optim.SGD`` does: d ← d + λ w first (CA-Fed's code uses it);
* ``adagrad``, ``adam``, ``yogi`` — FedAdagrad, FedAdam, FedYogi (Reddi et al., ICLR 2021, Algorithm 2):
  m ← β₁ m + (1 − β₁) d, the second moment v as below, w ← w − η m / (√v + τ), with v₋₁ = τ² and no bias
  correction as in the paper (``bias_correction: true`` applies Adam's, as Flower's FedAdam does):
  Adagrad v ← v + d², Adam v ← β₂ v + (1 − β₂) d², Yogi v ← v − (1 − β₂) d² sign(v − d²).

The state (m, v) is the server's and is checkpointed with the strategy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.registry import Component, Registry


class ServerOptimizer(Component):
    """Base of server optimisers."""

    model_config = ConfigDict(extra="forbid", frozen=False, arbitrary_types_allowed=True)

    def step(self, params: Tensor, direction: Tensor, lr: float) -> Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


SERVER_OPTIMIZERS: Registry[ServerOptimizer] = Registry("server optimizer")


class _Decayed(ServerOptimizer):
    """A server step on d + λ w (``torch.optim.SGD``'s weight decay; λ = 0: on d)."""

    weight_decay: float = Field(0.0, ge=0, description="L2 decay λ: the step uses d + λ w (torch.optim.SGD's)")

    def decayed(self, params: Tensor, direction: Tensor) -> Tensor:
        return direction + self.weight_decay * params if self.weight_decay else direction


@SERVER_OPTIMIZERS.register
class ServerSGD(_Decayed):
    """w ← w − η (d + λ w)."""

    name: ClassVar[str] = "sgd"
    description: ClassVar[str] = "plain server step w - lr * d (FedAvg)"

    def step(self, params: Tensor, direction: Tensor, lr: float) -> Tensor:
        return params - lr * self.decayed(params, direction)


@SERVER_OPTIMIZERS.register
class ServerMomentum(_Decayed):
    """v ← β v + d; w ← w − η v, or w ← w − η (d + β v) with Nesterov (FedAvgM, Hsu et al. 2019; PyTorch's
    SGD momentum with dampening 0 on the pseudo-gradient; with weight decay λ, d is d + λ w)."""

    name: ClassVar[str] = "momentum"
    description: ClassVar[str] = "server momentum (FedAvgM, Hsu et al. 2019)"
    beta: float = Field(0.9, ge=0, lt=1, description="momentum β")
    nesterov: bool = False

    _velocity: Tensor | None = PrivateAttr(None)

    def step(self, params: Tensor, direction: Tensor, lr: float) -> Tensor:
        direction = self.decayed(params, direction)
        v = direction if self._velocity is None else self.beta * self._velocity + direction
        self._velocity = v
        return params - lr * (direction + self.beta * v if self.nesterov else v)

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": self._velocity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._velocity = state.get("velocity")


class _Adaptive(ServerOptimizer):
    """FedOpt's adaptive server step (Reddi et al. 2021, Algorithm 2); subclasses give the second moment."""

    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂ (not used by Adagrad)")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ (also v₋₁ = τ²)")
    bias_correction: bool = Field(False, description="Adam's bias correction (Flower's FedAdam), not the paper's")

    _m: Tensor | None = PrivateAttr(None)
    _v: Tensor | None = PrivateAttr(None)
    _t: int = PrivateAttr(0)

    def second_moment(self, v: Tensor, d2: Tensor) -> Tensor:
        raise NotImplementedError

    def step(self, params: Tensor, direction: Tensor, lr: float) -> Tensor:
        d = direction.double()
        m = torch.zeros_like(d) if self._m is None else self._m
        v = torch.full_like(d, self.tau**2) if self._v is None else self._v
        self._m = self.beta1 * m + (1 - self.beta1) * d
        self._v = self.second_moment(v, d * d)
        self._t += 1
        m_hat, v_hat = self._m, self._v
        if self.bias_correction:
            m_hat = m_hat / (1 - self.beta1**self._t)
            v_hat = v_hat / (1 - self.beta2**self._t)
        return (params.double() - lr * m_hat / (v_hat.sqrt() + self.tau)).to(params.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"m": self._m, "v": self._v, "t": self._t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._m, self._v, self._t = state.get("m"), state.get("v"), int(state.get("t", 0))


@SERVER_OPTIMIZERS.register
class ServerAdagrad(_Adaptive):
    """v ← v + d² (FedAdagrad)."""

    name: ClassVar[str] = "adagrad"
    description: ClassVar[str] = "FedAdagrad (Reddi et al. 2021)"

    def second_moment(self, v: Tensor, d2: Tensor) -> Tensor:
        return v + d2


@SERVER_OPTIMIZERS.register
class ServerAdam(_Adaptive):
    """v ← β₂ v + (1 − β₂) d² (FedAdam)."""

    name: ClassVar[str] = "adam"
    description: ClassVar[str] = "FedAdam (Reddi et al. 2021)"

    def second_moment(self, v: Tensor, d2: Tensor) -> Tensor:
        return self.beta2 * v + (1 - self.beta2) * d2


@SERVER_OPTIMIZERS.register
class ServerYogi(_Adaptive):
    """v ← v − (1 − β₂) d² sign(v − d²) (FedYogi)."""

    name: ClassVar[str] = "yogi"
    description: ClassVar[str] = "FedYogi (Reddi et al. 2021)"

    def second_moment(self, v: Tensor, d2: Tensor) -> Tensor:
        return v - (1 - self.beta2) * d2 * torch.sign(v - d2)
