"""Tables of final metrics (rich for the terminal, markdown for reports): one row per run, or per group of seeds
(mean ± std over them), at each run's selected round when it selects one."""

from __future__ import annotations

import math

import numpy as np
from rich.table import Table

from fedhet.report.labels import format_value
from fedhet.report.runs import RunGroup, RunRecord, as_groups, common_description

DEFAULT_COLUMNS = (
    "test_accuracy",
    "test_accuracy_std",
    "test_accuracy_worst10",
    "test_accuracy_best10",
    "test_loss",
    "train_loss",
)
SHORT = {
    "test_accuracy": "acc",
    "test_accuracy_std": "acc std",
    "test_accuracy_worst10": "worst 10%",
    "test_accuracy_best10": "best 10%",
    "test_accuracy_pooled": "pooled acc",
    "test_loss": "test loss",
    "train_loss": "train loss",
    "train_accuracy": "train acc",
    "local_loss": "local loss",
    "unseen_test_accuracy": "unseen acc",
    "gm_appeal": "GM-appeal",
    "unseen_gm_appeal": "unseen GM-appeal",
    "val_loss": "val loss",
    "val_accuracy": "val acc",
    "test_auc": "AUC",
    "test_f1": "F1",
    "test_balanced_accuracy": "bal. acc",
    "test_mae": "MAE",
    "test_rmse": "RMSE",
    "test_r2": "R²",
    "personal_test_accuracy": "pers. acc",
    "personal_test_accuracy_worst10": "pers. worst 10%",
    "personal_test_accuracy_std": "pers. acc std",
    "personal_test_loss": "pers. loss",
    "personal_appeal": "pers. appeal",
    "personal_test_auc": "pers. AUC",
    "personal_test_f1": "pers. F1",
    "personal_test_balanced_accuracy": "pers. bal. acc",
}
# a personalised run's columns (each client's personalised model on its own test data), shown before the others
PERSONAL_COLUMNS = (
    "personal_test_accuracy",
    "personal_test_auc",
    "personal_test_f1",
    "personal_test_balanced_accuracy",
    "personal_test_accuracy_worst10",
    "personal_appeal",
)
PERSONAL = "personal_test_accuracy"
# the columns `fedhet compare` shows by default, among those the runs have: accuracy (classification), the task's own
# metrics (binary, regression), validation
TASK_COLUMNS = ("test_auc", "test_f1", "test_balanced_accuracy", "test_rmse", "test_mae", "test_r2", "val_loss")
RUN_WIDTH = 32  # the run column wraps longer labels (a method and two keys fit)
CELL = 3  # a column's padding and border in rich's default box


def default_columns(groups: list[RunGroup]) -> tuple[str, ...]:
    """`PERSONAL_COLUMNS`, `DEFAULT_COLUMNS` and `TASK_COLUMNS` that some run has, in that order (a personalised
    run's own columns first; all of `DEFAULT_COLUMNS` when none)."""
    have = {k for g in groups for r in g.runs for k in r.summary.get("final", {})}
    shown = tuple(c for c in (*PERSONAL_COLUMNS, *DEFAULT_COLUMNS, *TASK_COLUMNS) if c in have)
    return shown or DEFAULT_COLUMNS


def ranking(groups: list[RunGroup]) -> tuple[list[RunGroup], str]:
    """`groups` best first, and the rule in words. With personalised runs (some run has ``personal_test_accuracy``):
    by the mean over seeds of the personalised test accuracy, a run without personalised models by its
    ``test_accuracy`` (its clients use the global model); else by ``test_accuracy``; a task without accuracy by
    ``test_loss`` (lowest first). Values at each run's selected round; groups without the metric last, in order."""
    personal = any(PERSONAL in r.selected for g in groups for r in g.runs)
    have_accuracy = any("test_accuracy" in r.selected for g in groups for r in g.runs)
    metric = PERSONAL if personal else "test_accuracy" if have_accuracy else "test_loss"
    sign = 1.0 if metric == "test_loss" else -1.0

    def value(run: RunRecord) -> float:
        row = run.selected
        return row.get(metric, row.get("test_accuracy", math.nan) if personal else math.nan)

    def key(group: RunGroup) -> float:
        values = np.asarray([value(r) for r in group.runs], dtype=float)
        return sign * float(np.nanmean(values)) if not np.isnan(values).all() else math.inf

    ranked = sorted(groups, key=key)  # stable: equals keep their order
    if personal:
        rule = "rows ranked by personalised test accuracy (pers. acc; a run without personalised models by its acc)"
    else:
        rule = f"rows ranked by {metric.replace('_', ' ')} ({'lowest' if sign > 0 else 'highest'} first)"
    return ranked, rule


def group_cell(group: RunGroup, column: str) -> str:
    """A group's value of `column` at each run's selected round: the run's value, or mean ± std over its seeds
    (sample std; runs without it left out and counted)."""
    values = [r.selected.get(column, math.nan) for r in group.runs]
    if len(values) == 1:
        return format_value(column, values[0]) if not math.isnan(values[0]) else "-"
    arr = np.asarray(values, dtype=float)
    ok = arr[~np.isnan(arr)]
    if len(ok) == 0:
        return "-"
    missing = f" ({len(arr) - len(ok)} missing)" if len(ok) < len(arr) else ""
    if len(ok) == 1:
        return format_value(column, float(ok[0])) + missing
    return f"{format_value(column, float(ok.mean()))} ± {format_value(column, float(ok.std(ddof=1)))}{missing}"


