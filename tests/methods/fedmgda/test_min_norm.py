"""The min-norm QP of FedMGDA+ (eq. 25): against an exact rational reference on thousands of random and degenerate
instances, against SciPy's SLSQP on larger ones, and on hand-computed cases."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from fedhet.methods.fedmgda.min_norm import (
    box_bounds,
    frank_wolfe_gap,
    kkt_violation,
    min_norm_objective,
    min_norm_two,
    min_norm_weights,
    solve_min_norm,
)

# ---------------------------------------------------------------------------------------------------------------
# Exact reference: enumerate the KKT systems (which variables sit at their lower/upper bound, which are free) and
# solve each in exact integer arithmetic. Every float is a dyadic rational, so the data are integers over a common
# power of two. A pattern whose solution is feasible and whose multipliers have the right signs is a KKT point,
# hence a global minimum whenever G is positive semi-definite in exact arithmetic (the instances below make sure
# of that). A vertex of the (polyhedral) optimal set always has a non-singular KKT system, so skipping singular
# ones loses nothing. No float, tolerance or solver code is involved.
# ---------------------------------------------------------------------------------------------------------------


def _gauss_jordan(rows: list[list[int]]) -> tuple[int, list[int]] | None:
    """Fraction-free Gauss–Jordan elimination (Bareiss) of an integer [A | b]: (det A, det A · x), None if singular."""
    size, prev = len(rows), 1
    for k in range(size):
        pivot = next((r for r in range(k, size) if rows[r][k] != 0), None)
        if pivot is None:
            return None
        rows[k], rows[pivot] = rows[pivot], rows[k]
        top = rows[k]
        for i in range(size):
            if i != k:
                aik = rows[i][k]
                rows[i] = [(top[k] * x - aik * y) // prev for x, y in zip(rows[i], top, strict=True)]
        prev = top[k]
    return rows[0][0], [row[size] for row in rows]


class ExactMinNorm:
    """min λᵀGλ over {lower ≤ λ ≤ upper, Σ λ = 1}, exactly: `weights` and `objective` as Fractions."""

    def __init__(self, gram: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> None:
        n = len(gram)
        ratios = [float(x).as_integer_ratio() for x in np.concatenate((np.ravel(gram), lower, upper))]
        k = max(den.bit_length() - 1 for _, den in ratios)  # all data are integers over d = 2^k
        ints = [num << (k - den.bit_length() + 1) for num, den in ratios]
        self.n, self.d = n, 1 << k
        self.q = [ints[i * n : (i + 1) * n] for i in range(n)]
        self.lo, self.hi = ints[n * n : n * n + n], ints[n * n + n :]
        choices = [("L",) if self.lo[i] == self.hi[i] else ("F", "L", "U") for i in range(n)]
        for pattern in sorted(itertools.product(*choices), key=lambda p: p.count("F")):
            found = self._kkt_point(pattern)
            if found is not None:
                self.weights, self.objective = found
                return
        raise AssertionError("no KKT point: the feasible set is empty")

    def _kkt_point(self, pattern: tuple[str, ...]) -> tuple[list[Fraction], Fraction] | None:
        n, q, lo, hi, d = self.n, self.q, self.lo, self.hi, self.d
        free = [i for i in range(n) if pattern[i] == "F"]
        fixed = [i for i in range(n) if pattern[i] != "F"]
        base = [hi[i] if pattern[i] == "U" else lo[i] for i in range(n)]  # d·λ_i on the bounds
        rest = d - sum(base[i] for i in fixed)  # d·Σ_F λ_i
        det, nu = 1, None
        lam = base
        if not free and rest != 0 and lo != hi:  # (ε = 0: the box is the point λ0, whose float Σ may miss 1)
            return None
        if free:
            if not sum(lo[i] for i in free) < rest < sum(hi[i] for i in free):
                return None
            # (G_FF λ_F − ν 1 = −G_FB λ_B, Σ λ_F = 1 − Σ λ_B) times d²: unknowns d·λ_F and d²·ν
            rows = [[q[i][j] for j in free] + [-1, -sum(q[i][j] * base[j] for j in fixed)] for i in free]
            rows.append([1] * len(free) + [0, rest])
            solved = _gauss_jordan(rows)
            if solved is None:
                return None
            det, sol = solved
            if det < 0:
                det, sol = -det, [-x for x in sol]
            lam = [det * b for b in base]  # det·d·λ
            for i, x in zip(free, sol[:-1], strict=True):
                if not det * lo[i] <= x <= det * hi[i]:
                    return None
                lam[i] = x
            nu = sol[-1]  # det·d²·ν
        grad = [sum(q[i][j] * lam[j] for j in range(n)) for i in range(n)]  # det·d²·(Gλ)_i
        lows = [grad[i] for i in range(n) if pattern[i] == "L" and lo[i] != hi[i]]
        ups = [grad[i] for i in range(n) if pattern[i] == "U"]
        if nu is None:
            if lows and ups and max(ups) > min(lows):
                return None
        elif any(g < nu for g in lows) or any(g > nu for g in ups):
            return None
        value = Fraction(sum(x * g for x, g in zip(lam, grad, strict=True)), det * det * d**3)
        return [Fraction(x, det * d) for x in lam], value


def exact_objective(gram: np.ndarray, weights: np.ndarray) -> Fraction:
    """λᵀGλ of the float λ, exactly."""
    w, g = [Fraction(float(x)) for x in weights], [[Fraction(float(x)) for x in row] for row in gram]
    return sum((w[i] * g[i][j] * w[j] for i in range(len(w)) for j in range(len(w))), Fraction(0))


def exact_gram(u: np.ndarray) -> np.ndarray:
    """ŨŨᵀ computed without round-off, hence exactly positive semi-definite: Ũ is u rounded to 24 bits below its
    largest entry, so each product has ≤ 48 significant bits and sums of ≤ 16 of them are exact in float64."""
    assert u.shape[1] <= 16
    top = float(np.abs(u).max())
    if top == 0.0:
        return np.zeros((len(u), len(u)))
    shift = 24 - (np.frexp(top)[1])
    rounded = np.ldexp(np.round(np.ldexp(u, shift)), -shift)
    return rounded @ rounded.T


EXACT_KINDS = ["generic", "raw", "parallel", "rank", "duplicate", "zero", "identical", "scaled"]


def exact_instance(rng: np.random.Generator, kind: str, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """A Gram matrix of (mostly normalised) updates of one kind, a box centre λ0 and a radius ε."""
    d = int(rng.integers(2, 9))
    if kind == "parallel":  # nearly parallel: 1 − cos ḡ_i ḡ_j from ~1e-11 to ~0.1
        u = rng.normal(size=d) + 10 ** rng.uniform(-5.5, -0.5) * rng.normal(size=(n, d))
    elif kind == "rank":  # more clients than dimensions
        u = rng.normal(size=(n, int(rng.integers(1, n)))) + rng.normal(size=1)
    elif kind == "identical":
        u = np.tile(rng.normal(size=d), (n, 1))
    else:
        u = rng.normal(size=(n, d)) + rng.normal(size=d) * rng.uniform(0, 2)
    if kind == "duplicate":
        u[rng.integers(0, n, size=n // 2 + 1)] = u[int(rng.integers(0, n))]
    if kind == "zero":
        u[rng.integers(0, n, size=int(rng.integers(1, n)))] = 0.0
    u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
    if kind == "raw":  # FedMGDA without normalisation: lengths 2^-10 .. 2^10
        u = u * 2.0 ** rng.integers(-10, 11, size=(n, 1))
    gram = exact_gram(u)
    if kind == "scaled":  # huge or tiny updates (exact powers of two keep G exactly PSD)
        gram = gram * 2.0 ** float(rng.choice([-900, -400, 400, 900]))
    draw = rng.random()
    if draw < 0.4:
        center = np.full(n, 1.0 / n)
    elif draw < 0.8:
        center = rng.dirichlet(np.full(n, float(rng.choice([0.3, 1.0, 5.0]))))
    else:  # some clients with λ0_i = 0
        center = rng.dirichlet(np.ones(n)) * (rng.random(n) < 0.7)
        center = center / center.sum() if center.sum() > 0 else np.full(n, 1.0 / n)
    eps = float(rng.choice([0.005, 0.02, 0.05, 0.1, 0.3, 1.0]))
    return gram, center, eps


def reduced_curvature(gram: np.ndarray) -> float:
    """Smallest eigenvalue of G on {Σ p = 0}, relative to max G_ii: > 0 iff λ* is unique."""
    n = len(gram)
    z = np.linalg.qr(np.ones((n, 1)), mode="complete")[0][:, 1:]
    scale = float(np.abs(np.diag(gram)).max()) or 1.0
    return float(np.linalg.eigvalsh(z.T @ (gram / scale) @ z).min())


def check_against_exact(gram: np.ndarray, center: np.ndarray, eps: float) -> tuple[bool, bool]:
    """Solve, compare with the exact optimum, and say whether a lower / upper bound inside (0, 1) is active there."""
    n = len(gram)
    sol = solve_min_norm(gram, center, eps)
    lower, upper = box_bounds(center, eps)
    assert_feasible(sol.weights, center, eps)
    assert sol.converged
    ref = ExactMinNorm(gram, lower, upper)
    scale = float(np.abs(np.diag(gram)).max()) or 1.0
    error = float(exact_objective(gram, sol.weights) - ref.objective)
    assert abs(error) <= 1e-13 * scale, (gram, center, eps, sol)
    # also relative to the terms of λᵀGλ where the optimum is far below the scale (raw updates of very different
    # lengths): λ itself is only known to ~1e-16, so 1e-20 of the scale is the floor
    assert abs(error) <= 1e-9 * float(sol.weights @ np.abs(gram) @ sol.weights) + 1e-20 * scale, (gram, sol)
    assert error <= sol.gap + 1e-14 * scale  # the Frank–Wolfe gap bounds the error from above
    assert abs(sol.objective - float(ref.objective)) <= 1e-13 * scale
    assert sol.kkt_violation <= 1e-12
    kappa = reduced_curvature(gram)
    if kappa > 1e-10:  # λ* unique: the error in λ is round-off amplified by at most 1/κ
        exact = np.array([float(x) for x in ref.weights])
        assert np.abs(sol.weights - exact).max() <= 1e-12 / kappa, (gram, center, eps, sol, exact)
    lo = [Fraction(float(x)) for x in lower]
    hi = [Fraction(float(x)) for x in upper]
    active_lower = any(ref.weights[i] == lo[i] and 0 < lo[i] < hi[i] for i in range(n))
    active_upper = any(ref.weights[i] == hi[i] and lo[i] < hi[i] < 1 for i in range(n))
    return active_lower, active_upper


@pytest.mark.parametrize("kind", EXACT_KINDS)
def test_matches_exact_reference(kind: str) -> None:
    """300 instances of each kind, 2 to 4 clients: objective to 1e-13 of the scale, λ where unique."""
    rng = np.random.default_rng(EXACT_KINDS.index(kind) + 100)
    active = np.array([check_against_exact(*exact_instance(rng, kind, int(rng.integers(2, 5)))) for _ in range(300)])
    # the instances exercise both sides of the box: lower bounds above 0 and upper bounds below 1 bind
    assert active[:, 0].sum() >= 30 and active[:, 1].sum() >= 30, active.sum(0)


@pytest.mark.slow
def test_matches_exact_reference_five_and_six_clients() -> None:
    rng = np.random.default_rng(2024)
    for kind in EXACT_KINDS:
        for _ in range(12):
            check_against_exact(*exact_instance(rng, kind, int(rng.integers(5, 7))))


@pytest.mark.slow
def test_large_cohorts_are_certified() -> None:
    """20 to 100 clients of every degenerate kind: converged and certified by the Frank–Wolfe gap (an upper bound
    on the distance to the optimum that needs no solver) and the relative KKT violation."""
    rng = np.random.default_rng(77)
    for case in range(36):
        n, kind = int(rng.choice([20, 50, 100])), ["parallel", "rank", "duplicate", "zero", "raw", "scaled"][case % 6]
        d = 3 if kind == "rank" else 300
        u = rng.normal(size=(n, d)) + rng.normal(size=d) * (10 ** rng.uniform(1, 5) if kind == "parallel" else 1)
        if kind == "duplicate":
            u[rng.integers(0, n, size=n // 2)] = u[0]
        if kind == "zero":
            u[rng.integers(0, n, size=n // 4)] = 0.0
        u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
        if kind == "raw":
            u *= 10 ** rng.uniform(-3, 3, size=(n, 1))
        gram = (u @ u.T) * (10.0 ** float(rng.choice([-200, 200])) if kind == "scaled" else 1.0)
        center = np.full(n, 1.0 / n) if case % 2 else rng.dirichlet(np.ones(n))
        eps = float(rng.choice([0.005, 0.05, 1.0]))
        sol = solve_min_norm(gram, center, eps)
        scale = float(np.abs(np.diag(gram)).max())
        assert_feasible(sol.weights, center, eps)
        assert sol.converged and sol.kkt_violation <= 1e-12 and sol.gap <= 1e-12 * scale, (kind, n, sol)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(
    vectors=st.integers(2, 4).flatmap(
        lambda n: st.lists(st.lists(st.integers(-4, 4), min_size=3, max_size=3), min_size=n, max_size=n)
    ),
    eps=st.sampled_from([0.0, 0.01, 0.1, 0.25, 1.0, 2.0]),
    weights=st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_small_integer_updates_match_exact_reference(vectors: list[list[int]], eps: float, weights: list[int]) -> None:
    """Property: for any small integer updates (zero, repeated, parallel, opposite ones included) and any box."""
    u = np.array(vectors, dtype=np.float64)
    n = len(u)
    center = np.array(weights[:n], dtype=np.float64)
    center = center / center.sum() if center.sum() > 0 else np.full(n, 1.0 / n)
    check_against_exact(u @ u.T, center, eps)


def test_exact_reference_by_hand() -> None:
    """The reference itself: G = diag(1, 4) on the simplex → λ = (4/5, 1/5), f = 4/5; with the box [0.3, 0.7]
    around ½ the upper bound binds: λ = (7/10, 3/10), f = 49/100 + 4·9/100 = 85/100."""
    gram = np.diag([1.0, 4.0])
    ref = ExactMinNorm(gram, np.zeros(2), np.ones(2))
    assert ref.weights == [Fraction(4, 5), Fraction(1, 5)] and ref.objective == Fraction(4, 5)
    ref = ExactMinNorm(gram, np.array([0.3, 0.3]), np.array([0.7, 0.7]))
    # 0.3 and 0.7 are not dyadic: the exact optimum sits on the float 0.7's exact value
    assert ref.weights[0] == Fraction(0.7) and ref.weights[1] == 1 - Fraction(0.7)
    assert abs(float(ref.objective) - 0.85) < 1e-15


def test_issue_13_nearly_parallel_pair_regression() -> None:
    """Two nearly parallel unit updates (cos = 0.99967) made the old solver's absolute step test spin until its
    iteration limit on an AMD EPYC machine (numpy 2.4.6, scipy 1.17.1). By symmetry λ* = (½ + δ, ½ − δ) with
    δ = (G11 − G22)/(2(G11 − 2G12 + G22)) ≈ 3.3e-13."""
    gram = np.array([[1.0000000000000002, 0.9996678407755382], [0.9996678407755382, 1.0]])
    for eps in (1.0, 0.3, 0.05, 0.0):
        sol = solve_min_norm(gram, np.array([0.5, 0.5]), eps)
        assert sol.converged and sol.iterations <= 5
        ref = ExactMinNorm(gram, *box_bounds(np.array([0.5, 0.5]), eps))
        assert abs(float(exact_objective(gram, sol.weights) - ref.objective)) <= 1e-15
        np.testing.assert_allclose(sol.weights, [float(x) for x in ref.weights], rtol=0, atol=1e-12)


def test_nearly_parallel_normalised_updates_always_converge() -> None:
    """The issue's failure mode: 2 to 10 unit updates with pairwise cos between 0.999 and 1 − 1e-12 (half of these
    made the old solver raise). Each solution is certified by its Frank–Wolfe gap, which needs no solver."""
    rng = np.random.default_rng(13)
    for _ in range(300):
        n, d = int(rng.integers(2, 11)), int(rng.integers(5, 200))
        u = rng.normal(size=d) + 10 ** rng.uniform(-6, -1.5) * rng.normal(size=(n, d))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        gram = u @ u.T  # as FedMGDA+ forms it: round-off may make it slightly indefinite
        center = np.full(n, 1.0 / n) if rng.random() < 0.5 else rng.dirichlet(np.ones(n))
        eps = float(rng.choice([0.01, 0.1, 1.0]))
        sol = solve_min_norm(gram, center, eps)
        assert_feasible(sol.weights, center, eps)
        assert sol.converged and sol.iterations <= 10 * n + 100
        assert sol.gap <= 1e-12 and sol.kkt_violation <= 1e-12
        assert sol.objective <= min_norm_objective(gram, center) + 1e-15  # never worse than FedAvg's λ0


def test_degenerate_gram_matrices() -> None:
    # one client; all-zero updates; all-identical updates: every feasible λ is optimal, λ0 is returned
    assert solve_min_norm(np.array([[4.0]])).weights.tolist() == [1.0]
    center = np.array([0.2, 0.3, 0.5])
    for gram, value in ((np.zeros((3, 3)), 0.0), (np.ones((3, 3)), 1.0)):
        sol = solve_min_norm(gram, center, 1.0)
        assert sol.converged and sol.objective == pytest.approx(value, abs=1e-15)
        assert_feasible(sol.weights, center, 1.0)
    # a duplicated update: the pair's split is free, the total weight on it is not
    u = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    sol = solve_min_norm(u @ u.T)
    assert sol.weights[0] + sol.weights[1] == pytest.approx(0.8, abs=1e-12) and sol.objective == pytest.approx(0.8)
    # slightly indefinite (round-off in a float Gram matrix of parallel updates): still a feasible optimum
    gram = np.array([[1.0, 1.0 + 2e-16, 1.0], [1.0 + 2e-16, 1.0, 1.0], [1.0, 1.0, 1.0]])
    sol = solve_min_norm(gram)
    assert sol.converged and sol.objective == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("factor", [1e-300, 1e-310, 1e300])
def test_huge_tiny_and_subnormal_scales(factor: float) -> None:
    """λ* does not depend on the scale of G; G = 1e-310·G0 has subnormal entries (about 10 significant bits)."""
    rng = np.random.default_rng(4)
    u = rng.normal(size=(6, 8)) + rng.normal(size=8)
    gram = u @ u.T
    base = solve_min_norm(gram, eps=0.2)
    sol = solve_min_norm(gram * factor, eps=0.2)
    assert sol.converged
    assert_feasible(sol.weights, np.full(6, 1 / 6), 0.2)
    tol = 1e-10 if factor > 1e-305 else 1e-2
    np.testing.assert_allclose(sol.weights, base.weights, rtol=0, atol=tol)
    assert sol.objective == pytest.approx(base.objective * factor, rel=tol)


def test_iteration_cap_returns_the_best_feasible_point() -> None:
    """Stopped early, the solver still returns a feasible λ no worse than λ0, says so, and reports its KKT error."""
    rng = np.random.default_rng(9)
    u = rng.normal(size=(30, 40)) + rng.normal(size=40)
    gram = u @ u.T
    full = solve_min_norm(gram)
    assert full.converged and full.iterations > 3
    for cap in (1, 2, 3):
        sol = solve_min_norm(gram, max_iter=cap)
        assert not sol.converged and sol.iterations == cap
        assert_feasible(sol.weights, np.full(30, 1 / 30), 1.0)
        assert full.objective - 1e-12 <= sol.objective <= min_norm_objective(gram, np.full(30, 1 / 30))
        assert sol.kkt_violation > 1e-6 and sol.gap >= sol.objective - full.objective - 1e-12


def test_frank_wolfe_gap_and_kkt_violation_by_hand() -> None:
    """G = diag(1, 3), λ = (½, ½): ∇f = 2Gλ = (1, 3); the best vertex of the simplex is e1, gap = ∇fᵀ(λ − e1) = 1.
    Weight can move from client 2 to client 1: relative violation (3 − 1)/(3 + 1) = ½ (|∂f| = 2|G|λ = ∇f here)."""
    gram, lam = np.diag([1.0, 3.0]), np.array([0.5, 0.5])
    assert frank_wolfe_gap(gram, lam, np.zeros(2), np.ones(2)) == pytest.approx(1.0)
    assert kkt_violation(gram, lam, np.zeros(2), np.ones(2)) == pytest.approx(0.5)
    # inside the box [0.4, 0.6]: the best vertex is (0.6, 0.4), gap = ∇fᵀ(−0.1, 0.1) = 0.2
    assert frank_wolfe_gap(gram, lam, np.full(2, 0.4), np.full(2, 0.6)) == pytest.approx(0.2)
    # at the box optimum (0.6, 0.4) client 1 cannot grow any more: no violation, no gap
    opt = np.array([0.6, 0.4])
    assert kkt_violation(gram, opt, np.full(2, 0.4), np.full(2, 0.6)) == 0.0
    assert frank_wolfe_gap(gram, opt, np.full(2, 0.4), np.full(2, 0.6)) == pytest.approx(0.0, abs=1e-15)
    # opposite updates cancel: at (½, ½) ∂f = 0 on both, any other split has a violation relative to |∂f|
    gram = np.array([[1.0, -1.0], [-1.0, 1.0]])
    assert kkt_violation(gram, np.array([0.5, 0.5]), np.zeros(2), np.ones(2)) == 0.0
    assert kkt_violation(gram, np.array([0.75, 0.25]), np.zeros(2), np.ones(2)) == pytest.approx(0.5)


def test_invalid_gram_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        solve_min_norm(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="eps"):
        solve_min_norm(np.eye(2), eps=float("nan"))


def scipy_min_norm(gram: np.ndarray, center: np.ndarray, eps: float) -> tuple[np.ndarray, float]:
    """Reference: SLSQP from two starting points, tight tolerance; the better of the two."""
    n = len(gram)
    lower, upper = box_bounds(center, eps)
    best = None
    for start in (center, np.clip(np.full(n, 1.0 / n), lower, upper)):
        res = minimize(
            lambda x: x @ gram @ x,
            start,
            jac=lambda x: 2 * gram @ x,
            bounds=list(zip(lower, upper, strict=True)),
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones(n)}],
            method="SLSQP",
            options={"ftol": 1e-15, "maxiter": 1000},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    return best.x, float(best.fun)


def assert_feasible(lam: np.ndarray, center: np.ndarray, eps: float) -> None:
    lower, upper = box_bounds(center, eps)
    assert abs(lam.sum() - 1.0) < 1e-12
    assert np.all(lam >= lower - 1e-12) and np.all(lam <= upper + 1e-12)


def random_instance(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray, float]:
    n, d = int(rng.integers(2, 16)), int(rng.integers(2, 30))
    u = rng.normal(size=(n, d))
    if kind == "shared":  # a common component: updates nearly aligned, ill-conditioned G
        u = u + 4 * rng.normal(size=d)
    u /= np.linalg.norm(u, axis=1, keepdims=True)  # FedMGDA+ solves on normalised updates
    center = rng.dirichlet(np.ones(n)) if rng.random() < 0.5 else np.full(n, 1.0 / n)
    eps = float(rng.choice([0.01, 0.05, 0.1, 0.3, 1.0]))
    return u @ u.T, center, eps


@pytest.mark.parametrize("kind", ["generic", "shared"])
def test_matches_scipy_on_random_instances(kind: str) -> None:
    rng = np.random.default_rng(42 if kind == "generic" else 7)
    for _ in range(60):
        gram, center, eps = random_instance(rng, kind)
        sol = solve_min_norm(gram, center, eps)
        assert_feasible(sol.weights, center, eps)
        ref_x, ref_f = scipy_min_norm(gram, center, eps)
        assert sol.objective <= ref_f + 1e-6  # never worse than SciPy ...
        assert abs(sol.objective - ref_f) < 1e-6  # ... and equal to it to 1e-6
        assert sol.kkt_violation < 1e-8
        if np.linalg.eigvalsh(gram).min() > 1e-6:  # strictly convex: λ* is unique
            np.testing.assert_allclose(sol.weights, ref_x, atol=1e-6)


def test_more_clients_than_dimensions_matches_scipy_objective() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        u = rng.normal(size=(12, 3))  # rank-3 Gram matrix of 12 clients: λ* is not unique
        gram = u @ u.T
        center = np.full(12, 1 / 12)
        for eps in (0.05, 1.0):
            sol = solve_min_norm(gram, center, eps)
            assert_feasible(sol.weights, center, eps)
            assert abs(sol.objective - scipy_min_norm(gram, center, eps)[1]) < 1e-6


def test_two_vectors_closed_form() -> None:
    g1, g2 = np.array([1.0, 0.0]), np.array([0.3, 0.8])
    gram = np.array([[g1 @ g1, g1 @ g2], [g1 @ g2, g2 @ g2]])
    lam1 = (g2 - g1) @ g2 / np.sum((g1 - g2) ** 2)  # Sener & Koltun's formula, inside (0, 1) here
    np.testing.assert_allclose(min_norm_weights(gram), [lam1, 1 - lam1], atol=1e-12)
    np.testing.assert_allclose(min_norm_two(gram), [lam1, 1 - lam1], atol=1e-12)
    # with a box of radius 0.1 around 1/2 the unconstrained optimum is clipped to the box
    clipped = min(max(lam1, 0.4), 0.6)
    np.testing.assert_allclose(min_norm_weights(gram, eps=0.1), [clipped, 1 - clipped], atol=1e-12)
    np.testing.assert_allclose(min_norm_two(gram, 0.4, 0.6), [clipped, 1 - clipped], atol=1e-12)


def test_opposite_vectors_cancel() -> None:
    gram = np.array([[1.0, -1.0], [-1.0, 1.0]])  # g2 = −g1: ½ g1 + ½ g2 = 0
    sol = solve_min_norm(gram)
    np.testing.assert_allclose(sol.weights, [0.5, 0.5], atol=1e-12)
    assert sol.objective == pytest.approx(0.0, abs=1e-15)


def test_epsilon_zero_gives_center_and_epsilon_one_gives_mgda() -> None:
    rng = np.random.default_rng(5)
    u = rng.normal(size=(6, 4))
    gram = u @ u.T
    center = rng.dirichlet(np.ones(6))
    np.testing.assert_array_equal(min_norm_weights(gram, center, 0.0), center)
    # ε = 1: the box contains the simplex, so the solution is the unconstrained MGDA one (Sener & Koltun)
    unconstrained_x, unconstrained_f = scipy_min_norm(gram, center, 1.0)
    lam = min_norm_weights(gram, center, 1.0)
    np.testing.assert_allclose(lam, unconstrained_x, atol=1e-6)
    assert min_norm_objective(gram, lam) == pytest.approx(unconstrained_f, abs=1e-9)
    np.testing.assert_array_equal(lam, min_norm_weights(gram, center, 5.0))


def test_one_client_and_all_zero_updates() -> None:
    assert min_norm_weights(np.array([[4.0]])).tolist() == [1.0]
    center = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(min_norm_weights(np.zeros((3, 3)), center, 1.0), center)


def test_a_zero_update_takes_all_the_weight_when_allowed() -> None:
    u = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    gram = u @ u.T
    np.testing.assert_allclose(min_norm_weights(gram), [0.0, 1.0, 0.0], atol=1e-12)
    # inside a box of radius 0.2 around 1/3 the zero update gets its upper bound, the rest split evenly
    lam = min_norm_weights(gram, eps=0.2)
    np.testing.assert_allclose(lam, [(1 - 8 / 15) / 2, 8 / 15, (1 - 8 / 15) / 2], atol=1e-12)


def test_parallel_updates_objective_and_degenerate_lambda() -> None:
    base = np.array([1.0, 2.0, -1.0])
    u = np.stack([base, 2 * base, 0.5 * base, 3 * base])  # all parallel: d = (Σ λ_i c_i) base
    gram = u @ u.T
    lam = min_norm_weights(gram)
    np.testing.assert_allclose(lam, [0, 0, 1, 0], atol=1e-12)  # the shortest one
    normalised = u / np.linalg.norm(u, axis=1, keepdims=True)  # after normalisation every λ is optimal
    gram_n = normalised @ normalised.T
    for eps in (0.1, 1.0):
        sol = solve_min_norm(gram_n, eps=eps)
        assert sol.objective == pytest.approx(1.0, abs=1e-12)
        assert_feasible(sol.weights, np.full(4, 0.25), eps)


def test_common_descent_direction_with_epsilon_one() -> None:
    """Optimality of the min-norm point: ⟨d, g_i⟩ ≥ ‖d‖² for every i (MGDA's common descent, eq. 24)."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        u = rng.normal(size=(7, 5)) + rng.normal(size=5)
        lam = min_norm_weights(u @ u.T)
        d = lam @ u
        assert np.all(u @ d >= d @ d - 1e-9)


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="probability"):
        solve_min_norm(np.eye(2), np.array([0.7, 0.7]))
    with pytest.raises(ValueError, match="eps"):
        solve_min_norm(np.eye(2), eps=-0.1)
    with pytest.raises(ValueError, match="square"):
        solve_min_norm(np.ones((2, 3)))


