"""Privacy accounting with Google's dp-accounting: ε at a given δ after repeated Gaussian releases, and the noise
multiplier that reaches a target ε.

A `Release` is one use of a Gaussian mechanism with noise multiplier z (noise standard deviation over the clipping
bound C) on a sampled input:

* ``poisson``: each unit (a client, or an example) is in the sample independently with probability q; add-or-remove
  adjacency, where one unit moves the clipped sum by at most C (the Poisson-subsampled Gaussian);
* ``fixed``: a uniform sample of ``sample`` of the ``population`` units without replacement; replace-one adjacency
  (the population's size is public), where replacing one unit moves the sum by up to 2C, so the accountant's noise
  multiplier is z/2 (Wang, Balle & Kasiviswanathan, AISTATS 2019; RDP only);
* ``none``: no amplification by sampling, every release counts in full (a unit's data may be in each of them);
  ``replace`` says which adjacency the release is accounted under (replace-one: z/2, as above).

ε is computed afresh from the release and the count of releases (never by updating an accountant), so a run resumed
from a checkpoint reports exactly the numbers of one that was not interrupted. RDP (Mironov 2017) is fast and a
little loose; PLD (privacy loss distributions, Koskela et al. 2020; Doroshenko et al. 2022) is tight and slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from fedhet.errors import ConfigError

Accountant = Literal["rdp", "pld"]
INSTALL = "pip install 'fedhet[privacy]' (or pip install dp-accounting)"
NOISE_FLOOR = 1e-3  # the smallest noise multiplier a target ε is searched down to
NOISE_CEILING = 1e6  # and the largest (a target that needs more is refused)


def require_dp_accounting() -> Any:
    """The dp_accounting module, or a one-line error that says how to install it."""
    try:
        import dp_accounting
    except ImportError:
        raise ConfigError(
            f"differential privacy needs Google's dp-accounting library for its accounting: {INSTALL}"
        ) from None
    return dp_accounting


@dataclass(frozen=True)
class Release:
    """One Gaussian release of noise multiplier z on a sample (module docstring)."""

    noise_multiplier: float
    sampling: Literal["poisson", "fixed", "none"]
    rate: float = 1.0  # q, with poisson
    population: int = 0  # n, with fixed
    sample: int = 0  # m, with fixed
    replace: bool = False  # replace-one adjacency (fixed always is)

    def with_noise(self, noise_multiplier: float) -> Release:
        return Release(noise_multiplier, self.sampling, self.rate, self.population, self.sample, self.replace)

    @property
    def effective_noise(self) -> float:
        """The accountant's noise multiplier: z, or z/2 under replace-one adjacency (the sum moves by up to 2C)."""
        return self.noise_multiplier / 2 if self.replace or self.sampling == "fixed" else self.noise_multiplier


def _event(dp: Any, release: Release, count: int) -> Any:
    gaussian = dp.GaussianDpEvent(release.effective_noise)
    if release.sampling == "poisson" and release.rate < 1:
        one = dp.PoissonSampledDpEvent(release.rate, gaussian)
    elif release.sampling == "fixed" and release.sample < release.population:
        one = dp.SampledWithoutReplacementDpEvent(release.population, release.sample, gaussian)
    else:
        one = gaussian
    return dp.SelfComposedDpEvent(one, count)


@lru_cache(maxsize=4096)
def epsilon(release: Release, count: int, delta: float, accountant: Accountant = "rdp") -> float:
    """ε at `delta` after `count` releases (0 for none; ∞ without noise)."""
    if count <= 0 or (release.sampling == "poisson" and release.rate <= 0):
        return 0.0
    if release.noise_multiplier <= 0:
        return math.inf
    dp = require_dp_accounting()
    fixed = release.sampling == "fixed" and release.sample < release.population
    if accountant == "pld":
        if fixed:
            raise ConfigError(
                "the PLD accountant has no sampling without replacement (a fixed number of clients a round); use "
                "privacy.accountant: rdp, or algorithm.sampling: poisson"
            )
        engine = dp.pld.PLDAccountant()
    else:
        relation = dp.NeighboringRelation.REPLACE_ONE if fixed else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
        engine = dp.rdp.RdpAccountant(neighboring_relation=relation)
    return float(engine.compose(_event(dp, release, count)).get_epsilon(delta))


def calibrate(worst_epsilon: Callable[[float], float], target: float) -> float:
    """The smallest noise multiplier z (within a relative 1e-6) whose ε, `worst_epsilon(z)` (non-increasing in z),
    is at most `target`: a bracket by doubling or halving from z = 1, then bisection."""
    if not target > 0:
        raise ConfigError(f"privacy.target_epsilon must be positive (got {target})")
    lo, hi = 1.0, 1.0
    if worst_epsilon(hi) > target:
        while worst_epsilon(hi) > target:
            lo, hi = hi, hi * 2
            if hi > NOISE_CEILING:
                raise ConfigError(
                    f"privacy.target_epsilon {target:g} needs a noise multiplier above {NOISE_CEILING:g}; ask for a "
                    "larger ε, fewer rounds or more clients"
                )
    else:
        while worst_epsilon(lo) <= target:
            lo, hi = lo / 2, lo
            if lo < NOISE_FLOOR:
                return hi
    while hi / lo > 1 + 1e-6:
        middle = math.sqrt(lo * hi)
        if worst_epsilon(middle) > target:
            lo = middle
        else:
            hi = middle
    return hi
