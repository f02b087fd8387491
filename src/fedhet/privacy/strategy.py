"""Client-level differential privacy on any strategy: DP-FedAvg's mechanism (McMahan et al., ICLR 2018) with fixed
or adaptive clipping (Andrew et al., NeurIPS 2021), as a wrapper around a base strategy (``base:``).

Each round, every selected client clips its update Δ_k = w − w_k to norm at most C on its side (the engine does it
after the local steps, `fedhet.engine.privacy`, so on Flower it happens on the node) and, with ``noise: local``,
adds N(0, (zC)² I) to it before sending. With ``noise: central`` the server adds

    ξ ~ N(0, (z C max_k p_k)² I)

to the base strategy's aggregate direction d = Σ_k p_k Δ_k before its server step (so a server optimiser, FedAdam's
or momentum, works on the noised direction, as in DP-FedAvgM): for a uniform mean p_k = 1/m this is DP-FedAvg's
σ = zC/m; a base that weighs clients unequally (FedAvg by samples, MaxFL by appeal) pays for its largest weight.
Such a base declares its weights (`Strategy.aggregation_weights`); central noise on a base that does not (a
median, FedMGDA+'s min-norm direction) is refused, and local noise, which any aggregation merely post-processes,
is the alternative.

Adaptive clipping (Andrew et al., Algorithm 1): each client also reports b_k = 1[‖Δ_k‖ ≤ C]; the server forms the
noised share b̃ = (Σ_k b_k + N(0, σ_b²))/m and sets C ← C·exp(−η_C (b̃ − γ)), so that C tracks the γ-quantile of
the update norms. The count costs privacy too: the updates' noise multiplier becomes z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2),
and the two releases together are one Gaussian mechanism of multiplier z (the paper's Theorem 1), which is what
the accountant (`fedhet.privacy.ledger`) counts. The paper's defaults: γ = 0.5, η_C = 0.2, σ_b = m/20, C₀ = 0.1.

The mechanism is one of the run's privacy mechanisms (`fedhet.privacy.mechanisms`): its client transform is the
clip (and local noise), its server transform the central noise, its release a round (central noise) or a
participation (local noise), and `MechanismWrapper`, which runs any registered mechanism's hooks around a base
(``algorithm: {name: private, mechanism: ...}``), runs them.

Sampling: ``fixed`` keeps the base's selection (m of the K clients uniformly, which the accountant requires of it);
``poisson`` takes each client independently with probability q = m/K. Random draws: the central noise from (seed,
"dp-central-noise", round), the count's from (seed, "dp-clip-count", round), Poisson's from (seed, "dp-poisson",
round), a client's local noise from its own stream.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, field_validator, model_validator
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.privacy import UpdateClip
from fedhet.errors import ConfigError, FedhetWarning
from fedhet.privacy.accounting import Release
from fedhet.privacy.mechanisms import DEFAULT_NOISE_MULTIPLIER, DPSGD, MECHANISMS, Mechanism, RunShape, Unit
from fedhet.privacy.settings import PrivacyConfig
from fedhet.registry import spec_of
from fedhet.seeding import numpy_rng, torch_gen
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, Train
from fedhet.strategies.wrapper import Wrapper

__all__ = ["DEFAULT_NOISE_MULTIPLIER", "DP", "MechanismWrapper", "Private", "weights_of"]
COUNT_NOISE_SHARE = 20  # σ_b = m/20 (Andrew et al. 2021, §3: "we set σ_b = m/20 throughout")
MAX_EXPONENT = 30.0  # adaptive clipping's step C <- C exp(x) takes |x| <= 30 (C stays a finite, positive float)


def update_noise_multiplier(z: float, count_noise: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the updates' share of a total noise multiplier z when the clipped count is
    released with noise σ_b (Andrew et al. 2021, Theorem 1); z itself without a count (σ_b = ∞), 0 for z = 0."""
    if z <= 0:
        return 0.0
    if math.isinf(count_noise):
        return z
    rest = z**-2 - (2 * count_noise) ** -2
    if rest <= 0:
        raise ConfigError(
            f"adaptive clipping's count noise σ_b = {count_noise:g} takes the whole budget of noise multiplier "
            f"z = {z:g} (it needs z < 2σ_b = {2 * count_noise:g}); raise algorithm.count_noise or lower z"
        )
    return rest**-0.5


