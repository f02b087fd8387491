"""The min-norm subproblem of MGDA / FedMGDA+ (Hu et al., eqs. 23 and 25; Algorithm 1, line 6).

    λ* = argmin_λ ‖Σ_i λ_i ḡ_i‖² = λᵀ G λ   subject to   λ ∈ Δ (λ ≥ 0, Σ λ_i = 1),   ‖λ − λ0‖_∞ ≤ ε,

with G the Gram matrix G_ij = ⟨ḡ_i, ḡ_j⟩ of the (normalised) client updates. The feasible set is the box
[max(0, λ0 − ε), min(1, λ0 + ε)] cut by the hyperplane Σ λ_i = 1, so ε = 0 gives λ0 (FedAvg) and ε ≥ 1 gives plain
MGDA over the simplex.

`min_norm_weights` solves it exactly (to round-off) with a primal active-set method for convex quadratic
programs (Nocedal & Wright, *Numerical Optimization*, Algorithm 16.3), written for this problem: the working set
holds the variables pinned to a bound; each step minimises the objective over the others on the hyperplane
(an equality-constrained QP solved in an orthonormal basis of {Σ p = 0}). G is only positive *semi*-definite
(parallel or zero updates, more clients than dimensions); directions of zero curvature are handled explicitly
(a descent ray is followed to the next bound; otherwise the minimum-norm solution is taken), so no ridge is added.
On exit the KKT conditions are checked; the result is the optimum to about 1e-12 in λ for well-posed problems,
and in objective value always.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MinNormSolution", "box_bounds", "min_norm_objective", "min_norm_two", "min_norm_weights", "solve_min_norm"]

_FREE, _LOWER, _UPPER, _FIXED = 0, 1, 2, 3


@dataclass(frozen=True)
class MinNormSolution:
    """λ*, the objective λ*ᵀGλ*, the active-set iterations taken and the largest KKT violation at exit."""

    weights: np.ndarray
    objective: float
    iterations: int
    kkt_violation: float


def box_bounds(center: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The ε-box around λ0 intersected with [0, 1]: lower max(0, λ0 − ε), upper min(1, λ0 + ε)."""
    return np.maximum(0.0, center - eps), np.minimum(1.0, center + eps)


def min_norm_objective(gram: np.ndarray, weights: np.ndarray) -> float:
    """λᵀ G λ = ‖Σ_i λ_i ḡ_i‖²."""
    return float(weights @ gram @ weights)


def min_norm_two(gram: np.ndarray, lower: float = 0.0, upper: float = 1.0) -> np.ndarray:
    """Closed form for two vectors (Sener & Koltun 2018, Alg. 1): λ_1 = ⟨g2 − g1, g2⟩ / ‖g1 − g2‖², clipped to the
    box [lower, upper] for λ_1 (λ_2 = 1 − λ_1); the midpoint of the box when g1 = g2."""
    diff = gram[0, 0] - 2 * gram[0, 1] + gram[1, 1]
    raw = (gram[1, 1] - gram[0, 1]) / diff if diff > 0 else 0.5 * (lower + upper)
    first = float(np.clip(raw, lower, upper))
    return np.array([first, 1.0 - first])


def _null_basis(size: int) -> np.ndarray:
    """An orthonormal basis (size × size−1) of {p : Σ p = 0}."""
    full, _ = np.linalg.qr(np.ones((size, 1)), mode="complete")
    return full[:, 1:]


def _eqp_step(q: np.ndarray, g: np.ndarray, tol: float) -> tuple[np.ndarray, bool]:
    """Minimise ½ pᵀ q p + gᵀ p over Σ p = 0. Returns (p, ray): with ray=True, p is a direction of zero curvature
    along which the objective decreases without bound (follow it to a bound)."""
    size = len(g)
    if size < 2:
        return np.zeros(size), False
    z = _null_basis(size)
    h = z.T @ q @ z
    r = z.T @ g
    values, vectors = np.linalg.eigh(0.5 * (h + h.T))
    curved = values > tol * max(1.0, float(values.max(initial=0.0)))
    coef = vectors.T @ r
    flat = ~curved
    if bool(flat.any()) and float(np.abs(coef[flat]).max()) > tol * max(1.0, float(np.abs(r).max())):
        return -(z @ (vectors[:, flat] @ coef[flat])), True
    step = vectors[:, curved] @ (coef[curved] / values[curved])
    return -(z @ step), False


