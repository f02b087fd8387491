"""The min-norm subproblem of MGDA / FedMGDA+ (Hu et al., eqs. 23 and 25; Algorithm 1, line 6).

    λ* = argmin_λ ‖Σ_i λ_i ḡ_i‖² = λᵀ G λ   subject to   λ ∈ Δ (λ ≥ 0, Σ λ_i = 1),   ‖λ − λ0‖_∞ ≤ ε,

with G the Gram matrix G_ij = ⟨ḡ_i, ḡ_j⟩ of the (normalised) client updates. The feasible set P is the box
[max(0, λ0 − ε), min(1, λ0 + ε)] cut by the hyperplane Σ λ_i = 1, so ε = 0 gives λ0 (FedAvg) and ε ≥ 1 gives plain
MGDA over the simplex.

`solve_min_norm` uses a primal active-set method for convex quadratic programs (Nocedal & Wright, *Numerical
Optimization*, Algorithm 16.3) written for this problem: the working set holds the variables pinned to a bound;
each step minimises the objective over the others on the hyperplane (an equality-constrained QP in an
orthonormal basis of {Σ p = 0}). G is only positive *semi*-definite (parallel, duplicated or zero updates, more
clients than dimensions); directions of (numerically) zero curvature are handled explicitly — a descent ray is
followed to the next bound, otherwise they are left out of the step — so no ridge is added.

Every tolerance is relative — to the problem's scale (G is divided by its largest diagonal entry, which changes no
λ*), to the size of the terms compared, and to their round-off — never an absolute step length: nearly parallel
updates (cos ḡ_i ḡ_j → 1) make the reduced Hessian almost singular, and round-off then moves λ by far more than
any fixed threshold while the objective stays put (issue 13: the old absolute test looped until its iteration
limit and raised). A working set is left once the rest of the step on it would not change the gradient beyond
that round-off (or after three full steps on it). The method stops when the relative KKT violation
(`kkt_violation`, which reads the active bounds off λ, not off the working set) is below `tol`; if round-off
leaves no bound with a wrong-sign multiplier to release first, it stops there and is converged if the
Frank–Wolfe gap max_{s ∈ P} ∇f(λ)ᵀ(λ − s), an upper bound on f(λ) − f* that needs no solver, is round-off of its
own terms. It never raises on valid input and never loops forever: after the iteration cap it returns the best
feasible point seen, with `converged=False` and its KKT violation and gap. Finally, weights within the round-off
of Σ λ = 1 of a bound are put on it when that lowers the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg.lapack import dpotrf, dpstrf, dtrtrs

__all__ = [
    "MinNormSolution",
    "box_bounds",
    "frank_wolfe_gap",
    "kkt_violation",
    "min_norm_objective",
    "min_norm_two",
    "min_norm_weights",
    "solve_min_norm",
]

_FREE, _LOWER, _UPPER, _FIXED = 0, 1, 2, 3
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class MinNormSolution:
    """The result of `solve_min_norm`.

    `weights` λ (always feasible), `objective` λᵀGλ, `iterations` taken, `kkt_violation` (relative, see
    `kkt_violation`; ≲ n·1e-16 at a solution), `gap` the Frank–Wolfe gap, an upper bound on λᵀGλ − min (same units
    as the objective, up to round-off), and `converged`: False after the iteration cap, or when round-off kept
    the optimality conditions from being certified; λ is then the best point seen, still feasible.
    """

    weights: np.ndarray
    objective: float
    iterations: int
    kkt_violation: float
    gap: float = 0.0
    converged: bool = True


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


def _best_vertex(grad: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """argmin_{s ∈ P} gradᵀs over P = {lower ≤ s ≤ upper, Σ s = 1}: fill the bounds greedily in order of the
    gradient (a continuous knapsack)."""
    vertex = lower.astype(np.float64).copy()
    budget = 1.0 - float(vertex.sum())
    for i in np.argsort(grad, kind="stable"):
        if budget <= 0.0:
            break
        add = min(float(upper[i] - lower[i]), budget)
        vertex[i] += add
        budget -= add
    return vertex


def frank_wolfe_gap(gram: np.ndarray, weights: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """max_{s ∈ P} ∇f(λ)ᵀ(λ − s) for f = λᵀGλ over P = {lower ≤ s ≤ upper, Σ s = 1}: by convexity an upper bound on
    f(λ) − min_P f, and 0 exactly at the optimum."""
    grad = 2.0 * (gram @ weights)
    return max(0.0, float(grad @ (weights - _best_vertex(grad, lower, upper))))


class _Subspace:
    """min ½ pᵀQ_FF p + gᵀp over Σ p = 0 for one free set F, with its factorisation cached across iterations.

    The basis of {Σ p = 0} is the Householder reflector that swaps 1/√k and −e_1, minus its first column. The
    reduced Hessian H = Zᵀ Q_FF Z is factorised by Cholesky or, when H is (numerically) singular, by Cholesky with
    complete pivoting (LAPACK dpstrf), which stops at rank r once the remaining curvature is below `flat`: the
    other k − 1 − r directions are flat. Only single right-hand-side triangular solves follow: no
    eigendecomposition, no matrix-matrix solve (both far slower with several BLAS threads on a busy machine:
    docs/fedmgda.md).
    """

    def __init__(self, q: np.ndarray, noise: float) -> None:
        self.flat = noise * float(np.abs(np.diag(q)).max(initial=0.0))  # relative to this block's own size
        k = len(q)
        self.size = k
        self.chol: np.ndarray | None = None
        if k < 2:
            return
        w = np.full(k, 1.0 / np.sqrt(k))
        w[0] += 1.0
        self.w = w / np.linalg.norm(w)
        qw = q @ self.w
        a = 2.0 * qw - 2.0 * float(self.w @ qw) * self.w  # (I − 2wwᵀ) Q (I − 2wwᵀ) = Q − w aᵀ − a wᵀ
        half = q[1:, 1:] - np.outer(self.w[1:], a[1:])
        h = half + half.T - q[1:, 1:]  # exactly symmetric
        if bool((np.diag(h) > self.flat).all()):
            chol, info = dpotrf(h, lower=1, clean=1, overwrite_a=0)
            if info == 0 and float(np.diag(chol).min()) ** 2 > self.flat:
                self.chol, self.perm, self.rank = chol, np.arange(k - 1), k - 1
                self.below = np.zeros((0, k - 1))
                return
        pivoted, piv, rank, _ = dpstrf(h, tol=max(self.flat, np.finfo(np.float64).tiny), lower=1)
        self.perm, self.rank = piv - 1, int(rank)
        self.chol = np.tril(pivoted[: self.rank, : self.rank])
        self.below = pivoted[self.rank :, : self.rank]  # H[perm][:, perm] ≈ [L11; L21][L11; L21]ᵀ

    def to_reduced(self, x: np.ndarray) -> np.ndarray:
        return (x - 2.0 * self.w * float(self.w @ x))[1:]

    def from_reduced(self, y: np.ndarray) -> np.ndarray:
        full = np.concatenate(([0.0], y))
        return full - 2.0 * self.w * float(self.w @ full)

    def step(self, grad: np.ndarray, noise: float) -> tuple[np.ndarray, bool]:
        """(p, ray): the minimiser's step, or with ray=True a zero-curvature descent direction (scaled to ‖p‖∞ = 1)
        along which the objective falls until a bound stops it; a slope below `noise` is round-off, not descent."""
        if self.size < 2 or self.chol is None:
            return np.zeros(self.size), False
        r = self.to_reduced(grad)[self.perm]  # in pivoted order
        head = self.perm[: self.rank]
        y = np.zeros(self.size - 1)
        solved = np.zeros(self.rank)
        if self.rank:
            solved, _ = dtrtrs(self.chol, r[: self.rank], lower=1)  # L11⁻¹ r1
        if len(self.below):
            # the flat directions are N = [−L11⁻ᵀL21ᵀ; I] (H N ≈ 0); the slopes along them, s = Nᵀr = r2 − L21 L11⁻¹ r1
            slopes = r[self.rank :] - self.below @ solved
            direction = np.zeros(self.size - 1)  # N s, a descent direction of slope ‖s‖² within the flat space
            direction[self.perm[self.rank :]] = slopes
            if self.rank:
                direction[head], _ = dtrtrs(self.chol, -(self.below.T @ slopes), lower=1, trans=1)
            length = float(np.linalg.norm(direction))
            if length > 0 and float(slopes @ slopes) > noise * length:
                ray = -self.from_reduced(direction)
                return ray / float(np.abs(ray).max()), True
        if self.rank:
            y[head], _ = dtrtrs(self.chol, solved, lower=1, trans=1)
        return -self.from_reduced(y), False


def _multipliers(grad: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Lagrange multipliers of the bounds in the working set (+inf elsewhere), which pick the bound to release.

    Stationarity on the hyperplane: free variables share ∂f/∂λ_i = ν (least squares: their mean); a variable at
    its lower bound needs ∂f/∂λ_i − ν ≥ 0, at its upper bound ν − ∂f/∂λ_i ≥ 0 (fixed ones, lower = upper, need
    nothing).
    """
    free, at_lower, at_upper = state == _FREE, state == _LOWER, state == _UPPER
    nu = float(grad[free].mean()) if bool(free.any()) else 0.0
    out = np.full(len(grad), np.inf)
    out[at_lower] = grad[at_lower] - nu
    out[at_upper] = nu - grad[at_upper]
    return out


