"""Server-side estimators: loss filter (eq. 15), running minimum, Γ̂′ (eq. 17), Bayesian π̂/λ̂, oracle."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.availability.estimators import (
    ActivityCounts,
    BayesianAvailability,
    BetaPrior,
    LossTracker,
    bayesian_lambda,
    bayesian_pi,
    oracle_for,
)
from fedhet.availability.markov import Markov
from fedhet.errors import ConfigError


def test_loss_filter_by_hand() -> None:
    tracker = LossTracker(3, beta=0.2)
    tracker.update(np.array([0, 2]), np.array([1.0, 3.0]))  # first reports: client 1 gets the mean, 2.0
    np.testing.assert_allclose(tracker.estimate, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(tracker.gap, 0.0)
    tracker.update(np.array([1, 2]), np.array([1.0, 4.0]))  # F̂ = 0.8 F̂ + 0.2 F for active clients only
    np.testing.assert_allclose(tracker.estimate, [1.0, 1.8, 3.2])
    np.testing.assert_allclose(tracker.minimum, [1.0, 1.8, 3.0])
    np.testing.assert_allclose(tracker.gap, [0.0, 0.0, 0.2])
    assert tracker.gamma == pytest.approx(0.2)
    tracker.update(np.array([], dtype=int), np.array([]))  # nobody active: nothing changes
    np.testing.assert_allclose(tracker.estimate, [1.0, 1.8, 3.2])
    restored = LossTracker(3, beta=0.2)
    restored.load_state_dict(tracker.state_dict())
    np.testing.assert_array_equal(restored.gap, tracker.gap)
    with pytest.raises(ValueError):
        LossTracker(2, beta=0.0)


def test_counts_and_bayesian_formulas_by_hand() -> None:
    counts = ActivityCounts(1)
    for active in (1, 1, 0, 1, 0, 0):  # transitions: aa, ai, ia, ai, ii
        counts.observe(np.array([bool(active)]))
    prior = BetaPrior(active=1, inactive=1, stay_active=1, leave_active=1, stay_inactive=1, leave_inactive=1)
    assert bayesian_pi(counts, prior)[0] == pytest.approx((3 + 1) / (6 + 2))
    p_aa = (1 + 1) / (1 + 2 + 2)  # N^aa = 1, N^ai = 2
    p_ii = (1 + 1) / (1 + 1 + 2)  # N^ii = 1, N^ia = 1
    assert bayesian_lambda(counts, prior)[0] == pytest.approx(p_aa + p_ii - 1)


@pytest.mark.slow
def test_bayesian_estimates_converge_on_long_chains() -> None:
    pis, lams = np.array([0.9, 0.1, 0.5, 0.3]), np.array([0.9, 0.0, -0.5, 0.6])
    process = Markov(pi=pis.tolist(), lam=lams.tolist())
    process.setup(4, seed=1)
    estimator = BayesianAvailability(4, BetaPrior())
    for t in range(30_000):
        estimator.observe(process.available(t).numpy())
    pi_hat, lam_hat = estimator.estimates()
    np.testing.assert_allclose(pi_hat, pis, atol=0.02)
    np.testing.assert_allclose(lam_hat, lams, atol=0.05)
    # the authors' code would converge to 2π(1−π)(λ − 1) instead: far from λ for the correlated client
    assert abs(2 * 0.9 * 0.1 * (0.9 - 1) - 0.9) > 0.5


def test_oracle_returns_the_process_parameters() -> None:
    oracle = oracle_for({"name": "cafed_classes"}, 24, seed=0)
    process_pi, process_lam = oracle.estimates()
    assert set(np.round(process_pi, 6)) == {0.9, 0.1}
    assert (np.isclose(process_lam, 0.9)).sum() == 12
    oracle.observe(np.ones(24, dtype=bool))  # observing does not move it
    np.testing.assert_array_equal(oracle.estimates()[0], process_pi)
    with pytest.raises(ConfigError, match="no known"):
        oracle_for("always", 3, 0)