def adaptive_bound(
    bound: float, unclipped: float, count_noise: float, cohort: float, quantile: float, lr: float
) -> float:
    """C·exp(−η_C (b̃ − γ)) with b̃ = (unclipped + noise)/m: Andrew et al.'s geometric update of the clipping bound
    towards the γ-quantile of the update norms (`count_noise` is the drawn N(0, σ_b²) value)."""
    share = (unclipped + count_noise) / max(cohort, 1.0)
    step = min(MAX_EXPONENT, max(-MAX_EXPONENT, -lr * (share - quantile)))
    return min(max(bound * math.exp(step), 1e-30), 1e30)


def weights_of(strategy: Strategy) -> bool:
    """Whether `strategy` declares the weights its aggregate applies (`Strategy.aggregation_weights`, defined by the
    same class as its ``aggregate``, so a subclass with another aggregation does not inherit them by mistake)."""
    owner = _owner(type(strategy), "aggregation_weights")
    return owner is not Strategy and owner is _owner(type(strategy), "aggregate")


def _owner(cls: type, attribute: str) -> type:
    return next(c for c in cls.__mro__ if attribute in c.__dict__)


class MechanismWrapper(Wrapper):
    """A base strategy with a privacy mechanism's hooks around it (`fedhet.privacy.mechanisms`): each client's plan
    takes the mechanism's client transform (the engine applies it to the update the client sends), the base's
    aggregate takes its server noise (in the base's server step), and the server then lets it observe the round;
    selection, aggregation and state are the base's. The run's ledger accounts what it releases."""

    def privacy_mechanism(self) -> Mechanism:
        """The mechanism this wrapper runs."""
        raise NotImplementedError

    @classmethod
    def check_base(cls, built: Strategy) -> None:
        super().check_base(built)
        if built.asynchronous:
            raise ValueError(
                f"'{built.name}' is asynchronous (updates one by one, no rounds), and {cls.name} accounts per round: "
                "choose a synchronous base such as fedavg"
            )
        inner = next((part for part in built.parts() if isinstance(part, MechanismWrapper)), None)
        if inner is not None:
            raise ValueError(
                f"the base of {cls.name} runs a privacy mechanism of its own ('{inner.name}'), and the outer one "
                "would replace its client transform: use one of them"
            )

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        mechanism = self.privacy_mechanism()
        if mechanism.needs_weights() and not weights_of(self.inner):
            raise ConfigError(
                f"central DP noise is calibrated to the weights of the base's aggregate, and '{self.inner.name}' "
                "does not aggregate by a weighted sum of the updates; use algorithm.noise: local, or a base such as "
                "fedavg, fedprox or maxfl"
            )
        mechanism.prepare(ctx)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = self.inner.configure(round_, clients, global_params)
        clip = self.privacy_mechanism().client_transform(round_)
        return plan if clip is None else replace(plan, clip=clip)

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        clip = self.privacy_mechanism().client_transform(round_)

        def private(plan: LocalPlan) -> LocalResult:
            reported = [t.name for t in plan.terms if t.reports_state]
            if reported:
                raise ConfigError(
                    f"client-level DP protects the model updates, but '{self.inner.name}' also sends the state of "
                    f"{', '.join(reported)}, which it does not; choose another base strategy"
                )
            return train(plan if clip is None else replace(plan, clip=clip))

        return self.inner.local_training(round_, clients, global_params, private)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        mechanism = self.privacy_mechanism()
        noise = mechanism.server_noise(round_, global_params, result, self.inner)
        if noise is not None:
            self.inner.perturb_next_step(noise)
        new = self.inner.aggregate(round_, global_params, result)
        if self.inner.pending_perturbation():
            raise ConfigError(f"central DP noise needs '{self.inner.name}' to take a server step; use noise: local")
        mechanism.observe(round_, result)
        return new

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        return self.inner.personalization(clients)

    def round_metrics(self) -> dict[str, float]:
        return {**self.inner.round_metrics(), **self.privacy_mechanism().mechanism_metrics()}

    def state_dict(self) -> dict[str, Any]:
        # the wrapper has no server step; its state is the mechanism's (adaptive clipping's bound, say)
        return {"base": self.inner.state_dict(), **self.privacy_mechanism().mechanism_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["base"])
        self.privacy_mechanism().load_mechanism_state(state)


