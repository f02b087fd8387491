"""Read run folders back (summary.json and metrics.csv)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError


@dataclass
class RunRecord:
    """A finished (or interrupted) run read from its folder."""

    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, float]]

    @property
    def label(self) -> str:
        return self.path.name

    def curve(self, metric: str) -> tuple[list[float], list[float]]:
        pairs = [(r["round"], r[metric]) for r in self.rows if metric in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def read_run(path: Path) -> RunRecord:
    summary_file, metrics_file = path / "summary.json", path / "metrics.csv"
    if not summary_file.is_file() or not metrics_file.is_file():
        raise ConfigError(f"'{path}' is not a run folder (needs summary.json and metrics.csv from fedhet run)")
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"'{summary_file}' is not valid JSON ({err}); rerun or resume that run") from None
    final = summary.get("final", {}) if isinstance(summary, dict) else None
    if not isinstance(final, dict) or not all(type(v) in (int, float) for v in final.values()):
        raise ConfigError(
            f"'{summary_file}' does not hold a run summary (an object whose 'final' maps names to numbers)"
        )
    try:
        with metrics_file.open(encoding="utf-8", newline="") as f:
            rows = [{str(k): float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    except (UnicodeDecodeError, ValueError, TypeError, csv.Error) as err:
        reason = str(err).splitlines()[0][:100] if str(err) else type(err).__name__
        raise ConfigError(f"'{metrics_file}' is not a metrics table of numbers ({reason})") from None
    return RunRecord(path, summary, rows)


def metric_names(records: list[RunRecord]) -> list[str]:
    names: list[str] = []
    for rec in records:
        for row in rec.rows:
            names.extend(k for k in row if k not in names and k != "round")
    return names
