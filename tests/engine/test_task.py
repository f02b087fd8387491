"""Tasks (`fedhet.engine.task`): losses and their gradients at the outputs, the per-client metrics against
scikit-learn's definitions, and every backend training a binary and a regression task to the same numbers."""

from __future__ import annotations

import warnings
from typing import ClassVar

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    balanced_accuracy_score,
    f1_score,
    mean_absolute_error,
    r2_score,
    roc_auc_score,
    root_mean_squared_error,
)
from torch import nn

from fedhet.data.dataset import ClientData
from fedhet.engine.conv import conv_layers, train_conv
from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.evaluate import score_clients
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential, train_vectorised
from fedhet.engine.objective import Proximal
from fedhet.engine.optimizers import SGD
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.engine.task import TASKS, Binary, Classification, Regression, Task, client_auc
from fedhet.errors import ConfigError
from helpers.tiny import cohort

TOL = {"atol": 1e-6, "rtol": 1e-5}


class Huber(Task):
    """A task of one's own with only a loss: its gradient comes from autograd."""

    name: ClassVar[str] = "test_huber"
    accuracy: ClassVar[bool] = False
    classes: ClassVar[bool] = False

    def loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.huber_loss(z, y.reshape(z.shape), reduction="none", delta=0.5).mean(-1)

    def correct(self, z: torch.Tensor, y: torch.Tensor) -> None:
        return None


def _labels(task: Task, shape: tuple[int, ...], outputs: int, gen: torch.Generator) -> torch.Tensor:
    if isinstance(task, Classification):
        return torch.randint(0, outputs, shape, generator=gen)
    if isinstance(task, Binary):
        return torch.randint(0, 2, shape, generator=gen)
    return torch.randn(*shape, *((outputs,) if outputs > 1 else ()), generator=gen)


@pytest.mark.parametrize(
    ("task", "outputs"), [(Classification(), 4), (Binary(), 1), (Regression(), 1), (Regression(), 3), (Huber(), 2)]
)
def test_every_gradient_form_is_autograds_gradient_of_the_loss(task: Task, outputs: int) -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, outputs, generator=gen, requires_grad=True)
    y = _labels(task, (3, 5), outputs, gen)
    expected = torch.autograd.grad(task.loss(z, y).sum(), z)[0]
    z = z.detach()
    torch.testing.assert_close(task.output_grad(z, y), expected, **TOL)
    torch.testing.assert_close(task.loss_value(z, y), task.loss(z, y), **TOL)
    share = torch.rand(3, 5, generator=gen)
    losses, scaled = task.loss_grad(z, y, share)
    torch.testing.assert_close(losses, task.loss(z, y), **TOL)
    torch.testing.assert_close(scaled, expected * share.unsqueeze(-1), **TOL)
    scale = share.unsqueeze(-1)
    torch.testing.assert_close(task.scaled_grad(z, task.prepare(y, scale, outputs), scale), expected * scale, **TOL)


def test_losses_by_hand() -> None:
    z = torch.tensor([[0.0], [2.0]])
    expected = torch.tensor([np.log(2), np.log1p(np.exp(2.0))], dtype=torch.float32)
    assert torch.allclose(Binary().loss(z, torch.tensor([1, 0])), expected)
    grad = torch.tensor([[-0.5], [1 / (1 + np.exp(-2))]], dtype=torch.float32)
    assert torch.allclose(Binary().output_grad(z, torch.tensor([1, 0])), grad)
    two = torch.tensor([[1.0, 3.0]])  # (1/2)((1 − 0)² + (3 − 1)²) = 2.5; gradient (2/2)(z − y)
    assert torch.allclose(Regression().loss(two, torch.tensor([[0.0, 1.0]])), torch.tensor([2.5]))
    assert torch.allclose(Regression().output_grad(two, torch.tensor([[0.0, 1.0]])), torch.tensor([[1.0, 2.0]]))
    assert Binary().outputs(2) == 1 and Regression().outputs(3) == 3 and Classification().outputs(10) == 10
    assert {"classification", "binary", "regression"} <= set(TASKS.names())


def test_labels_a_task_cannot_learn_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="task 'binary' needs two classes but dataset 'x' has 3"):
        Binary().check_labels(torch.tensor([0, 1, 2]), 3, "dataset 'x'")
    with pytest.raises(ConfigError, match="task 'regression' needs numeric targets"):
        Regression().check_labels(torch.tensor([0, 1]), 2, "dataset 'x'")
    with pytest.raises(ConfigError, match="use task: regression"):
        Classification().check_labels(torch.tensor([0.5, 1.0]), 1, "dataset 'x'")


