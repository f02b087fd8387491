"""Callbacks: small classes told about each round (metrics sinks, early stopping, progress display)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhet.experiments.state import RunState


class Callback:
    """Override any hook. ``on_round_end`` returns True to stop the run early."""

    def on_run_start(self, state: RunState) -> None:
        """Before the first round to run (also after a resume)."""

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        """After round ``state.round`` (1-based, completed); `metrics` is None when it was not evaluated."""
        return False

    def on_run_end(self, state: RunState) -> None:
        """After the last round, an early stop, or a divergence."""


class EarlyStopping(Callback):
    """Stop once `metric` reaches `target` (at least, or at most with ``mode='min'``)."""

    def __init__(self, metric: str, target: float, mode: str = "max") -> None:
        self.metric, self.target, self.mode = metric, target, mode

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if metrics is None or self.metric not in metrics:
            return False
        value = metrics[self.metric]
        return value >= self.target if self.mode == "max" else value <= self.target
