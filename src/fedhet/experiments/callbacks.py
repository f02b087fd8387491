"""Callbacks: small classes told about each round (metrics sinks, early stopping, progress display)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhet.experiments.runner import RunState


class Callback:
    """Override any hook. ``on_round_end`` returns True to stop the run early."""

    def on_run_start(self, state: RunState) -> None:
        """Before the first round to run (also after a resume)."""

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        """After round ``state.round`` (1-based, completed); `metrics` is None when it was not evaluated."""
        return False

    def on_run_end(self, state: RunState) -> None:
        """After the last round, an early stop, or a divergence."""


class CSVWriter(Callback):
    """Writes ``metrics.csv``: one row per evaluated round, columns from the first row."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_run_start(self, state: RunState) -> None:
        write_csv(self.path, state.history)

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if metrics is not None:
            write_csv(self.path, state.history)
        return False


class EarlyStopping(Callback):
    """Stop once `metric` reaches `target` (at least, or at most with ``mode='min'``)."""

    def __init__(self, metric: str, target: float, mode: str = "max") -> None:
        self.metric, self.target, self.mode = metric, target, mode

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if metrics is None or self.metric not in metrics:
            return False
        value = metrics[self.metric]
        return value >= self.target if self.mode == "max" else value <= self.target


def write_csv(path: Path, rows: list[dict[str, float]]) -> None:
    """Write `rows` (all columns of all rows, in first-seen order) atomically."""
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(v) for k, v in row.items()})
    tmp.replace(path)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
