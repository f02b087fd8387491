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
