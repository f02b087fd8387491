"""Malicious clients: what they report (inflated losses) and what they send (corrupted updates).

An attack picks ``round(fraction · K)`` malicious clients once (from the seed), or the listed ``clients``.
The runner passes every cohort's `LocalResult` through ``corrupt_updates`` before aggregation, and strategies
obtain client losses through `ServerContext.client_losses`, which passes them through ``report_losses``. So any
strategy can be attacked without knowing about it.

Update attacks (on Δ_k = w_global − w_k of malicious clients): ``gaussian`` adds N(0, σ²) noise, ``scale``
multiplies by `factor`, ``sign_flip`` multiplies by −`factor`, ``replace`` sends pure N(0, σ²) noise.
Loss attacks (FedMGDA+ §6 bias/scaling attacks, MaxFL's Byzantine clients): reported loss F + `loss_bias`,
then × `loss_scale`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry
from fedhet.seeding import numpy_rng, torch_gen


class Attack(Component):
    """Base class; the default does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=False)
    _malicious: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    _seed: int = PrivateAttr(0)

    def setup(self, num_clients: int, seed: int) -> None:
        self._seed = seed
        self._malicious = torch.zeros(num_clients, dtype=torch.bool)

    @property
    def malicious(self) -> Tensor:
        """(K,) bool: which clients are malicious."""
        return self._malicious

    def corrupt_updates(self, result: LocalResult, global_params: Tensor, round_: int) -> LocalResult:
        return result

    def report_losses(self, clients: Tensor, losses: Tensor) -> Tensor:
        return losses


ATTACKS: Registry[Attack] = Registry("attack")


@ATTACKS.register
class NoAttack(Attack):
    name: ClassVar[str] = "none"
    description: ClassVar[str] = "every client is honest"


@ATTACKS.register
class MaliciousClients(Attack):
    """A fraction of clients corrupt their updates and/or inflate the losses they report."""

    name: ClassVar[str] = "malicious"
    description: ClassVar[str] = "a fraction of clients send corrupted updates and/or inflated losses"
    fraction: float = Field(0.1, ge=0, le=1, description="share of clients that are malicious")
    update: Literal["none", "gaussian", "scale", "sign_flip", "replace"] = "none"
    noise_std: float = Field(1.0, ge=0, description="σ of the Gaussian noise (gaussian, replace)")
    factor: float = Field(10.0, description="multiplier of the update (scale, sign_flip)")
    loss_bias: float = Field(0.0, description="added to the reported loss")
    loss_scale: float = Field(1.0, ge=0, description="multiplies the reported loss (after the bias)")
    clients: list[int] = Field(default_factory=list, description="ids of the malicious clients (overrides fraction)")

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        if self.clients:  # a chosen attacker, e.g. FedMGDA+'s PhD domain on Adult (Table 7)
            if min(self.clients) < 0 or max(self.clients) >= num_clients:
                raise ConfigError(f"attack.clients {self.clients} must be client ids in 0..{num_clients - 1}")
            self._malicious[torch.as_tensor(self.clients, dtype=torch.long)] = True
            return
        count = round(self.fraction * num_clients)
        chosen = np.sort(numpy_rng(seed, "malicious").choice(num_clients, size=count, replace=False))
        self._malicious[torch.as_tensor(chosen, dtype=torch.long)] = True

    def corrupt_updates(self, result: LocalResult, global_params: Tensor, round_: int) -> LocalResult:
        bad = self._malicious[result.clients]
        if self.update == "none" or not bool(bad.any()):
            return result
        delta = result.updates(global_params)
        for row in torch.nonzero(bad).flatten().tolist():
            k = int(result.clients[row])
            noise = torch.randn(delta.shape[1], generator=torch_gen(self._seed, "attack-noise", round_, k))
            if self.update == "gaussian":
                delta[row] = delta[row] + self.noise_std * noise
            elif self.update == "replace":
                delta[row] = self.noise_std * noise
            elif self.update == "scale":
                delta[row] = self.factor * delta[row]
            else:
                delta[row] = -self.factor * delta[row]
        params = global_params.unsqueeze(0) - delta
        return dataclasses.replace(result, params=params)

    def report_losses(self, clients: Tensor, losses: Tensor) -> Tensor:
        bad = self._malicious[clients]
        return torch.where(bad, (losses + self.loss_bias) * self.loss_scale, losses)
