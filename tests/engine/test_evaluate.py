"""Batched evaluation equals a client-by-client loop."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from helpers.tiny import linear_model, tiny_data


def test_scores_match_a_loop_over_clients() -> None:
    data = tiny_data([4, 9, 2], classes=3)
    model = linear_model(classes=3)
    engine = Engine(model, data)
    w = model.initial_params()
    scores = engine.scores(w, "test")
    for k in range(3):
        x, y = data.test.client(k)
        logits = model.logits(w, x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        torch.testing.assert_close(scores.loss[k], loss)
        torch.testing.assert_close(scores.accuracy[k], acc)
    torch.testing.assert_close(engine.losses_at(w, torch.tensor([2, 0])), scores.loss[[2, 0]])


def test_own_models_are_scored_on_own_data() -> None:
    data = tiny_data([4, 9, 2], classes=3)
    model = linear_model(classes=3)
    engine = Engine(model, data)
    params = torch.stack([model.initial_params() + i for i in range(2)])
    own = engine.own_scores(params, torch.tensor([1, 2]), "train")
    for row, k in enumerate([1, 2]):
        expected = engine.scores(params[row], "train").loss[k]
        torch.testing.assert_close(own.loss[row], expected)


def test_own_and_split_models_score_a_binary_tasks_metrics_as_scikit_learn() -> None:
    """Each client's own model (vmap) and a dense model with personal layers give the task's metrics (AUC, F1,
    balanced accuracy) of that client's outputs on its data, as scikit-learn computes them."""
    import numpy as np
    from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score
    from torch import nn

    from fedhet.engine.dense import dense_layers
    from fedhet.engine.evaluate import personal_columns, score_own_models, score_split_dense
    from fedhet.engine.functional import FlatModel
    from fedhet.engine.task import Binary

    data = tiny_data([14, 9, 11, 6], classes=2, seed=3).test
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)), Binary())
    clients = torch.tensor([2, 0, 3])
    params = torch.stack([model.initial_params() + 0.3 * torch.randn(model.size) for _ in clients])
    layers = dense_layers(model)
    assert layers is not None
    whole = personal_columns(layers, torch.ones(model.size, dtype=torch.bool))  # every layer personal
    for scores in (
        score_own_models(model, params, data, clients),
        score_split_dense(layers, whole, model.initial_params(), params, data, clients, model.task),
    ):
        for row, k in enumerate(clients.tolist()):
            x, y = data.client(k)
            z = model.logits(params[row], x).detach().squeeze(1).double().numpy()
            truth, pred = y.numpy(), (z > 0).astype(np.int64)
            np.testing.assert_allclose(float(scores.extra["auc"][row]), roc_auc_score(truth, z), rtol=1e-6)
            f1 = f1_score(truth, pred, zero_division=np.nan)
            np.testing.assert_allclose(float(scores.extra["f1"][row]), f1, rtol=1e-6)
            balanced = balanced_accuracy_score(truth, pred)
            np.testing.assert_allclose(float(scores.extra["balanced_accuracy"][row]), balanced, rtol=1e-6)
        assert torch.isfinite(scores.extra["auc"]).all()  # every client has both classes: NaN would pass the above
        assert scores.owner is not None and torch.equal(torch.bincount(scores.owner), data.sizes[clients])