def test_raw_updates_of_very_different_lengths_match_scipy() -> None:
    """FedMGDA (no normalisation) solves on raw updates whose norms differ by orders of magnitude."""
    rng = np.random.default_rng(21)
    for _ in range(30):
        n, d = int(rng.integers(2, 12)), int(rng.integers(2, 20))
        u = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-3, 3, size=(n, 1))
        gram, center = u @ u.T, np.full(n, 1.0 / n)
        eps = float(rng.choice([0.05, 0.2, 1.0]))
        sol = solve_min_norm(gram, center, eps)
        assert_feasible(sol.weights, center, eps)
        scale = float(np.abs(np.diag(gram)).max())  # SciPy on the rescaled problem (same minimiser)
        ref_x, ref_f = scipy_min_norm(gram / scale, center, eps)
        assert sol.objective / scale <= ref_f + 1e-9
        assert abs(sol.objective / scale - ref_f) < 1e-6
        if np.linalg.eigvalsh(gram / scale).min() > 1e-6:
            np.testing.assert_allclose(sol.weights, ref_x, atol=1e-6)


def test_epsilon_one_is_mgda_over_the_whole_simplex() -> None:
    """ε = 1 against SciPy on the plain simplex {λ ≥ 0, Σ λ = 1} (no box): MGDA's λ* (eq. 23)."""
    rng = np.random.default_rng(8)
    for _ in range(30):
        n = int(rng.integers(2, 10))
        u = rng.normal(size=(n, 12)) + rng.normal(size=12)
        gram = u @ u.T
        res = minimize(
            lambda x, g=gram: x @ g @ x,
            np.full(n, 1.0 / n),
            jac=lambda x, g=gram: 2 * g @ x,
            bounds=[(0.0, None)] * n,
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0}],
            method="SLSQP",
            options={"ftol": 1e-15, "maxiter": 1000},
        )
        np.testing.assert_allclose(min_norm_weights(gram, eps=1.0), res.x, atol=1e-6)
