"""What the CA-Fed server estimates from what it observes (Rodio et al. 2023, Sec. IV-B).

* `LossTracker`: the loss filter F̂ (eq. 15), the running minimum F̂* and the dissimilarity Γ̂′ (eq. 17).
* `ActivityCounts` + `BetaPrior`: Bayesian estimates of each client's availability π̂_k (Beta prior) and of
  the second eigenvalue λ̂_k of its two-state chain, from counted transitions (`BayesianAvailability`).
* `OracleAvailability`: the true π_k and λ_k of the run's availability process (the paper's experiments).

All estimators keep their state as NumPy arrays and expose ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedhet.availability.base import AVAILABILITY
from fedhet.availability.markov import MarkovChains
from fedhet.errors import ConfigError

# ----------------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class LossTracker:
    """F̂ (eq. 15), F̂* (running minimum) and Γ̂′ (eq. 17) over N clients.

    F̂^(t) = (1 − β 1_{A_t}) ⊙ F̂^(t−1) + β 1_{A_t} ⊙ F^(t): inactive clients keep their estimate. The paper
    leaves F̂^(0) open; here the first round with reports sets every active client's F̂ to its report and every
    other client's to the mean report (the authors' code does the same), so that F̂* is never the arbitrary
    initial value. With `floor` given, F̂* is that fixed vector instead of the running minimum (the authors'
    code: the loss of a locally fitted model).
    """

    num_clients: int
    beta: float
    floor: np.ndarray | None = None
    estimate: np.ndarray = field(init=False)
    minimum: np.ndarray = field(init=False)
    started: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.beta <= 1:
            raise ValueError(f"β must lie in (0, 1] (got {self.beta})")
        self.estimate = np.zeros(self.num_clients)
        self.minimum = np.zeros(self.num_clients) if self.floor is None else np.asarray(self.floor, np.float64)

    def update(self, clients: np.ndarray, losses: np.ndarray) -> None:
        """Fold in the losses F_k^(t) reported by the active `clients`."""
        clients, losses = np.asarray(clients, dtype=np.int64), np.asarray(losses, dtype=np.float64)
        if len(clients) == 0:
            return
        if not self.started:
            self.estimate[:] = losses.mean()
            self.estimate[clients] = losses
            if self.floor is None:
                self.minimum = self.estimate.copy()
            self.started = True
            return
        self.estimate[clients] = (1.0 - self.beta) * self.estimate[clients] + self.beta * losses
        if self.floor is None:
            self.minimum = np.minimum(self.minimum, self.estimate)

    @property
    def gap(self) -> np.ndarray:
        """F̂_k − F̂_k*, the per-client terms of eq. (16) (≥ 0 with the running minimum)."""
        return self.estimate - self.minimum

    @property
    def gamma(self) -> float:
        """Γ̂′ = max_k (F̂_k − F̂_k*), eq. (17)."""
        return float(self.gap.max()) if self.num_clients else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate.copy(), "minimum": self.minimum.copy(), "started": self.started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.estimate = np.asarray(state["estimate"], dtype=np.float64).copy()
        self.minimum = np.asarray(state["minimum"], dtype=np.float64).copy()
        self.started = bool(state["started"])


# ----------------------------------------------------------------------------------------------------------------
# Availability
# ----------------------------------------------------------------------------------------------------------------


class BetaPrior(BaseModel):
    """Beta pseudo-counts of the Bayesian availability estimators (the paper's n_k, m_k; values not given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    active: float = Field(1.0, gt=0, description="n_k: prior active rounds for π̂")
    inactive: float = Field(1.0, gt=0, description="m_k: prior inactive rounds for π̂")
    stay_active: float = Field(1.0, gt=0, description="prior active→active transitions")
    leave_active: float = Field(1.0, gt=0, description="prior active→inactive transitions")
    stay_inactive: float = Field(1.0, gt=0, description="prior inactive→inactive transitions")
    leave_inactive: float = Field(1.0, gt=0, description="prior inactive→active transitions")


@dataclass
class ActivityCounts:
    """What the server has seen of each client's activity: rounds, active rounds, transitions by type."""

    num_clients: int
    rounds: int = 0
    active: np.ndarray = field(init=False)
    transitions: np.ndarray = field(init=False)  # (N, 2, 2): [from active?][to active?] as [[ii, ia], [ai, aa]]
    last: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.active = np.zeros(self.num_clients)
        self.transitions = np.zeros((self.num_clients, 2, 2))

    def observe(self, mask: np.ndarray) -> None:
        """Count one round's activity indicator 1_{A_t} (N,) bool."""
        mask = np.asarray(mask, dtype=bool)
        if self.last is not None:
            self.transitions[np.arange(self.num_clients), self.last.astype(int), mask.astype(int)] += 1
        self.rounds += 1
        self.active += mask
        self.last = mask.copy()

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "active": self.active.copy(),
            "transitions": self.transitions.copy(),
            "last": None if self.last is None else self.last.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])
        self.active = np.asarray(state["active"], dtype=np.float64).copy()
        self.transitions = np.asarray(state["transitions"], dtype=np.float64).copy()
        self.last = None if state["last"] is None else np.asarray(state["last"], dtype=bool).copy()


