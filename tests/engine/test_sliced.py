"""Sub-models trained as the smaller networks they are (`fedhet.engine.sliced`): the same models as the masked
full network, for prefixes, rolling windows and any unit sets, with and without the scaler; masks that are not a
sub-network of units, and objectives it does not cover, train the masked full network."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.optimizers import SGD
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.engine.sliced import train_sliced, unit_structure
from fedhet.strategies.fedrolex import rolling_units
from fedhet.strategies.submodels import first_units, unit_mask
from helpers.tiny import tiny_data

LAYERS = ["0", "2", "4"]


def two_hidden() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)))


def request(model: FlatModel, masks: torch.Tensor, scales: torch.Tensor | None = None, **plan: object) -> TrainRequest:
    data = tiny_data([7, 9, 4, 6], dim=5, classes=3, seed=2)
    engine = Engine(model, data, backend="dense", seed=3)
    w = model.initial_params()
    clients = torch.arange(len(masks))
    base = LocalPlan.uniform(clients, 4, 0.1, 3, **plan)  # type: ignore[arg-type]
    base.masks, base.scales = masks, scales
    cohort = engine.cohort(base, w, 0)
    starts = torch.where(masks, w, 0.0)
    return TrainRequest(model, data.train, w, base, cohort, 3, 0, starts=starts)


def masks_of(model: FlatModel) -> torch.Tensor:
    keep_half = first_units([8, 6], 0.5)
    rolled = [rolling_units(8, 0.5, 5), rolling_units(6, 0.5, 5)]
    odd = [torch.arange(8) % 3 == 0, torch.arange(6) % 2 == 1]
    full = torch.ones(model.size, dtype=torch.bool)
    return torch.stack([unit_mask(model, LAYERS, units) for units in (keep_half, rolled, odd)] + [full])


@pytest.mark.parametrize("scaled", [False, True])
def test_the_smaller_networks_train_to_the_masked_full_networks_models(scaled: bool) -> None:
    model = two_hidden()
    layers = dense_layers(model)
    assert layers is not None
    masks = masks_of(model)
    scales = torch.tensor([[2.0, 2.0, 1.0], [2.0, 2.0, 1.0], [3.0, 2.0, 1.0], [1.0, 1.0, 1.0]]) if scaled else None
    sliced = train_sliced(request(model, masks, scales), layers)
    assert sliced is not None
    full = train_dense(request(model, masks, scales), layers)
    torch.testing.assert_close(sliced[0], full[0].masked_fill(~masks, 0.0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sliced[1], full[1], atol=1e-6, rtol=1e-5)
    assert bool((sliced[0][~masks] == 0).all())


def test_a_mask_that_is_not_a_sub_network_of_units_is_left_to_the_masked_network() -> None:
    model = two_hidden()
    layers = dense_layers(model)
    assert layers is not None
    masks = masks_of(model)
    assert all(unit_structure(layers, row) is not None for row in masks)
    torn = masks[0].clone()
    torn[layers[1].weight.start] = not bool(torn[layers[1].weight.start])  # one weight more or less
    assert unit_structure(layers, torn) is None
    assert train_sliced(request(model, torn.unsqueeze(0)), layers) is None
    momentum = request(model, masks, optimizer=SGD(momentum=0.9))
    assert train_sliced(momentum, layers) is None  # optimiser state: the masked network


def test_every_coordinate_of_the_models_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result is not cleared before the sub-networks are scattered into it: memory that starts as NaN must
    end as the trained values and zeros (prefixes, rolling windows, any unit sets, the full model)."""
    model = two_hidden()
    layers = dense_layers(model)
    assert layers is not None
    masks = masks_of(model)
    full = train_dense(request(model, masks), layers)
    empty = torch.empty

    def dirty(*args: object, **kwargs: object) -> torch.Tensor:
        out = empty(*args, **kwargs)  # type: ignore[call-overload]
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", dirty)
    sliced = train_sliced(request(model, masks), layers)
    assert sliced is not None
    torch.testing.assert_close(sliced[0], full[0].masked_fill(~masks, 0.0), atol=1e-6, rtol=1e-5)
