"""FedBN: FedAvg on every layer but batch norm, whose parameters and statistics stay with each client; and the
run's batch-norm statistics policy (`check_statistics`), refused in one line where it cannot hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fedhet.catalog import MODELS, STRATEGIES
from fedhet.engine.batches import local_batches
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError, FedhetNote
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fedbn import FedBN, check_statistics, norm_names
from helpers.hostile import assert_refused
from helpers.personal import personal_models, run_round
from helpers.tiny import make_context, tiny_data

SIZES = [4, 8]
BATCH, LR = 4, 0.1


def bn_first(seed: int = 0) -> FlatModel:
    """Batch norm on the inputs: its statistics after a step are those of the step's batch, whatever the weights."""
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2)))


def setup(strategy: Any, model: FlatModel, backend: str = "sequential", steps: int = 1) -> Engine:
    engine = Engine(model, tiny_data(SIZES, dim=3, classes=2, seed=5), backend=backend, seed=1)  # type: ignore[arg-type]
    strategy.setup(make_context(engine, steps=steps, lr=LR, batch=BATCH, m=2))
    check_statistics(MODELS.build({"name": "logistic"}), strategy, model, private=False)
    return engine


def batch_statistics(engine: Engine, round_: int, steps: int = 1) -> list[tuple[Tensor, Tensor]]:
    """Each client's (mean, unbiased variance) of its mini-batch in each step of round `round_` (the engine's
    batches, drawn as every backend draws them)."""
    data = engine.data.train
    index, _ = local_batches(data.offsets, torch.tensor([0, 1]), torch.tensor([steps, steps]), BATCH, 1, round_)
    return [(data.x[index[k, 0]].mean(0), data.x[index[k, 0]].var(0)) for k in range(2)]


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_fedavg_averages_the_statistics_by_sample_count(backend: str) -> None:
    """Policy ``aggregate``: after one step each client holds 0.1·mean and 0.9 + 0.1·var of its batch (momentum
    0.1), and the global statistics are their average weighted by n_k (4 and 8 samples)."""
    strategy = FedAvg()
    engine = setup(strategy, bn_first(), backend)
    model = engine.model
    result, w = run_round(strategy, engine, model.initial_params(), 0)
    (m0, v0), (m1, v1) = batch_statistics(engine, 0)
    p = torch.tensor([1 / 3, 2 / 3])
    torch.testing.assert_close(w[model.slices["0.running_mean"]], 0.1 * (p[0] * m0 + p[1] * m1))
    torch.testing.assert_close(w[model.slices["0.running_var"]], 0.9 + 0.1 * (p[0] * v0 + p[1] * v1))
    assert float(w[model.slices["0.num_batches_tracked"]]) == 1.0
    torch.testing.assert_close(w, p @ result.params)  # and the parameters, as FedAvg's


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_fedbn_keeps_each_clients_batch_norm_and_averages_the_rest(backend: str) -> None:
    strategy = FedBN()
    engine = setup(strategy, bn_first(), backend)
    model = engine.model
    mine = torch.zeros(model.size, dtype=torch.bool)
    for name in norm_names(model):
        mine[model.slices[name]] = True
    assert norm_names(model) == ["0.weight", "0.bias", "0.running_mean", "0.running_var", "0.num_batches_tracked"]
    w0 = model.initial_params()
    trained = []
    for k in range(2):  # each client's plain FedAvg round alone: what its own model becomes
        solo = FedAvg()
        solo_engine = setup(solo, bn_first(), backend)
        clients = torch.tensor([k])
        out = solo.local_training(0, clients, w0, lambda plan, e=solo_engine: e.train(w0, plan, 0))
        trained.append(out.params[0])
    _, w = run_round(strategy, engine, w0, 0)
    p = torch.tensor([1 / 3, 2 / 3])
    torch.testing.assert_close(w[mine], w0[mine])  # the server never moves the BN layers
    torch.testing.assert_close(w[~mine], (p @ torch.stack(trained))[~mine])
    own = personal_models(strategy, engine, w, 1)
    stats = batch_statistics(engine, 0)
    for k, (mean, var) in enumerate(stats):  # the BN part each client keeps: its own, hand-computed statistics
        torch.testing.assert_close(own[k, model.slices["0.running_mean"]], 0.1 * mean)
        torch.testing.assert_close(own[k, model.slices["0.running_var"]], 0.9 + 0.1 * var)
        torch.testing.assert_close(own[k, mine], trained[k][mine])
        torch.testing.assert_close(own[k, ~mine], w[~mine])
    _, w2 = run_round(strategy, engine, w, 1)  # round 2 starts from each client's own statistics
    later = batch_statistics(engine, 1)
    own2 = personal_models(strategy, engine, w2, 2)
    for k in range(2):
        expected = 0.9 * 0.1 * stats[k][0] + 0.1 * later[k][0]
        torch.testing.assert_close(own2[k, model.slices["0.running_mean"]], expected)
        assert float(own2[k, model.slices["0.num_batches_tracked"]]) == 2.0