def final_rows(
    records: list[RunRecord] | list[RunGroup], columns: tuple[str, ...] = DEFAULT_COLUMNS
) -> list[list[str]]:
    """Per run (or group of seeds): its label, the rounds it ran (an integer, or a range over seeds) and its value
    of each of `columns` at the selected round (mean ± std over a group's seeds)."""
    rows = []
    for group in as_groups(records):
        counts = sorted({r.summary.get("rounds", "") for r in group.runs}, key=str)
        texts = [str(int(n)) if isinstance(n, int | float) else str(n) for n in counts]
        rounds = texts[0] if len(texts) == 1 else f"{texts[0]}–{texts[-1]}"
        rows.append([group.label, rounds, *(group_cell(group, c) for c in columns)])
    return rows


def fitting_columns(
    records: list[RunRecord] | list[RunGroup], columns: tuple[str, ...], width: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The leading `columns` whose table fits `width` characters (labels longer than `RUN_WIDTH` wrap), and the
    columns left out (at least one column is kept)."""
    rows = final_rows(records, columns)
    total = 1 + CELL + run_width(rows) + CELL + max(len("rounds"), *(len(r[1]) for r in rows))
    kept: list[str] = []
    for i, column in enumerate(columns):
        cell = max(len(SHORT.get(column, column)), *(len(r[2 + i]) for r in rows)) + CELL
        if kept and total + cell > width:
            break
        kept.append(column)
        total += cell
    return tuple(kept), tuple(c for c in columns if c not in kept)


def run_width(rows: list[list[str]]) -> int:
    return min(RUN_WIDTH, max([len("run")] + [len(r[0]) for r in rows]))


def compare_table(
    records: list[RunRecord] | list[RunGroup], columns: tuple[str, ...] = DEFAULT_COLUMNS, width: int | None = None
) -> tuple[Table, tuple[str, ...]]:
    """The final metrics of `records` (runs, or groups of seeds: mean ± std) side by side, at each run's selected
    round, fitted to `width` characters (None: all columns); returns the table and the columns dropped to fit (the
    caption names them, the seeds and the selection rule)."""
    groups, rule = ranking(as_groups(records))
    dropped: tuple[str, ...] = ()
    if width is not None:
        columns, dropped = fitting_columns(groups, columns, width)
    common = common_description([r for g in groups for r in g.runs])
    caption = f"all runs: {common}" if common else ""
    seeds = sorted({g.seeds for g in groups})
    if seeds[-1] > 1:
        counts = "/".join(map(str, seeds))
        caption += ("; " if caption else "") + f"mean ± std over {counts} seeds per row"
    rules = sorted({g.selection for g in groups} - {""})
    if rules:
        caption += ("; " if caption else "") + f"values at each run's best round by {', '.join(rules)}"
    if len(groups) > 1:
        caption += ("; " if caption else "") + rule
    if any(c.startswith("personal_") for c in columns):
        caption += "; pers.: each client's personalised model on its own test data, the others: the global model"
    if dropped:
        names = ", ".join(SHORT.get(c, c) for c in dropped)
        caption += ("; " if caption else "") + f"left out to fit {width} columns: {names} (choose with --column)"
    title = "metrics at the selected round" if rules else "final metrics"
    table = Table(title=f"{title} (accuracy: mean over clients)", caption=caption or None, caption_justify="left")
    rows = final_rows(groups, columns)
    table.add_column("run", justify="left", overflow="fold", min_width=run_width(rows), max_width=RUN_WIDTH)
    table.add_column("rounds", justify="right", no_wrap=True)
    for c in columns:
        table.add_column(SHORT.get(c, c), justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table, dropped


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def reach_columns(
    records: list[RunRecord] | list[RunGroup], metric: str, target: float
) -> tuple[list[str], list[list[str]]]:
    """Per run (or group: mean ± std over seeds): the first round and simulated time at which `metric` reached
    `target` (time-to-accuracy), "-" where it never did or the run keeps no clock."""
    header = ["run", f"rounds to {metric} {target:g}", f"time (s) to {metric} {target:g}"]
    rows = []
    for group in as_groups(records):
        hits = [r.reaches(metric, target) for r in group.runs]
        cells = []
        for key, digits in (("round", 0), ("time_s", 1)):
            arr = np.asarray([h[key] for h in hits], dtype=float)
            ok = arr[~np.isnan(arr)]
            if len(ok) == 0:
                cells.append("-")
            elif len(arr) == 1:
                cells.append(f"{ok[0]:.{digits}f}")
            else:
                spread = f" ± {ok.std(ddof=1):.{digits}f}" if len(ok) > 1 else ""
                never = f" ({len(arr) - len(ok)} never)" if len(ok) < len(arr) else ""
                cells.append(f"{ok.mean():.{digits}f}{spread}{never}")
        rows.append([group.label, *cells])
    return header, rows
