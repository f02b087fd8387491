"""DepthFL: depth sub-models of a multi-exit model, mutual self-distillation, the per-coordinate average."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalSettings
from fedhet.engine.task import TASKS
from fedhet.errors import ConfigError, FedhetNote
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.models.base import MODELS
from fedhet.models.flops import parameter_flops
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.depthfl import DepthFL, ExitDistillation, depth_mask, exit_mask, mutual_distillation
from fedhet.strategies.fedavg import FedAvg
from helpers.hostile import assert_refused
from helpers.personal import BATCH, LR, TOL, data, run_round, weighted
from helpers.tiny import tiny_data

AUTOGRAD = ["sequential", "vectorised"]


def exits_model(hidden: list[int] | None = None) -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(MODELS.build({"name": "mlp_exits", "hidden": hidden or [4, 4]}).build((3,), 2))


def setup(strategy: Strategy, backend: str, model: FlatModel, steps: int = 1, terms: tuple = ()) -> Engine:
    """`strategy` on a fresh engine over the two clients of `helpers.personal` (both in every round)."""
    engine = Engine(model, data(), backend=backend, seed=1)  # type: ignore[arg-type]
    local = LocalSettings(steps, LR, BATCH, terms=terms)  # a batch larger than every client: full-batch steps
    strategy.setup(ServerContext(engine, local, seed=0, clients_per_round=2))
    return engine


def kl(target: Tensor, student: Tensor) -> Tensor:
    """KL(softmax(target) ‖ softmax(student)) per sample, the target held fixed."""
    p = torch.softmax(target, -1).detach()
    return (p * (p.log() - torch.log_softmax(student, -1))).sum(-1)


def test_mutual_distillation_is_the_mean_kl_between_the_held_exits_with_the_targets_fixed() -> None:
    z = torch.randn(3, 5, 4, requires_grad=True)
    held = torch.tensor([1.0, 1.0, 0.0])  # the third exit is absent: in no pair
    got = mutual_distillation(z, held)
    expected = (kl(z[1], z[0]) + kl(z[0], z[1])) / (2 - 1)
    torch.testing.assert_close(got, expected)
    (g,) = torch.autograd.grad(got.sum(), z)
    (h,) = torch.autograd.grad(expected.sum(), z)
    torch.testing.assert_close(g, h)
    assert bool((g[2] == 0).all())
    three = mutual_distillation(z.detach(), torch.ones(3))
    pairs = [kl(z[j], z[i]) for i in range(3) for j in range(3) if i != j]
    torch.testing.assert_close(three, torch.stack(pairs).sum(0) / 2)
    assert bool((mutual_distillation(z.detach(), torch.tensor([0.0, 1.0, 0.0])) == 0).all())  # one exit: none


def test_the_depth_masks_keep_the_first_blocks_and_their_exits() -> None:
    model = exits_model([4, 4, 4])
    module = model.module
    names, sizes = model.names, model.numels

    def kept(mask: Tensor) -> set[str]:
        return {n for n, v in model.unflatten(mask).items() if bool(v.all())}

    assert kept(depth_mask(module, names, sizes, 2)) == {  # type: ignore[arg-type]
        "blocks.0.0.weight",
        "blocks.0.0.bias",
        "blocks.1.0.weight",
        "blocks.1.0.bias",
        "heads.0.weight",
        "heads.0.bias",
        "heads.1.weight",
        "heads.1.bias",
    }
    only = kept(exit_mask(module, names, sizes, 2))  # type: ignore[arg-type]
    assert only == {
        "blocks.0.0.weight",
        "blocks.0.0.bias",
        "blocks.1.0.weight",
        "blocks.1.0.bias",
        "heads.1.weight",
    } | {"heads.1.bias"}


def _objective(model: FlatModel, w: Tensor, k: int, depth: int, distill: bool) -> Tensor:
    """Client k's DepthFL loss at w for a sub-model of `depth` exits, written out by hand."""
    x, y = data().train.client(k)
    v = model.unflatten(w)
    h, z = x, []
    for i in range(depth):
        h = torch.relu(h @ v[f"blocks.{i}.0.weight"].T + v[f"blocks.{i}.0.bias"])
        z.append(h @ v[f"heads.{i}.weight"].T + v[f"heads.{i}.bias"])
    loss = sum(F.cross_entropy(zi, y) for zi in z)
    if distill and depth > 1:
        pairs = [kl(z[j], z[i]).mean() for i in range(depth) for j in range(depth) if i != j]
        loss = loss + sum(pairs) / (depth - 1)
    return loss  # type: ignore[return-value]


