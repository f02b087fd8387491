"""MaxFL's mean-estimation study (App. A of the TMLR version; Fig. 2 and Fig. 5) and its figure.

Client k has true loss f_k(w) = (w − θ_k)², empirical mean θ̂_k ~ N(θ_k, γ²) (γ² = 1), local model ŵ_k = θ̂_k and
requirement ρ_k = (θ̂_k − θ_k)², so the global model w appeals to k iff |w − θ_k| < |θ̂_k − θ_k|. Three global
objectives (all with F_k(w) − ρ_k = (w − θ̂_k)²):

- standard FL: Σ_k (w − θ̂_k)² (minimiser: the average of the θ̂_k);
- MaxFL (ReLU): Σ_k ReLU((w − θ̂_k)²) — the same minimiser (Lemma 2.2);
- MaxFL: Σ_k σ((w − θ̂_k)²), non-convex. The paper finds "a local minima ... using the scipy.optimize function"
  without saying from where; here each run starts uniformly between its clients' empirical means and goes to the
  local minimum of its start's basin: the one gradient descent with small steps reaches (`local_minimum`).

Each run is minimised to its own stationarity (|∂/∂w| ≤ 1e-10 and a bracketing sign change of the derivative).
An earlier version ran one L-BFGS-B over the *sum* of all runs' objectives: it stopped when the sum stopped
falling, which left some runs far from stationary (docs/maxfl.md has the curve before and after, and what
scipy.optimize.minimize run per run from other starts would pick).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import expit

from fedhet.seeding import numpy_rng

CURVATURE_BOUND = 1.0  # ≥ max_w |d²/dw² σ((w − θ)²)| = max_u |2σ'(u) + 4uσ''(u)| ≈ 0.5 (checked by a test)


def _terms(w: np.ndarray, theta_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d = w − θ̂ (runs × clients), σ(d²) and σ'(d²) = σ(d²)σ(−d²) (no cancellation for large d²)."""
    d = w[:, None] - theta_hat
    u = d * d
    return d, expit(u), expit(u) * expit(-u)


def maxfl_objective(w: np.ndarray, theta_hat: np.ndarray) -> np.ndarray:
    """Per run r: Σ_k σ((w_r − θ̂_rk)²) (`theta_hat` is runs × clients)."""
    return np.asarray(expit((w[:, None] - theta_hat) ** 2).sum(1))


def maxfl_gradient(w: np.ndarray, theta_hat: np.ndarray) -> np.ndarray:
    """Per run: d/dw Σ_k σ((w − θ̂_k)²) = Σ_k 2 (w − θ̂_k) σ'((w − θ̂_k)²)."""
    d, _, ds = _terms(w, theta_hat)
    return np.asarray((2 * d * ds).sum(1))


def maxfl_curvature(w: np.ndarray, theta_hat: np.ndarray) -> np.ndarray:
    """Per run: d²/dw² Σ_k σ((w − θ̂_k)²) = Σ_k 2σ'(u) + 4u σ''(u), u = (w − θ̂_k)², σ'' = σ'(1 − 2σ)."""
    d, s, ds = _terms(w, theta_hat)
    u = d * d
    return np.asarray((2 * ds + 4 * u * ds * (1 - 2 * s)).sum(1))


