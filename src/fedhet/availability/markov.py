"""Markovian client availability (CA-Fed, Rodio et al. 2023, Sec. III-A, III-D, V-A and VI-B).

Each chain has two states (active, inactive) and is given by its stationary availability π and its second
eigenvalue λ. With stay probabilities p_a (active) and p_i (inactive), λ = p_a + p_i − 1 and
π = (1 − p_i)/(2 − p_a − p_i); inverting,

    P(active_{t+1} | active_t)   = λ + (1 − λ) π
    P(active_{t+1} | inactive_t) = (1 − λ) π.

These are probabilities iff max(1 − 1/π, 1 − 1/(1 − π)) ≤ λ ≤ 1; Assumption 1 (irreducible, aperiodic) also
needs −1 < λ < 1 and 0 < π < 1. Chains start from stationarity (A_0 ~ Bernoulli(π)).

Processes:

* ``markov``: one independent chain per client (Sec. III-D, all the paper's experiments);
* ``markov_clusters``: one chain per cluster; all clients of a cluster are on and off together (Sec. VI-B);
* ``cafed_classes``: the paper's client classes (Sec. V-A): within each data group, half of the clients are
  "more available" (π = 1/2 + g), half "less available" (π = 1/2 − g); each half is split again into
  "correlated" (λ = ν) and "weakly correlated" (λ ~ N(0, ε²)) clients.

The trajectory is a function of the run seed only: round t draws its uniforms from
``numpy_rng(seed, "availability", t)``; the current chain state is checkpointed, and a process asked for a
later round than the one it holds steps forward through the rounds in between.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.availability.base import AVAILABILITY, Availability
from fedhet.data.partition import block_groups
from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng

ArrayLike = float | list[float]


def lambda_bounds(pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The valid λ range of a two-state chain with stationary availability π: [max(1 − 1/π, 1 − 1/(1−π)), 1]."""
    pi = np.asarray(pi, dtype=np.float64)
    with np.errstate(divide="ignore"):
        low = np.maximum(1.0 - 1.0 / pi, 1.0 - 1.0 / (1.0 - pi))
    return low, np.ones_like(pi)


def check_chains(pi: np.ndarray, lam: np.ndarray, where: str = "availability") -> None:
    """Raise ConfigError unless every (π, λ) is an irreducible, aperiodic two-state chain (Assumption 1)."""
    pi, lam = np.asarray(pi, dtype=np.float64), np.asarray(lam, dtype=np.float64)
    if bool(((pi <= 0) | (pi >= 1)).any()):
        raise ConfigError(f"{where}: every π must lie strictly between 0 and 1 (got {pi.tolist()})")
    low, _ = lambda_bounds(pi)
    bad = (lam < low - 1e-12) | (lam >= 1) | (lam <= -1)
    if bool(bad.any()):
        k = int(np.flatnonzero(bad)[0])
        raise ConfigError(
            f"{where}: λ = {lam[k]:g} is not a valid eigenvalue for π = {pi[k]:g}; "
            f"it must satisfy max(1 − 1/π, 1 − 1/(1−π), −1) = {max(low[k], -1.0):g} ≤ λ < 1"
        )


def transition_probabilities(pi: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P(active → active), P(inactive → active)) = (λ + (1 − λ)π, (1 − λ)π)."""
    pi, lam = np.asarray(pi, dtype=np.float64), np.asarray(lam, dtype=np.float64)
    return lam + (1.0 - lam) * pi, (1.0 - lam) * pi


def step_chains(state: np.ndarray | None, pi: np.ndarray, lam: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One step of independent chains driven by uniforms `u`; ``state=None`` draws the stationary start."""
    if state is None:
        return u < pi
    stay, enter = transition_probabilities(pi, lam)
    return np.where(state, u < stay, u < enter)


