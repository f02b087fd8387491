"""Shared pieces of the availability-aware strategies (CA-Fed, Unbiased, AdaFed, F3AST).

The generic algorithm of CA-Fed's paper (Rodio et al. 2023, eqs. 2–3): every round the server observes the
active set A_t, chooses weights q_k ≥ 0, the active clients with q_k > 0 run E local steps, and

    w_{t+1,0} = w_{t,0} + η_s Σ_{k ∈ A_t} q_k Δ_k^t,   Δ_k^t = w^k_{t,E} − w_{t,0}                    (3)

with un-normalised q. The server's view of availability (π̂, λ̂) comes from an oracle of the run's process or
from Bayesian estimates (`fedhet.availability.estimators`). Every round's A_t, S_t and q_t are logged for the
participation figures (`participation_log`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.availability.estimators import (
    AvailabilityEstimator,
    BayesianAvailability,
    BetaPrior,
    oracle_for,
)
from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import ServerContext, Strategy, weighted_update

# ----------------------------------------------------------------------------------------------------------------
# Maths (NumPy, float64)
# ----------------------------------------------------------------------------------------------------------------


def target_importance(sizes: np.ndarray, weighting: str = "samples") -> np.ndarray:
    """α_k ∝ |D_k| ("samples", per-sample fairness) or α_k = 1/N ("uniform") (Sec. II, VI-C)."""
    w = np.asarray(sizes, dtype=np.float64) if weighting == "samples" else np.ones(len(sizes))
    return w / w.sum()


def unbiased_weights(alpha: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """q_k = α_k / π_k, which makes the biased importance p equal α (Sec. III-B, Guideline C)."""
    return np.asarray(alpha, dtype=np.float64) / np.asarray(pi, dtype=np.float64)


def biased_importance(pi: np.ndarray, q: np.ndarray) -> np.ndarray:
    """p = π ⊙~ q, i.e. p_k = π_k q_k / Σ_h π_h q_h (eq. 4); zeros when every q_k is 0."""
    mass = np.asarray(pi, dtype=np.float64) * np.asarray(q, dtype=np.float64)
    total = mass.sum()
    return mass / total if total > 0 else np.zeros_like(mass)


def tv_distance(alpha: np.ndarray, p: np.ndarray) -> float:
    """d_TV(α, p) = ½ Σ_k |α_k − p_k| (Theorem 3)."""
    return 0.5 * float(np.abs(np.asarray(alpha) - np.asarray(p)).sum())


def proxy_error(
    q: np.ndarray, alpha: np.ndarray, pi: np.ndarray, gap: np.ndarray, gamma: float, bias_weight: float = 1.0
) -> float:
    """ε̂ = ⟨F̂ − F̂*, π ⊙~ q⟩ + κ̄² d_TV²(α, π ⊙~ q) Γ̂′ (eqs. 16–18; κ̄² from Sec. VI-A, 1 in eq. 14)."""
    p = biased_importance(pi, q)
    return float(np.dot(gap, p)) + bias_weight * tv_distance(alpha, p) ** 2 * gamma


def greedy_exclusion(
    q: np.ndarray,
    order: np.ndarray,
    alpha: np.ndarray,
    pi: np.ndarray,
    gap: np.ndarray,
    gamma: float,
    tau: float = 0.0,
    bias_weight: float = 1.0,
    exclude_on_ties: bool = False,
) -> np.ndarray:
    """The function `get` of Algorithm 1 (lines 16–27): visit clients in `order`; set q_k = 0 whenever that
    lowers ε̂ by at least τ (line 22: ε̂ − ε̂⁺ ≥ τ). Kept weights are not renormalised. A client is never
    excluded if that would exclude everyone (p would be undefined).

    With τ = 0, line 22 also holds at exact ties ε̂⁺ = ε̂, which happen when ε̂ ≡ 0 (every F̂_k at its running
    minimum, so Γ̂′ = 0: e.g. the first round, or exact loss reports while all losses fall); taken literally
    the server then excludes every client but one without any estimated gain. By default an exclusion needs
    a strict decrease as well (identical to line 22 whenever τ > 0); ``exclude_on_ties=True`` is the literal
    rule.
    """
    q = np.asarray(q, dtype=np.float64).copy()
    eps = proxy_error(q, alpha, pi, gap, gamma, bias_weight)
    for k in order:
        if q[k] == 0:
            continue
        trial = q.copy()
        trial[k] = 0.0
        if not (trial > 0).any():
            continue
        eps_plus = proxy_error(trial, alpha, pi, gap, gamma, bias_weight)
        if eps - eps_plus >= tau and (exclude_on_ties or eps_plus < eps):
            eps, q = eps_plus, trial
    return q


def descending(values: np.ndarray) -> np.ndarray:
    """Client ids by descending `values` (ties by id, a stable sort)."""
    return np.argsort(-np.asarray(values, dtype=np.float64), kind="stable")


# ----------------------------------------------------------------------------------------------------------------
# Strategy base
# ----------------------------------------------------------------------------------------------------------------


class AvailabilityAware(Strategy):
    """Base of strategies that weight active clients by their availability: subclasses define `weights`.

    Each round: observe 1_{A_t}, update (π̂, λ̂), compute q over all N clients, train the active clients with
    q_k > 0 (active clients with q_k = 0 stay idle), aggregate with eq. (3).
    """

    oracle: str | dict[str, Any] | None = Field(
        None,
        description="availability process whose true π, λ the server knows (the paper's oracle, e.g. the run's "
        "availability spec); None: Bayesian estimates from the observed activity",
    )
    prior: BetaPrior = Field(default_factory=BetaPrior, description="Beta priors of the Bayesian estimators")
    weighting: Literal["samples", "uniform"] = Field("samples", description="α_k ∝ samples, or uniform")

    _alpha: np.ndarray = PrivateAttr(default_factory=lambda: np.zeros(0))
    _availability: AvailabilityEstimator | None = PrivateAttr(None)
    _q: np.ndarray = PrivateAttr(default_factory=lambda: np.zeros(0))
    _log: dict[str, list[np.ndarray]] = PrivateAttr(default_factory=dict)
    _last: dict[str, float] = PrivateAttr(default_factory=dict)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        n = ctx.num_clients
        self._alpha = target_importance(ctx.train_sizes.numpy(), self.weighting)
        if self.oracle is not None:
            self._availability = oracle_for(self.oracle, n, ctx.seed)
        else:
            self._availability = BayesianAvailability(n, self.prior)
        self._q = np.zeros(n)
        self._log = {"active": [], "selected": [], "weights": [], "pi_hat": [], "lambda_hat": []}
        self._last = {}

    @property
    def alpha(self) -> np.ndarray:
        """Target importance α (N,)."""
        return self._alpha

    @property
    def estimator(self) -> AvailabilityEstimator:
        if self._availability is None:
            raise RuntimeError(f"strategy '{self.name}' used before setup()")
        return self._availability

    def weights(self, round_: int, active: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """q (N,) ≥ 0 for this round given the active mask and the availability estimates."""
        raise NotImplementedError

    def select(self, round_: int, available: Tensor) -> Tensor:
        active = available.numpy().astype(bool)
        self.estimator.observe(active)
        pi, lam = self.estimator.estimates()
        q = np.asarray(self.weights(round_, active, pi, lam), dtype=np.float64)
        selected = active & (q > 0)
        self._q = q
        self._record(active, selected, q, pi, lam)
        return torch.as_tensor(np.flatnonzero(selected), dtype=torch.long)

    def _record(self, active: np.ndarray, selected: np.ndarray, q: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> None:
        for key, value in (
            ("active", active),
            ("selected", selected),
            ("weights", np.where(selected, q, 0.0)),
            ("pi_hat", pi),
            ("lambda_hat", lam),
        ):
            self._log[key].append(np.asarray(value).copy())
        p = biased_importance(pi, q)
        self._last = {
            "selected": float(selected.sum()),
            "excluded": float((active & ~selected).sum()),
            "weight_sum": float(q[selected].sum()),
            "tv_alpha_p": tv_distance(self._alpha, p),
        }

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """w ← w + η_s Σ_k q_k Δ_k (eq. 3; the engine's updates are w − w_k = −Δ_k), through the server optimiser
        (the authors' code: ``server_optimizer: {name: momentum, beta: 0.9}``)."""
        q = torch.as_tensor(self._q[result.clients.numpy()], dtype=torch.float32)
        return self.server_step(global_params, weighted_update(result.updates(global_params), q))

    def round_metrics(self) -> dict[str, float]:
        return dict(self._last)

    def participation_log(self) -> dict[str, np.ndarray]:
        """Per round × client arrays: active, selected, applied weight q_k 1{k ∈ S_t}, π̂, λ̂; and α."""
        out = {key: np.stack(rows) if rows else np.zeros((0, len(self._alpha))) for key, rows in self._log.items()}
        out["alpha"] = self._alpha.copy()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "availability": self.estimator.state_dict(),
            "q": self._q.copy(),
            "log": {key: [r.copy() for r in rows] for key, rows in self._log.items()},
            "last": dict(self._last),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.estimator.load_state_dict(state["availability"])
        self._q = np.asarray(state["q"], dtype=np.float64).copy()
        self._log = {key: [np.asarray(r).copy() for r in rows] for key, rows in state["log"].items()}
        self._last = dict(state["last"])
