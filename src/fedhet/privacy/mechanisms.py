"""Privacy mechanisms as registered components (``MECHANISMS``): what a mechanism does, and what it releases.

A mechanism has three kinds of hook, and the generic layers call them without knowing which mechanism it is:

* client side: ``client_transform`` (what each client does to its update before sending it: clip, local noise; an
  `UpdateClip` the engine applies on every backend and Flower node) and ``local_steps`` (what each local step
  does: DP-SGD's per-sample clipping and noise);
* server side: ``server_noise`` (noise on the aggregate direction, which the base's server step takes: central
  noise), then ``observe`` (what the server learns from the round, such as adaptive clipping's count);
* release: ``release`` (one counted use of the mechanism, a `fedhet.privacy.accounting.Release`: Gaussian of noise
  multiplier z on a sample, or Laplace's pure ε₀) and ``unit`` (what is counted: the run's rounds, each client's
  participations, or each client's local steps), which the run's ledger (`fedhet.privacy.ledger`) composes with
  dp-accounting into ε at δ; the noise a target ε sets is the mechanism's z (``noise_key`` names its config key).

A strategy wrapper runs a mechanism's client- and server-side hooks around a base strategy
(`fedhet.privacy.strategy.MechanismWrapper`: ``algorithm: {name: private, mechanism: ...}``, or client-level
DP's own ``algorithm: dp``); DP-SGD (``local.dp_sgd``) is a mechanism whose hooks the ledger runs. docs/privacy.md,
Mechanisms, and docs/extending.md show a plugin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.privacy import ExampleDP, UpdateClip
from fedhet.privacy.accounting import Release
from fedhet.privacy.settings import DPSGDConfig, PrivacyConfig
from fedhet.registry import Component, Registry

if TYPE_CHECKING:
    from fedhet.strategies.base import ServerContext, Strategy

DEFAULT_NOISE_MULTIPLIER = 1.0  # z without noise_multiplier and without a target ε
Unit = Literal["round", "participation", "step"]


@dataclass
class RunShape:
    """What accounting needs of a run besides its mechanisms."""

    rounds: int
    clients_per_round: int
    train_sizes: Tensor  # (K,) training samples per client
    seen: Tensor  # (K,) bool: the clients that train
    steps: Tensor  # (K,) local steps per round under the run's local settings
    batch_size: int
    participations: Tensor | None = None  # (K,) rounds each client will take part in (None: not known, every round)

    def planned(self) -> Tensor:
        """(K,) the rounds each client takes part in: as planned where the cohorts are known before the run (a
        uniform sample from the run's seed, `planned_participations`), else every round (an upper bound)."""
        if self.participations is not None:
            return self.participations
        return torch.full((len(self.train_sizes),), self.rounds, dtype=torch.long)


class Mechanism(Component):
    """Base of privacy mechanisms (module docstring). A subclass sets ``name``/``description``, its hooks and its
    release; one with a ``noise_multiplier`` field (None: a target ε sets it, else 1.0) names it in ``noise_key``."""

    model_config = ConfigDict(extra="forbid", frozen=False, arbitrary_types_allowed=True)
    level: ClassVar[str] = ""  # its block in summary.json's privacy (default: its name)
    prefix: ClassVar[str] = ""  # its metrics' and clients.csv columns' prefix, <prefix>_epsilon (default: dp_<name>)
    noise_key: ClassVar[str | None] = None  # the config key of the noise a target ε sets (None: none it can set)
    clips_updates: ClassVar[bool] = False  # its client transform clips updates (the ledger counts who was clipped)

    _z: float | None = PrivateAttr(None)
    _context: Any = PrivateAttr(None)

    def active(self) -> bool:
        """Whether it runs in this configuration (a strategy that is a mechanism only when some setting asks)."""
        return True

    # -- what the run reports it as ---------------------------------------------------------------------------
    def block(self) -> str:
        return self.level or self.name

    def metric_prefix(self) -> str:
        return self.prefix or f"dp_{self.name}"

    # -- its noise ----------------------------------------------------------------------------------------------
    def noise_given(self) -> bool:
        """Whether the config sets the noise (a target ε then is refused: not both)."""
        return getattr(self, "noise_multiplier", None) is not None

    @property
    def z(self) -> float:
        """The noise multiplier: the one a target ε set, the configured one, else 1.0."""
        if self._z is not None:
            return self._z
        given = getattr(self, "noise_multiplier", None)
        return DEFAULT_NOISE_MULTIPLIER if given is None else float(given)

    def use_noise_multiplier(self, z: float) -> None:
        """Set z before the run (from a target ε)."""
        self._z = z

    def noise_limit(self, shape: RunShape) -> tuple[float, str] | None:
        """The largest useful z and the rule that says so (refused beyond it, and a target's ceiling); None: none."""
        return None

    def refuse_unusable(self) -> None:
        """Refuse, in one line and before the run, a noise that cannot work (once z is set)."""

    # -- client side --------------------------------------------------------------------------------------------
    def prepare(self, ctx: ServerContext) -> None:
        """Called once before the first round (and again before a resumed run loads its state) with the run's
        context (`context`: the engine and its model, m, T, the seed); an override calls ``super().prepare(ctx)``."""
        self._context = ctx

    @property
    def context(self) -> ServerContext:
        """The run's context, once prepared."""
        if self._context is None:
            raise RuntimeError(f"privacy mechanism '{self.name}' used before prepare()")
        return self._context

    def client_transform(self, round_: int) -> UpdateClip | None:
        """What each client does to its update this round (clip, local noise); None: nothing."""
        return None

    def local_steps(self, plan: LocalPlan) -> LocalPlan:
        """A plan the round trains, with this mechanism in its local steps (DP-SGD's); default: as it is."""
        return plan

    # -- server side --------------------------------------------------------------------------------------------
    def needs_weights(self) -> bool:
        """Whether its server noise is sized by the base's declared aggregation weights."""
        return False

    def server_noise(self, round_: int, global_params: Tensor, result: LocalResult, base: Strategy) -> Tensor | None:
        """Noise (P,) on the base's aggregate direction this round (its server step takes it); None: none."""
        return None

    def observe(self, round_: int, result: LocalResult) -> None:
        """The server has aggregated `result` (adaptive clipping's bound moves here)."""

    def mechanism_metrics(self) -> dict[str, float]:
        """The last round's numbers, logged with the strategy's (the noise's scale, the clipping bound)."""
        return {}

    def mechanism_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the mechanism."""
        return {}

    def load_mechanism_state(self, state: dict[str, Any]) -> None:
        """Restore `mechanism_state`."""

    # -- release ------------------------------------------------------------------------------------------------
    def unit(self) -> Unit:
        """What one release is: a round of the run (every client's ε is the run's), a client's participation, or
        one of its local steps (`step_counts`)."""
        return "participation"

    def release(self, z: float, n: int, shape: RunShape, settings: PrivacyConfig) -> Release:
        """One release at noise multiplier z for a client with `n` training samples."""
        raise NotImplementedError

    def step_counts(self, clients: Tensor, steps: Tensor, shape: RunShape) -> Tensor:
        """What `steps` local steps of `clients` add to their counts (unit ``step``): the steps."""
        return steps.long()

    def assumes_uniform_cohort(self, settings: PrivacyConfig) -> bool:
        """Whether its release counts amplification by a uniform sample of clients each round."""
        return False

    def accounting_metrics(self) -> dict[str, float]:
        """Numbers the ledger logs beside <prefix>_epsilon each round."""
        return {}

    def report(self, rounds: int) -> dict[str, Any]:
        """Its block of summary.json besides ``epsilon`` (its settings as the run used them)."""
        return {"noise_multiplier": self.z}


MECHANISMS: Registry[Mechanism] = Registry("privacy mechanism")


@MECHANISMS.register
class DPSGD(DPSGDConfig, Mechanism):
    """DP-SGD (``local.dp_sgd``, Abadi et al. 2016) as a mechanism: every local step clips each sample's gradient
    and adds Gaussian noise (`fedhet.engine.privacy.ExampleDP`); a step (Poisson) or a batch (shuffle) of client
    k's is a release on its n_k samples, so ε is per client."""

    name: ClassVar[str] = "dp_sgd"
    description: ClassVar[str] = "example-level DP-SGD in every local step (local.dp_sgd)"
    level: ClassVar[str] = "example"
    prefix: ClassVar[str] = "dp_sgd"
    noise_key: ClassVar[str | None] = "local.dp_sgd.noise_multiplier"

    def local_steps(self, plan: LocalPlan) -> LocalPlan:
        return replace(plan, dp_sgd=ExampleDP(self.clip, self.z, self.sampling))

    def unit(self) -> Unit:
        return "step"

    def release(self, z: float, n: int, shape: RunShape, settings: PrivacyConfig) -> Release:
        """One DP-SGD step (Poisson, at q_k = min(1, B/n_k)) or batch (shuffle) of a client with `n` samples."""
        if self.sampling == "shuffle":
            return Release(z, "none", replace=True)
        rate = min(1.0, shape.batch_size / max(n, 1))
        return Release(z, "poisson" if settings.amplification else "none", rate=rate)

    def step_counts(self, clients: Tensor, steps: Tensor, shape: RunShape) -> Tensor:
        """The steps (Poisson), or with shuffled batches the passes they start over their data, ⌈τ / ⌊n_k / b_k⌋⌉
        (a sample is in one batch a pass)."""
        if self.sampling == "poisson":
            return steps.long()
        n = shape.train_sizes[clients].long()
        per_pass = (n // n.clamp(min=1, max=shape.batch_size)).clamp(min=1)
        return -(-steps.long() // per_pass)

    def noise_limit(self, shape: RunShape) -> tuple[float, str]:
        """Beyond z = B√S the noise on one coordinate over a client's S = τT steps, √S·zC/B, exceeds the most S
        clipped mean gradients can move it, S·C."""
        steps = int(shape.steps.max()) if len(shape.steps) else 1
        limit = shape.batch_size * math.sqrt(max(1, steps * shape.rounds))
        return limit, f"B·√(τT), batch size B = {shape.batch_size}, τT local steps in all"

    def accounting_metrics(self) -> dict[str, float]:
        return {"dp_sgd_noise_multiplier": self.z}

    def report(self, rounds: int) -> dict[str, Any]:
        return {"noise_multiplier": self.z, "clip": self.clip, "sampling": self.sampling}


@MECHANISMS.register
class LocalGaussian(Mechanism):
    """Local DP with Gaussian noise: each client clips its update to norm C and adds N(0, (zC)² I) before sending
    it (what ``algorithm: {name: dp, noise: local, clipping: fixed}`` does, on the base's own selection). Its
    participations are its releases: replace-one (the server knows who took part), a Gaussian of multiplier z/2
    each, without amplification."""

    name: ClassVar[str] = "local_gaussian"
    description: ClassVar[str] = "local DP: each client clips its update and adds Gaussian noise (replace-one)"
    noise_key: ClassVar[str | None] = "algorithm.mechanism.noise_multiplier"
    clips_updates: ClassVar[bool] = True
    clip: float = Field(1.0, gt=0, description="C: every update is scaled to norm <= C")
    noise_multiplier: float | None = Field(
        None, ge=0, description="z: N(0, (zC)^2) on each coordinate (None: from privacy.target_epsilon, else 1.0)"
    )

    def client_transform(self, round_: int) -> UpdateClip:
        return UpdateClip(self.clip, self.z * self.clip)

    def release(self, z: float, n: int, shape: RunShape, settings: PrivacyConfig) -> Release:
        return Release(z, "none", replace=True)

    def noise_limit(self, shape: RunShape) -> tuple[float, str]:
        """Beyond z = √(mT) the noise on one coordinate of the mean of m updates over T rounds, √T·zC/√m, exceeds
        the most T clipped mean updates can move it, T·C."""
        m = max(1, min(shape.clients_per_round, int(shape.seen.sum())))
        limit = math.sqrt(m * max(1, shape.rounds))
        return limit, f"√(mT), m = {shape.clients_per_round} clients a round, T = {shape.rounds} rounds"

    def report(self, rounds: int) -> dict[str, Any]:
        return {"noise_multiplier": self.z, "clip": self.clip}


def example_level(settings: DPSGDConfig | None) -> list[Mechanism]:
    """The run's DP-SGD mechanism from ``local.dp_sgd`` (none without it)."""
    return [] if settings is None else [MECHANISMS.build({"name": DPSGD.name, **settings.model_dump()})]