def _per_item(value: ArrayLike, count: int, what: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size == 1:
        return np.full(count, float(arr[0]))
    if arr.size != count:
        raise ConfigError(f"{what} needs one value or {count} values (got {arr.size})")
    return arr


class MarkovChains(Availability):
    """Clients driven by independent two-state chains; several clients may share one chain.

    Subclasses define `chains()`: the chains' (π, λ) and the chain of each client. ``pi``/``lam`` then give
    each client's marginal stationary availability and eigenvalue (what the paper's oracle knows) as
    ``client_pi``/``client_lambda``.
    """

    _chain_pi: np.ndarray = PrivateAttr(default_factory=lambda: np.zeros(0))
    _chain_lam: np.ndarray = PrivateAttr(default_factory=lambda: np.zeros(0))
    _member: np.ndarray = PrivateAttr(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _state: np.ndarray | None = PrivateAttr(None)
    _round: int = PrivateAttr(-1)

    def chains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(π per chain, λ per chain, chain index of each client)."""
        raise NotImplementedError

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        pi, lam, member = self.chains()
        check_chains(pi, lam, f"availability '{self.name}'")
        if len(member) != num_clients:
            raise ConfigError(f"availability '{self.name}': {len(member)} clients described, expected {num_clients}")
        self._chain_pi, self._chain_lam, self._member = pi, lam, member.astype(np.int64)
        self._state, self._round = None, -1

    @property
    def client_pi(self) -> np.ndarray:
        """Stationary availability π_k of each client (K,)."""
        return self._chain_pi[self._member]

    @property
    def client_lambda(self) -> np.ndarray:
        """Second eigenvalue λ_k of each client's chain (K,)."""
        return self._chain_lam[self._member]

    @property
    def member(self) -> np.ndarray:
        """The chain (cluster) of each client (K,)."""
        return self._member.copy()

    def saved_arrays(self) -> dict[str, np.ndarray]:
        """Each client's π, λ and chain."""
        return {"pi": self.client_pi, "lambda": self.client_lambda, "chain": self.member}

    def available(self, round_: int) -> Tensor:
        if round_ < self._round:  # asked for the past: replay from the start (same streams, same states)
            self._state, self._round = None, -1
        while self._round < round_:
            self._round += 1
            u = self.rng("availability", self._round).random(len(self._chain_pi))
            self._state = step_chains(self._state, self._chain_pi, self._chain_lam, u)
        assert self._state is not None
        return torch.as_tensor(self._state[self._member], dtype=torch.bool)

    def state_dict(self) -> dict[str, Any]:
        return {"round": self._round, "state": None if self._state is None else self._state.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._round = int(state["round"])
        self._state = None if state["state"] is None else np.asarray(state["state"], dtype=bool).copy()


@AVAILABILITY.register
class Markov(MarkovChains):
    """Independent two-state chain per client (Sec. III-D), given π_k and λ_k (one value or one per client)."""

    name: ClassVar[str] = "markov"
    description: ClassVar[str] = "an independent two-state Markov chain per client, by stationary π and eigenvalue λ"
    pi: ArrayLike = Field(0.5, description="stationary availability π_k (one value or one per client)")
    lam: ArrayLike = Field(0.0, description="second eigenvalue λ_k of each chain (one value or one per client)")

    def chains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.num_clients
        return _per_item(self.pi, k, "availability.pi"), _per_item(self.lam, k, "availability.lam"), np.arange(k)


@AVAILABILITY.register
class MarkovClusters(MarkovChains):
    """Spatially correlated availability (Sec. VI-B): one chain per cluster; its clients are on and off together.

    Clusters are contiguous blocks of client ids unless `assignment` gives each client's cluster.
    """

    name: ClassVar[str] = "markov_clusters"
    description: ClassVar[str] = "one two-state Markov chain per cluster of clients (on and off together)"
    clusters: int = Field(2, ge=1, description="number of clusters")
    pi: ArrayLike = Field(0.5, description="stationary availability π_c (one value or one per cluster)")
    lam: ArrayLike = Field(0.0, description="second eigenvalue λ_c (one value or one per cluster)")
    assignment: list[int] = Field(default_factory=list, description="cluster of each client (default: blocks)")

    def chains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k, c = self.num_clients, self.clusters
        member = np.asarray(self.assignment, dtype=np.int64) if self.assignment else block_groups(k, c)
        if len(member) and (member.min() < 0 or member.max() >= c):
            raise ConfigError(f"availability.assignment: cluster ids must lie in 0..{c - 1}")
        return _per_item(self.pi, c, "availability.pi"), _per_item(self.lam, c, "availability.lam"), member


@AVAILABILITY.register
class ClientClasses(MarkovChains):
    """The paper's client classes (Sec. V-A): more/less available × correlated/weakly correlated.

    Clients are cut into `groups` contiguous data groups (as the CA-Fed datasets lay them out). Within each
    group a uniformly random half is "more available" (π = 1/2 + g), the rest "less available" (π = 1/2 − g);
    each half is split again uniformly at random into "correlated" (λ = ν) and "weakly correlated"
    (λ ~ N(0, ε²)) clients, λ clipped to the valid range. ``mix="repo"`` follows the authors' code instead
    (their type matrix [[0, ½, 0], [¼, ¼, 0]]): every more available client is weakly correlated with
    λ = (N(0, ε²) + ε)/2, the less available half is split into correlated and weakly correlated clients; the
    code assigns these types over all clients at random, here they are split within each group (6/3/3 of 12).
    The classes come from `layout_seed` (fixed across runs, like the authors' data seed 42, so that per-client
    figures average over seeds); the chains' trajectories come from the run seed.
    """

    name: ClassVar[str] = "cafed_classes"
    description: ClassVar[str] = "CA-Fed client classes: more/less available x correlated/weakly correlated chains"
    g: float = Field(0.4, gt=0, lt=0.5, description="availability heterogeneity: π = 1/2 ± g")
    nu: float = Field(0.9, gt=-1, lt=1, description="λ of the correlated clients")
    eps: float = Field(1e-2, ge=0, description="std of λ ~ N(0, ε²) of the weakly correlated clients")
    groups: int = Field(2, ge=1, description="data groups (contiguous blocks of client ids)")
    layout_seed: int | None = Field(42, description="seed of the class assignment (None: the run seed)")
    mix: Literal["paper", "repo"] = Field(
        "paper",
        description="class mix: 'paper' (Sec. V-A, four equal cells per group) or 'repo' (the authors' code: every "
        "more available client weakly correlated, λ = (N(0, ε²) + ε)/2)",
    )

    def derived(self) -> dict[str, Any]:
        return {"layout_seed": self.seed} if self.layout_seed is None else {}

    def classes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(data group, more available?, correlated?) of each client."""
        k = self.num_clients
        seed = self.seed if self.layout_seed is None else self.layout_seed
        rng = numpy_rng(seed, "cafed-classes")
        group = block_groups(k, self.groups)
        more = np.zeros(k, dtype=bool)
        correlated = np.zeros(k, dtype=bool)
        for g in range(self.groups):
            members = rng.permutation(np.flatnonzero(group == g))
            more_half, less_half = np.array_split(members, 2)
            more[more_half] = True
            for half, split in ((more_half, self.mix == "paper"), (less_half, True)):
                corr, _ = np.array_split(rng.permutation(half), 2)
                correlated[corr] = split
        return group, more, correlated

    def saved_arrays(self) -> dict[str, np.ndarray]:
        """Each client's π, λ and chain, and its class: data group, more available?, correlated?"""
        group, more, correlated = self.classes()
        return {**super().saved_arrays(), "group": group, "more_available": more, "correlated": correlated}

    def chains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.num_clients
        seed = self.seed if self.layout_seed is None else self.layout_seed
        _, more, correlated = self.classes()
        pi = np.where(more, 0.5 + self.g, 0.5 - self.g)
        weak = numpy_rng(seed, "cafed-weak-lambda").normal(0.0, self.eps, k)
        if self.mix == "repo":
            weak = 0.5 * (weak + self.eps)
        low, _ = lambda_bounds(pi)
        lam = np.clip(np.where(correlated, self.nu, weak), np.maximum(low, -1 + 1e-8), 1 - 1e-8)
        return pi, lam, np.arange(k)
