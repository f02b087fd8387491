"""The dense backend (hand-derived gradients for Linear + activation networks) against the autograd backends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.catalog import MODELS
from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential, train_vectorised
from fedhet.engine.objective import Proximal, WeightDecay
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.errors import ConfigError
from helpers.tiny import Shift, cohort, linear_model, tiny_data

TOL = {"atol": 1e-6, "rtol": 1e-5}


def _mlp(activation: type[nn.Module], dropout: float, bias: bool = True) -> FlatModel:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(5, 8, bias=bias), activation()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(8, 6, bias=bias), activation(), nn.Linear(6, 3, bias=bias)]
    return FlatModel(nn.Sequential(*layers))


def _plan(model: FlatModel, **extra: object) -> LocalPlan:
    """Unequal steps (one client skips the round) and learning rates, batches larger than some clients."""
    return LocalPlan(
        clients=torch.tensor([0, 1, 2, 3, 4]),
        steps=torch.tensor([4, 0, 7, 1, 7]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2, 0.3]),
        batch_size=4,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh, nn.Sigmoid])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("chunk", [0, 1, 2])
def test_dense_matches_both_autograd_backends(activation: type[nn.Module], dropout: float, chunk: int) -> None:
    model = _mlp(activation, dropout)
    layers = dense_layers(model)
    assert layers is not None and [la.dropout for la in layers] == [dropout, 0.0, 0.0]
    data = tiny_data([9, 3, 14, 2, 11], dim=5, classes=3).train
    w0 = model.initial_params()
    corr = torch.randn(5, model.size, generator=torch.Generator().manual_seed(1)) * 0.01
    plan = _plan(model, terms=(Proximal(mu=0.1), WeightDecay(lam=0.01), Shift()))
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, corr), 3, 2))
    vec = train_vectorised(TrainRequest(model, data, w0, plan, cohort(plan, w0, corr), 3, 2))
    den = train_dense(
        TrainRequest(model, data, w0, plan, cohort(plan, w0, corr), 3, 2, chunk_size=chunk, workers=2), layers
    )
    assert float((seq[0] - w0).abs().max()) > 1e-2  # the clients moved
    torch.testing.assert_close(den[0], seq[0], **TOL)
    torch.testing.assert_close(den[0], vec[0], **TOL)
    torch.testing.assert_close(den[1], seq[1], equal_nan=True, **TOL)
    assert torch.equal(den[0][1], w0) and torch.isnan(den[1][1])  # zero steps: the received model, no loss


@pytest.mark.parametrize(
    "terms",
    [(), (Proximal(mu=0.5),), (WeightDecay(lam=0.05),), (Shift(),)],
    ids=["sgd", "prox", "decay", "correction"],
)
def test_each_update_term_without_bias(terms: tuple) -> None:
    model = _mlp(nn.ReLU, 0.0, bias=False)
    layers = dense_layers(model)
    assert layers is not None and all(la.bias is None for la in layers)
    data = tiny_data([9, 3, 14, 2, 11], dim=5, classes=3).train
    w0 = model.initial_params()
    shift = torch.linspace(-0.05, 0.05, 5 * model.size).reshape(5, -1)
    plan = _plan(model, terms=terms)
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 0, 1))
    den = train_dense(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 0, 1, workers=1), layers)
    torch.testing.assert_close(den[0], seq[0], **TOL)
    torch.testing.assert_close(den[1], seq[1], equal_nan=True, **TOL)


def test_recognises_the_papers_dense_models_and_nothing_else() -> None:
    def build(spec: dict[str, object], shape: tuple[int, ...] = (784,)) -> FlatModel:
        return FlatModel(MODELS.build(spec).build(shape, 10))

    assert dense_layers(build({"name": "logistic"})) is not None
    assert dense_layers(build({"name": "logistic", "bias": False})) is not None
    maxfl = dense_layers(build({"name": "mlp", "hidden": [64, 30], "dropout": 0.2}))
    assert maxfl is not None and [la.shape for la in maxfl] == [(64, 784), (30, 64), (10, 30)]
    assert [la.activation for la in maxfl] == ["relu", "relu", None] and maxfl[0].dropout == 0.2
    assert dense_layers(build({"name": "mlp", "hidden": [200], "activation": "tanh"})) is not None
    assert dense_layers(linear_model()) is not None  # a bare nn.Linear
    assert dense_layers(build({"name": "mlp", "hidden": [20], "activation": "gelu"})) is None
    assert dense_layers(build({"name": "lenet_cifar"}, (3, 32, 32))) is None
    assert dense_layers(FlatModel(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))) is None  # logits after an activation
    assert dense_layers(FlatModel(nn.Sequential(nn.Linear(4, 3), nn.Flatten(), nn.Linear(3, 2)))) is None


@pytest.mark.parametrize("gram", [True, False])
@pytest.mark.parametrize("terms", [(), (Proximal(mu=0.1), WeightDecay(lam=0.01))], ids=["sgd", "terms"])
def test_linear_layers_in_a_row_match_the_sequential_backend(
    monkeypatch: pytest.MonkeyPatch, gram: bool, terms: tuple
) -> None:
    """A hidden Linear layer without an activation feeds the next directly (issue 42: `auto` picked dense for
    nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)) and the first step raised an IndexError)."""
    import fedhet.engine.dense as dense

    monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a: gram)
    torch.manual_seed(0)
    for module in (
        nn.Sequential(nn.Linear(5, 2), nn.Linear(2, 3)),
        nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 3)),
    ):
        model = FlatModel(module)
        layers = dense_layers(model)
        assert layers is not None and layers[-2].activation is None
        assert resolve_backend("auto", model, cohort=5) == "dense"
        data = tiny_data([9, 3, 14, 2, 11], dim=5, classes=3).train
        w0 = model.initial_params()
        plan = _plan(model, terms=terms)
        seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
        den = train_dense(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2, workers=1), layers)
        assert float((seq[0] - w0).abs().max()) > 1e-2
        torch.testing.assert_close(den[0], seq[0], **TOL)
        torch.testing.assert_close(den[1], seq[1], equal_nan=True, **TOL)


def test_image_inputs_are_flattened() -> None:
    torch.manual_seed(0)
    model = FlatModel(MODELS.build({"name": "mlp", "hidden": [7]}).build((2, 3, 3), 4))
    layers = dense_layers(model)
    assert layers is not None
    base = tiny_data([6, 9], dim=18, classes=4)
    images = type(base.train)(base.train.x.reshape(-1, 2, 3, 3), base.train.y, base.train.offsets)
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 3, 0.1, 4)
    seq = train_sequential(TrainRequest(model, images, w0, plan, cohort(plan, w0), 0, 0))
    den = train_dense(TrainRequest(model, images, w0, plan, cohort(plan, w0), 0, 0), layers)
    torch.testing.assert_close(den[0], seq[0], **TOL)


def test_auto_picks_dense_and_explicit_dense_needs_a_dense_model() -> None:
    mlp = FlatModel(MODELS.build({"name": "mlp", "hidden": [16]}).build((64,), 10))
    assert resolve_backend("auto", mlp, cohort=3) == "dense"
    assert resolve_backend("auto", mlp, cohort=300) == "dense"
    cnn = FlatModel(MODELS.build({"name": "lenet_cifar"}).build((3, 32, 32), 10))
    assert resolve_backend("auto", cnn, cohort=100) != "dense"
    with pytest.raises(ConfigError, match="backend 'dense'"):
        Engine(cnn, tiny_data([3]), backend="dense")


def test_engine_rounds_agree_across_backends() -> None:
    """Whole FedAvg-style rounds through `Engine.train` and the evaluation, on the three backends."""
    data = tiny_data([12, 7, 20, 5, 9, 15], dim=5, classes=3)
    model = _mlp(nn.Tanh, 0.2)
    results = {}
    for backend in ("sequential", "vectorised", "dense"):
        engine = Engine(model, data, backend=backend, seed=4)  # type: ignore[arg-type]
        w = engine.initial_params()
        for round_ in range(3):
            plan = LocalPlan.uniform(torch.tensor([0, 2, 3, 5]), 5, 0.2, 4, terms=(Proximal(mu=0.01),))
            w = engine.train(w, plan, round_).params.mean(0)
        scores = engine.scores(w, "test")
        results[backend] = (w, scores.loss, scores.accuracy)
    for backend in ("vectorised", "dense"):
        for got, expected in zip(results[backend], results["sequential"], strict=True):
            torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_runs_give_the_same_metrics_on_every_backend(algorithm: str) -> None:
    """Whole runs (digits, an MLP with dropout): every per-round metric agrees to 1e-5 across backends."""
    from fedhet.experiments.config import parse_config
    from fedhet.experiments.runner import run

    config = {
        "dataset": "digits",
        "algorithm": {"name": algorithm, "mu": 0.1} if algorithm == "fedprox" else algorithm,
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": {"name": "mlp", "hidden": [16], "dropout": 0.1},
        "num_clients": 8,
        "clients_per_round": 4,
        "rounds": 4,
        "local": {"steps": 3, "lr": 0.1, "batch_size": 8},
        "seed": 5,
    }
    states = {b: run(parse_config({**config, "backend": b})) for b in ("sequential", "vectorised", "dense")}
    reference = states["sequential"]
    for backend in ("vectorised", "dense"):
        state = states[backend]
        torch.testing.assert_close(state.params, reference.params, atol=1e-5, rtol=1e-5)
        for got, expected in zip(state.history, reference.history, strict=True):
            assert got.keys() == expected.keys()
            for key in got:
                assert got[key] == pytest.approx(expected[key], abs=1e-5), (backend, key)


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("chunk", [0, 2])
@pytest.mark.parametrize("epochs", ["several", "under one"])
def test_gram_first_layer_matches_the_per_step_updates(
    monkeypatch: pytest.MonkeyPatch, activation: type[nn.Module], bias: bool, dropout: float, chunk: int, epochs: str
) -> None:
    """The first layer from its inputs' Gram matrices (`_GramFirstLayer`) against the per-step weight updates and
    the sequential backend, with unequal steps (a client that skips the round, one that stops after a step),
    unequal learning rates, padded batches, dropout, with and without biases, and a one-layer model; on the
    clients' samples where the steps go over them several times (7 steps of 4 from 14 samples and fewer), on the
    steps' rows where they do not."""
    import fedhet.engine.dense as dense

    used: list[bool] = []
    by_sample: list[bool] = []
    choose, gram_layer = dense.use_gram_first_layer, dense._GramFirstLayer

    class Recorded(gram_layer):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            by_sample.append(self.by_sample)

    monkeypatch.setattr(dense, "_GramFirstLayer", Recorded)
    for model in (_mlp(activation, dropout, bias), FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(5, 3, bias=bias)))):
        layers = dense_layers(model)
        assert layers is not None
        data = tiny_data([9, 3, 14, 2, 11], dim=5, classes=3).train
        w0 = model.initial_params()
        plan = _plan(model)
        if epochs == "under one":
            plan.steps = torch.tensor([2, 0, 3, 1, 2])  # T·b ≤ each chunk's largest client
        seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
        results = {}
        for forced in (True, False):
            monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a, forced=forced: used.append(forced) or forced)
            results[forced] = train_dense(
                TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2, chunk, workers=2), layers
            )
        monkeypatch.setattr(dense, "use_gram_first_layer", choose)
        assert float((seq[0] - w0).abs().max()) > 1e-2
        for den in results.values():
            torch.testing.assert_close(den[0], seq[0], **TOL)
            torch.testing.assert_close(den[1], seq[1], equal_nan=True, **TOL)
        assert torch.equal(results[True][0][1], w0)  # the client without steps keeps the received model
    assert True in used and False in used
    assert by_sample and set(by_sample) == {epochs == "several"}


def test_gram_first_layer_is_chosen_only_where_it_saves_work() -> None:
    from fedhet.engine.dense import DenseLayer, use_gram_first_layer

    mnist = DenseLayer(slice(0, 1), None, (200, 784), "relu")  # 784-200: T·b up to 318 rows
    assert use_gram_first_layer(mnist, 10 * 10, plain=True, terms=False)
    assert not use_gram_first_layer(mnist, 10 * 10, plain=False, terms=False)  # momentum, Adam: per-step updates
    assert not use_gram_first_layer(mnist, 10 * 10, plain=True, terms=True)  # FedProx, SCAFFOLD, weight decay
    assert not use_gram_first_layer(mnist, 50 * 10, plain=True, terms=False)  # more rows than the layer saves
    assert not use_gram_first_layer(DenseLayer(slice(0, 1), None, (10, 60), None), 100, plain=True, terms=False)