def bayesian_pi(counts: ActivityCounts, prior: BetaPrior) -> np.ndarray:
    """π̂_k = (Σ_{s≤t} 1{k ∈ A_s} + n_k) / (t + n_k + m_k) (Sec. IV-B), the posterior mean under Beta(n_k, m_k)."""
    return (counts.active + prior.active) / (counts.rounds + prior.active + prior.inactive)


def bayesian_lambda(counts: ActivityCounts, prior: BetaPrior) -> np.ndarray:
    """λ̂_k = P̂_aa + P̂_ii − 1, the non-unit eigenvalue of the estimated 2×2 transition matrix.

    Each row of P̂ is the posterior mean of its Beta prior given the transitions counted out of that state:
    P̂_aa = (N^aa + a)/(N^aa + N^ai + a + b), P̂_ii = (N^ii + c)/(N^ii + N^ia + c + d). The normalisation is by
    the visits to the source state (the authors' code divides by the number of rounds instead, which converges
    to 2π(1−π)(λ − 1), not λ).
    """
    t = counts.transitions
    n_ii, n_ia, n_ai, n_aa = t[:, 0, 0], t[:, 0, 1], t[:, 1, 0], t[:, 1, 1]
    p_aa = (n_aa + prior.stay_active) / (n_aa + n_ai + prior.stay_active + prior.leave_active)
    p_ii = (n_ii + prior.stay_inactive) / (n_ii + n_ia + prior.stay_inactive + prior.leave_inactive)
    return p_aa + p_ii - 1.0


class AvailabilityEstimator:
    """π̂, λ̂ from the observed activity; `observe` is called once per round with 1_{A_t}."""

    def __init__(self, num_clients: int) -> None:
        self.counts = ActivityCounts(num_clients)

    def observe(self, mask: np.ndarray) -> None:
        self.counts.observe(mask)

    def estimates(self) -> tuple[np.ndarray, np.ndarray]:
        """(π̂, λ̂), each (N,)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return self.counts.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts.load_state_dict(state)


class BayesianAvailability(AvailabilityEstimator):
    """π̂ and λ̂ from counts with Beta priors (Sec. IV-B)."""

    def __init__(self, num_clients: int, prior: BetaPrior) -> None:
        super().__init__(num_clients)
        self.prior = prior

    def estimates(self) -> tuple[np.ndarray, np.ndarray]:
        return bayesian_pi(self.counts, self.prior), bayesian_lambda(self.counts, self.prior)


class OracleAvailability(AvailabilityEstimator):
    """The true π_k and λ_k (Sec. V-A: "all algorithms can access an oracle")."""

    def __init__(self, pi: np.ndarray, lam: np.ndarray) -> None:
        super().__init__(len(pi))
        self.pi, self.lam = np.asarray(pi, dtype=np.float64), np.asarray(lam, dtype=np.float64)

    def estimates(self) -> tuple[np.ndarray, np.ndarray]:
        return self.pi.copy(), self.lam.copy()


def oracle_for(spec: str | dict[str, Any], num_clients: int, seed: int) -> OracleAvailability:
    """The oracle of availability process `spec` (a Markov process), set up as the run sets it up."""
    process = AVAILABILITY.build(spec, where="oracle")
    if not isinstance(process, MarkovChains):
        raise ConfigError(f"oracle: availability '{process.name}' has no known π and λ; use a Markov process")
    process.setup(num_clients, seed)
    return OracleAvailability(process.client_pi, process.client_lambda)