def _step(model: FlatModel, w: Tensor, k: int, depth: int, mask: Tensor, distill: bool = True) -> Tensor:
    """One full-batch SGD step of client k from the global model cut to its mask."""
    start = torch.where(mask, w, 0.0).requires_grad_(True)
    (g,) = torch.autograd.grad(_objective(model, start, k, depth, distill), start)
    return torch.where(mask, start.detach() - LR * g, 0.0)


@pytest.mark.parametrize("backend", AUTOGRAD)
def test_a_round_with_a_depth_one_and_a_depth_two_client_matches_the_hand_computed_model(backend: str) -> None:
    strategy = DepthFL(levels=[1.0, 0.5], capacities=[0.5, 1.0])  # client A (0): one block; B (1): both
    model = exits_model()
    engine = setup(strategy, backend, model)
    w = model.initial_params()
    shallow = depth_mask(model.module, model.names, model.numels, 1)  # type: ignore[arg-type]
    a = _step(model, w, 0, 1, shallow)
    b = _step(model, w, 1, 2, torch.ones(model.size, dtype=torch.bool))
    expected = torch.where(shallow, weighted([a, b]), b)  # block 2 and exit 2: client B's alone
    result, got = run_round(strategy, engine, w, 0)
    torch.testing.assert_close(result.params, torch.stack([a, b]), **TOL)
    torch.testing.assert_close(got, expected, **TOL)
    assert bool((result.params[0, ~shallow] == 0).all())


