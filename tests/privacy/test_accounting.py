"""ε from the releases a run made, against dp-accounting called directly on the same mechanism, and the noise a
target ε asks for."""

from __future__ import annotations

import math

import dp_accounting as dp
import pytest

from fedhet.errors import ConfigError
from fedhet.privacy.accounting import Release, calibrate, epsilon


def test_poisson_rounds_are_the_poisson_subsampled_gaussian() -> None:
    direct = dp.rdp.RdpAccountant().compose(
        dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(1.3)), 50)
    )
    assert epsilon(Release(1.3, "poisson", rate=0.1), 50, 1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    pld = dp.pld.PLDAccountant(value_discretization_interval=1e-3).compose(
        dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(1.3)), 50)
    )
    assert epsilon(Release(1.3, "poisson", rate=0.1), 50, 1e-5, "pld") == pytest.approx(pld.get_epsilon(1e-5))
    finer = dp.pld.PLDAccountant().compose(
        dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(1.3)), 50)
    )
    assert finer.get_epsilon(1e-5) <= pld.get_epsilon(1e-5) < finer.get_epsilon(1e-5) * 1.001  # pessimistic, close
    assert epsilon(Release(1.3, "poisson", rate=0.1), 50, 1e-5, "pld") < epsilon(
        Release(1.3, "poisson", rate=0.1), 50, 1e-5, "rdp"
    )  # PLD is the tighter


def test_fixed_size_rounds_are_sampling_without_replacement_under_replace_one() -> None:
    """m of n without replacement: replacing one client moves the clipped sum by up to 2C, so z/2 (Wang et al.)."""
    event = dp.SelfComposedDpEvent(dp.SampledWithoutReplacementDpEvent(100, 10, dp.GaussianDpEvent(0.8)), 30)
    direct = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE).compose(event)
    got = epsilon(Release(1.6, "fixed", population=100, sample=10), 30, 1e-6)
    assert got == pytest.approx(direct.get_epsilon(1e-6), rel=1e-12)


def test_releases_without_amplification_count_in_full() -> None:
    full = dp.rdp.RdpAccountant().compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(2.0), 7))
    assert epsilon(Release(2.0, "none"), 7, 1e-5) == pytest.approx(full.get_epsilon(1e-5), rel=1e-12)
    half = dp.rdp.RdpAccountant().compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.0), 7))
    assert epsilon(Release(2.0, "none", replace=True), 7, 1e-5) == pytest.approx(half.get_epsilon(1e-5), rel=1e-12)
    pld = dp.pld.PLDAccountant(value_discretization_interval=1e-3).compose(
        dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.0), 7)
    )
    assert epsilon(Release(2.0, "none", replace=True), 7, 1e-5, "pld") == pytest.approx(pld.get_epsilon(1e-5))
    everyone = Release(2.0, "fixed", population=10, sample=10)  # m = n: no sampling, replace-one
    assert epsilon(everyone, 7, 1e-5) == pytest.approx(half.get_epsilon(1e-5), rel=1e-12)


def test_degenerate_releases() -> None:
    assert epsilon(Release(1.0, "poisson", rate=0.5), 0, 1e-5) == 0.0
    assert epsilon(Release(0.0, "poisson", rate=0.5), 3, 1e-5) == math.inf
    assert epsilon(Release(1.0, "poisson", rate=0.0), 3, 1e-5) == 0.0


def test_the_pld_accountant_refuses_sampling_without_replacement_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"PLD accountant has no sampling without replacement.*rdp"):
        epsilon(Release(1.0, "fixed", population=20, sample=5), 3, 1e-5, "pld")


@pytest.mark.parametrize(
    ("target", "accountant"), [(0.5, "rdp"), (2.0, "rdp"), (8.0, "rdp"), (40.0, "rdp"), (2.0, "pld"), (8.0, "pld")]
)
def test_a_target_epsilon_sets_a_noise_that_lands_within_one_percent(target: float, accountant: str) -> None:
    release = Release(1.0, "poisson", rate=0.05)
    spent = lambda z: epsilon(release.with_noise(z), 200, 1e-5, accountant)  # noqa: E731
    z = calibrate(spent, target)
    assert spent(z) <= target * (1 + 1e-9)
    assert spent(z) == pytest.approx(target, rel=0.01)
    assert spent(z * 0.99) > target  # the smallest such noise


def test_a_target_out_of_reach_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="needs a noise multiplier above"):
        calibrate(lambda z: 1.0, 0.5)