def _violation(grad: np.ndarray, size: np.ndarray, weights: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """`kkt_violation` from ½∇f = Gλ and the sizes of its terms."""
    slack = 4.0 * len(weights) * _EPS  # the round-off of Σ λ = 1: closer to a bound than this is on it
    shrink, grow = weights > lower + slack, weights < upper - slack
    if not (bool(shrink.any()) and bool(grow.any())):
        return 0.0
    diff = grad[shrink][:, None] - grad[grow][None, :]
    total = size[shrink][:, None] + size[grow][None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(total > 0, diff / total, np.where(diff > 0, np.inf, 0.0))
    return max(0.0, float(ratio.max()))


def _sizes(size_gram: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """|G|λ + n·ulp·max_j |G_ij|: the size of the terms of (Gλ)_i, and of its change when λ moves by round-off."""
    return size_gram @ weights + len(weights) * _EPS * size_gram.max(axis=1)


def kkt_violation(gram: np.ndarray, weights: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The relative KKT violation of λ for min λᵀGλ over {lower ≤ λ ≤ upper, Σ λ = 1}; 0 exactly at the optimum.

    KKT: some ν has ∂_i f ≥ ν wherever λ_i can grow and ∂_i f ≤ ν wherever it can shrink, i.e. no weight can move
    from a client i to a client j with ∂_i f > ∂_j f. The violation is the largest (∂_i f − ∂_j f)/(|∂|_i + |∂|_j)
    over such pairs, with |∂| = 2|G|λ (+ 2n·ulp·max_j |G_ij|, the round-off of λ itself) the size of the terms that
    make up ∂f = 2Gλ: relative to the magnitudes involved, so it is about n·1e-16 at a solution whatever the scale
    of G (and of single rows). λ_i within the round-off of Σ λ = 1 (4n ulp) of a bound counts as on it. No working
    set (or solver) is needed.
    """
    return _violation(gram @ weights, _sizes(np.abs(gram), weights), weights, lower, upper)


def _repair(lam: np.ndarray, lower: np.ndarray, upper: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Remove round-off: clip to the box and spread any drift of Σλ from 1 over the free variables in proportion
    to their weight (a relative change of ~1e-16 each; a weight of 0 stays 0), or, failing that, their room."""
    if bool(((lam < lower) | (lam > upper)).any()):
        lam = np.clip(lam, lower, upper)
    for _ in range(3):
        drift = 1.0 - float(lam.sum())
        if drift == 0.0:
            break
        room = upper - lam if drift > 0 else lam - lower
        share = np.where((state == _FREE) & (room > 0), lam, 0.0)
        if not float(share.sum()) > 0.0:
            share = room
        total = float(share.sum())
        if not total > 0.0:
            break
        lam = np.clip(lam + share * (drift / max(total, abs(drift))), lower, upper)
    return lam


def _snap(q: np.ndarray, lam: np.ndarray, lower: np.ndarray, upper: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Put weights within the round-off of Σ λ = 1 (4n ulp) of a bound on it, if that lowers the objective: a
    weight of 1e-17 on an update 10⁶ times longer than the others would otherwise show in λᵀGλ."""
    slack = 4.0 * len(lam) * _EPS
    near_lower, near_upper = (lam > lower) & (lam <= lower + slack), (lam < upper) & (lam >= upper - slack)
    if not bool((near_lower | near_upper).any()):
        return lam
    snapped, pinned = np.where(near_lower, lower, np.where(near_upper, upper, lam)), state.copy()
    pinned[near_lower | near_upper] = _FIXED
    snapped = _repair(snapped, lower, upper, pinned)
    return snapped if min_norm_objective(q, snapped) <= min_norm_objective(q, lam) else lam


def solve_min_norm(
    gram: np.ndarray,
    center: np.ndarray | None = None,
    eps: float = 1.0,
    *,
    tol: float = 1e-12,
    max_iter: int | None = None,
) -> MinNormSolution:
    """Solve min λᵀGλ over the simplex with ‖λ − λ0‖_∞ ≤ ε (eq. 25) by an active-set method.

    `gram`: (n, n) symmetric positive semi-definite, finite. `center`: λ0 on the simplex (default uniform 1/n).
    `tol`: the relative KKT violation (`kkt_violation`) accepted at the solution; it is raised to the round-off
    level 16·n·ulp, the most that float64 can promise.
    """
    gram = np.asarray(gram, dtype=np.float64)
    n = gram.shape[0] if gram.ndim == 2 else 0
    if gram.shape != (n, n) or n == 0:
        raise ValueError(f"gram must be a non-empty square matrix, got shape {gram.shape}")
    if not bool(np.isfinite(gram).all()):
        raise ValueError("gram must be finite (a client update with inf or nan entries?)")
    c = np.full(n, 1.0 / n) if center is None else np.asarray(center, dtype=np.float64).copy()
    if c.shape != (n,) or not bool(np.isfinite(c).all()) or bool((c < -1e-12).any()) or abs(c.sum() - 1.0) > 1e-6:
        raise ValueError("center must be a probability vector with one entry per client")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    sym = 0.5 * (gram + gram.T)
    scale = float(np.abs(np.diag(sym)).max())
    if bool((c < 0).any()) or abs(float(c.sum()) - 1.0) > n * _EPS:  # a float32 λ0 may miss Σ = 1 by ~1e-8
        c = np.clip(c, 0.0, None) / np.clip(c, 0.0, None).sum()
    if n == 1 or eps == 0 or scale == 0.0:
        return MinNormSolution(c, min_norm_objective(sym, c), 0, 0.0)
    q = sym / scale  # λ* does not depend on the scale
    size_q = np.abs(q)
    lower, upper = box_bounds(c, eps)
    noise = 16.0 * n * _EPS  # relative round-off of a sum of n products
    accept = max(tol, noise)
    limit = max_iter if max_iter is not None else 10 * n + 100
    state = np.where(upper - lower <= 4 * _EPS, _FIXED, _FREE)
    lam = c.copy()
    best = (min_norm_objective(q, lam), lam.copy(), state.copy())
    subspace: tuple[bytes, _Subspace] | None = None
    full_steps, iterations, converged = 0, 0, False
    while iterations < limit:
        iterations += 1
        free = np.flatnonzero(state == _FREE)
        grad, size = q @ lam, _sizes(size_q, lam)  # ½∇f and the size of its terms
        key = free.tobytes()
        try:
            if subspace is None or subspace[0] != key:
                subspace = (key, _Subspace(q[np.ix_(free, free)], noise))
            step, ray = subspace[1].step(grad[free], noise * float(size[free].max(initial=0.0)))
        except np.linalg.LinAlgError:
            break  # cannot happen for finite input; the best point so far is returned
        # stationary on this working set: the rest of the step would not move any gradient entry by more than a
        # fraction of the accepted error (or three full steps were taken and round-off is all that is left)
        if not ray and (bool((np.abs(q[:, free] @ step) <= 0.25 * accept * size).all()) or full_steps >= 3):
            if _violation(grad, size, lam, lower, upper) <= accept:
                converged = True
                break
            multipliers = _multipliers(grad, state)
            index = int(np.argmin(multipliers))
            if not multipliers[index] < 0:  # nothing to release: round-off beat the subspace solves
                vertex = _best_vertex(grad, lower, upper)  # converged if the gap is round-off of its own terms
                converged = float(grad @ (lam - vertex)) <= noise * float(size @ (lam + vertex))
                break
            state[index] = _FREE  # release the bound whose multiplier has the wrong sign
            full_steps = 0
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(step < 0, (lower[free] - lam[free]) / step, (upper[free] - lam[free]) / step)
        room = np.where(step != 0, np.maximum(room, 0.0), np.inf)
        j = int(np.argmin(room)) if len(room) else -1
        alpha = float(room[j]) if j >= 0 else np.inf
        blocking = int(free[j]) if alpha < (np.inf if ray else 1.0) else -1
        alpha = alpha if ray or blocking >= 0 else 1.0
        side = _LOWER if blocking >= 0 and step[j] < 0 else _UPPER
        if not np.isfinite(alpha):
            break  # a ray inside a bounded set: cannot happen (Σ p = 0, p ≠ 0 has a negative entry)
        lam[free] += alpha * step
        if blocking >= 0:
            lam[blocking] = lower[blocking] if side == _LOWER else upper[blocking]
            state[blocking] = side
            full_steps = 0
        else:
            full_steps += 1
        lam = _repair(lam, lower, upper, state)
        value = min_norm_objective(q, lam)
        if value <= best[0]:
            best = (value, lam.copy(), state.copy())
    if not converged:
        lam, state = best[1], best[2]
    lam = _snap(q, lam, lower, upper, state)
    violation = _violation(q @ lam, _sizes(size_q, lam), lam, lower, upper)
    gap = scale * frank_wolfe_gap(q, lam, lower, upper)
    return MinNormSolution(lam, min_norm_objective(sym, lam), iterations, violation, gap, converged)


def min_norm_weights(gram: np.ndarray, center: np.ndarray | None = None, eps: float = 1.0) -> np.ndarray:
    """λ* of eq. (25) (see `solve_min_norm`)."""
    return solve_min_norm(gram, center, eps).weights
