"""MaxFL's mean-estimation study: FedAvg's appeal vanishes with heterogeneity, MaxFL's does not."""

from __future__ import annotations

import numpy as np

from fedhet.studies.mean_estimation import (
    MAXFL_LOWER_BOUND,
    expected_appeal,
    fedavg_bound,
    local_minimum,
    two_client_curve,
)


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


def test_fedavg_appeal_falls_toward_zero_while_maxfl_stays_bounded_away() -> None:
    curve = two_client_curve(points=3, runs=2000, seed=0, max_gamma_g2=16.0)
    assert np.allclose(curve.fedavg, curve.maxfl_relu)  # Lemma 2.2: convex surrogates give FedAvg's solution
    assert curve.fedavg[-1] < 0.02 <= fedavg_bound(curve.gamma_g2)[-1] + 0.02
    assert curve.maxfl[-1] > 0.15 > MAXFL_LOWER_BOUND
    assert curve.fedavg[0] > 0.5 and abs(curve.maxfl[0] - curve.fedavg[0]) < 0.05


def test_three_clients_two_close_one_far_maxfl_keeps_the_close_pair() -> None:
    from fedhet.studies.mean_estimation import three_client_curve

    curve = three_client_curve(points=2, runs=2000, seed=1, max_gamma_g2=16.0)
    assert np.allclose(curve.fedavg, curve.maxfl_relu)
    assert curve.fedavg[-1] < 0.05  # the average is far from every client
    assert curve.maxfl[-1] > 0.25  # MaxFL sits between the two close clients and satisfies some of them