def local_minimum(theta_hat: np.ndarray, start: np.ndarray, step: float = 0.01, bisections: int = 200) -> np.ndarray:
    """Per run (rows of `theta_hat`), the local minimum of Σ_k σ((w − θ̂_k)²) that gradient flow from `start`
    reaches: the first zero of the derivative in the downhill direction.

    All runs move at once, each with its own convergence test. A run walks downhill in steps of
    max(|g| / L, `step`) (L bounds |g'|, so the longer steps cannot pass a zero of g; `step` carries it across
    flat regions, where g ≈ 0 far from every client) until g changes sign or vanishes, then bisects that bracket
    down to adjacent floating-point numbers. A run whose start is exactly stationary stays there. The walk never
    leaves the hull of the start and the θ̂_k, since outside it every term increases away from the clients.
    """
    theta_hat = np.asarray(theta_hat, dtype=float)
    lo = np.asarray(start, dtype=float).copy()
    g = maxfl_gradient(lo, theta_hat)
    direction = -np.sign(g)
    hi = lo.copy()
    left = np.minimum(theta_hat.min(1), lo)
    right = np.maximum(theta_hat.max(1), lo)
    lipschitz = CURVATURE_BOUND * theta_hat.shape[1]
    walking = np.flatnonzero(direction != 0)
    glo = g.copy()
    while len(walking):  # bracket: g(lo) points downhill along `direction`, g(hi) does not
        i = walking
        nxt = np.clip(lo[i] + direction[i] * np.maximum(np.abs(glo[i]) / lipschitz, step), left[i], right[i])
        gn = maxfl_gradient(nxt, theta_hat[i])
        crossed = ~(gn * direction[i] < 0) | (nxt == lo[i])  # (NaN input and the hull's end count as crossed)
        hi[i[crossed]] = nxt[crossed]
        lo[i[~crossed]], glo[i[~crossed]] = nxt[~crossed], gn[~crossed]
        walking = i[~crossed]
    hi[direction == 0] = lo[direction == 0]
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        open_ = (mid != lo) & (mid != hi)
        if not open_.any():
            break
        i = np.flatnonzero(open_)
        downhill = maxfl_gradient(mid[i], theta_hat[i]) * direction[i] < 0
        lo[i[downhill]] = mid[i[downhill]]
        hi[i[~downhill]] = mid[i[~downhill]]
    g_lo, g_hi = np.abs(maxfl_gradient(lo, theta_hat)), np.abs(maxfl_gradient(hi, theta_hat))
    return np.where(g_lo < g_hi, lo, hi)


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


TWO_CLIENTS = "Expected GM-appeal against heterogeneity, two clients (MaxFL Fig. 2a)"


def plot_two_client_curve(
    curve: AppealCurve, out: Path, bounds: bool = True, title: str = TWO_CLIENTS, runs: int = 0
) -> Path:
    """Expected GM-appeal against γ_G², with the two-client bounds of Lemma 2.1 and Theorem 2.1 (MaxFL Fig. 2a).
    `runs`: the Monte-Carlo draws behind each point (for the caption). A curve equal to an earlier one is named so
    in the legend ("= standard FL"); its markers keep both visible."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import same_as, save_figure

    lines = {
        "standard FL (FedAvg)": (curve.fedavg, "o-"),
        "MaxFL (ReLU)": (curve.maxfl_relu, "x--"),
        "MaxFL": (curve.maxfl, "s-"),
    }
    notes = same_as({name: np.asarray(y) for name, (y, _) in lines.items()}, scale=1.0)
    fig, ax = plt.subplots(figsize=(7.5, 4.0), dpi=120)
    for name, (y, style) in lines.items():
        label = f"{name} ({notes[name]})" if name in notes else name
        ax.plot(curve.gamma_g2, y, style, label=label, markersize=5 if name in notes else 4)
    if bounds:
        ax.plot(curve.gamma_g2, fedavg_bound(curve.gamma_g2), ":", color="grey", label="FedAvg bound 2exp(-γ_G²/5)")
        ax.axhline(MAXFL_LOWER_BOUND, color="black", linestyle=":", label="MaxFL bound e⁻¹/16")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("heterogeneity γ_G² (squared half-distance between the clients' true means)")
    ax.set_ylabel("expected GM-appeal (share of clients)")
    ax.set_ylim(0, 1)
    draws = f"{runs:,} draws" if runs else "many draws"
    caption = (
        f"Each point: the mean over {draws} of the clients' empirical means (Monte Carlo; no band). GM-appeal: share "
        "of clients for whom the global model beats their own estimate. Bounds: Lemma 2.1 (FedAvg, upper) and "
        "Theorem 2.1 (MaxFL, lower)."
    )
    if not bounds:
        caption = caption.rsplit(" Bounds:", 1)[0]
    return save_figure(fig, ax, out, caption=caption)
