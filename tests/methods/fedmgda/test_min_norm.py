"""The min-norm QP of FedMGDA+ (eq. 25) against SciPy's SLSQP, on random and degenerate instances."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from fedhet.methods.fedmgda.min_norm import (
    box_bounds,
    min_norm_objective,
    min_norm_two,
    min_norm_weights,
    solve_min_norm,
)


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
    for _ in range(120):
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
    for _ in range(60):
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
