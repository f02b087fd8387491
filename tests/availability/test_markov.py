"""Two-state Markov availability: valid range, stationarity, lag-1 correlation, clusters, classes, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.availability.markov import (
    ClientClasses,
    Markov,
    MarkovClusters,
    check_chains,
    lambda_bounds,
    transition_probabilities,
)
from fedhet.catalog import AVAILABILITY
from fedhet.data.partition import block_groups
from fedhet.errors import ConfigError


def trajectory(process: Markov | MarkovClusters | ClientClasses, rounds: int) -> np.ndarray:
    return np.stack([process.available(t).numpy() for t in range(rounds)])


def test_transition_probabilities_by_hand() -> None:
    stay, enter = transition_probabilities(np.array([0.9, 0.1]), np.array([0.9, 0.0]))
    np.testing.assert_allclose(stay, [0.9 + 0.1 * 0.9, 0.1])  # λ + (1 − λ)π
    np.testing.assert_allclose(enter, [0.1 * 0.9, 0.1])  # (1 − λ)π
    # the stationary active probability of P = [[stay, 1 − stay], [enter, 1 − enter]] is π
    np.testing.assert_allclose(enter / (1 - stay + enter), [0.9, 0.1])


def test_lambda_range_is_checked() -> None:
    low, _ = lambda_bounds(np.array([0.9, 0.5, 0.1]))
    np.testing.assert_allclose(low, [1 - 1 / 0.9, -1.0, 1 - 1 / 0.9])
    check_chains(np.array([0.9]), np.array([-0.11]))
    with pytest.raises(ConfigError, match="not a valid eigenvalue"):
        check_chains(np.array([0.9]), np.array([-0.2]))  # P(active → active) would be negative
    with pytest.raises(ConfigError, match="not a valid eigenvalue"):
        check_chains(np.array([0.5]), np.array([1.0]))  # reducible
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        check_chains(np.array([1.0]), np.array([0.0]))
    process = Markov(pi=0.9, lam=-0.5)
    with pytest.raises(ConfigError, match="eigenvalue"):
        process.setup(3, 0)


@pytest.mark.slow
def test_empirical_pi_and_lag_one_correlation_match() -> None:
    pis, lams = [0.9, 0.1, 0.5, 0.3], [0.9, 0.0, -0.6, 0.5]
    process = Markov(pi=pis, lam=lams)
    process.setup(4, seed=3)
    x = trajectory(process, 20_000).astype(float)
    np.testing.assert_allclose(x.mean(0), pis, atol=0.03)
    centred = x - x.mean(0)
    lag1 = (centred[1:] * centred[:-1]).mean(0) / centred.var(0)  # autocorrelation of a 2-state chain is λ^h
    np.testing.assert_allclose(lag1, lams, atol=0.05)


def test_starts_from_stationarity() -> None:
    first = []
    for seed in range(400):
        process = Markov(pi=[0.9, 0.2], lam=0.95)
        process.setup(2, seed)
        first.append(process.available(0).numpy())
    np.testing.assert_allclose(np.mean(first, 0), [0.9, 0.2], atol=0.06)


def test_deterministic_and_resumable() -> None:
    a, b = Markov(pi=0.4, lam=0.7), Markov(pi=0.4, lam=0.7)
    a.setup(6, 11)
    b.setup(6, 11)
    full = trajectory(a, 50)
    for t in range(20):
        b.available(t)
    saved = b.state_dict()
    resumed = Markov(pi=0.4, lam=0.7)
    resumed.setup(6, 11)
    resumed.load_state_dict(saved)
    assert saved["round"] == 19 and saved["state"].shape == (6,)
    np.testing.assert_array_equal(np.stack([resumed.available(t).numpy() for t in range(20, 50)]), full[20:])
    skipping = Markov(pi=0.4, lam=0.7)  # asked for a later round directly: steps through the ones between
    skipping.setup(6, 11)
    np.testing.assert_array_equal(skipping.available(30).numpy(), full[30])
    np.testing.assert_array_equal(skipping.available(4).numpy(), full[4])  # and replays the past
    other = Markov(pi=0.4, lam=0.7)
    other.setup(6, 12)
    assert not np.array_equal(trajectory(other, 50), full)


def test_clusters_switch_together() -> None:
    process = AVAILABILITY.build({"name": "markov_clusters", "clusters": 3, "pi": [0.9, 0.5, 0.1], "lam": 0.8})
    assert isinstance(process, MarkovClusters)
    process.setup(9, 0)
    x = trajectory(process, 3000)
    np.testing.assert_array_equal(process.member, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    for c in range(3):
        block = x[:, 3 * c : 3 * c + 3]
        assert (block == block[:, :1]).all()
    np.testing.assert_allclose(x[:, [0, 3, 6]].mean(0), [0.9, 0.5, 0.1], atol=0.05)
    np.testing.assert_allclose(process.client_pi, [0.9] * 3 + [0.5] * 3 + [0.1] * 3)
    explicit = MarkovClusters(clusters=2, pi=0.5, lam=0.0, assignment=[1, 0, 1])
    explicit.setup(3, 0)
    x = trajectory(explicit, 100)
    assert (x[:, 0] == x[:, 2]).all() and not (x[:, 0] == x[:, 1]).all()


def test_paper_classes() -> None:
    process = ClientClasses(g=0.4, nu=0.9, eps=1e-2)
    process.setup(24, seed=5)
    group, more, correlated = process.classes()
    np.testing.assert_array_equal(group, block_groups(24, 2))
    assert (group[:12] == 0).all() and (group[12:] == 1).all()
    for g in range(2):  # 3 clients per (group × availability × correlation) cell
        for m in (True, False):
            for c in (True, False):
                assert int(((group == g) & (more == m) & (correlated == c)).sum()) == 3
    np.testing.assert_allclose(process.client_pi, np.where(more, 0.9, 0.1))
    lam = process.client_lambda
    np.testing.assert_allclose(lam[correlated], 0.9)
    assert np.abs(lam[~correlated]).max() < 0.05 and np.abs(lam[~correlated]).min() > 0
    same_layout = ClientClasses()
    same_layout.setup(24, seed=6)  # another run seed: same classes (layout_seed), another trajectory
    np.testing.assert_array_equal(same_layout.client_pi, process.client_pi)
    assert not torch.equal(
        torch.stack([same_layout.available(t) for t in range(30)]),
        torch.stack([process.available(t) for t in range(30)]),
    )


def test_repo_classes() -> None:
    process = ClientClasses(mix="repo", eps=1e-2)
    process.setup(24, seed=0)
    group, more, correlated = process.classes()
    for g in range(2):  # per group: 6 more available (all weak), 3 less available correlated, 3 less weak
        assert int(((group == g) & more & ~correlated).sum()) == 6
        assert int(((group == g) & more & correlated).sum()) == 0
        assert int(((group == g) & ~more & correlated).sum()) == 3
    lam = process.client_lambda
    np.testing.assert_allclose(lam[correlated], 0.9)
    # λ = (N(0, ε²) + ε)/2: mean ε/2, std ε/2
    assert 0 < lam[~correlated].mean() < 0.01 and lam[~correlated].std() < 0.01
    paper = ClientClasses()
    paper.setup(24, seed=0)
    np.testing.assert_array_equal(paper.classes()[1], more)  # the same availability halves in both mixes
