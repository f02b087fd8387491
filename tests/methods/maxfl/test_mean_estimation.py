"""MaxFL's mean-estimation study: FedAvg's appeal vanishes with heterogeneity, MaxFL's does not."""

from __future__ import annotations

import numpy as np

from fedhet.methods.maxfl.mean_estimation import (
    CURVATURE_BOUND,
    MAXFL_LOWER_BOUND,
    expected_appeal,
    fedavg_bound,
    local_minimum,
    maxfl_curvature,
    maxfl_gradient,
    maxfl_objective,
    two_client_curve,
)
from fedhet.seeding import numpy_rng


def test_appeal_is_strict_and_by_hand() -> None:
    theta = np.array([0.0, 4.0])
    theta_hat = np.array([[1.0, 3.0]])  # ρ = (1, 1)
    assert expected_appeal(np.array([0.5]), theta, theta_hat) == 0.5  # |0.5 − 0| < 1, |0.5 − 4| > 1
    assert expected_appeal(np.array([2.0]), theta, theta_hat, tie_scale=0.0) == 0.0  # |2 − 0| = 2 > 1


def test_local_minimum_is_stationary_and_near_a_client_when_far_apart() -> None:
    theta_hat = np.array([[0.0, 10.0], [0.0, 0.5]])
    w = local_minimum(theta_hat, np.array([2.0, 0.3]))
    assert abs(w[0]) < 1e-3  # far apart: MaxFL picks one client's local model
    assert abs(w[1] - 0.25) < 1e-3  # close: the average, like FedAvg


def test_derivatives_by_finite_differences_and_the_curvature_bound() -> None:
    theta_hat = np.array([[0.0, 3.0, -1.5], [0.2, 0.4, 9.0]])
    w, h = np.array([0.7, 4.0]), 1e-6
    fd = (maxfl_objective(w + h, theta_hat) - maxfl_objective(w - h, theta_hat)) / (2 * h)
    np.testing.assert_allclose(maxfl_gradient(w, theta_hat), fd, atol=1e-8)
    fd2 = (maxfl_gradient(w + h, theta_hat) - maxfl_gradient(w - h, theta_hat)) / (2 * h)
    np.testing.assert_allclose(maxfl_curvature(w, theta_hat), fd2, atol=1e-7)
    grid = np.linspace(-8.0, 8.0, 20_001)
    one_client = np.zeros((len(grid), 1))
    bound = np.abs(maxfl_curvature(grid, one_client)).max()
    assert 0.49 < bound <= CURVATURE_BOUND  # |d²/dw² σ(w²)| peaks at 0.5 (w = 0)
    assert maxfl_gradient(np.array([7.0]), np.zeros((1, 1)))[0] > 0  # far from a client: tiny, yet no underflow


def test_every_run_ends_stationary_at_a_minimum_downhill_from_its_start() -> None:
    """Per-run stationarity (not of the sum over runs): at γ_G² = 8, for 2000 runs, |∂/∂w| ≤ 1e-10 at each
    run's solution, the curvature there is ≥ 0, and the objective never rises on the way from the start (the
    start's basin, the minimum that gradient flow reaches)."""
    rng = numpy_rng(5, "test")
    theta = np.array([0.0, 2 * np.sqrt(8.0)])
    theta_hat = rng.normal(theta, 1.0, size=(2000, 2))
    start = rng.uniform(theta_hat.min(1), theta_hat.max(1))
    w = local_minimum(theta_hat, start)
    assert np.abs(maxfl_gradient(w, theta_hat)).max() <= 1e-10
    assert maxfl_curvature(w, theta_hat).min() >= -1e-12
    path = start[:, None] + np.linspace(0.0, 1.0, 400)[None, :] * (w - start)[:, None]
    values = np.stack([maxfl_objective(path[:, i], theta_hat) for i in range(path.shape[1])], axis=1)
    assert np.all(np.diff(values, axis=1) <= 1e-12)
    # both kinds of minimum occur: beside one client (separation) and, for close draws, between them
    near_client = np.abs(w[:, None] - theta_hat).min(1) < 0.5
    assert 0.5 < near_client.mean() < 1.0


def test_local_minimum_degenerate_starts() -> None:
    symmetric = np.array([[0.0, 8.0]])
    assert local_minimum(symmetric, np.array([4.0]))[0] == 4.0  # exactly stationary (a maximum): stays
    assert abs(local_minimum(np.array([[1.5]]), np.array([-3.0]))[0] - 1.5) < 1e-12  # one client: its mean
    assert abs(local_minimum(np.array([[0.0, 8.0]]), np.array([20.0]))[0] - 8.0) < 1e-6  # start outside the hull
    out = local_minimum(np.array([[np.nan, 1.0], [0.0, 0.5]]), np.array([0.0, 0.1]))  # NaN: no endless loop
    assert np.isnan(out[0]) and abs(out[1] - 0.25) < 1e-9


def test_fedavg_appeal_falls_toward_zero_while_maxfl_stays_bounded_away() -> None:
    curve = two_client_curve(points=3, runs=2000, seed=0, max_gamma_g2=16.0)
    assert np.allclose(curve.fedavg, curve.maxfl_relu)  # Lemma 2.2: convex surrogates give FedAvg's solution
    assert curve.fedavg[-1] < 0.02 <= fedavg_bound(curve.gamma_g2)[-1] + 0.02
    assert curve.maxfl[-1] > 0.15 > MAXFL_LOWER_BOUND
    assert curve.fedavg[0] > 0.5 and abs(curve.maxfl[0] - curve.fedavg[0]) < 0.05


def test_three_clients_two_close_one_far_maxfl_keeps_the_close_pair() -> None:
    from fedhet.methods.maxfl.mean_estimation import three_client_curve

    curve = three_client_curve(points=2, runs=2000, seed=1, max_gamma_g2=16.0)
    assert np.allclose(curve.fedavg, curve.maxfl_relu)
    assert curve.fedavg[-1] < 0.05  # the average is far from every client
    assert curve.maxfl[-1] > 0.25  # MaxFL sits between the two close clients and satisfies some of them
