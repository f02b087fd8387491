"""Per-round evaluation of the global model on every client (seen and unseen)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.protocol import EngineProtocol
from fedhet.metrics.clients import distribution, pooled


def evaluate_global(
    engine: EngineProtocol, params: Tensor
) -> tuple[dict[str, float], dict[str, Tensor], ClientScores, ClientScores]:
    """Round metrics (see `fedhet.metrics.METRICS`), per-client columns, and test/train scores of the global
    model on every client."""
    data = engine.data
    test, train = engine.scores(params, "test"), engine.scores(params, "train")
    scored = ~torch.isnan(test.loss)  # a remote engine scores NaN for clients it could not reach
    seen, unseen = data.seen & scored, ~data.seen & scored
    metrics: dict[str, float] = {}
    metrics.update(distribution(test.accuracy[seen], "test_accuracy"))
    metrics["test_accuracy_pooled"] = pooled(test.accuracy[seen], test.count[seen])
    metrics["test_loss"] = float(test.loss[seen].double().mean())
    metrics["train_loss"] = float(train.loss[seen].double().mean())
    metrics["train_accuracy"] = float(train.accuracy[seen].double().mean())
    if bool(unseen.any()):
        metrics["unseen_test_accuracy"] = float(test.accuracy[unseen].double().mean())
        metrics["unseen_test_loss"] = float(test.loss[unseen].double().mean())
    columns = {
        "seen": seen.int(),
        "train_samples": train.count,
        "test_samples": test.count,
        "test_accuracy": test.accuracy,
        "test_loss": test.loss,
        "train_accuracy": train.accuracy,
        "train_loss": train.loss,
    }
    return metrics, columns, test, train