def test_fedbn_without_batch_norm_is_fedavg() -> None:
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))))
    fedbn, fedavg = FedBN(), FedAvg()
    engines = [setup(fedbn, models[0], "dense", steps=2), setup(fedavg, models[1], "dense", steps=2)]
    assert fedbn.spec is None and fedbn.personalization(torch.tensor([0, 1])) is None
    w = [models[0].initial_params(), models[1].initial_params()]
    for t in range(3):
        w = [run_round(s, e, wk, t)[1] for s, e, wk in zip((fedbn, fedavg), engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=0)


def small_run(algorithm: str, model: dict[str, Any], **extra: Any) -> Any:
    raw = {
        "dataset": {"name": "digits", "image": True},
        "model": model,
        "algorithm": algorithm,
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 2,
        "local": {"steps": 2, "batch_size": 8, "lr": 0.05},
        "seed": 2,
        **extra,
    }
    return run(parse_config(raw))


def test_a_fedbn_run_without_batch_norm_equals_fedavg() -> None:
    with pytest.warns(FedhetNote, match="this model has none: the run is FedAvg"):
        bn = small_run("fedbn", {"name": "cnn_mnist", "channels": [2, 2], "hidden": 8})
    avg = small_run("fedavg", {"name": "cnn_mnist", "channels": [2, 2], "hidden": 8})
    torch.testing.assert_close(bn.params, avg.params, atol=1e-6, rtol=0)
    assert bn.history[-1]["test_loss"] == pytest.approx(avg.history[-1]["test_loss"], abs=1e-6)


def test_a_fedbn_run_on_a_resnet_scores_each_clients_own_batch_norm() -> None:
    state = small_run("fedbn", {"name": "resnet8", "width": 4}, personal_eval={"appeal": False})
    model = state.experiment.engine.model
    assert model.statistics == "local"
    torch.testing.assert_close(state.params[model.stats], model.initial_params()[model.stats])  # never averaged
    assert "personal_test_accuracy" in state.history[-1]


def refusal(algorithm: dict[str, Any], batch_norm: str | None, model: str = "resnet8", private: bool = False) -> None:
    spec = MODELS.build({"name": model, "batch_norm": batch_norm} if model == "resnet8" else {"name": model})
    strategy = STRATEGIES.build(algorithm)
    flat = FlatModel(spec.build((3, 8, 8), 2))
    check_statistics(spec, strategy, flat, private)


@pytest.mark.parametrize(
    ("algorithm", "batch_norm", "fragment"),
    [
        ({"name": "fedavg"}, "local", "model.batch_norm 'local' keeps each client's batch-norm layers"),
        ({"name": "fedbn"}, "aggregate", "algorithm fedbn keeps each client's batch-norm layers local"),
        ({"name": "fedbn"}, "recompute", "model.batch_norm 'recompute' contradicts it"),
        ({"name": "fedavg", "server_optimizer": {"name": "momentum"}}, None, "server_optimizer 'momentum'"),
        ({"name": "fedavg", "server_lr": 2.0}, "aggregate", "server_lr 2, which would not average them"),
    ],
)
def test_a_policy_that_cannot_hold_is_one_line(
    algorithm: dict[str, Any], batch_norm: str | None, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]+$") as err:
        refusal(algorithm, batch_norm)
    assert fragment in str(err.value)


def test_policies_that_hold() -> None:
    refusal({"name": "fedavg", "server_optimizer": {"name": "adam"}}, "recompute")  # recomputed: never stepped
    refusal({"name": "fedbn", "server_optimizer": {"name": "momentum"}}, None)  # local: never stepped
    refusal({"name": "fedavg", "server_optimizer": {"name": "momentum"}}, None, model="logistic")  # no statistics
    with pytest.raises(ConfigError, match="differential privacy cannot protect batch norm"):
        refusal({"name": "fedavg"}, None, private=True)
    spec = MODELS.build({"name": "resnet8", "batch_norm": "recompute"})
    flat = FlatModel(spec.build((3, 8, 8), 2))
    with pytest.raises(ConfigError, match="Flower's nodes hold apart"):
        check_statistics(spec, STRATEGIES.build("fedavg"), flat, private=False, native=False)


def test_the_cli_refuses_before_writing_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fast = ["--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--set", "model.name=resnet8", "--quiet"]
    args = ["run", *fast, "--algorithm", "fedavg", "--set", "model.batch_norm=local", "--out", "r"]
    assert_refused(args, "use it, or batch_norm 'aggregate' or 'recompute'", tmp_path)


def test_a_policy_for_a_model_without_statistics_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resnet8 with GroupNorm keeps no running statistics: a batch_norm policy for it would be ignored."""
    monkeypatch.chdir(tmp_path)
    fast = ["--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--quiet", "--out", "r"]
    model = ["--set", "model={name: resnet8, width: 2, norm: group, batch_norm: recompute}"]
    assert_refused(["run", *fast, *model], "this model keeps none (no BatchNorm, or norm: group)", tmp_path)
