"""The sub-model schemes on their shared mechanism (`fedhet.strategies.submodels`): HeteroFL's scaler by hand,
FedRolex's rolling windows and FjORD's ordered dropout by hand, every scheme at full width is FedAvg, a resumed run
is byte-identical, and a run writes each level's accuracy and each client's capacity."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.flower.codec import decode_plan, encode_plan
from fedhet.strategies.base import STRATEGIES, Strategy
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fedrolex import FedRolex, rolling_units
from fedhet.strategies.fjord import FjORD
from fedhet.strategies.heterofl import HeteroFL, scaler_factors
from fedhet.strategies.submodels import SubModels, unit_mask, width_mask
from helpers.hostile import assert_refused
from helpers.personal import LR, SIZES, STEPS, TOL, data, mlp, run_round, setup, weighted
from helpers.tiny import make_context, tiny_data
from helpers.zoo_cnns import image_federated, zoo_model

BACKENDS = ["dense", "vectorised", "sequential"]
SCHEMES = ["heterofl", "fedrolex", "fjord"]


def scaled_sgd(model: FlatModel, w: torch.Tensor, k: int, level: float, mask: torch.Tensor) -> torch.Tensor:
    """Client k's full-batch SGD on the masked MLP Linear(3, 4), Tanh, Linear(4, 2) with HeteroFL's scaler written
    out: logits = W₂ tanh((W₁x + b₁)/r) + b₂, the weights outside `mask` at zero and kept there."""
    x, y = data().train.client(k)
    v = torch.where(mask, w, 0.0)
    for _ in range(STEPS):
        v = v.detach().requires_grad_(True)
        p = model.unflatten(v)
        hidden = torch.tanh((x @ p["0.weight"].T + p["0.bias"]) / level)
        loss = torch.nn.functional.cross_entropy(hidden @ p["2.weight"].T + p["2.bias"], y)
        (g,) = torch.autograd.grad(loss, v)
        v = torch.where(mask, v - LR * g, v)
    return v.detach()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_scaler_divides_the_hidden_outputs_by_the_level_in_training(backend: str) -> None:
    """Two clients at levels 1 and 1/2 (the scaler: ×1 and ×2 on the hidden layer's outputs, ×1 on the logits):
    the round's model is Eq. 2's average of the two trainings written out by hand."""
    strategy = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5])
    engine = setup(strategy, backend)
    model = engine.model
    w = model.initial_params()
    half, full = width_mask(model, ["0", "2"], 0.5), torch.ones(model.size, dtype=torch.bool)
    plan = strategy.configure(0, torch.tensor([0, 1]), w)
    assert plan.scales is not None and plan.scales.tolist() == [[1.0, 1.0], [2.0, 1.0]]
    big, small = scaled_sgd(model, w, 0, 1.0, full), scaled_sgd(model, w, 1, 0.5, half)
    expected = torch.where(half, weighted([big, small]), big)  # only client 0 trained the other half
    result, got = run_round(strategy, engine, w, 0)
    torch.testing.assert_close(result.params, torch.stack([big, small]), **TOL)
    torch.testing.assert_close(got, expected, **TOL)
    unscaled = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5], scaler=False)
    assert not torch.allclose(run_round(unscaled, setup(unscaled, backend), w, 0)[1], got, atol=1e-4)


def test_the_vectorised_backend_scales_each_clients_outputs_by_its_own_factors() -> None:
    """Three clients at levels 1, 1/2, 1/4 taking 3, 1 and 2 steps, in chunks of two (a step where only some clients
    of a chunk train): each client's factors reach its own rows, as on the sequential backend."""
    plans, results = [], []
    for backend in ("vectorised", "sequential"):
        engine = Engine(mlp(), tiny_data([3, 5, 4], dim=3), backend=backend, seed=1, chunk_size=2)  # type: ignore[arg-type]
        levels = torch.tensor([1.0, 0.5, 0.25])
        plan = LocalPlan(torch.arange(3), torch.tensor([3, 1, 2]), torch.full((3,), LR), 2)
        plan.masks = torch.stack([width_mask(engine.model, ["0", "2"], float(r)) for r in levels])
        plan.scales = scaler_factors(levels, 2)
        plans.append(plan)
        results.append(engine.train(engine.model.initial_params(), plan, 0).params)
    torch.testing.assert_close(results[0], results[1], **TOL)
    unscaled = replace(plans[0], scales=None)
    engine = Engine(mlp(), tiny_data([3, 5, 4], dim=3), backend="vectorised", seed=1, chunk_size=2)
    assert not torch.allclose(engine.train(engine.model.initial_params(), unscaled, 0).params, results[0], atol=1e-4)


def test_the_scaler_on_a_cnn_trains_the_same_on_the_conv_and_sequential_backends() -> None:
    """Levels 1 and 1/2 with the scaler on the zoo's MNIST CNN: conv's hand-derived backward with the factors
    against autograd through the sequential backend's output hooks (pinned by hand on the MLP above)."""
    images = image_federated((784,), [3, 4])
    rounds = []
    for backend in ("conv", "sequential"):
        model = zoo_model("fedavg_cnn")[0]
        strategy = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5])
        engine = Engine(model, images, backend=backend, seed=1)  # type: ignore[arg-type]
        strategy.setup(make_context(engine, steps=2, lr=0.05, batch=2, m=2))
        plan = strategy.configure(0, torch.tensor([0, 1]), model.initial_params())
        assert plan.scales is not None and plan.scales[1].tolist() == [2.0, 2.0, 2.0, 1.0]
        rounds.append(run_round(strategy, engine, model.initial_params(), 0)[1])
    torch.testing.assert_close(rounds[0], rounds[1], **TOL)
    unscaled = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5], scaler=False)
    engine = Engine(zoo_model("fedavg_cnn")[0], images, backend="conv", seed=1)
    unscaled.setup(make_context(engine, steps=2, lr=0.05, batch=2, m=2))
    assert not torch.allclose(run_round(unscaled, engine, engine.model.initial_params(), 0)[1], rounds[0], atol=1e-4)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--algorithm", "fedrolex", "--set", "algorithm.scaler=maybe"], "scaler"),
        (["--algorithm", "fjord", "--set", "algorithm.scaler=true"], "scaler"),
        (["--algorithm", "fjord", "--set", "algorithm.capacities=[0.3]"], "one of"),
    ],
)
def test_the_command_line_refuses_in_one_line_and_writes_nothing(
    extra: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", "--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--set", "model.hidden=[8]"]
    assert_refused([*args, *extra, "--out", "run", "--quiet"], fragment, tmp_path)


def test_the_scales_reach_clients_under_flower() -> None:
    plan = HeteroFL(levels=[1.0, 0.5], capacities=[1.0, 0.5])
    setup(plan, "dense")
    sent = plan.configure(0, torch.tensor([0, 1]), plan.ctx.engine.model.initial_params())
    decoded = decode_plan(*encode_plan(sent, torch.tensor([1, 0])))
    assert decoded.scales is not None and decoded.scales.tolist() == [[2.0, 1.0], [1.0, 1.0]]


def test_fedrolex_rolls_each_levels_window_by_one_unit_a_round() -> None:
    """Hidden width 4: level 1/2 trains units {0,1}, {1,2}, {2,3} in rounds 0, 1, 2 (then {3,0}); level 1/4 {0},
    {1}, {2}; level 1 all four."""
    windows = [[rolling_units(4, r, t).nonzero().flatten().tolist() for t in range(4)] for r in (0.5, 0.25, 1.0)]
    assert windows[0] == [[0, 1], [1, 2], [2, 3], [0, 3]]
    assert windows[1] == [[0], [1], [2], [3]]
    assert windows[2] == [[0, 1, 2, 3]] * 4


def test_fedrolex_rounds_0_1_2_with_a_full_and_a_half_client_match_the_hand_computed_models() -> None:
    """Each round: client 0 (level 1) trains everything, client 1 (level 1/2) the window of round t; the next
    model averages the window's coordinates over both, the rest is client 0's."""
    strategy = FedRolex(levels=[1.0, 0.5], capacities=[1.0, 0.5])
    engine = setup(strategy, "dense")
    model = engine.model
    w = model.initial_params()
    full = torch.ones(model.size, dtype=torch.bool)
    for t, units in enumerate([[0, 1], [1, 2], [2, 3]]):
        keep = torch.zeros(4, dtype=torch.bool)
        keep[units] = True
        window = unit_mask(model, ["0", "2"], [keep])
        assert torch.equal(strategy.masks(t, torch.tensor([0, 1])), torch.stack([full, window]))
        big, small = scaled_sgd(model, w, 0, 1.0, full), scaled_sgd(model, w, 1, 1.0, window)  # no scaler
        expected = torch.where(window, weighted([big, small]), big)
        w_next = run_round(strategy, engine, w, t)[1]
        torch.testing.assert_close(w_next, expected, **TOL)
        w = w_next


def test_fjord_draws_p_up_to_each_clients_capacity_and_trains_the_first_units() -> None:
    strategy = STRATEGIES.build(
        {"name": "fjord", "levels": [1, 0.5, 0.25], "capacities": [1, 0.5, 0.25] * 10, "draws": "round"}
    )
    assert isinstance(strategy, FjORD)
    engine = Engine(mlp(), tiny_data([3] * 30, dim=3), backend="dense")
    strategy.setup(make_context(engine, m=30))
    clients = torch.arange(30)
    draws = torch.stack([strategy.trained_levels(t, clients) for t in range(20)])
    capacity = strategy.capacity(0)
    assert bool((draws <= capacity).all())
    assert set(draws[:, 0].tolist()) == {1.0, 0.5, 0.25} and set(draws[:, 1].tolist()) == {0.5, 0.25}
    assert set(draws[:, 2].tolist()) == {0.25}
    assert torch.equal(strategy.trained_levels(3, clients[5:7]), draws[3, 5:7])  # whatever the cohort
    for client, p in zip(clients.tolist(), draws[0].tolist(), strict=True):
        assert torch.equal(strategy.masks(0, torch.tensor([client]))[0], width_mask(engine.model, ["0", "2"], p))


def test_fjord_round_with_two_clients_matches_the_hand_computed_model() -> None:
    """``draws: round`` (one p per client per round); per-batch draws: tests/strategies/test_fjord.py."""
    strategy = FjORD(levels=[1.0, 0.5], capacities=[1.0, 0.5], draws="round")
    engine = setup(strategy, "dense")
    model = engine.model
    w = model.initial_params()
    for t in range(3):
        p = strategy.trained_levels(t, torch.tensor([0, 1])).tolist()
        assert p[1] == 0.5  # client 1 can only train half
        masks = [width_mask(model, ["0", "2"], level) for level in p]
        trained = [scaled_sgd(model, w, k, 1.0, masks[k]) for k in range(2)]
        n = torch.tensor(SIZES, dtype=torch.float32)
        on = torch.stack(masks).float() * n.unsqueeze(1)
        expected = torch.where(on.sum(0) > 0, (on * torch.stack(trained)).sum(0) / on.sum(0).clamp_min(1), w)
        w_next = run_round(strategy, engine, w, t)[1]
        torch.testing.assert_close(w_next, expected, **TOL)
        w = w_next


def build(name: str, **config: Any) -> SubModels:
    strategy = STRATEGIES.build({"name": name, **config})
    assert isinstance(strategy, SubModels)
    return strategy


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SCHEMES)
def test_every_client_at_full_width_is_fedavg(name: str, backend: str) -> None:
    scheme: Strategy = build(name, levels=[1.0])
    fedavg = FedAvg()
    engines = [setup(scheme, backend), setup(fedavg, backend)]
    w = [engines[0].model.initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([scheme, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", SCHEMES)
def test_every_client_at_full_width_is_fedavg_for_a_cnn_on_the_conv_backend(name: str) -> None:
    models = [zoo_model("fedavg_cnn")[0] for _ in range(2)]
    images = image_federated((784,), [3, 4])
    scheme, fedavg = build(name, levels=[1.0]), FedAvg()
    engines = [Engine(model, images, backend="conv", seed=1) for model in models]
    for strategy, engine in zip([scheme, fedavg], engines, strict=True):
        strategy.setup(make_context(engine, steps=2, lr=0.05, batch=2, m=2))
    w = [models[0].initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([scheme, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)


def config(name: str, rounds: int = 4) -> dict[str, Any]:
    return {
        "algorithm": {"name": name, "levels": [1, 0.5, 0.25]},
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 6,
        "clients_per_round": 4,
        "rounds": rounds,
        "local": {"steps": 3, "lr": 0.05, "batch_size": 8},
        "seed": 1,
    }


@pytest.mark.parametrize("name", SCHEMES)
def test_a_resumed_run_is_byte_identical(name: str, tmp_path: Path) -> None:
    run(parse_config(config(name)), tmp_path / "straight")
    run(parse_config(config(name, rounds=2)), tmp_path / "cut")
    text = (tmp_path / "cut" / "config.yaml").read_text().replace("rounds: 2", "rounds: 4")
    (tmp_path / "cut" / "config.yaml").write_text(text)
    resume(tmp_path / "cut")
    for file in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / file).read_bytes() == (tmp_path / "straight" / file).read_bytes(), file


@pytest.mark.parametrize("name", ["fedrolex", "fjord"])
def test_a_run_writes_the_accuracy_at_every_level_and_each_clients_capacity(name: str, tmp_path: Path) -> None:
    args = ["run", "--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]"]
    args += ["--algorithm", name, "--set", "algorithm.levels=[1,0.5]", "--out", str(tmp_path / "run"), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with (tmp_path / "run" / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    assert float(last["test_accuracy_level1"]) == pytest.approx(float(last["test_accuracy"]))
    assert 0 <= float(last["test_accuracy_level0.5"]) <= 1
    with (tmp_path / "run" / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    assert sorted(float(c["capacity"]) for c in clients) == [0.5] * 3 + [1.0] * 3


def test_levels_from_the_system_model_s_capacity_and_the_clock_charges_their_flops() -> None:
    """assignment: system trains each client at its system capacity (by speed: the fastest at full width), and a
    client's compute on the clock is its sub-model's share of the FLOPs: a round of sub-models is shorter."""
    base = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [64]},
        "num_clients": 8,
        "clients_per_round": 8,
        "rounds": 2,
        "local": {"steps": 5, "lr": 0.1, "batch_size": 10},
        "system": {"name": "lognormal", "capacity": {"levels": [1.0, 0.25], "by": "speed"}},
    }
    state = run(
        parse_config({**base, "algorithm": {"name": "heterofl", "levels": [1.0, 0.25], "assignment": "system"}})
    )
    capacity = state.experiment.system.capacities()
    trained = state.experiment.strategy.capacity(0).double()
    assert torch.equal(trained, capacity) and sorted(capacity.tolist()) == [0.25] * 4 + [1.0] * 4
    full = run(parse_config({**base, "algorithm": "fedavg"}))
    assert state.final["time_s"] < full.final["time_s"]  # the same clients, the slow ones on a quarter-width model


def test_assignment_system_needs_the_system_s_capacity() -> None:
    cfg = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [16]},
        "num_clients": 4,
        "clients_per_round": 2,
        "rounds": 1,
        "algorithm": {"name": "heterofl", "assignment": "system"},
    }
    with pytest.raises(ConfigError, match=r"sets none; set system\.capacity"):
        run(parse_config(cfg))
    cfg["system"] = {"name": "none", "capacity": {"levels": [1.0, 0.3]}}
    with pytest.raises(ConfigError, match=r"levels \[0.3\] that algorithm.levels"):
        run(parse_config(cfg))


def test_accuracy_by_capacity_quartile_averages_each_quarter_of_clients_at_their_own_level(tmp_path: Path) -> None:
    """12 clients at fixed levels: q1 is the mean of clients.csv's capacity_test_accuracy over the 3 clients of the
    lowest capacities (ties by client number), q4 over the 3 highest."""
    cfg = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [32]},
        "num_clients": 12,
        "clients_per_round": 6,
        "rounds": 2,
        "local": {"steps": 5, "lr": 0.1, "batch_size": 10},
        "algorithm": {"name": "heterofl", "levels": [1.0, 0.5, 0.25], "scaler": False},
    }
    state = run(parse_config(cfg), tmp_path / "r")
    rows = list(csv.DictReader((tmp_path / "r" / "clients.csv").open()))
    ranked = sorted(rows, key=lambda r: (float(r["capacity"]), int(r["client"])))
    for q in range(4):
        quarter = ranked[3 * q : 3 * q + 3]
        expected = sum(float(r["capacity_test_accuracy"]) for r in quarter) / 3
        assert state.final[f"capacity_test_accuracy_q{q + 1}"] == pytest.approx(expected, abs=1e-6)