def test_binary_client_metrics_are_scikit_learns() -> None:
    gen = np.random.default_rng(3)
    owner = np.repeat(np.arange(5), [30, 12, 1, 20, 8])
    y = (gen.random(len(owner)) < 0.3).astype(np.int64)
    y[owner == 1] = 0  # one class only: no AUC
    score = np.round(gen.normal(size=len(owner)) + y, 1)  # rounded: ties
    got = Binary().client_scores(torch.tensor(score).unsqueeze(1), torch.tensor(y), torch.tensor(owner), 6)
    for k in range(6):
        mine = owner == k
        truth, pred = y[mine], (score[mine] > 0).astype(np.int64)
        auc = roc_auc_score(truth, score[mine]) if len(np.unique(truth)) == 2 else np.nan
        f1 = f1_score(truth, pred, zero_division=np.nan) if mine.any() else np.nan
        with warnings.catch_warnings():  # one class: sklearn warns, and averages the recall of the class present
            warnings.simplefilter("ignore")
            balanced = balanced_accuracy_score(truth, pred) if mine.any() else np.nan
        np.testing.assert_allclose(float(got["auc"][k]), auc, rtol=1e-12)
        np.testing.assert_allclose(float(got["f1"][k]), f1, rtol=1e-12)
        np.testing.assert_allclose(float(got["balanced_accuracy"][k]), balanced, rtol=1e-12)
    assert np.isnan(float(got["auc"][1])) and np.isnan(float(got["auc"][5]))  # one class; no samples
    pooled = Binary().pooled_scores(torch.tensor(score).unsqueeze(1), torch.tensor(y))
    assert pooled["auc"] == pytest.approx(roc_auc_score(y, score))


def test_auc_by_hand_counts_ties_half() -> None:
    # positives score 0.8 and 0.5, negatives 0.5 and 0.1: pairs (0.8>0.5, 0.8>0.1, 0.5=0.5, 0.5>0.1) → 3.5 / 4
    auc = client_auc(torch.tensor([0.8, 0.5, 0.5, 0.1]), torch.tensor([1, 1, 0, 0]).bool(), torch.zeros(4).long(), 1)
    assert float(auc[0]) == 0.875


@pytest.mark.parametrize("targets", [1, 2])
def test_regression_client_metrics_are_scikit_learns(targets: int) -> None:
    gen = np.random.default_rng(1)
    owner = np.repeat(np.arange(4), [25, 7, 1, 40])
    y = gen.normal(size=(len(owner), targets)) * 3 + 1
    z = y + gen.normal(size=y.shape)
    shape = (len(owner),) if targets == 1 else y.shape
    got = Regression().client_scores(torch.tensor(z), torch.tensor(y.reshape(shape)), torch.tensor(owner), 4)
    for k in (0, 1, 3):
        mine = owner == k
        np.testing.assert_allclose(float(got["mae"][k]), mean_absolute_error(y[mine], z[mine]), rtol=1e-10)
        np.testing.assert_allclose(float(got["rmse"][k]), root_mean_squared_error(y[mine], z[mine]), rtol=1e-10)
        np.testing.assert_allclose(float(got["r2"][k]), r2_score(y[mine], z[mine]), rtol=1e-10)
    assert np.isnan(float(got["r2"][2]))  # one sample: no spread to explain
    pooled = Regression().pooled_scores(torch.tensor(z), torch.tensor(y.reshape(shape)))
    assert pooled["rmse"] == pytest.approx(root_mean_squared_error(y, z))


def _data(task: Task, sizes: list[int], dim: int, outputs: int, seed: int = 0) -> ClientData:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, dim, generator=gen) for n in sizes]
    ys = [_labels(task, (n,), outputs, gen) for n in sizes]
    return ClientData.from_parts(xs, ys)


def _plan(**extra: object) -> LocalPlan:
    return LocalPlan(
        clients=torch.tensor([0, 1, 2, 3]),
        steps=torch.tensor([5, 0, 3, 6]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2]),
        batch_size=4,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("task", "outputs"), [(Binary(), 1), (Regression(), 1), (Regression(), 2), (Huber(), 2)])
