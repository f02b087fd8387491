"""The config's privacy sections: ``privacy`` (accounting) and ``local.dp_sgd`` (example-level DP-SGD)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedhet.registry import Settings


class PrivacyConfig(Settings):
    """How the privacy of a DP run (``algorithm: {name: dp, ...}`` or ``local.dp_sgd``) is accounted."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of the (ε, δ) reported after each round")
    accountant: Literal["rdp", "pld"] = Field(
        "rdp", description="dp-accounting's RDP (fast) or PLD (tighter; Poisson sampling only) accountant"
    )
    target_epsilon: float | None = Field(
        None,
        gt=0,
        description="set the noise multiplier before the run so that ε after all rounds is this (--target-epsilon)",
    )
    amplification: bool = Field(
        True,
        description="count amplification by sampling; false accepts an accounting without it (needed where "
        "availability, opt-outs or a strategy's own selection make the cohort a non-uniform sample)",
    )


class DPSGDConfig(Settings):
    """DP-SGD in every client's local steps (Abadi et al. 2016): per-sample gradient clipping and Gaussian noise."""

    model_config = ConfigDict(extra="forbid")
    clip: float = Field(1.0, gt=0, description="C: every sample's gradient is scaled to norm <= C")
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        description="z: N(0, (zC)^2) on each step's sum of clipped gradients (None: from privacy.target_epsilon, "
        "else 1.0)",
    )
    sampling: Literal["poisson", "shuffle"] = Field(
        "poisson",
        description="poisson: each sample in a step's batch with probability B/n_k (accounted with amplification); "
        "shuffle: the engine's shuffled batches (accounted without it)",
    )
