"""Words for metrics: axis labels, figure titles, value ranges (to clip bands) and how to print a value."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fedhet.metrics import METRICS

UNIT = (0.0, 1.0)
NONNEG = (0.0, None)


@dataclass(frozen=True)
class MetricInfo:
    """How to show metric `name`: `label` for an axis or column, `title` naming the quantity, `description` (one
    sentence or ""), the range [`low`, `high`] its values lie in (None: unbounded), and whether it counts things."""

    name: str
    label: str
    title: str
    description: str = ""
    low: float | None = None
    high: float | None = None
    count: bool = False


# name → (axis label, title, range, count)
_KNOWN: dict[str, tuple[str, str, tuple[float | None, float | None], bool]] = {
    "round": ("communication round", "Communication round", NONNEG, True),
    "test_accuracy": ("test accuracy (mean over clients)", "Test accuracy of the global model", UNIT, False),
    "test_accuracy_std": ("std of test accuracy over clients", "Spread of test accuracy across clients", NONNEG, False),
    "test_accuracy_worst10": ("test accuracy of the worst 10% of clients", "Worst clients' test accuracy", UNIT, False),
    "test_accuracy_best10": ("test accuracy of the best 10% of clients", "Best clients' test accuracy", UNIT, False),
    "test_accuracy_p5": ("5th percentile of client test accuracy", "Worst 5% of clients' test accuracy", UNIT, False),
    "test_accuracy_p95": ("95th percentile of client test accuracy", "Best 5% of clients' test accuracy", UNIT, False),
    "test_accuracy_pooled": (
        "test accuracy (all test samples pooled)",
        "Test accuracy of the global model",
        UNIT,
        False,
    ),
    "test_loss": ("test loss (mean over clients)", "Test loss of the global model", NONNEG, False),
    "train_loss": ("training loss (mean over clients)", "Training loss of the global model", NONNEG, False),
    "train_accuracy": ("training accuracy (mean over clients)", "Training accuracy of the global model", UNIT, False),
    "local_loss": ("local training loss (mean over participants)", "Participants' local training loss", NONNEG, False),
    "participants": ("clients that trained in the round", "Clients that trained in each round", NONNEG, True),
    "available": ("clients available in the round", "Pool of available clients", NONNEG, True),
    "personal_test_accuracy": (
        "personalised test accuracy (mean over clients)",
        "Test accuracy of the clients' personalised models",
        UNIT,
        False,
    ),
    "personal_test_accuracy_worst10": (
        "personalised test accuracy of the worst 10% of clients",
        "Worst clients' personalised test accuracy",
        UNIT,
        False,
    ),
    "personal_appeal": ("personalised appeal (share of clients)", "Appeal of the personalised models", UNIT, False),
    "personal_test_loss": (
        "personalised test loss (mean over clients)",
        "Test loss of the clients' personalised models",
        NONNEG,
        False,
    ),
    "personal_test_auc": (
        "personalised test ROC AUC (mean over clients)",
        "Test ROC AUC of the clients' personalised models",
        UNIT,
        False,
    ),
    "personal_test_f1": (
        "personalised test F1 score (mean over clients)",
        "Test F1 score of the clients' personalised models",
        UNIT,
        False,
    ),
    "personal_test_balanced_accuracy": (
        "personalised test balanced accuracy (mean over clients)",
        "Test balanced accuracy of the clients' personalised models",
        UNIT,
        False,
    ),
    "time_s": ("simulated time (s)", "Simulated time", NONNEG, False),
    "bytes_down": ("bytes sent to clients", "Traffic to the clients", NONNEG, False),
    "bytes_up": ("bytes received from clients", "Traffic from the clients", NONNEG, False),
    "late_clients": ("clients left out by the deadline", "Clients left out by the deadline", NONNEG, True),
    "staleness": ("staleness of the updates (versions)", "Staleness of asynchronous updates", NONNEG, False),
    "gm_appeal": ("GM-appeal (share of clients)", "Global-model appeal (GM-appeal)", UNIT, False),
    "gm_appeal_train": ("GM-appeal on training data (share of clients)", "GM-appeal on training data", UNIT, False),
    "preferred_accuracy": ("preferred-model accuracy (mean over clients)", "Preferred-model accuracy", UNIT, False),
    "improved_users": (
        "share of participants whose loss did not rise",
        "Participants whose loss did not rise",
        UNIT,
        False,
    ),
    "improved_users_ewm": (
        "share of participants whose loss did not rise (EWM)",
        "Participants whose training loss did not rise",
        UNIT,
        False,
    ),
    "time_avg_accuracy": ("time-average test accuracy up to the round", "Time-average test accuracy", UNIT, False),
    "max_accuracy": ("best test accuracy so far", "Best test accuracy so far", UNIT, False),
    "second_half_std": ("std of test accuracy over the second half", "Test accuracy's fluctuation", NONNEG, False),
    "alpha_test_accuracy": ("α-weighted test accuracy", "α-weighted test accuracy", UNIT, False),
    "alpha_test_loss": ("α-weighted test loss", "α-weighted test loss", NONNEG, False),
    "alpha_train_loss": ("α-weighted training loss", "α-weighted training loss", NONNEG, False),
    "rounds_to_target": ("rounds to reach the target accuracy", "Rounds to the target accuracy", NONNEG, True),
    "best_test_accuracy": ("best test accuracy so far", "Best test accuracy so far", UNIT, False),
    "gsnr_entropy": ("entropy of the local-step allocation (nats)", "FedGSNR's step allocation entropy", NONNEG, False),
    "gsnr_mean": ("mean GSNR over participants", "Gradient signal-to-noise ratio (GSNR)", NONNEG, False),
    "contribution_round_mean": ("mean client GSNR in the round", "Clients' contribution (GSNR)", NONNEG, False),
    "test_auc": ("test ROC AUC (mean over clients)", "Test ROC AUC of the global model", UNIT, False),
    "test_f1": ("test F1 score (mean over clients)", "Test F1 score of the global model", UNIT, False),
    "test_balanced_accuracy": (
        "test balanced accuracy (mean over clients)",
        "Test balanced accuracy of the global model",
        UNIT,
        False,
    ),
    "test_mae": ("test mean absolute error (mean over clients)", "Test MAE of the global model", NONNEG, False),
    "test_rmse": ("test root mean squared error (mean over clients)", "Test RMSE of the global model", NONNEG, False),
    "test_r2": ("test R² (mean over clients)", "Test R² of the global model", (None, 1.0), False),
    "dp_epsilon": ("privacy spent ε (client level)", "Privacy spent by client-level DP", NONNEG, False),
    "dp_sgd_epsilon": ("privacy spent ε (DP-SGD, worst client)", "Privacy spent by DP-SGD", NONNEG, False),
    "dp_clip_bound": ("clipping bound C", "Client-level DP's clipping bound", NONNEG, False),
    "dp_clipped_share": ("share of updates clipped", "Updates clipped in the round", UNIT, False),
}
_EXTRA_DESCRIPTIONS = {
    "gm_appeal": "share of clients whose test loss under the global model is below their own model's (MaxFL Def. 1)",
    "preferred_accuracy": "mean over clients of the accuracy of the model each client prefers (global or its own)",
    "improved_users_ewm": "share of the round's participants whose training loss did not increase, smoothed (EWM)",
    "time_avg_accuracy": "mean of the α-weighted test accuracy over the rounds so far (CA-Fed's time average)",
}
_PREFIXES = {"unseen_": "unseen clients", "ft_": "after local fine-tuning"}


def metric_info(name: str) -> MetricInfo:
    """What to call metric `name` (metrics.csv's column) on a figure or in a table; unknown names get their words."""
    if name.startswith("val_") and name not in _KNOWN and f"test_{name[4:]}" in _KNOWN:  # validation: as test
        base = metric_info(f"test_{name[4:]}")
        label, title = base.label.replace("test", "validation"), base.title.replace("Test", "Validation")
        return replace(base, name=name, label=label, title=title, description=METRICS.get(name, base.description))
    if name.endswith("_pooled") and name not in _KNOWN and name[: -len("_pooled")] in _KNOWN:
        base = metric_info(name[: -len("_pooled")])
        label = base.label.replace("(mean over clients)", "(all samples pooled)")
        return replace(base, name=name, label=label, description=METRICS.get(name, base.description))
    for prefix, words in _PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            base = metric_info(name[len(prefix) :])
            return replace(
                base,
                name=name,
                label=f"{base.label}, {words}",
                title=f"{base.title} ({words})",
                description=METRICS.get(name, base.description),
            )
    description = METRICS.get(name, _EXTRA_DESCRIPTIONS.get(name, ""))
    if name in _KNOWN:
        label, title, (low, high), count = _KNOWN[name]
        return MetricInfo(name, label, title, description, low, high, count)
    words = name.replace("_", " ")
    return MetricInfo(name, words, words[:1].upper() + words[1:], description)


BYTES = ("bytes_down", "bytes_up")  # amounts of bytes: whole numbers, thousands apart (a mean over seeds too)


def format_value(name: str, value: float, digits: int = 4) -> str:
    """`value` of metric `name` for a table: counts as integers, bytes as whole numbers with thousands separators
    (``1,234,560``), other numbers with `digits` decimals."""
    if math.isnan(value):
        return "n/a"
    if name in BYTES and math.isfinite(value):
        return f"{value:,.0f}"
    if metric_info(name).count and float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}"
