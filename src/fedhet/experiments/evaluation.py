"""Per-round evaluation of the global model on every client (seen and unseen), or on a seeded sample of them
(``eval_clients``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.protocol import EngineProtocol
from fedhet.metrics.clients import distribution, pooled
from fedhet.seeding import numpy_rng

EVAL_STREAM = "eval-clients"


def evaluation_sample(num_clients: int, count: int, seed: int, round_: int) -> Tensor | None:
    """The clients evaluated after round `round_` when ``eval_clients`` is `count`: `count` of the `num_clients`
    drawn uniformly without replacement from the run's own stream (sorted; training draws are untouched); None
    (everyone) when `count` is 0 or at least `num_clients`."""
    if count <= 0 or count >= num_clients:
        return None
    chosen = numpy_rng(seed, EVAL_STREAM, round_).choice(num_clients, size=count, replace=False)
    return torch.as_tensor(np.sort(chosen), dtype=torch.long)


def evaluate_global(
    engine: EngineProtocol, params: Tensor, clients: Tensor | None = None, count: bool = False
) -> tuple[dict[str, float], dict[str, Tensor], ClientScores, ClientScores]:
    """Round metrics (see `fedhet.metrics.METRICS`), per-client columns, and test/train scores of the global
    model on every client, or on `clients` only (the others NaN in the columns; the metrics are those of the
    clients evaluated, and ``evaluated`` says how many seen clients that was; with `count` also when all were)."""
    data = engine.data
    test, train = engine.scores(params, "test", clients), engine.scores(params, "train", clients)
    scored = ~torch.isnan(test.loss)  # not evaluated, or a client a remote engine could not reach
    seen, unseen = data.seen & scored, ~data.seen & scored
    metrics: dict[str, float] = {}
    metrics.update(distribution(test.accuracy[seen], "test_accuracy"))
    metrics["test_accuracy_pooled"] = pooled(test.accuracy[seen], test.count[seen])
    metrics["test_loss"] = float(test.loss[seen].double().mean())
    metrics["train_loss"] = float(train.loss[seen].double().mean())
    metrics["train_accuracy"] = float(train.accuracy[seen].double().mean())
    if clients is not None or count:
        metrics["evaluated"] = float(seen.sum())
    if bool(unseen.any()):
        metrics["unseen_test_accuracy"] = float(test.accuracy[unseen].double().mean())
        metrics["unseen_test_loss"] = float(test.loss[unseen].double().mean())
    columns = {
        "seen": data.seen.int(),  # whether the client trains, also when it was not scored (a lost Flower node's)
        "train_samples": train.count,
        "test_samples": test.count,
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "train_accuracy": train.accuracy,
        "train_loss": train.loss,
    }
    return metrics, columns, test, train


def spread_scores(scores: ClientScores, clients: Tensor) -> ClientScores:
    """`scores` with every client outside `clients` given the values of one of `clients` (in turn): finite,
    plausible scores for a metric plugin whose cost, not its values, matters (``--estimate``)."""
    if len(clients) == 0:
        return scores
    k = len(scores.loss)
    source = clients[torch.arange(k) % len(clients)]
    source[clients] = clients
    return ClientScores(scores.loss[source], scores.accuracy[source], scores.count[source])
