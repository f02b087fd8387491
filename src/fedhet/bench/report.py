"""Tables of a benchmark: rows and targets for the terminal (rich) and Markdown from the JSON file.

``python -m fedhet.bench.report runs/bench.json`` prints the Markdown tables of a saved run (as pasted into
benchmarks/README.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from fedhet.bench.run import Row
from fedhet.bench.targets import Target

COLUMNS = (
    "workload",
    "system",
    "round ms",
    "train ms",
    "eval ms",
    "train × plain",
    "fastest train × plain",
    "round × plain",
    "× naive",
    "× Flower",
    "train / best",
    "train FLOP frac",
    "eval FLOP frac",
    "spread",
    "peak MB",
    "load",
)


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None or value != value else pattern.format(value)


def _fraction(r: dict[str, Any], part: str) -> float | None:
    """FLOPs / seconds / matmul rate of a part (`train` or `eval`), from a row's fields."""
    if f"{part}_flop_fraction" in r:
        return float(r[f"{part}_flop_fraction"])
    seconds, flops = r.get(f"{part}_s"), r.get(f"{part}_flops")
    if not seconds or flops is None:
        return None
    return float(flops) / float(seconds) / (float(r["matmul_gflops"]) * 1e9)


def _cells(r: dict[str, Any]) -> list[str]:
    return [
        r["workload"],
        r["backend"],
        _fmt(1e3 * r["median_s"], "{:.1f}"),
        _fmt(1e3 * r["train_s"], "{:.1f}"),
        _fmt(1e3 * r["eval_s"], "{:.1f}"),
        _fmt(r.get("train_ratio_to_plain"), "{:.2f}"),
        _fmt(r.get("fastest_train_ratio_to_plain"), "{:.2f}"),
        _fmt(r.get("ratio_to_plain"), "{:.2f}"),
        _fmt(r.get("ratio_to_naive"), "{:.1f}"),
        _fmt(r.get("ratio_to_flower"), "{:.0f}"),
        _fmt(r.get("ratio_to_best_backend")),
        _fmt(_fraction(r, "train"), "{:.3f}"),
        _fmt(_fraction(r, "eval"), "{:.3f}"),
        _fmt(r.get("spread"), "{:.2f}"),
        _fmt(r["peak_mem_mb"], "{:.0f}"),
        _fmt(r["load_avg"], "{:.1f}"),
    ]


TERMINAL = ("workload", "system", "round ms", "train ms", "eval ms", "train × plain", "train / best", "train FLOP frac")


def rows_table(rows: Sequence[Row]) -> Table:
    """The main columns (the JSON file and `python -m fedhet.bench.report` have them all)."""
    table = Table(title="medians per round: local training, and the rest (aggregation + evaluation of every client)")
    keep = [COLUMNS.index(name) for name in TERMINAL]
    for name in TERMINAL:
        table.add_column(name, justify="left" if name in ("workload", "system") else "right")
    for r in rows:
        cells = _cells(r.as_dict())
        table.add_row(*(cells[i] for i in keep))
    return table


def targets_table(targets: Sequence[Target]) -> Table:
    table = Table(title="targets (ratios measured in this run)")
    for name in ("target", "goal", "measured", "met"):
        table.add_column(name)
    for t in targets:
        table.add_row(t.name, t.goal, t.measured, {True: "yes", False: "NO", None: "-"}[t.met])
    return table


def _markdown(header: Iterable[str], lines: Iterable[list[str]]) -> str:
    head = list(header)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def markdown_report(payload: dict[str, Any]) -> str:
    """The machine, the command, the rows and the targets of a saved run, as Markdown."""
    m = payload["machine"]
    intro = (
        f"`{payload['command']}` on {m['cpu']} ({m['cores']} cores, torch {m['torch']} with "
        f"{m['torch_threads']} threads, Python {m['python']}), {payload['started']}, "
        f"{payload['seconds']:.0f} s; load average {payload['load_avg_start']:.1f} at the start and "
        f"{payload['load_avg_end']:.1f} at the end."
    )
    rows = _markdown(COLUMNS, (_cells(r) for r in payload["rows"]))
    yes = {True: "yes", False: "**no**", None: "-"}
    targets = _markdown(
        ("target", "goal", "measured", "met"),
        ([t["name"], t["goal"], t["measured"], yes[t["met"]]] for t in payload["targets"]),
    )
    return f"{intro}\n\n{rows}\n\n{targets}\n"


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a thin command-line wrapper
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m fedhet.bench.report BENCH.json")
    print(markdown_report(json.loads(Path(args[0]).read_text())))


if __name__ == "__main__":  # pragma: no cover
    main()
