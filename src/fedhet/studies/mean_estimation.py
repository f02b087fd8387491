"""MaxFL's mean-estimation study (App. A of the TMLR version; Fig. 2 and Fig. 5).

Client k has true loss f_k(w) = (w − θ_k)², empirical mean θ̂_k ~ N(θ_k, γ²) (γ² = 1), local model ŵ_k = θ̂_k and
requirement ρ_k = (θ̂_k − θ_k)², so the global model w appeals to k iff |w − θ_k| < |θ̂_k − θ_k|. Three global
objectives (all with F_k(w) − ρ_k = (w − θ̂_k)²):

- standard FL: Σ_k (w − θ̂_k)² (minimiser: the average of the θ̂_k);
- MaxFL (ReLU): Σ_k ReLU((w − θ̂_k)²) — the same minimiser (Lemma 2.2);
- MaxFL: Σ_k σ((w − θ̂_k)²), non-convex; a local minimum is found by L-BFGS (scipy.optimize) from a start drawn
  uniformly between the clients' empirical means (the paper does not say where it starts).

All runs of one setting are solved at once: the objectives are separable, so minimising their sum over the
vector of runs finds each run's local minimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from fedhet.seeding import numpy_rng


def maxfl_objective(w: np.ndarray, theta_hat: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ_runs Σ_k σ((w_r − θ̂_rk)²) and its gradient in w (runs × clients)."""
    d = w[:, None] - theta_hat
    s = expit(d**2)
    return float(s.sum()), (s * (1 - s) * 2 * d).sum(1)


def local_minimum(theta_hat: np.ndarray, start: np.ndarray) -> np.ndarray:
    """A local minimum of the MaxFL objective for every run (rows of `theta_hat`)."""
    res = minimize(
        maxfl_objective, start, args=(theta_hat,), jac=True, method="L-BFGS-B", options={"maxiter": 2000, "gtol": 1e-10}
    )
    return np.asarray(res.x)


def expected_appeal(w: np.ndarray, theta: np.ndarray, theta_hat: np.ndarray, tie_scale: float = 1e-9) -> float:
    """Mean over runs of the share of clients with |w − θ_k| < |θ̂_k − θ_k| (strict).

    A local minimum of MaxFL sits strictly beside a client's θ̂_k, shifted toward the other clients by an
    amount that underflows in floating point when they are far (it scales like exp(−distance²)). Where
    |w − θ̂_k| < `tie_scale`, the test therefore uses the exact minimiser's side: the direction of the nearest
    other client (an infinitesimal shift appeals iff it points toward θ_k).
    """
    d = w[:, None] - theta_hat
    appealing = np.abs(w[:, None] - theta) < np.abs(theta_hat - theta)
    if theta_hat.shape[1] > 1:
        gaps = theta_hat[:, None, :] - theta_hat[:, :, None]  # gaps[r, k, j] = θ̂_j − θ̂_k
        masked = np.where(np.eye(theta_hat.shape[1], dtype=bool), np.inf, np.abs(gaps))
        nearest = np.take_along_axis(gaps, masked.argmin(2)[:, :, None], 2)[:, :, 0]
        tie = np.abs(d) < tie_scale
        appealing = np.where(tie, np.sign(nearest) == np.sign(theta - theta_hat), appealing)
    return float(appealing.mean())


@dataclass
class AppealCurve:
    gamma_g2: np.ndarray  # heterogeneity γ_G² = ((θ_1 − θ_2)/2)²
    fedavg: np.ndarray
    maxfl_relu: np.ndarray
    maxfl: np.ndarray


def solutions(theta: np.ndarray, runs: int, seed: int, key: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """θ̂ draws (runs × clients) and each objective's solution per run."""
    rng = numpy_rng(seed, "mean-estimation", key)
    theta_hat = rng.normal(theta, 1.0, size=(runs, len(theta)))
    average = theta_hat.mean(1)
    start = rng.uniform(theta_hat.min(1), theta_hat.max(1))
    return theta_hat, {"fedavg": average, "maxfl_relu": average.copy(), "maxfl": local_minimum(theta_hat, start)}


def two_client_curve(points: int = 21, runs: int = 10_000, seed: int = 0, max_gamma_g2: float = 20.0) -> AppealCurve:
    """Expected GM-appeal against γ_G² ∈ [0, max] with θ_1 = 0, θ_2 = 2γ_G (Fig. 2a)."""
    return _curve(1, points, runs, seed, max_gamma_g2, key=0)


def three_client_curve(points: int = 21, runs: int = 10_000, seed: int = 0, max_gamma_g2: float = 20.0) -> AppealCurve:
    """The three-client case "two close, one far" (Fig. 5c) as a curve: θ_1 = θ_2 = 0, θ_3 = 2γ_G."""
    return _curve(2, points, runs, seed, max_gamma_g2, key=2000)


def _curve(at_zero: int, points: int, runs: int, seed: int, max_gamma_g2: float, key: int) -> AppealCurve:
    """`at_zero` clients with θ = 0 and one with θ = 2γ_G, for γ_G² on a grid over [0, max]."""
    grid = np.linspace(0.0, max_gamma_g2, points)
    out: dict[str, list[float]] = {"fedavg": [], "maxfl_relu": [], "maxfl": []}
    for i, g2 in enumerate(grid):
        theta = np.array([0.0] * at_zero + [2 * np.sqrt(g2)])
        theta_hat, sols = solutions(theta, runs, seed, key + i)
        for name, w in sols.items():
            out[name].append(expected_appeal(w, theta, theta_hat))
    return AppealCurve(grid, *(np.asarray(out[k]) for k in ("fedavg", "maxfl_relu", "maxfl")))


THREE_CLIENT_CASES: dict[str, tuple[float, float, float]] = {
    "close means (0, 0.3, 0.6)": (0.0, 0.3, 0.6),
    "all different (0, 5, 13)": (0.0, 5.0, 13.0),
    "two close, one far (0, 0.5, 8)": (0.0, 0.5, 8.0),
}


def three_client_appeal(runs: int = 10_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Expected GM-appeal of each objective in the three cases of Fig. 5 (θ chosen to illustrate them)."""
    table: dict[str, dict[str, float]] = {}
    for i, (case, means) in enumerate(THREE_CLIENT_CASES.items()):
        theta = np.asarray(means)
        theta_hat, sols = solutions(theta, runs, seed, 1000 + i)
        table[case] = {name: expected_appeal(w, theta, theta_hat) for name, w in sols.items()}
    return table


def fedavg_bound(gamma_g2: np.ndarray) -> np.ndarray:
    """Lemma 2.1: E[GM-appeal of standard FL] ≤ 2 exp(−γ_G² / (5γ²)) with γ² = 1."""
    return np.minimum(1.0, 2 * np.exp(-gamma_g2 / 5))


MAXFL_LOWER_BOUND = float(np.exp(-1.0) / 16)  # Theorem 2.1 with γ² = 1
