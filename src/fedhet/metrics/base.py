"""Metric plugins: extra numbers computed at each evaluated round (GM-appeal, improved users, ...).

A run lists them in its config (``metrics: [improved_users, {name: appeal, ...}]``); each returns round
metrics (columns of ``metrics.csv``) and optional per-client columns (of ``clients.csv``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.plan import LocalResult
from fedhet.engine.protocol import EngineProtocol
from fedhet.registry import Component, Registry


@dataclass
class RoundView:
    """What a metric may look at after round `round` (1-based count of completed rounds)."""

    round: int
    engine: EngineProtocol
    params: Tensor  # global model after the round
    previous: Tensor  # global model before the round
    result: LocalResult | None  # the cohort's local training (None when nobody trained)
    test: ClientScores  # of `params` on every client's test data
    train: ClientScores  # of `params` on every client's train data
    history: list[dict[str, float]]  # earlier evaluated rounds
    final: bool = False  # the last round of the run


class Metric(Component):
    """Base of metric plugins; may keep state across rounds in private attributes (then override
    ``state_dict``/``load_state_dict``)."""

    model_config = ConfigDict(extra="forbid", frozen=False)
    needs_all_clients: ClassVar[bool] = True
    """Whether `compute` needs every client scored (``RoundView.test``/``train``); while one plugin of a run
    does, ``eval_clients`` sampling is off (set False where a sample's scores are enough)."""

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        """Called once before the first round (precompute per-client thresholds and the like)."""

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        raise NotImplementedError

    def save(self, out: Path) -> None:
        """Write extra files into the run folder `out` when the run ends (default: nothing)."""

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        del state


def needs_all_clients(metrics: Iterable[Metric]) -> bool:
    """Whether one of `metrics` needs every client scored (`Metric.needs_all_clients`)."""
    return any(plugin.needs_all_clients for plugin in metrics)


METRIC_PLUGINS: Registry[Metric] = Registry("metric")
