"""Model selection over a run's rounds: which evaluated round's model is the run's result (the best by a validation
metric, ``selection.metric``), and early stopping (``selection.patience``, ``selection.min_delta``).

Both are pure functions of the metrics rows, so the sweep, the recipes and `fedhet compare` choose from metrics.csv
exactly what the run chose, and a resumed run chooses what an uninterrupted one did. Before a run starts,
`check_selection` refuses a metric that names a built-in column the run will not write (``val_loss`` without a
validation split, ``val_auc`` on a classification task).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhet.errors import ConfigError
from fedhet.experiments.evaluation import scores_personal
from fedhet.metrics import METRICS
from fedhet.strategies.base import Strategy

if TYPE_CHECKING:
    from fedhet.experiments.build import Experiment

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


def _spread(prefix: str) -> list[str]:
    return [prefix, f"{prefix}_std", f"{prefix}_worst10", f"{prefix}_best10"]


def task_metric_names(exp: Experiment) -> list[str] | None:
    """The names of the run's task's own metrics (auc, f1, ...; `fedhet.engine.task`), from one training sample
    (None: no samples here, as on a Flower server)."""
    data, task = exp.data, exp.engine.model.task
    if len(data.train.y) == 0:
        return None
    z = torch.zeros(1, task.outputs(data.num_classes))
    return list(task.client_scores(z, data.train.y[:1].cpu(), torch.zeros(1, dtype=torch.long), 1))


def run_columns(exp: Experiment, task_names: list[str]) -> list[str]:
    """The metrics.csv columns a run of `exp` writes (`fedhet.experiments.runner._evaluate`), without the
    strategy's own (`Strategy.round_metrics`, undeclared); a privacy ledger's ``dp_*`` columns all count."""
    cfg, data, task = exp.config, exp.data, exp.engine.model.task
    unseen = bool((~data.seen).any())
    columns = ["round"]
    if task.accuracy:
        columns += [*_spread("test_accuracy"), "test_accuracy_pooled"]
    columns += ["test_loss", *(f"test_{n}{p}" for p in ("", "_pooled") for n in task_names), "train_loss"]
    columns += ["train_accuracy"] if task.accuracy else []
    columns += ["evaluated"] if cfg.eval_clients else []
    if unseen:
        columns += ["unseen_test_accuracy"] if task.accuracy else []
        columns += ["unseen_test_loss", *(f"unseen_test_{n}" for n in task_names)]
    if data.val is not None:
        columns += ["val_accuracy"] if task.accuracy else []
        columns += ["val_loss", *(f"val_{n}{p}" for p in ("", "_pooled") for n in task_names)]
    columns += ["local_loss", "participants", "available"]
    if exp.privacy is not None:
        columns += [c for c in METRICS if c.startswith(("dp_", "test_accuracy_size", "test_accuracy_clipped"))]
    if scores_personal(exp.strategy, cfg.personal_eval):
        columns += [*_spread("personal_test_accuracy"), "personal_test_loss", "personal_appeal"]
        if unseen:
            columns += ["unseen_personal_test_accuracy", "unseen_personal_test_loss", "unseen_personal_appeal"]
    if exp.system.simulates_time or exp.strategy.asynchronous:
        columns += ["time_s", "bytes_down", "bytes_up"]
        columns += ["staleness", "in_flight"] if exp.strategy.asynchronous else ["late_clients"]
    return columns + [c for plugin in exp.metrics for c in plugin.columns()]


def check_selection(exp: Experiment) -> None:
    """Refuse, in one line, a selection metric this run does not write (its best round would be none, and the run's
    result silently its last): a built-in column (`fedhet.metrics.METRICS`) or a metric plugin's it lacks, or any
    other name when the strategy writes no columns of its own (`Strategy.round_metrics` not overridden)."""
    metric = exp.config.selection_metric()
    task_names = task_metric_names(exp) if metric is not None else None
    if metric is None or task_names is None:
        return
    columns = run_columns(exp, task_names)
    own_columns = type(exp.strategy).round_metrics is not Strategy.round_metrics
    if metric in columns or (metric not in METRICS and own_columns):
        return  # a strategy's own column (afl_lambda_max, ...) is known only once it is written: `missing_metric`
    if metric.startswith("val_") and exp.data.val is None:
        why = "val_ columns need a validation split: set val_fraction, e.g. 0.1"
    elif metric.startswith("unseen_"):
        why = "unseen_ columns need held-out clients: set unseen_clients"
    elif metric in ("time_s", "bytes_down", "bytes_up", "late_clients"):
        why = "the clock's columns need a system model: set system"
    else:
        why = f"task {exp.engine.model.task.name}, algorithm {exp.config.spec('algorithm')['name']}"
    raise ConfigError(
        f"selection.metric '{metric}' is not a column this run writes ({why}); its metrics are: {', '.join(columns)}"
    )


def missing_metric(row: dict[str, float], rule: Rule) -> str | None:
    """A note when the first evaluated row lacks the rule's metric (a name the run could not check beforehand)."""
    if rule.metric in row:
        return None
    return (
        f"selection.metric '{rule.metric}' is not a column of this run's metrics.csv ({', '.join(row)}), so no "
        "round is selected by it and the run's result is its last round"
    )