@STRATEGIES.register
class Private(MechanismWrapper):
    """Any registered privacy mechanism (``mechanism:``, `fedhet.privacy.mechanisms.MECHANISMS`, a plugin's too)
    on a base strategy; the run accounts it (``privacy:``)."""

    name: ClassVar[str] = "private"
    description: ClassVar[str] = "a registered privacy mechanism (a plugin's too) on any strategy, accounted"
    base: str | dict[str, Any] = Field(
        "fedavg", validate_default=True, description="the strategy made private (weighting: uniform unless given)"
    )
    mechanism: str | dict[str, Any] = Field(
        "local_gaussian",
        validate_default=True,
        description="the privacy mechanism: a name or {name: ..., **params} (fedhet list mechanisms)",
    )

    _mechanism: Mechanism | None = PrivateAttr(None)

    @field_validator("base", mode="before")
    @classmethod
    def _uniform_by_default(cls, value: Any) -> Any:
        return uniform_by_default(value)

    @field_validator("mechanism", mode="before")
    @classmethod
    def _resolve_mechanism(cls, value: Any) -> dict[str, Any]:
        try:
            built = MECHANISMS.build(value, where="algorithm.mechanism")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        if isinstance(built, DPSGD):
            raise ValueError("DP-SGD runs in the local steps of any strategy: set local.dp_sgd, not a mechanism")
        return spec_of(built)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._mechanism = MECHANISMS.build(self.mechanism, where="algorithm.mechanism")

    def privacy_mechanism(self) -> Mechanism:
        assert self._mechanism is not None
        return self._mechanism


def uniform_by_default(value: Any) -> Any:
    """DP-FedAvg weighs every client's clipped update equally (McMahan et al. 2018, Algorithm 1: a fixed
    denominator): a base with a ``weighting`` the config leaves out weighs uniformly, as the noise is sized by
    the largest weight (by samples it is m·max_k p_k times larger)."""
    spec = {"name": value} if isinstance(value, str) else value
    if not isinstance(spec, dict) or "weighting" in spec or not isinstance(spec.get("name"), str):
        return value
    try:
        fields = STRATEGIES.get(spec["name"]).model_fields
    except ConfigError:
        return value  # the base's own validation says what is wrong
    weighting = fields.get("weighting")
    if weighting is None or weighting.annotation is None or "uniform" not in str(weighting.annotation):
        return value
    return {**spec, "weighting": "uniform"}