def solve_min_norm(
    gram: np.ndarray,
    center: np.ndarray | None = None,
    eps: float = 1.0,
    *,
    tol: float = 1e-12,
    max_iter: int | None = None,
) -> MinNormSolution:
    """Solve min λᵀGλ over the simplex with ‖λ − λ0‖_∞ ≤ ε (eq. 25) exactly by an active-set method.

    `gram`: (n, n) symmetric positive semi-definite. `center`: λ0 on the simplex (default uniform 1/n).
    """
    gram = np.asarray(gram, dtype=np.float64)
    n = gram.shape[0]
    if gram.shape != (n, n) or n == 0:
        raise ValueError(f"gram must be a non-empty square matrix, got shape {gram.shape}")
    c = np.full(n, 1.0 / n) if center is None else np.asarray(center, dtype=np.float64).copy()
    if c.shape != (n,) or bool((c < -1e-12).any()) or abs(float(c.sum()) - 1.0) > 1e-6:
        raise ValueError("center must be a probability vector with one entry per client")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    q = 0.5 * (gram + gram.T)
    scale = float(np.max(np.abs(np.diag(q)))) if n else 0.0
    if n == 1 or eps == 0 or scale <= 0.0:
        return MinNormSolution(c, min_norm_objective(q, c), 0, 0.0)
    c = np.clip(c, 0.0, None) / np.clip(c, 0.0, None).sum()  # a float32 λ0 may miss Σ = 1 by ~1e-8
    q = q / scale  # the solution does not depend on the scale; tolerances become relative
    lower, upper = box_bounds(c, eps)
    state = np.where(upper - lower <= 1e-15, _FIXED, _FREE)
    lam = c.copy()
    limit = max_iter if max_iter is not None else 50 * n + 100
    iterations = 0
    while iterations < limit:
        iterations += 1
        free = np.flatnonzero(state == _FREE)
        grad = q @ lam
        step, ray = _eqp_step(q[np.ix_(free, free)], grad[free], tol)
        if not ray and float(np.abs(step).max(initial=0.0)) <= 1e-13:
            worst, index = _worst_multiplier(grad, state, free)
            if worst >= -1e3 * tol:
                break
            state[index] = _FREE  # release the constraint whose multiplier has the wrong sign
            continue
        alpha, blocking, bound = (np.inf, -1, _FREE) if ray else (1.0, -1, _FREE)
        for j, i in enumerate(free):
            if step[j] < -1e-15:
                room, side = (lower[i] - lam[i]) / step[j], _LOWER
            elif step[j] > 1e-15:
                room, side = (upper[i] - lam[i]) / step[j], _UPPER
            else:
                continue
            if room < alpha:
                alpha, blocking, bound = max(room, 0.0), int(i), side
        if not np.isfinite(alpha):
            raise RuntimeError("min-norm QP: unbounded direction inside a bounded set (numerical breakdown)")
        lam[free] += alpha * step
        if blocking >= 0:
            lam[blocking] = lower[blocking] if bound == _LOWER else upper[blocking]
            state[blocking] = bound
        lam = _repair(lam, lower, upper, state)
    else:
        raise RuntimeError(f"min-norm QP did not converge in {limit} active-set iterations")
    free = np.flatnonzero(state == _FREE)
    violation = max(0.0, -_worst_multiplier(q @ lam, state, free)[0])
    return MinNormSolution(lam, min_norm_objective(0.5 * (gram + gram.T), lam), iterations, violation)


def _worst_multiplier(grad: np.ndarray, state: np.ndarray, free: np.ndarray) -> tuple[float, int]:
    """The most negative Lagrange multiplier of a bound in the working set (and its index).

    Stationarity on the hyperplane: free variables share ∂f/∂λ_i = ν; a variable at its lower bound needs
    ∂f/∂λ_i − ν ≥ 0, at its upper bound ν − ∂f/∂λ_i ≥ 0 (fixed variables, with lower = upper, are never released).
    """
    if len(free) == 0:
        return 0.0, -1
    nu = float(grad[free].mean())
    multipliers = np.full(len(grad), np.inf)
    at_lower, at_upper = state == _LOWER, state == _UPPER
    multipliers[at_lower] = grad[at_lower] - nu
    multipliers[at_upper] = nu - grad[at_upper]
    index = int(np.argmin(multipliers))
    return float(multipliers[index]), index


def _repair(lam: np.ndarray, lower: np.ndarray, upper: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Remove round-off: clip to the box and put any drift of Σλ from 1 on the free variables."""
    lam = np.clip(lam, lower, upper)
    free = state == _FREE
    drift = 1.0 - float(lam.sum())
    if drift != 0.0 and bool(free.any()):
        lam[free] += drift / int(free.sum())
        lam = np.clip(lam, lower, upper)
    return lam


def min_norm_weights(gram: np.ndarray, center: np.ndarray | None = None, eps: float = 1.0) -> np.ndarray:
    """λ* of eq. (25) (see `solve_min_norm`)."""
    return solve_min_norm(gram, center, eps).weights
