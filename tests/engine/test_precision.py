"""Mixed precision (``precision: bfloat16|float16``): local training under torch.autocast, within tolerance."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.numerics import mixed_precision
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from helpers.tiny import tiny_data


def _trained(precision: str, backend: str = "vectorised") -> tuple[torch.Tensor, str | None]:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)))
    engine = Engine(model, tiny_data([5, 7, 6, 4, 8, 5]), backend=backend, precision=precision)  # type: ignore[arg-type]
    params = engine.train(model.initial_params(), LocalPlan.uniform(torch.arange(6), 3, 0.1, 4), 0).params
    return params, engine.last_backend


def test_bfloat16_training_is_within_its_tolerance_of_float32_and_not_float32() -> None:
    exact, _ = _trained("float32")
    mixed, backend = _trained("bfloat16", backend="auto")
    assert backend == "vectorised"  # auto leaves the dense backend, whose own products autocast does not reach
    assert mixed.dtype == torch.float32  # the weights stay float32
    gap = (mixed - exact).abs().max().item()
    assert 0 < gap < 5e-3  # bfloat16's 8-bit mantissa in the products, 3 steps (docs/performance.md)


def test_autocast_is_on_only_inside_mixed_precision() -> None:
    cpu = torch.device("cpu")
    with mixed_precision(cpu, "float32"):
        assert not torch.is_autocast_enabled("cpu")
    with mixed_precision(cpu, "bfloat16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("backend", ["dense"])
def test_a_backend_that_autocast_does_not_reach_is_refused(backend: str) -> None:
    with pytest.raises(ConfigError, match=r"precision bfloat16 .* backend auto or vectorised"):
        _trained("bfloat16", backend=backend)
