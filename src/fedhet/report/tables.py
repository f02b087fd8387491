"""Tables of final metrics (rich for the terminal, markdown for reports)."""

from __future__ import annotations

from rich.table import Table

from fedhet.report.runs import RunRecord

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
    "test_loss": "test loss",
    "train_loss": "train loss",
}


def final_rows(records: list[RunRecord], columns: tuple[str, ...] = DEFAULT_COLUMNS) -> list[list[str]]:
    rows = []
    for rec in records:
        final = rec.summary.get("final", {})
        head = [rec.label, str(rec.summary.get("rounds", ""))]
        rows.append(head + [f"{final[c]:.4f}" if c in final else "-" for c in columns])
    return rows


def compare_table(records: list[RunRecord], columns: tuple[str, ...] = DEFAULT_COLUMNS) -> Table:
    table = Table(title="final metrics (test accuracy averaged over clients)")
    for name in ("run", "rounds", *(SHORT.get(c, c) for c in columns)):
        text = name == "run"
        width = min(24, max([len(name)] + [len(r.label) for r in records])) if name == "run" else None
        table.add_column(
            name, justify="left" if text else "right", overflow="fold", no_wrap=not text, min_width=width or 6
        )
    for row in final_rows(records, columns):
        table.add_row(*row)
    return table


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
