"""Convergence speed: communication rounds to reach a target test accuracy, best test accuracy, speedup.

FedGSNR Tables 1–3: rounds to reach 0.5 test accuracy, speedup S = T_old / T_new (after Karimireddy et al. 2020),
and the best test accuracy over the run.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.protocol import EngineProtocol
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView
from fedhet.metrics.clients import pooled


def rounds_to_target(rounds: list[float], accuracy: list[float], target: float) -> float:
    """The first round whose accuracy is ≥ `target`; NaN if none is."""
    for r, a in zip(rounds, accuracy, strict=True):
        if a >= target:
            return float(r)
    return float("nan")


def speedup(t_old: float, t_new: float) -> float:
    """S = T_old / T_new (NaN when either method never reached the target)."""
    if math.isnan(t_old) or math.isnan(t_new) or t_new <= 0:
        return float("nan")
    return t_old / t_new


@METRIC_PLUGINS.register
class TargetAccuracy(Metric):
    """``rounds_to_target``: the first evaluated round with test accuracy ≥ `target` (NaN until reached);
    ``best_test_accuracy``: the best so far. `column` chooses the client mean (``test_accuracy``) or the
    sample-weighted accuracy over all seen clients' test data (``test_accuracy_pooled``, a global test set)."""

    name: ClassVar[str] = "target_accuracy"
    description: ClassVar[str] = "rounds to reach a target test accuracy, and the best test accuracy"
    target: float = Field(0.5, ge=0, le=1, description="target test accuracy")
    column: Literal["test_accuracy", "test_accuracy_pooled"] = "test_accuracy"

    _reached: float = PrivateAttr(float("nan"))
    _best: float = PrivateAttr(float("nan"))

    def columns(self) -> tuple[str, ...]:
        return ("rounds_to_target", "best_test_accuracy")

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        super().setup(engine, seed)
        self._reached, self._best = float("nan"), float("nan")

    def accuracy(self, view: RoundView) -> float:
        seen = view.engine.data.seen
        acc = view.test.accuracy[seen]
        if self.column == "test_accuracy_pooled":
            return pooled(acc, view.test.count[seen])
        return float(acc.double().mean())

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        acc = self.accuracy(view)
        if math.isnan(self._reached) and acc >= self.target:
            self._reached = float(view.round)
        if math.isnan(self._best) or acc > self._best:
            self._best = acc
        return {"rounds_to_target": self._reached, "best_test_accuracy": self._best}, {}

    def state_dict(self) -> dict[str, object]:
        return {"reached": self._reached, "best": self._best}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._reached = float(state["reached"])  # type: ignore[arg-type]
        self._best = float(state["best"])  # type: ignore[arg-type]
