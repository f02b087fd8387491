"""Model selection over a run's rounds: which evaluated round's model is the run's result (the best by a validation
metric, ``selection.metric``), and early stopping (``selection.patience``, ``selection.min_delta``).

Both are pure functions of the metrics rows, so the sweep, the recipes and `fedhet compare` choose from metrics.csv
exactly what the run chose, and a resumed run chooses what an uninterrupted one did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LOWER_IS_BETTER = ("loss", "rmse", "mae", "regret")


def better(metric: str) -> str:
    """ "min" for losses, errors, spreads and round counts, "max" otherwise (accuracy, AUC, F1, R², appeal)."""
    lower = any(word in metric for word in LOWER_IS_BETTER) or metric.endswith("_std") or metric.startswith("rounds")
    return "min" if lower else "max"


@dataclass(frozen=True)
class Rule:
    """How the best round is chosen: the metric, whether larger is better, and what counts as an improvement."""

    metric: str
    mode: str = "max"  # "max" or "min"
    min_delta: float = 0.0

    def improves(self, value: float, best: float | None) -> bool:
        """Whether `value` beats `best` (the best so far, None at the start) by more than ``min_delta``."""
        if math.isnan(value):
            return False
        if best is None:
            return True
        return value > best + self.min_delta if self.mode == "max" else value < best - self.min_delta

    def describe(self) -> str:
        """The rule in words, for tables: "val_loss (min)"."""
        return f"{self.metric} ({self.mode})"


def best_index(rows: Sequence[dict[str, float]], rule: Rule) -> int | None:
    """The index of the first row whose `rule.metric` no later row beats (by `Rule.improves`); None when no row
    has a value of it."""
    best: float | None = None
    found = None
    for i, row in enumerate(rows):
        value = row.get(rule.metric)
        if value is not None and rule.improves(float(value), best):
            best, found = float(value), i
    return found


def rounds_without_improvement(rows: Sequence[dict[str, float]], rule: Rule) -> int:
    """Evaluated rounds since the best one (all of them when none has the metric yet)."""
    found = best_index(rows, rule)
    return len(rows) if found is None else len(rows) - 1 - found


def selected_row(rows: Sequence[dict[str, float]], rule: Rule | None) -> dict[str, float]:
    """The row of the selected round: the best by `rule`, or the last row (no rule, or no value of its metric)."""
    if not rows:
        return {}
    found = best_index(rows, rule) if rule is not None else None
    return dict(rows[found if found is not None else -1])
