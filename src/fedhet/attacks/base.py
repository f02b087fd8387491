"""Malicious clients: what they report (inflated losses) and what they send (corrupted updates).

An attack picks ``round(fraction · K)`` malicious clients once (from the seed) among the K clients that train
(MaxFL's unseen clients never do, so they are never drawn), or the listed ``clients``.
The runner passes each round's cohort through ``cohort`` (attackers that always take part), the local-training
plan through ``corrupt_plan`` (a scaled local objective) and the cohort's `LocalResult` through ``corrupt_updates``
before aggregation; strategies obtain client losses through `ServerContext.client_losses`, which passes them
through ``report_losses``. So any strategy can be attacked without knowing about it.

Update attacks (on Δ_k = w_global − w_k of malicious clients): ``gaussian`` adds N(0, σ²) noise, ``scale``
multiplies by `factor`, ``sign_flip`` multiplies by −`factor`, ``replace`` sends pure N(0, σ²) noise.
Loss attacks (FedMGDA+ §6.2.2; MaxFL's Byzantine clients) inflate the attacker's objective f_k:

- the *bias attack* f_k ← f_k + c (``loss_bias``): gradients, hence local training, are unchanged; only the
  loss the client reports grows by c;
- the *scaling attack* f_k ← s · f_k (``loss_scale``): the reported loss is multiplied by s (after the bias) and,
  with ``scale_training`` (default), the client trains on s · f_k. For SGD ∇(s f) = s ∇f, so this is done by
  multiplying its local learning rate by s: exact for plain SGD, an approximation when the plan adds a proximal
  term, a correction or weight decay (those are scaled too). With one local step it multiplies the update by s.

``always_participate`` puts the attackers in every cohort they are available for (FedMGDA+'s attacker "present
in every round", the authors' ``--vip``): an attacker that was not drawn replaces a random honest member, so the
cohort keeps its size. ``opt_in`` is for pools the clients join themselves (MaxFL's appeal-driven
participation, `fedhet.methods.maxfl.participation`): ``honest`` (default) attackers opt in like everyone else, when the
global model appeals to them on their honest training loss; ``always``: they are in the pool in every round,
whatever their loss, and compete for the cohort's slots.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry
from fedhet.seeding import numpy_rng, torch_gen


class Attack(Component):
    """Base class; the default does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=False)
    _malicious: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    _seed: int = PrivateAttr(0)

    def setup(self, num_clients: int, seed: int, eligible: Tensor | None = None) -> None:
        """`eligible` (num_clients,) bool: the clients that may be malicious (default: all)."""
        self._seed = seed
        self._malicious = torch.zeros(num_clients, dtype=torch.bool)

    @property
    def malicious(self) -> Tensor:
        """(K,) bool: which clients are malicious."""
        return self._malicious

    def cohort(self, clients: Tensor, available: Tensor, round_: int) -> Tensor:
        """The round's cohort after the attackers had their say (default: as the strategy chose it)."""
        return clients

    def corrupt_plan(self, plan: LocalPlan, round_: int) -> LocalPlan:
        """The local-training instructions as the clients follow them (default: as given)."""
        return plan

    def corrupt_updates(self, result: LocalResult, global_params: Tensor, round_: int) -> LocalResult:
        return result

    def report_losses(self, clients: Tensor, losses: Tensor) -> Tensor:
        return losses

    def opted_in(self) -> Tensor:
        """(K,) bool: clients that join an opt-in pool whatever the global model (default: none)."""
        return torch.zeros_like(self._malicious)


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
    loss_scale: float = Field(1.0, ge=0, description="s of the scaling attack f ← s·f (reported loss, after the bias)")
    scale_training: bool = Field(True, description="the attacker also trains on s·f (local lr × s)")
    always_participate: bool = Field(False, description="attackers take part in every round they are available")
    opt_in: Literal["honest", "always"] = Field(
        "honest", description="opt-in pools (MaxFL): attackers join when the model appeals to them, or always"
    )
    clients: list[int] = Field(default_factory=list, description="ids of the malicious clients (overrides fraction)")

    def setup(self, num_clients: int, seed: int, eligible: Tensor | None = None) -> None:
        super().setup(num_clients, seed, eligible)
        if self.clients:  # a chosen attacker, e.g. FedMGDA+'s PhD domain on Adult (Table 7)
            if min(self.clients) < 0 or max(self.clients) >= num_clients:
                raise ConfigError(f"attack.clients {self.clients} must be client ids in 0..{num_clients - 1}")
            self._malicious[torch.as_tensor(self.clients, dtype=torch.long)] = True
            return
        pool = np.arange(num_clients) if eligible is None else torch.nonzero(eligible).flatten().numpy()
        count = round(self.fraction * len(pool))
        chosen = np.sort(numpy_rng(seed, "malicious").choice(pool, size=count, replace=False))
        self._malicious[torch.as_tensor(chosen, dtype=torch.long)] = True

    def cohort(self, clients: Tensor, available: Tensor, round_: int) -> Tensor:
        if not self.always_participate or len(clients) == 0:
            return clients
        attackers = torch.nonzero(self._malicious & available).flatten()
        missing = attackers[~torch.isin(attackers, clients)]
        if len(missing) == 0:
            return clients
        honest = clients[~self._malicious[clients]]
        room = max(0, len(clients) - len(attackers))
        rng = numpy_rng(self._seed, "attack-cohort", round_)
        keep = np.sort(rng.choice(len(honest), size=min(room, len(honest)), replace=False))
        kept = honest[torch.as_tensor(keep, dtype=torch.long)]
        return torch.cat([kept, attackers]).sort().values

    def corrupt_plan(self, plan: LocalPlan, round_: int) -> LocalPlan:
        if self.loss_scale == 1.0 or not self.scale_training:
            return plan
        bad = self._malicious[plan.clients]
        if not bool(bad.any()):
            return plan
        return dataclasses.replace(plan, lr=torch.where(bad, plan.lr * self.loss_scale, plan.lr))

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

    def opted_in(self) -> Tensor:
        return self._malicious.clone() if self.opt_in == "always" else super().opted_in()
