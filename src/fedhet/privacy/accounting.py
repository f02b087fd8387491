"""Privacy accounting with Google's dp-accounting: ε at a given δ after repeated releases, and the noise
multiplier that reaches a target ε.

A `Release` is one use of a Gaussian mechanism with noise multiplier z (noise standard deviation over the clipping
bound C), or of a Laplace mechanism (``kind="laplace"``: z is the noise's scale over the L1 sensitivity, so one use
is pure ε₀ = 1/z; dp-accounting's `LaplaceDpEvent`), on a sampled input:

* ``poisson``: each unit (a client, or an example) is in the sample independently with probability q; add-or-remove
  adjacency, where one unit moves the clipped sum by at most C (the Poisson-subsampled Gaussian);
* ``fixed``: a uniform sample of ``sample`` of the ``population`` units without replacement; replace-one adjacency
  (the population's size is public), where replacing one unit moves the sum by up to 2C, so the accountant's noise
  multiplier is z/2 (Wang, Balle & Kasiviswanathan, AISTATS 2019; RDP only);
* ``none``: no amplification by sampling, every release counts in full (a unit's data may be in each of them);
  ``replace`` says which adjacency the release is accounted under (replace-one: z/2, as above).

ε is a function of the release and the count of releases (never the state of an accountant that was updated), so a
run resumed from a checkpoint reports exactly the numbers of one that was not interrupted. RDP (Mironov 2017;
dp-accounting's default orders) is fast, and a little loose: one release's RDP is computed once and scaled by the
count. PLD (privacy loss distributions, Doroshenko et al. 2022) is tight and slower: one release's distribution,
self-composed `count` times, discretised at 1e-3 pessimistically (an upper bound on ε). A Laplace release's ε is
the smaller of the accountant's and basic composition's, count·ε₀ (both are upper bounds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Literal

from fedhet.errors import ConfigError

Accountant = Literal["rdp", "pld"]
INSTALL = "pip install 'fedhet[privacy]' (or pip install dp-accounting)"
NOISE_FLOOR = 1e-3  # the smallest noise multiplier a target ε is searched down to
NOISE_CEILING = 1e6  # and the largest (a target that needs more is refused; a run's own bound is lower)
CALIBRATION_TOLERANCE = 1e-4  # relative, on the noise multiplier
PLD_DISCRETIZATION = 1e-3  # of the privacy loss: a pessimistic (upper) estimate, within 1e-4 of 1e-4's, 10x faster


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
    kind: Literal["gaussian", "laplace"] = "gaussian"

    def with_noise(self, noise_multiplier: float) -> Release:
        return replace(self, noise_multiplier=noise_multiplier)

    @property
    def effective_noise(self) -> float:
        """The accountant's noise multiplier: z, or z/2 under replace-one adjacency (the sum moves by up to 2C)."""
        return self.noise_multiplier / 2 if self.replace or self.sampling == "fixed" else self.noise_multiplier


def _single(dp: Any, release: Release) -> Any:
    """One release as a dp-accounting event."""
    event = (dp.LaplaceDpEvent if release.kind == "laplace" else dp.GaussianDpEvent)(release.effective_noise)
    if release.sampling == "poisson" and release.rate < 1:
        return dp.PoissonSampledDpEvent(release.rate, event)
    if release.sampling == "fixed" and release.sample < release.population:
        return dp.SampledWithoutReplacementDpEvent(release.population, release.sample, event)
    return event


@lru_cache(maxsize=1024)
def _rdp(release: Release) -> tuple[Any, Any]:
    """The RDP orders and the RDP of one release at each (RdpAccountant's, composed once): `count` releases have
    `count` times it (RDP composes additively), so a run's ε after every round costs one computation."""
    dp = require_dp_accounting()
    fixed = release.sampling == "fixed" and release.sample < release.population
    relation = dp.NeighboringRelation.REPLACE_ONE if fixed else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    accountant = dp.rdp.RdpAccountant(neighboring_relation=relation)
    with _quiet_absl():
        accountant.compose(_single(dp, release))
    return accountant._orders, accountant._rdp  # one release's RDP, to be scaled by the count


