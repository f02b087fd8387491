"""HeteroFL: width sub-models as masked full models, the per-coordinate average, levels per client."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.errors import ConfigError
from fedhet.flower.codec import decode_plan, encode_plan
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.heterofl import HeteroFL, masked_average, sliced_layers, width_mask
from helpers.personal import LR, STEPS, TOL, data, mlp, run_round, setup, sgd, weighted
from helpers.tiny import linear_model, make_context, tiny_data
from helpers.zoo_cnns import image_federated, zoo_model

BACKENDS = ["dense", "vectorised", "sequential"]


def test_the_half_width_mask_keeps_the_first_half_of_each_hidden_layer() -> None:
    model = mlp()  # Linear(3, 4), Tanh, Linear(4, 2)
    mask = width_mask(model, sliced_layers(model, "test"), 0.5)
    w = model.unflatten(mask)
    assert w["0.weight"].tolist() == [[True] * 3] * 2 + [[False] * 3] * 2  # 2 of 4 units, every input
    assert w["0.bias"].tolist() == [True, True, False, False]
    assert w["2.weight"].tolist() == [[True, True, False, False]] * 2  # every output, from the kept units
    assert w["2.bias"].tolist() == [True, True]
    assert int(mask.sum()) == 6 + 2 + 4 + 2
    assert bool(width_mask(model, ["0", "2"], 1.0).all())
    assert int(width_mask(model, ["0", "2"], 0.1).sum()) == 3 + 1 + 2 + 2  # ⌈0.1·4⌉ = 1 unit


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_training_is_training_with_the_sliced_off_weights_frozen_at_zero(backend: str) -> None:
    engine = Engine(mlp(), data(), backend=backend, seed=1)  # type: ignore[arg-type]
    model = engine.model
    half, full = width_mask(model, ["0", "2"], 0.5), torch.ones(model.size, dtype=torch.bool)
    w = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), STEPS, LR, 8)
    plan.masks = torch.stack([half, full])
    got = engine.train(w, plan, 0).params
    expected = [sgd(model, torch.where(m, w, 0.0), k, STEPS, frozen=~m) for k, m in enumerate([half, full])]
    torch.testing.assert_close(got, torch.stack(expected), **TOL)
    assert bool((got[0, ~half] == 0).all())


def test_the_aggregate_averages_each_coordinate_over_the_clients_that_trained_it() -> None:
    w = torch.tensor([1.0, 1.0, 1.0, 7.0])
    params = torch.tensor([[0.0, 2.0, 4.0, 0.0], [2.0, 0.0, 0.0, 0.0]])  # client 1: half width (coordinate 0)
    masks = torch.tensor([[True, True, True, False], [True, False, False, False]])
    d = masked_average(w, params, masks, torch.tensor([0.25, 0.75]))
    # coordinate 0: (0.25·(1−0) + 0.75·(1−2)) / 1 = −0.5; 1 and 2: client 0 alone; 3: nobody, unchanged
    torch.testing.assert_close(w - d, torch.tensor([1.5, 2.0, 4.0, 7.0]))


def test_a_round_with_a_full_and_a_half_width_client_matches_the_hand_computed_model() -> None:
    strategy = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5], scaler=False)
    engine = setup(strategy, "dense")
    model = engine.model
    w = model.initial_params()
    half = width_mask(model, ["0", "2"], 0.5)
    full = sgd(model, w, 0, STEPS)
    small = sgd(model, torch.where(half, w, 0.0), 1, STEPS, frozen=~half)
    expected = torch.where(half, weighted([full, small]), full)  # only client 0 trained the other half
    _, got = run_round(strategy, engine, w, 0)
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_client_at_full_width_is_fedavg(backend: str) -> None:
    heterofl, fedavg = HeteroFL(levels=[1.0]), FedAvg()
    engines = [setup(heterofl, backend), setup(fedavg, backend)]
    w = [engines[0].model.initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([heterofl, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)


def _strategy(k: int, **config: object) -> HeteroFL:
    strategy = STRATEGIES.build({"name": "heterofl", **config})
    assert isinstance(strategy, HeteroFL)
    engine = Engine(mlp(), tiny_data([3] * k, dim=3), backend="dense")
    strategy.setup(make_context(engine, m=k))
    return strategy


def test_fixed_levels_follow_the_proportions_and_the_seed() -> None:
    strategy = _strategy(10, levels=[1, 0.5], proportions=[0.3, 0.7])
    levels = strategy.capacity(0)
    assert sorted(levels.tolist()) == [0.5] * 7 + [1.0] * 3
    assert torch.equal(strategy.capacity(5), levels)
    assert torch.equal(_strategy(10, levels=[1, 0.5], proportions=[0.3, 0.7]).capacity(0), levels)


def test_dynamic_levels_are_redrawn_each_round_from_the_seeded_stream() -> None:
    strategy = _strategy(40, levels=[1, 0.5, 0.25], assignment="dynamic")
    rounds = [strategy.capacity(t) for t in range(3)]
    assert not torch.equal(rounds[0], rounds[1])
    assert set(torch.cat(rounds).tolist()) == {1.0, 0.5, 0.25}
    assert torch.equal(_strategy(40, levels=[1, 0.5, 0.25], assignment="dynamic").capacity(1), rounds[1])


def test_the_evaluated_model_is_scored_at_every_level_and_per_client_capacity() -> None:
    strategy = _strategy(4, levels=[1, 0.25], capacities=[1, 0.25, 0.25, 1])
    engine = strategy.ctx.engine
    w = engine.model.initial_params()
    strategy.evaluation_params(w)
    metrics = strategy.round_metrics()
    quartiles = {f"capacity_test_accuracy_q{q}" for q in range(1, 5)}
    assert set(metrics) == {"test_accuracy_level1", "test_accuracy_level0.25", *quartiles}
    full = engine.scores(w, "test").accuracy
    assert metrics["test_accuracy_level1"] == pytest.approx(float(full.double().mean()))
    small = engine.scores(torch.where(strategy._prefix[0.25], w, 0.0), "test").accuracy
    columns = strategy.client_columns()
    assert columns["capacity"].tolist() == [1, 0.25, 0.25, 1]
    torch.testing.assert_close(columns["capacity_test_accuracy"], torch.where(columns["capacity"] == 1, full, small))
    # one client a quarter, from the weakest: clients 1, 2 (level 0.25), then 0, 3 (level 1)
    own = [float(small[1]), float(small[2]), float(full[0]), float(full[3])]
    assert [metrics[f"capacity_test_accuracy_q{q}"] for q in range(1, 5)] == pytest.approx(own)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"levels": [1, 0]}, "levels must be in"),
        ({"levels": [1, 0.5], "proportions": [1]}, "one share per level"),
        ({"levels": [1, 0.5], "proportions": [0, 0]}, "not all 0"),
        ({"capacities": [1], "assignment": "dynamic"}, "use assignment: fix"),
        ({"levels": [1, 0.5], "capacities": [0.25]}, "one of the levels"),
    ],
)
def test_bad_settings_are_refused_in_one_line(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        STRATEGIES.build({"name": "heterofl", **config})


def test_models_and_objectives_it_cannot_slice_are_refused_at_setup() -> None:
    sigmoid = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 2)))
    for model, message in [(linear_model(), "not a sequence of layers"), (sigmoid, "Sigmoid")]:
        with pytest.raises(ConfigError, match=message):
            HeteroFL().setup(make_context(Engine(model, data(), backend="sequential")))
    engine = Engine(mlp(), data(), backend="dense")
    prox = ServerContext(engine, LocalSettings(2, 0.1, 4, terms=(Proximal(mu=0.1),)), seed=0, clients_per_round=2)
    with pytest.raises(ConfigError, match="pulls the sliced-off weights"):
        HeteroFL().setup(prox)
    with pytest.raises(ConfigError, match="capacities lists 1 levels for 2 clients"):
        HeteroFL(levels=[1], capacities=[1]).setup(make_context(engine))


FAST = ["run", "--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]"]


HETEROFL = ["--algorithm", "heterofl"]
DP_SGD = ["--set", "local.dp_sgd.clip=1", "--set", "local.dp_sgd.noise_multiplier=1"]
LOCAL_DP = ["--algorithm", "dp", "--set", "algorithm.base=heterofl", "--set", "algorithm.noise=local"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([*HETEROFL, "--set", "algorithm.capacities=[1]"], "capacities lists 1 levels for 6 clients"),
        ([*HETEROFL, "--set", "model.activation=sigmoid"], "has a Sigmoid layer"),
        ([*HETEROFL, "--set", "algorithm.levels=[1,0]"], "capacity levels must be in"),
        ([*HETEROFL, *DP_SGD], "does not combine with it"),
        (LOCAL_DP, "does not combine with it"),
    ],
)
def test_the_command_line_refuses_in_one_line_and_writes_nothing(
    extra: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*FAST, *extra, "--out", "run", "--quiet"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_run_writes_the_accuracy_at_every_level_and_each_clients_capacity(tmp_path: Path) -> None:
    args = [*FAST, "--algorithm", "heterofl", "--set", "algorithm.levels=[1,0.5]", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*args, "--quiet"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "run" / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    assert float(last["test_accuracy_level1"]) == pytest.approx(float(last["test_accuracy"]))
    assert 0 <= float(last["test_accuracy_level0.5"]) <= 1
    with (tmp_path / "run" / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    assert sorted(float(c["capacity"]) for c in clients) == [0.5] * 3 + [1.0] * 3
    full = [c for c in clients if float(c["capacity"]) == 1]
    assert all(c["capacity_test_accuracy"] == c["test_accuracy"] for c in full)


def test_the_masks_reach_clients_under_flower() -> None:
    plan = LocalPlan.uniform(torch.tensor([3, 5]), 2, 0.1, 4)
    plan.masks = torch.tensor([[True, False, True], [False, False, True]])
    decoded = decode_plan(*encode_plan(plan, torch.tensor([1, 0])))
    assert decoded.masks is not None and decoded.masks.tolist() == [[False, False, True], [True, False, True]]


@pytest.mark.parametrize("backend", ["conv", "sequential"])
def test_a_cnns_channels_are_sliced_and_trained_as_the_smaller_network(backend: str) -> None:
    model, shape = zoo_model("fedavg_cnn")  # channels [4, 8], fc 16, on flat 28x28 inputs
    layers = sliced_layers(model, "test")
    assert layers == ["features.0", "features.3", "head.0", "head.2"]
    half = width_mask(model, layers, 0.5)
    w = model.unflatten(half)
    assert w["features.0.weight"][:, 0].flatten(1).all(1).tolist() == [True, True, False, False]
    assert w["features.3.weight"][:4, :, 0, 0].tolist() == [[True, True, False, False]] * 4
    assert not w["features.3.weight"][4:].any()
    spatial = model.shapes[model.names.index("head.0.weight")][1] // 8  # the head reads 8 flattened channels
    assert w["head.0.weight"][0].tolist() == [True] * 4 * spatial + [False] * 4 * spatial
    data = image_federated(shape, [3, 4])
    engine = Engine(model, data, backend=backend, seed=1)  # type: ignore[arg-type]
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 2, 0.05, 8)  # full-batch steps
    plan.masks = torch.stack([half, torch.ones(model.size, dtype=torch.bool)])
    w0 = model.initial_params()
    got = engine.train(w0, plan, 0).params
    for k in range(2):
        x, y = data.train.client(k)
        v, keep = torch.where(plan.masks[k], w0, 0.0), plan.masks[k]
        for _ in range(2):
            v = v.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model.logits(v, x), y), v)
            v = torch.where(keep, v - 0.05 * g, v)
        torch.testing.assert_close(got[k], v.detach(), **TOL)


def test_a_cnn_with_group_norm_is_refused() -> None:
    with pytest.raises(ConfigError, match="GroupNorm"):
        sliced_layers(zoo_model("vgg16_gn")[0], "algorithm 'heterofl'")


def test_every_client_at_full_width_is_fedavg_for_a_cnn_on_the_conv_backend() -> None:
    models = [zoo_model("fedavg_cnn")[0] for _ in range(2)]
    data = image_federated((784,), [3, 4])
    heterofl, fedavg = HeteroFL(levels=[1.0]), FedAvg()
    engines = [Engine(model, data, backend="conv", seed=1) for model in models]
    for strategy, engine in zip([heterofl, fedavg], engines, strict=True):
        strategy.setup(make_context(engine, steps=2, lr=0.05, batch=2, m=2))
    w = [models[0].initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([heterofl, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)
