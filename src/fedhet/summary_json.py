"""A run folder's ``summary.json`` as strict JSON: a NaN (or infinite) number is written as ``null`` (Python's bare
``NaN`` is not JSON: strict parsers, ``jq`` and JavaScript's ``JSON.parse`` reject it), and read back as NaN in the
metric rows (``final``, ``selected``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRIC_ROWS = ("final", "selected")  # the blocks of metric name → number, where null means NaN


def summary_text(summary: dict[str, Any]) -> str:
    """The text of ``summary.json``: `summary` as strict JSON, non-finite numbers as null."""
    return json.dumps(_finite(summary), indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def read_summary(path: Path) -> Any:
    """``summary.json`` as written, null in its metric rows read as NaN (older files' bare NaN reads too); raises
    OSError, ValueError (not JSON) or RecursionError as `json` does."""
    summary = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(summary, dict):
        for key in METRIC_ROWS:
            row = summary.get(key)
            if isinstance(row, dict):
                summary[key] = {name: math.nan if value is None else value for name, value in row.items()}
    return summary