@pytest.mark.parametrize("optimizer", [SGD(), SGD(momentum=0.9)])
def test_dense_sequential_and_vectorised_train_any_task_to_the_same_numbers(
    task: Task, outputs: int, optimizer: SGD
) -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, outputs)), task)
    layers = dense_layers(model)
    assert layers is not None
    data = _data(task, [9, 3, 14, 6], 5, outputs)
    w0 = model.initial_params()
    plan = _plan(terms=(Proximal(mu=0.1),), optimizer=optimizer)
    runs = [
        train(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
        for train in (train_sequential, train_vectorised, lambda r: train_dense(r, layers))
    ]
    assert float((runs[0][0] - w0).abs().max()) > 1e-2
    for other in runs[1:]:
        torch.testing.assert_close(other[0], runs[0][0], **TOL)
        torch.testing.assert_close(other[1], runs[0][1], equal_nan=True, **TOL)


@pytest.mark.parametrize(("task", "outputs"), [(Binary(), 1), (Regression(), 2)])
def test_the_conv_backend_trains_any_task_as_autograd_does(task: Task, outputs: int) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, outputs))
    model = FlatModel(net, task)
    spec = conv_layers(model, input_shape=(1, 4, 4))
    assert spec is not None and spec.task is task
    gen = torch.Generator().manual_seed(1)
    sizes = [7, 3, 10, 5]
    xs = [torch.randn(n, 1, 4, 4, generator=gen) for n in sizes]
    data = ClientData.from_parts(xs, [_labels(task, (n,), outputs, gen) for n in sizes])
    w0, plan = model.initial_params(), _plan()
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
    con = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2), spec)
    torch.testing.assert_close(con[0], seq[0], **TOL)
    torch.testing.assert_close(con[1], seq[1], equal_nan=True, **TOL)


def test_evaluation_scores_the_tasks_own_metrics_and_no_accuracy_for_a_regression() -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Linear(3, 1), Regression())
    data = _data(Regression(), [6, 9], 3, 1)
    scores = score_clients(model, model.initial_params(), data)
    assert torch.isnan(scores.accuracy).all() and set(scores.extra) == {"mae", "rmse", "r2"}
    z = model.logits(model.initial_params(), data.x).detach()
    expected = ((z.squeeze(1) - data.y) ** 2)[:6].mean()
    assert float(scores.loss[0]) == pytest.approx(float(expected), rel=1e-5)
    assert float(scores.extra["rmse"][0]) == pytest.approx(float(expected) ** 0.5, rel=1e-5)


@pytest.mark.parametrize(("task", "outputs"), [(Binary(), 1), (Regression(), 2)])
@pytest.mark.parametrize("backend", ["vectorised", "sequential"])
def test_dp_sgd_takes_the_tasks_loss(task: Task, outputs: int, backend: str) -> None:
    """DP-SGD's per-sample gradients are those of the task's loss: with an infinite bound and no noise it is plain
    SGD; with a small bound, one step is w − η Σ_i clip(g_i)/b with g_i autograd's gradient of ℓ_task on sample i."""
    import math
    from dataclasses import replace

    from fedhet.data.dataset import FederatedData
    from fedhet.engine.engine import Engine
    from fedhet.engine.privacy import ExampleDP

    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, outputs)), task)
    part = _data(task, [4, 6], 5, outputs)
    data = FederatedData("t", part, part, outputs, torch.ones(2, dtype=torch.bool))
    engine = Engine(model, data, backend=backend, seed=0)  # type: ignore[arg-type]
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 3, 0.1, 2)
    plain = engine.train(w, plan, 0)
    private = engine.train(w, replace(plan, dp_sgd=ExampleDP(math.inf, 0.0, "shuffle")), 0)
    torch.testing.assert_close(private.params, plain.params, **TOL)
    one = replace(LocalPlan.uniform(torch.tensor([0]), 1, 0.5, 4), dp_sgd=ExampleDP(0.05, 0.0, "shuffle"))
    x, y = part.client(0)
    total = torch.zeros_like(w)
    for i in range(4):
        v = w.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(task.loss(model.logits(v, x[i : i + 1]), y[i : i + 1]).sum(), v)
        total += g * min(1.0, 0.05 / float(g.norm()))
    torch.testing.assert_close(engine.train(w, one, 0).params[0], w - 0.5 * total / 4, **TOL)


def test_a_regression_trains_on_standardised_targets_unless_told_and_says_what_scales() -> None:
    from fedhet.experiments.config import parse_config

    assert Regression().standardizes_targets() and not Regression(standardize=False).standardizes_targets()
    assert not Classification().standardizes_targets() and not Binary().standardizes_targets()
    assert Regression.target_powers == {"loss": 2, "mae": 1, "rmse": 1}  # R² is scale-free
    assert Classification.target_powers == {}
    config = parse_config({"task": {"name": "regression", "standardize": False}})
    assert TASKS.build(config.task, where="task").standardizes_targets() is False