@STRATEGIES.register
class DP(MechanismWrapper, Mechanism):
    """Client-level DP on a base strategy: updates clipped to C on the clients, Gaussian noise on the server
    (central) or on each client (local), fixed or adaptive clipping; selection, aggregation and state are the
    base's. The wrapper is its own mechanism; the privacy spent is accounted by the run (``privacy:``,
    `fedhet.privacy.ledger`)."""

    model_config = Strategy.model_config
    name: ClassVar[str] = "dp"
    level: ClassVar[str] = "client"
    prefix: ClassVar[str] = "dp"
    noise_key: ClassVar[str | None] = "algorithm.noise_multiplier"
    clips_updates: ClassVar[bool] = True
    description: ClassVar[str] = (
        "client-level differential privacy on any strategy: clipped, noised updates (DP-FedAvg)"
    )
    base: str | dict[str, Any] = Field(
        "fedavg", validate_default=True, description="the strategy made private (weighting: uniform unless given)"
    )
    clip: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,
        description="C: every update is scaled to norm <= C (.inf: none; adaptive: C0; None: from the noise, "
        "C = rms(w0)·m/(z√T), so that the run's noise on a coordinate stays at the initial weights' scale)",
    )
    clipping: Literal["fixed", "adaptive"] = Field(
        "fixed", description="fixed C, or adaptive: C tracks a quantile of the update norms (Andrew et al. 2021)"
    )
    quantile: float = Field(0.5, ge=0, le=1, description="γ: adaptive clipping's target share of unclipped updates")
    clip_lr: float = Field(
        0.2, gt=0, le=10, description="η_C: adaptive clipping's step C <- C exp(-η_C (b - γ)) (at most 10)"
    )
    count_noise: float | None = Field(
        None, ge=0, description="σ_b: noise on adaptive clipping's count of unclipped updates (None: m/20)"
    )
    noise_multiplier: float | None = Field(
        None, ge=0, description="z: noise standard deviation over C (None: from privacy.target_epsilon, else 1.0)"
    )
    noise: Literal["central", "local"] = Field(
        "central", description="central: the server noises the aggregate; local: each client noises its update"
    )
    sampling: Literal["fixed", "poisson"] = Field(
        "poisson",
        description="poisson: each client with probability m/K (DP-FedAvg's); fixed: the base's m of K clients",
    )

    _bound: float = PrivateAttr(1.0)
    _z: float | None = PrivateAttr(None)
    _last: dict[str, float] = PrivateAttr(default_factory=dict)
    _warned: bool = PrivateAttr(False)
    _std: float = PrivateAttr(0.0)

    @field_validator("base", mode="before")
    @classmethod
    def _uniform_by_default(cls, value: Any) -> Any:
        return uniform_by_default(value)

    @model_validator(mode="after")
    def _consistent(self) -> DP:
        if self.clipping == "adaptive" and self.noise == "local":
            raise ValueError(
                "adaptive clipping noises the clipped count on the server: use noise: central, or clipping: fixed"
            )
        if (
            self.clip is not None
            and math.isinf(self.clip)
            and (self.clipping == "adaptive" or self.noise_multiplier is None or self.noise_multiplier > 0)
        ):
            raise ValueError(
                "the noise is z times the clipping bound C: give a finite clip (an infinite one only with "
                "noise_multiplier: 0, the bare strategy)"
            )
        return self

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._bound = self.clip if self.clip is not None else 1.0
        self._z = self.noise_multiplier

    def initial_bound(self) -> float:
        """C (adaptive: C₀): the configured one, else (``clip`` unset) the bound at which the noise the run puts on
        one coordinate of the model, √T·σ with σ = z·C/m (central) or z·C/√m (local), equals the initial
        weights' root mean square: C = rms(w₀)·m/(z√T). It reads only public numbers (the model's initial
        weights, z, m, T): no privacy is spent on it, and without noise there is no bound (∞)."""
        if self.clip is not None:
            return self.clip
        if self.z == 0:
            return math.inf
        w0 = self.ctx.engine.initial_params()
        rms = float(w0.double().pow(2).mean().sqrt()) if w0.numel() else 1.0
        m = self.cohort_size()
        share = m if self.noise == "central" else math.sqrt(m)
        return rms * share / (self.z * math.sqrt(max(1, self.ctx.rounds))) if rms > 0 else 1.0

    @property
    def z(self) -> float:
        """The noise multiplier: the configured one, the one a target ε set (`use_noise_multiplier`), else 1.0."""
        return DEFAULT_NOISE_MULTIPLIER if self._z is None else self._z

    def use_noise_multiplier(self, z: float) -> None:
        """Set z before the run (from a target ε), and the bound that follows from it when ``clip`` is unset."""
        self._z = z
        self._bound = self.initial_bound()

    def derived(self) -> dict[str, Any]:
        return {"clip": self.initial_bound()} if self.clip is None else {}

    def cohort_size(self) -> float:
        """m: the cohort the noise is calibrated to (clients_per_round; Poisson's expectation q·K)."""
        return float(self.ctx.clients_per_round)

    @property
    def count_std(self) -> float:
        """σ_b of adaptive clipping (∞: no count is released, fixed clipping)."""
        if self.clipping == "fixed":
            return math.inf
        if self.z == 0:
            return 0.0
        return self.count_noise if self.count_noise is not None else self.cohort_size() / COUNT_NOISE_SHARE

    @property
    def update_z(self) -> float:
        """z_Δ: the noise multiplier of the updates (z, less adaptive clipping's share)."""
        sigma_b = self.count_std
        return self.z if sigma_b == 0 else update_noise_multiplier(self.z, sigma_b)

    def privacy_mechanism(self) -> Mechanism:
        return self

    def prepare(self, ctx: ServerContext) -> None:
        super().prepare(ctx)
        self._last = {}
        self._bound = self.initial_bound()

    def needs_weights(self) -> bool:
        return self.noise == "central" and self.z > 0

    def select(self, round_: int, available: Tensor) -> Tensor:
        if self.sampling == "fixed":
            return super().select(round_, available)
        seen = self.ctx.engine.data.seen
        rate = min(1.0, self.ctx.clients_per_round / max(1, int(seen.sum())))
        drawn = torch.as_tensor(numpy_rng(self.ctx.seed, "dp-poisson", round_).random(len(available)) < rate)
        return torch.nonzero(available & drawn).flatten()

    def client_transform(self, round_: int) -> UpdateClip:
        return self.client_clip()

    def client_clip(self) -> UpdateClip:
        """What each client does to its update this round: clip to C, and with local noise add N(0, (zC)²)."""
        local = self.z * self._bound if self.noise == "local" and self.z > 0 else 0.0
        return UpdateClip(self._bound, local)

    def server_noise(self, round_: int, global_params: Tensor, result: LocalResult, base: Strategy) -> Tensor | None:
        """Central noise ξ ~ N(0, (z_Δ C max_k p_k)² I) on the base's direction (none with local noise)."""
        self._std = 0.0
        if self.noise != "central" or self.z <= 0:
            return None
        weights = base.aggregation_weights(round_, result)
        assert weights is not None  # `setup` refused bases without them
        std = self.update_z * self._bound * float(weights.abs().max()) if len(weights) else 0.0
        self._std = std
        self._warn_if_swamped(round_, global_params, result, weights, std)
        if std <= 0:
            return None
        noise = torch.randn(global_params.shape, generator=torch_gen(self.ctx.seed, "dp-central-noise", round_))
        return noise.mul_(std).to(global_params.dtype)

    def observe(self, round_: int, result: LocalResult) -> None:
        """Adaptive clipping's step from the noised count of unclipped updates, and the round's numbers."""
        clipped = result.clipped if result.clipped is not None else torch.zeros(len(result.clients), dtype=torch.bool)
        bound = self._bound
        if self.clipping == "adaptive":
            noise_b = float(numpy_rng(self.ctx.seed, "dp-clip-count", round_).normal()) * self.count_std
            unclipped = float((~clipped).sum())
            self._bound = adaptive_bound(bound, unclipped, noise_b, self.cohort_size(), self.quantile, self.clip_lr)
        local = self.z * bound if self.noise == "local" else 0.0
        self._last = {
            "dp_clip_bound": bound,
            "dp_clipped_share": float(clipped.double().mean()) if len(clipped) else float("nan"),
            "dp_noise_std": self._std if self.noise == "central" else local,
            "dp_noise_multiplier": self.z,
        }

    def _warn_if_swamped(
        self, round_: int, global_params: Tensor, result: LocalResult, weights: Tensor, std: float
    ) -> None:
        """Warn once (one line) when the aggregate's noise outweighs the clipped mean update d = Σ_k p_k Δ_k by
        more than √T: then even the T rounds' updates added up (signal T‖d‖, noise √T‖ξ‖) are mostly noise."""
        if self._warned or std <= 0 or not len(weights) or result.params.shape[-1] != global_params.numel():
            return  # (no models: Flower's SecAgg+ keeps them on the nodes, `fedhet.flower.secagg.withhold_models`)
        p = weights.to(result.params.dtype)
        signal = float(torch.linalg.vector_norm(p.sum() * global_params - p @ result.params))  # ‖Σ_k p_k Δ_k‖
        noise = std * math.sqrt(global_params.numel())
        rounds = max(1, self.ctx.rounds)
        if noise <= math.sqrt(rounds) * signal:
            return
        self._warned = True
        unequal = float(weights.abs().max()) * len(weights)
        hint = (
            f", or weigh clients uniformly (this base's largest weight makes it {unequal:.3g}x)"
            if unequal > 1.01
            else ""
        )
        warnings.warn(
            f"client-level DP noise swamps the updates: round {round_ + 1}'s central noise has norm {noise:.3g} "
            f"(σ = {std:.3g} on each of {global_params.numel():,} parameters) against {signal:.3g} for the clipped "
            f"mean update, more than √rounds = {math.sqrt(rounds):.3g} times it (the run's noise outweighs its "
            f"updates, expect a model far below a non-private one); lower z = {self.z:.3g} (a larger target ε), "
            f"take more clients a round (σ = zC/m), or use a smaller model{hint}",
            FedhetWarning,
            stacklevel=2,
        )

    @property
    def bound(self) -> float:
        """The clipping bound C of the next round."""
        return self._bound

    def mechanism_metrics(self) -> dict[str, float]:
        return self._last

    def mechanism_state(self) -> dict[str, Any]:
        return {"bound": self._bound, "last": dict(self._last)}

    def load_mechanism_state(self, state: dict[str, Any]) -> None:
        self._bound = float(state["bound"])
        self._last = {str(k): float(v) for k, v in state["last"].items()}

    # -- its release (`fedhet.privacy.ledger`) --------------------------------------------------------------------
    def unit(self) -> Unit:
        """Central noise: every round is a release on the cohort (ε the run's); local noise: a client's rounds."""
        return "round" if self.noise == "central" else "participation"

    def release(self, z: float, n: int, shape: RunShape, settings: PrivacyConfig) -> Release:
        """One round's release at noise multiplier z: central noise on a fixed-size sample of m of the K seen
        clients (replace-one) or a Poisson sample of rate m/K (add or remove); without amplification, or with local
        noise (replace-one: the server knows who took part), in full."""
        fixed = self.sampling == "fixed"
        if self.noise == "local" or not settings.amplification:
            return Release(z, "none", replace=fixed or self.noise == "local")
        population = int(shape.seen.sum())
        m = min(shape.clients_per_round, population)
        if fixed:
            return Release(z, "fixed", population=population, sample=m)
        return Release(z, "poisson", rate=m / max(population, 1))

    def assumes_uniform_cohort(self, settings: PrivacyConfig) -> bool:
        return self.noise == "central" and settings.amplification

    def noise_limit(self, shape: RunShape) -> tuple[float, str]:
        """The largest useful z: beyond it the noise the run adds to one coordinate of the model, √T·zC/m
        (central; local: √T·zC/√m), exceeds the most T clipped mean updates can move it, T·C: z > m√T (central),
        √(mT) (local)."""
        m = max(1, min(shape.clients_per_round, int(shape.seen.sum())))
        central = self.noise == "central"
        limit = (m if central else math.sqrt(m)) * math.sqrt(max(1, shape.rounds))
        text = (
            f"{'m' if central else '√m'}·√T, m = {shape.clients_per_round} clients a round, T = {shape.rounds} rounds"
        )
        return limit, text

    def refuse_unusable(self) -> None:
        self.update_z  # noqa: B018 - refuses, before the run, a count noise that leaves the updates none

    def report(self, rounds: int) -> dict[str, Any]:
        return {
            "noise_multiplier": self.z,
            "noise": self.noise,
            "sampling": self.sampling,
            "clipping": self.clipping,
            "clip": self.initial_bound(),
            "clip_final": self.bound,
            "rounds": rounds,
        }
