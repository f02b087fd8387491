"""Tables of final metrics (rich for the terminal, markdown for reports)."""

from __future__ import annotations

from rich.table import Table

from fedhet.report.labels import format_value
from fedhet.report.runs import RunRecord, common_description

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
}
RUN_WIDTH = 24  # the run column wraps longer labels
CELL = 3  # a column's padding and border in rich's default box


def final_rows(records: list[RunRecord], columns: tuple[str, ...] = DEFAULT_COLUMNS) -> list[list[str]]:
    """Per run: its label, the rounds it ran (an integer) and its final value of each of `columns`."""
    rows = []
    for rec in records:
        final = rec.summary.get("final", {})
        rounds = rec.summary.get("rounds", "")
        head = [rec.label, str(int(rounds)) if isinstance(rounds, int | float) else str(rounds)]
        rows.append(head + [format_value(c, final[c]) if c in final else "-" for c in columns])
    return rows


def fitting_columns(
    records: list[RunRecord], columns: tuple[str, ...], width: int
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
    records: list[RunRecord], columns: tuple[str, ...] = DEFAULT_COLUMNS, width: int | None = None
) -> tuple[Table, tuple[str, ...]]:
    """The final metrics of `records` side by side, fitted to `width` characters (None: all columns); returns the
    table and the columns dropped to fit (the caption names them)."""
    dropped: tuple[str, ...] = ()
    if width is not None:
        columns, dropped = fitting_columns(records, columns, width)
    common = common_description(records)
    caption = f"all runs: {common}" if common else ""
    if dropped:
        names = ", ".join(SHORT.get(c, c) for c in dropped)
        caption += ("; " if caption else "") + f"left out to fit {width} columns: {names} (choose with --column)"
    table = Table(title="final metrics (accuracy: mean over clients)", caption=caption or None, caption_justify="left")
    rows = final_rows(records, columns)
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


def reach_columns(records: list[RunRecord], metric: str, target: float) -> tuple[list[str], list[list[str]]]:
    """Per run: the first round and simulated time at which `metric` reached `target` (time-to-accuracy), "-" where
    it never did or the run keeps no clock."""
    header = ["run", f"rounds to {metric} {target:g}", f"time (s) to {metric} {target:g}"]
    rows = []
    for rec in records:
        hit = rec.reaches(metric, target)
        cells = [f"{hit[k]:.0f}" if k == "round" else f"{hit[k]:.1f}" for k in ("round", "time_s")]
        rows.append([rec.label, *("-" if c == "nan" else c for c in cells)])
    return header, rows
