"""Staleness functions as registered components: the built-ins by hand, a plugin one in FedAsync and FedBuff."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.strategies.fedasync import FedAsync, fedasync_step
from fedhet.strategies.fedbuff import FedBuff
from fedhet.strategies.staleness import STALENESS, Hinge, Polynomial, SquareRoot, StalenessFunction


@STALENESS.register
class Halving(StalenessFunction):
    """A plugin: s(x) = 2^(−x)."""

    name: ClassVar[str] = "halving"

    def weight(self, staleness: torch.Tensor) -> torch.Tensor:
        return torch.pow(0.5, staleness.double())


def test_the_built_in_functions_by_hand() -> None:
    x = torch.tensor([0, 3, 8])
    assert Polynomial(a=1.0).weight(x).tolist() == pytest.approx([1.0, 1 / 4, 1 / 9])
    assert Hinge().weight(x).tolist() == pytest.approx([1.0, 1.0, 1 / 41])  # a = 10, b = 4: 1 / (10·4 + 1)
    assert SquareRoot().weight(x).tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    assert STALENESS.build("constant").weight(x).tolist() == [1.0, 1.0, 1.0]


def test_fedasync_takes_a_function_by_name_or_with_its_parameters() -> None:
    w, local = torch.tensor([1.0, 1.0]), torch.tensor([[3.0, -1.0]])
    result = LocalResult(torch.tensor([2]), local, torch.zeros(1), torch.ones(1), torch.ones(1))

    def mixed(strategy: FedAsync, lag: int) -> torch.Tensor:
        return strategy.aggregate_buffer(7, w, result, w.unsqueeze(0), torch.tensor([lag]))

    named = FedAsync(alpha=0.6, staleness="hinge", a=10, b=4)
    given = FedAsync(alpha=0.6, staleness={"name": "hinge", "a": 10, "b": 4})
    torch.testing.assert_close(mixed(named, 4), mixed(given, 4))  # t − τ = 5: 1 / (10 (5 − 4) + 1)
    torch.testing.assert_close(mixed(given, 4), fedasync_step(w, local[0], 0.6 / 11))
    plugin = FedAsync(alpha=0.6, staleness="halving")
    torch.testing.assert_close(mixed(plugin, 1), fedasync_step(w, local[0], 0.6 / 4))  # t − τ = 2: 2^(−2)
    with pytest.raises(ConfigError, match="unknown staleness function 'no_such_function'"):
        FedAsync(staleness="no_such_function")


def test_fedbuff_scales_by_any_function_of_the_lag() -> None:
    starts = torch.zeros(2, 1)
    result = LocalResult(
        torch.tensor([0, 1]), torch.tensor([[-1.0], [-1.0]]), torch.zeros(2), torch.ones(2), torch.ones(2)
    )
    lags = torch.tensor([0, 3])
    default = FedBuff(buffer_size=2, server_lr=1.0).aggregate_buffer(0, torch.zeros(1), result, starts, lags)
    torch.testing.assert_close(default, torch.tensor([-(1 + 0.5) / 2]))  # w − (1/K) Σ Δ_k / √(1 + lag), Δ = 1
    none = FedBuff(buffer_size=2, server_lr=1.0, staleness_scaling="none")
    torch.testing.assert_close(none.aggregate_buffer(0, torch.zeros(1), result, starts, lags), torch.tensor([-1.0]))
    plugin = FedBuff(buffer_size=2, server_lr=1.0, staleness_scaling={"name": "halving"})
    halved = plugin.aggregate_buffer(0, torch.zeros(1), result, starts, lags)
    torch.testing.assert_close(halved, torch.tensor([-(1 + 1 / 8) / 2]))