@lru_cache(maxsize=1024)
def _pld(release: Release) -> Any:
    """The privacy loss distribution of one Poisson-sampled release (as dp-accounting's PLDAccountant builds it)."""
    dp = require_dp_accounting()
    return dp.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=release.effective_noise,
        value_discretization_interval=PLD_DISCRETIZATION,
        sampling_prob=release.rate,
        neighboring_relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


@lru_cache(maxsize=4096)
def epsilon(release: Release, count: int, delta: float, accountant: Accountant = "rdp") -> float:
    """ε at `delta` after `count` releases (0 for none; ∞ without noise)."""
    if count <= 0 or (release.sampling == "poisson" and release.rate <= 0):
        return 0.0
    if release.noise_multiplier <= 0:
        return math.inf
    if release.kind == "laplace":
        return min(count / release.effective_noise, _accounted(release, count, delta, accountant))
    if accountant == "rdp":
        return _accounted(release, count, delta, accountant)
    check_accountant(release, accountant)
    dp = require_dp_accounting()
    if release.sampling == "poisson" and release.rate < 1:
        return float(_pld(release).self_compose(count).get_epsilon_for_delta(delta))
    gaussian = dp.pld.privacy_loss_distribution.from_gaussian_mechanism(  # count Gaussians: one of σ/√count
        standard_deviation=release.effective_noise / math.sqrt(count), value_discretization_interval=PLD_DISCRETIZATION
    )
    return float(gaussian.get_epsilon_for_delta(delta))


def _accounted(release: Release, count: int, delta: float, accountant: Accountant) -> float:
    """ε at `delta` of `count` releases composed by dp-accounting's accountant (any kind of release it knows)."""
    dp = require_dp_accounting()
    check_accountant(release, accountant)
    if accountant == "rdp":
        orders, rdp = _rdp(release)
        with _quiet_absl():
            return float(dp.rdp.rdp_privacy_accountant.compute_epsilon(orders, rdp * count, delta)[0])
    pld = dp.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    return float(pld.compose(_single(dp, release), count).get_epsilon(delta))


@contextmanager
def _quiet_absl() -> Iterator[None]:
    """dp-accounting's RDP logs a warning (through absl) for each fractional order whose series it leaves out; the
    ε is still a valid bound (the minimum over the other orders), so the warnings stay out of a run's output."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_accountant(release: Release, accountant: Accountant) -> None:
    """Refuse, in one line, a release the accountant cannot count (PLD has no sampling without replacement)."""
    if accountant == "pld" and release.sampling == "fixed" and release.sample < release.population:
        raise ConfigError(
            "the PLD accountant has no sampling without replacement (a fixed number of clients a round); use "
            "privacy.accountant: rdp, or algorithm.sampling: poisson"
        )


def calibrate(worst_epsilon: Callable[[float], float], target: float, ceiling: float = NOISE_CEILING) -> float:
    """The smallest noise multiplier z (within a relative 1e-4: ε within about 2e-4 of the target) whose ε,
    `worst_epsilon(z)` (non-increasing in z), is at most `target`: a bracket by doubling or halving from z = 1,
    then bisection. A target that needs more than `ceiling` is refused in one line, with the smallest reachable ε."""
    if not target > 0:
        raise ConfigError(f"privacy.target_epsilon must be positive (got {target})")
    if worst_epsilon(ceiling) > target:
        raise ConfigError(
            f"privacy.target_epsilon {target:g} needs a noise multiplier above {ceiling:.4g}, beyond any use in this "
            f"run (docs/privacy.md, Refusals); the smallest ε it can reach is {worst_epsilon(ceiling):.3g}: ask for "
            "that or more, or run fewer rounds or more clients a round"
        )
    lo, hi = 1.0, 1.0
    if worst_epsilon(hi) > target:
        while worst_epsilon(hi) > target:
            lo, hi = hi, min(hi * 2, ceiling)
    else:
        while worst_epsilon(lo) <= target:
            lo, hi = lo / 2, lo
            if lo < NOISE_FLOOR:
                return hi
    while hi / lo > 1 + CALIBRATION_TOLERANCE:
        middle = math.sqrt(lo * hi)
        if worst_epsilon(middle) > target:
            lo = middle
        else:
            hi = middle
    return hi
