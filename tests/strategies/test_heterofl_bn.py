"""HeteroFL on models with batch norm: a BN'd CNN's and a ResNet's channels sliced and trained as the smaller network
(parameters and running statistics), every client at level 1 is FedAvg, each level scored with statistics worked out
at that level (static batch norm), a resumed run is byte-identical, and the combinations that cannot hold are
refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.catalog import MODELS, STRATEGIES
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fedbn import check_statistics
from fedhet.strategies.heterofl import HeteroFL, scaler_factors, sliced_layers, width_mask
from fedhet.strategies.submodels import channels
from helpers.hostile import assert_refused
from helpers.personal import run_round
from helpers.tiny import make_context, tiny_data
from helpers.zoo_cnns import image_federated

SHAPE = (1, 8, 8)
SIZES = [3, 5]
STEPS, LR, BATCH = 3, 0.1, 8  # a batch larger than every client: full-batch steps
TOL = {"atol": 2e-5, "rtol": 1e-4}


def resnet(width: int) -> nn.Module:
    return MODELS.build({"name": "resnet8", "width": width}).build(SHAPE, 10)


def bn_cnn(channels_: int, hidden: int) -> nn.Module:
    """Conv → BN → ReLU → max-pool → fc → BN → ReLU → fc: a CNN with batch norm on channels and on units."""
    return nn.Sequential(
        nn.Unflatten(1, SHAPE),
        nn.Conv2d(1, channels_, 3, padding=1),
        nn.BatchNorm2d(channels_),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(channels_ * 16, hidden),
        nn.BatchNorm1d(hidden, momentum=0.3),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


NETS = {"resnet8": (lambda: resnet(4), lambda: resnet(2)), "bn_cnn": (lambda: bn_cnn(4, 6), lambda: bn_cnn(2, 3))}


def with_statistics(module: nn.Module) -> FlatModel:
    """`module` as a flat model whose running statistics are not the initial 0 and 1 (so that slicing them shows)."""
    gen = torch.Generator().manual_seed(3)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return FlatModel(module)


def first(full: Tensor, shape: torch.Size) -> Tensor:
    """The leading block of `full` of `shape` (the first channels on every dimension)."""
    return full[tuple(slice(0, d) for d in shape)]


def plain_training(module: nn.Module, x: Tensor, y: Tensor, level: float) -> nn.Module:
    """`STEPS` full-batch SGD steps of a plain torch module in training mode, HeteroFL's scaler (outputs of every
    Linear/Conv2d layer but the last divided by `level`) as forward hooks."""
    module = copy.deepcopy(module).train()
    layers = [m for m in module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    for layer in layers[:-1]:
        layer.register_forward_hook(lambda m, _i, out: out / level if m.training else out)
    for _ in range(STEPS):
        module.zero_grad()
        F.cross_entropy(module(x), y).backward()
        with torch.no_grad():
            for p in module.parameters():
                p -= LR * p.grad
    return module.eval()


@pytest.mark.parametrize("name", ["resnet8", "resnet18"])
def test_a_resnets_level_keeps_the_smaller_resnets_coordinates(name: str) -> None:
    """Level 1/2 of a ResNet of width 4 keeps as many coordinates as the ResNet of width 2 has (parameters and
    running statistics), the shortcut's channels those of the block's output; level 1 keeps all."""
    big, small = (FlatModel(MODELS.build({"name": name, "width": w}).build((3, 32, 32), 10)) for w in (4, 2))
    layers = sliced_layers(big, "test")
    assert int(width_mask(big, layers, 0.5).sum()) == small.size
    assert bool(width_mask(big, layers, 1.0).all())
    groups = channels(big, layers)
    assert groups.writes["layer2.0.downsample.0"] == groups.writes["layer2.0.conv2"] == groups.reads["layer3.0.conv1"]
    assert groups.writes["conv1"] == groups.writes["layer1.0.conv2"] == groups.reads["layer2.0.downsample.0"]


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_the_masked_model_trains_as_the_smaller_network_with_its_batch_norm(net: str, backend: str) -> None:
    """Client 0 at level 1/2 (with the scaler) trains, on the engine, what the half-width network built by hand
    trains by autograd from the first channels of the global model: its parameters and running statistics; the
    sliced-off coordinates stay 0, and the evaluated masked model computes the smaller network's logits (a zero
    channel normalises to 0 with eps). Client 1 trains the full network."""
    big_net, small_net = NETS[net]
    torch.manual_seed(0)
    model = with_statistics(big_net())
    data = image_federated((64,), SIZES)  # flat 8x8 images
    engine = Engine(model, data, backend=backend, seed=1)  # type: ignore[arg-type]
    layers = sliced_layers(model, "test")
    half, full = width_mask(model, layers, 0.5), torch.ones(model.size, dtype=torch.bool)
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), STEPS, LR, BATCH)
    plan.masks = torch.stack([half, full])
    plan.scales = scaler_factors(torch.tensor([0.5, 1.0]), len(layers))
    got = engine.train(w0, plan, 0).params
    start = model.unflatten(w0)
    small = small_net()
    small.load_state_dict({n: first(start[n], t.shape) for n, t in small.state_dict().items()})
    x, y = data.train.client(0)
    small = plain_training(small, x, y, 0.5)
    trained = small.state_dict()
    mine = model.unflatten(got[0])
    for name, value in trained.items():
        torch.testing.assert_close(first(mine[name], value.shape), value.float(), **TOL, msg=name)
        assert int((mine[name] != 0).sum()) <= value.numel(), name  # nothing outside the first channels
    assert bool((got[0, ~half] == 0).all())
    with torch.no_grad():
        torch.testing.assert_close(model.logits(got[0], x), small.eval()(x), **TOL)
    whole = copy.deepcopy(model.module)
    whole.load_state_dict({n: start[n].to(t.dtype) for n, t in whole.state_dict().items()})
    x1, y1 = data.train.client(1)
    expected = plain_training(whole, x1, y1, 1.0).state_dict()
    for name, value in model.unflatten(got[1]).items():
        torch.testing.assert_close(value, expected[name].float(), **TOL, msg=name)


def test_with_batch_norm_after_every_scaled_layer_the_scaler_only_scales_eps() -> None:
    """BN(x / r) with eps normalises as BN(x) with eps·r² (training normalises by the batch's statistics): the
    scaler trains the parameters that the unscaled network with every BN's eps times r² trains, so nothing
    compounds from layer to layer (the running statistics, tracked in the scaled space, differ)."""
    data = image_federated((64,), SIZES)
    trained = []
    for scaled in (True, False):
        torch.manual_seed(0)
        model = FlatModel(resnet(4))
        if not scaled:
            for m in model.module.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eps *= 0.5**2
        layers = sliced_layers(model, "test")
        plan = LocalPlan.uniform(torch.tensor([0, 1]), STEPS, LR, BATCH)
        plan.masks = width_mask(model, layers, 0.5).expand(2, -1).clone()
        plan.scales = scaler_factors(torch.tensor([0.5, 0.5]), len(layers)) if scaled else None
        engine = Engine(model, data, backend="sequential", seed=1)
        trained.append(engine.train(model.initial_params(), plan, 0).params[:, : model.num_params])
    torch.testing.assert_close(trained[0], trained[1], **TOL)


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_every_client_at_level_1_is_fedavg_on_a_model_with_batch_norm(backend: str) -> None:
    strategies = [HeteroFL(levels=[1.0]), FedAvg()]
    engines = []
    for strategy in strategies:
        torch.manual_seed(0)
        engine = Engine(FlatModel(resnet(2)), image_federated((64,), SIZES), backend=backend, seed=1)  # type: ignore[arg-type]
        strategy.setup(make_context(engine, steps=2, lr=LR, batch=4, m=2))
        engines.append(engine)
    w = [engines[0].model.initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip(strategies, engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)


def test_each_level_is_scored_with_statistics_worked_out_at_that_level() -> None:
    """Linear(3, 4) → ReLU → Linear(4, 4) → BN → ReLU → Linear(4, 2) at levels 1 and 1/2 (the default policy for
    heterofl: recompute): level 1/2's BN statistics are the mean and unbiased variance over every client's training
    data of the second layer's first 2 units as the half network computes them (reading 2 hidden units), not the
    full model's, and its scores are the half network's with them."""
    torch.manual_seed(0)
    model = FlatModel(
        nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    )
    engine = Engine(model, tiny_data([5, 7], dim=3, classes=2, seed=4), backend="sequential", seed=1)
    strategy = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5])
    strategy.setup(make_context(engine, m=2))
    assert check_statistics(MODELS.build({"name": "logistic"}), strategy, model, private=False) == "recompute"
    w = model.initial_params() + 0.3 * torch.randn(model.size, generator=torch.Generator().manual_seed(1))
    w[model.stats] = 0.0  # whatever the trained statistics: they are recomputed
    p, x = model.unflatten(w), engine.data.train.x

    def statistics(k: int) -> tuple[Tensor, Tensor]:
        hidden = torch.relu(x @ p["0.weight"][:k].T + p["0.bias"][:k])
        out = hidden @ p["2.weight"][:k, :k].T + p["2.bias"][:k]
        return out.mean(0), out.var(0)

    (mean, var), (full_mean, full_var) = statistics(2), statistics(4)
    half = strategy._prefix[0.5]
    scored = model.unflatten(engine.evaluated(torch.where(half, w, 0.0)))
    torch.testing.assert_close(scored["3.running_mean"], torch.cat([mean, torch.zeros(2)]))
    torch.testing.assert_close(scored["3.running_var"], torch.cat([var, torch.zeros(2)]))
    assert not torch.allclose(mean, full_mean[:2], atol=1e-3)  # the full model's statistics differ
    torch.testing.assert_close(model.unflatten(engine.evaluated(w))["3.running_var"], full_var)
    strategy.evaluation_params(w)
    scores = strategy.level_scores()[0.5]
    for client in range(2):
        xk, yk = engine.data.test.client(client)
        hidden = torch.relu(xk @ p["0.weight"][:2].T + p["0.bias"][:2]) @ p["2.weight"][:2, :2].T + p["2.bias"][:2]
        normed = (hidden - mean) / torch.sqrt(var + 1e-5) * p["3.weight"][:2] + p["3.bias"][:2]
        logits = torch.relu(normed) @ p["5.weight"][:, :2].T + p["5.bias"]
        assert float(scores.loss[client]) == pytest.approx(float(F.cross_entropy(logits, yk)), rel=1e-5)


def test_the_sub_model_methods_default_to_static_batch_norm_and_refuse_what_cannot_hold() -> None:
    """Default: recompute (each level's statistics at that level); aggregate (averaging the statistics of sub-models
    of different widths) and Flower (whose nodes hold the data apart) are refused in one line."""
    spec = MODELS.build({"name": "logistic"})
    for name in ("heterofl", "fedrolex", "fjord"):
        strategy = STRATEGIES.build({"name": name})
        assert check_statistics(spec, strategy, FlatModel(resnet(2)), private=False) == "recompute"
    assert check_statistics(spec, FedAvg(), FlatModel(resnet(2)), private=False) == "aggregate"
    aggregate = MODELS.build({"name": "resnet8", "width": 2, "batch_norm": "aggregate"})
    with pytest.raises(ConfigError, match="trains sub-models of different widths"):
        check_statistics(aggregate, HeteroFL(), FlatModel(resnet(2)), private=False)
    with pytest.raises(ConfigError, match="Flower's nodes hold apart"):
        check_statistics(spec, HeteroFL(), FlatModel(resnet(2)), private=False, native=False)


BN_RUN = ["run", "--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--set", "model.name=resnet8"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--set", "model.batch_norm=aggregate"], "trains sub-models of different widths"),
        (["--set", "model.norm=group"], "has a GroupNorm layer"),
        (["--set", "model.batch_norm=local"], "that is algorithm fedbn"),
    ],
)
def test_the_command_line_refuses_in_one_line_and_writes_nothing(
    extra: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*BN_RUN, "--set", "model.width=2", "--algorithm", "heterofl", *extra, "--out", "run", "--quiet"]
    assert_refused(args, fragment, tmp_path)


def config(rounds: int = 3) -> dict[str, Any]:
    return {
        "algorithm": {"name": "heterofl", "levels": [1, 0.5]},
        "dataset": "digits",
        "model": {"name": "resnet8", "width": 2},
        "num_clients": 4,
        "clients_per_round": 3,
        "rounds": rounds,
        "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
        "seed": 1,
    }


def test_a_resumed_run_is_byte_identical(tmp_path: Path) -> None:
    run(parse_config(config()), tmp_path / "straight")
    run(parse_config(config(rounds=1)), tmp_path / "cut")
    text = (tmp_path / "cut" / "config.yaml").read_text().replace("rounds: 1", "rounds: 3")
    (tmp_path / "cut" / "config.yaml").write_text(text)
    resume(tmp_path / "cut")
    for file in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / file).read_bytes() == (tmp_path / "straight" / file).read_bytes(), file


def test_levels_from_the_system_model_charge_the_sub_models_flops_on_a_model_with_batch_norm() -> None:
    """A client's compute on the clock is its sub-model's share of the parameters' FLOPs (the running statistics,
    the vector's last coordinates, cost none): the slow clients at a quarter width make a shorter round."""
    base = {**config(rounds=1), "clients_per_round": 4, "local": {"steps": 2, "lr": 0.1, "batch_size": 10}}
    base["system"] = {"name": "lognormal", "capacity": {"levels": [1.0, 0.25], "by": "speed"}}
    algorithm = {"name": "heterofl", "levels": [1.0, 0.25], "assignment": "system"}
    state = run(parse_config({**base, "algorithm": algorithm}))
    assert state.final["time_s"] < run(parse_config({**base, "algorithm": "fedavg"})).final["time_s"]