@pytest.mark.parametrize("backend", AUTOGRAD)
def test_a_single_exit_at_full_depth_without_distillation_is_fedavg_on_the_mlp(backend: str) -> None:
    depthfl, fedavg = DepthFL(levels=[1.0], distill=False), FedAvg()
    torch.manual_seed(0)
    mlp = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    engines = [setup(depthfl, backend, exits_model([4]), steps=2), setup(fedavg, "dense", mlp, steps=2)]
    w = [mlp.initial_params()] * 2
    torch.testing.assert_close(engines[0].model.initial_params(), w[0])  # the same network, the same weights
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([depthfl, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("distill", [False, True])
def test_several_exits_at_full_depth_is_fedavg_on_the_multi_exit_loss(distill: bool) -> None:
    depthfl, fedavg = DepthFL(levels=[1.0], distill=distill), FedAvg()
    terms = (ExitDistillation(),) if distill else ()
    engines = [setup(depthfl, "vectorised", exits_model(), 2), setup(fedavg, "sequential", exits_model(), 2, terms)]
    w = [engines[0].model.initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([depthfl, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-5)
    model = engines[0].model
    full = torch.ones(model.size, dtype=torch.bool)
    start = model.initial_params()
    step = [_step(model, start, k, 2, full, distill) for k in range(2)]
    once = FedAvg()
    engine = setup(once, "sequential", exits_model(), 1, terms)
    torch.testing.assert_close(run_round(once, engine, start, 0)[1], weighted(step), **TOL)


def test_each_level_is_scored_as_the_ensemble_of_its_exits_and_each_exit_alone() -> None:
    strategy = DepthFL(levels=[1.0, 0.5], capacities=[0.5, 1.0])
    model = exits_model()
    setup(strategy, "sequential", model)
    strategy.evaluation_params(model.initial_params())
    metrics = strategy.round_metrics()
    levels = {"test_accuracy_level1", "test_accuracy_level0.5", "test_accuracy_exit1", "test_accuracy_exit2"}
    assert levels | {f"capacity_test_accuracy_q{q}" for q in range(1, 5)} == set(metrics)
    assert metrics["test_accuracy_level0.5"] == metrics["test_accuracy_exit1"]  # depth 1: exit 1 alone
    full = strategy.ctx.engine.scores(model.initial_params(), "test").accuracy.double().mean()
    assert metrics["test_accuracy_level1"] == pytest.approx(float(full))


SMALL = {
    "algorithm": {"name": "depthfl", "levels": [1, 0.5]},
    "dataset": "digits",
    "model": {"name": "mlp_exits", "hidden": [8, 8]},
    "num_clients": 6,
    "clients_per_round": 3,
    "rounds": 4,
    "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
    "seed": 1,
}


class Interrupt(Callback):
    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 2:
            raise KeyboardInterrupt
        return False


def test_a_resumed_run_writes_the_uninterrupted_runs_files(tmp_path: Path) -> None:
    cfg = parse_config({**SMALL, "availability": {"name": "bernoulli", "p": 0.7}})
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    assert json.loads((tmp_path / "cut/summary.json").read_text())["rounds"] == 2
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    header = (tmp_path / "full/metrics.csv").read_text().splitlines()[0]
    assert "test_accuracy_level0.5" in header and "test_accuracy_exit2" in header


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (["--set", "model={name: mlp, hidden: [8]}"], "use model: mlp_exits"),
        (["--set", "algorithm.levels=[1, 0.9]"], "give the same depth 4"),
        (
            [
                "--algorithm",
                "fedavg",
                "--set",
                "model={name: mlp, hidden: [8]}",
                "--set",
                "local.terms=[exit_distillation]",
            ],
            "has none",
        ),
        (["--set", "algorithm.name=depthfl", "--set", "local.terms=[{name: proximal, mu: 0.1}]"], "pulls"),
        (["--algorithm", "fedavg", "--set", "local.dp_sgd={clip: 1.0, noise_multiplier: 1.0}"], "multi-exit"),
    ],
)
def test_combinations_it_cannot_run_are_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    base = [
        "run",
        "--algorithm",
        "depthfl",
        "--set",
        "dataset=digits",
        "--set",
        "model={name: mlp_exits, hidden: [8, 8, 8, 8]}",
    ]
    assert_refused([*base, *changes, "--rounds", "1", "--out", "runs/r"], fragment, tmp_path)


def test_a_shallow_client_computes_its_share_of_the_flops() -> None:
    """Depth 1 of a 3 → 4 → 4 network with exits of 2 classes: block 1 (2·12 + 4) and exit 1 (2·8 + 2) of the
    FLOPs of both blocks and exits (100), the share the clock charges (`RoundClock.work_share`)."""
    model = exits_model()
    flops = parameter_flops(model.module, (3,))
    shallow = depth_mask(model.module, model.names, model.numels, 1)  # type: ignore[arg-type]
    assert float(flops.sum()) == 100 and float(shallow.double() @ flops) == 46


@pytest.mark.slow
def test_a_run_whose_slow_clients_train_one_block_is_faster_on_the_clock() -> None:
    base = {
        "dataset": "digits",
        "model": {"name": "mlp_exits", "hidden": [32, 32, 32, 32]},
        "num_clients": 8,
        "clients_per_round": 8,
        "rounds": 1,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 10},
        "system": {"name": "lognormal", "capacity": {"levels": [1.0, 0.25], "by": "speed"}},
    }
    algorithm = {"name": "depthfl", "levels": [1.0, 0.25], "assignment": "system"}
    state = run(parse_config({**base, "algorithm": algorithm}))
    assert sorted(state.experiment.strategy.capacity(0).tolist()) == [0.25] * 4 + [1.0] * 4
    full = run(parse_config({**base, "algorithm": "fedavg"}))
    assert state.final["time_s"] < full.final["time_s"]


def test_self_distillation_on_a_task_without_classes_is_refused() -> None:
    torch.manual_seed(0)
    module = MODELS.build({"name": "mlp_exits", "hidden": [4, 4]}).build((3,), 1)
    model = FlatModel(module, task=TASKS.build("regression"))
    with pytest.raises(ConfigError, match=r"algorithm\.distill=false"):
        setup(DepthFL(levels=[1.0, 0.5]), "sequential", model)
    setup(DepthFL(levels=[1.0, 0.5], distill=False), "sequential", model)  # the sum of the exits' squared errors


def _truncated_loss(module: nn.Module, w: dict[str, Tensor], x: Tensor, y: Tensor, depth: int) -> Tensor:
    """The DepthFL loss of the network cut after `depth` blocks, run block by block (no zeroed exits involved)."""

    def part(name: str) -> dict[str, Tensor]:
        return {n[len(name) + 1 :]: v for n, v in w.items() if n.startswith(name + ".")}

    h, z = module.stem(x), []  # type: ignore[operator]
    for i in range(depth):
        h = torch.func.functional_call(module.blocks[i], part(f"blocks.{i}"), (h,))  # type: ignore[index]
        z.append(torch.func.functional_call(module.heads[i], part(f"heads.{i}"), (h,)))  # type: ignore[index]
    loss = sum(F.cross_entropy(zi, y) for zi in z)
    pairs = [kl(z[j], z[i]).mean() for i in range(depth) for j in range(depth) if i != j]
    return loss + (sum(pairs) / (depth - 1) if depth > 1 else 0.0)  # type: ignore[return-value]


@pytest.mark.parametrize("backend", AUTOGRAD)
def test_the_cnn_round_matches_the_truncated_networks_trained_by_hand(backend: str) -> None:
    cohort = tiny_data([4, 6], dim=16, classes=2, seed=3)
    torch.manual_seed(0)
    model = FlatModel(MODELS.build({"name": "cnn_exits", "channels": [2, 3, 3]}).build((16,), 2))
    strategy = DepthFL(levels=[1.0, 0.5], capacities=[0.5, 1.0])  # depths 2 (⌈0.5·3⌉) and 3 of 3 blocks
    engine = Engine(model, cohort, backend=backend, seed=1)  # type: ignore[arg-type]
    strategy.setup(ServerContext(engine, LocalSettings(1, LR, BATCH), seed=0, clients_per_round=2))
    w = model.initial_params()
    steps = []
    for k, depth in ((0, 2), (1, 3)):
        x, y = cohort.train.client(k)
        v = {n: t.clone().requires_grad_(True) for n, t in model.unflatten(w).items()}
        grads = torch.autograd.grad(_truncated_loss(model.module, v, x, y, depth), list(v.values()), allow_unused=True)
        flat = torch.cat(
            [g.reshape(-1) if g is not None else torch.zeros(t.numel()) for g, t in zip(grads, v.values(), strict=True)]
        )
        mask = depth_mask(model.module, model.names, model.numels, depth)  # type: ignore[arg-type]
        steps.append(torch.where(mask, w - LR * flat, 0.0))
    clients = torch.tensor([0, 1])
    result = strategy.local_training(0, clients, w, lambda plan: engine.train(w, plan, 0))
    torch.testing.assert_close(result.params, torch.stack(steps), **TOL)


def test_a_config_without_a_model_trains_the_multi_exit_mlp_and_says_so(tmp_path: Path) -> None:
    config = {key: value for key, value in SMALL.items() if key != "model"}
    with pytest.warns(FedhetNote, match="trains model mlp_exits unless the config names a model"):
        state = run(parse_config({**config, "algorithm": "depthfl", "rounds": 1}), tmp_path / "r")
    assert state.experiment.engine.model.exits == 4
    assert "name: mlp_exits" in (tmp_path / "r/config.yaml").read_text()
