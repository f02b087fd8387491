"""Local training of models with batch norm: the sequential and vectorised backends give what a plain PyTorch loop
gives (parameters and running statistics) on the engine's mini-batches; the hand-written backends refuse them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from fedhet.data.dataset import FederatedData
from fedhet.engine.batches import local_batches
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalSettings
from fedhet.errors import ConfigError, FedhetWarning
from helpers.tiny import tiny_data

SIZES = [6, 10]
STEPS, LR, BATCH, SEED = 3, 0.1, 4, 1
TOL = {"atol": 1e-5, "rtol": 1e-4}


def conv_bn(seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(
        nn.Sequential(
            nn.Unflatten(1, (1, 2, 2)),
            nn.Conv2d(1, 3, 2, padding=1),
            nn.BatchNorm2d(3),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(27, 4),
            nn.BatchNorm1d(4, momentum=0.3),
            nn.Linear(4, 2),
        )
    )


def data() -> FederatedData:
    return tiny_data(SIZES, dim=4, classes=2, seed=3)


def plain_loop(model: FlatModel, w0: Tensor, fed: FederatedData, unpadded: bool = False) -> Tensor:
    """Each client's model after `STEPS` SGD steps of a plain torch loop on the engine's mini-batches (`unpadded`:
    without their weight-0 padding rows): (2, P) with the parameters and the statistics."""
    clients = torch.arange(2)
    index, weight = local_batches(fed.train.offsets, clients, torch.full((2,), STEPS), BATCH, SEED, 0)
    out = []
    for k in range(2):
        module = copy.deepcopy(model.module).train()
        torch.nn.utils.vector_to_parameters(w0[: model.num_params].clone(), module.parameters())
        start = model.unflatten(w0)
        for name in model.stat_names:
            owner, _, leaf = name.rpartition(".")
            buffers = module.get_submodule(owner)._buffers
            buffers[leaf] = start[name].clone().to(torch.int64 if leaf == "num_batches_tracked" else torch.float32)
        for t in range(STEPS):
            rows = index[k, t][weight[k, t] > 0] if unpadded else index[k, t]
            loss = nn.functional.cross_entropy(module(fed.train.x[rows]), fed.train.y[rows])
            grads = torch.autograd.grad(loss, list(module.parameters()))
            with torch.no_grad():
                for p, g in zip(module.parameters(), grads, strict=True):
                    p -= LR * g
        params = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
        stats = [module.state_dict()[n].reshape(-1).float() for n in model.stat_names]
        out.append(torch.cat([params, *stats]))
    return torch.stack(out)


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_the_autograd_backends_train_statistics_as_a_plain_loop(backend: str) -> None:
    model, fed = conv_bn(), data()
    engine = Engine(model, fed, backend=backend, seed=SEED)  # type: ignore[arg-type]
    w0 = model.initial_params()
    plan = LocalSettings(STEPS, LR, BATCH).plan(torch.arange(2), fed.train.sizes)
    result = engine.train(w0, plan, 0)
    expected = plain_loop(model, w0, fed)
    torch.testing.assert_close(result.params, expected, **TOL)
    assert result.params[:, model.slices["6.num_batches_tracked"]].flatten().tolist() == [STEPS, STEPS]


def test_clients_with_fewer_steps_keep_their_statistics_on_the_vectorised_backend() -> None:
    model, fed = conv_bn(), data()
    results = []
    for backend in ("sequential", "vectorised"):
        engine = Engine(model, fed, backend=backend, seed=SEED)  # type: ignore[arg-type]
        plan = LocalSettings(STEPS, LR, BATCH).plan(torch.arange(2), fed.train.sizes)
        plan.steps[0] = 1
        results.append(engine.train(model.initial_params(), plan, 0).params)
    torch.testing.assert_close(results[0], results[1], **TOL)
    assert float(results[1][0, model.slices["2.num_batches_tracked"]]) == 1.0


@pytest.mark.parametrize("backend", ["dense", "conv"])
def test_the_hand_written_backends_refuse_batch_norm_in_one_line(backend: str) -> None:
    model = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match=rf"^backend '{backend}' needs .*use backend 'auto', 'vectorised'"):
        resolve_backend(backend, model)  # type: ignore[arg-type]
    assert resolve_backend("auto", model, cohort=2) in ("sequential", "vectorised")


def test_a_cumulative_average_trains_on_the_sequential_backend() -> None:
    """BatchNorm with ``momentum=None`` divides by num_batches_tracked (a Python number): vmap cannot run it, so
    `auto` trains it client by client, as a plain loop does."""
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=None), nn.Linear(3, 2)))
    fed = data()
    with pytest.warns(FedhetWarning, match="trains clients one after another"):
        engine = Engine(model, fed, backend="auto", seed=SEED)
    assert engine.backend_for(2) == "sequential"
    w0 = model.initial_params()
    expected = plain_loop(model, w0, fed)
    plan = LocalSettings(STEPS, LR, BATCH).plan(torch.arange(2), fed.train.sizes)
    torch.testing.assert_close(engine.train(w0, plan, 0).params, expected, **TOL)


def test_recompute_scores_the_global_model_with_statistics_from_the_training_data() -> None:
    model, fed = conv_bn(), data()
    engine = Engine(model, fed, backend="sequential", seed=SEED)
    w = model.initial_params()
    recomputed = model.recompute_statistics(w, fed.train.x)
    assert not torch.equal(recomputed[model.stats], w[model.stats])
    as_is = engine.scores(w)  # policy aggregate: the statistics of the vector
    model.statistics = "recompute"
    scored = engine.scores(w)
    assert engine.evaluated(w) is engine.evaluated(w.clone())  # worked out once per model
    model.statistics = "aggregate"
    torch.testing.assert_close(scored.loss, engine.scores(recomputed).loss)
    assert not torch.allclose(scored.loss, as_is.loss)


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_padding_rows_stay_out_of_the_batch_statistics(backend: str) -> None:
    """Clients with fewer samples than the batch size (3 and 5 of 8) train as a plain loop on their unpadded
    batches: the engine's weight-0 padding rows count neither in the loss nor in batch norm's statistics."""
    global BATCH
    model, fed = conv_bn(), tiny_data([3, 5], dim=4, classes=2, seed=3)
    engine = Engine(model, fed, backend=backend, seed=SEED)  # type: ignore[arg-type]
    w0 = model.initial_params()
    plan = LocalSettings(STEPS, LR, 8).plan(torch.arange(2), fed.train.sizes)
    got = engine.train(w0, plan, 0).params
    batch, BATCH = BATCH, 8
    try:
        expected = plain_loop(model, w0, fed, unpadded=True)
    finally:
        BATCH = batch
    torch.testing.assert_close(got, expected, **TOL)
