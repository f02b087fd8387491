"""Config vocabulary shared by the schema (experiments) and the readers of run folders (report), kept below both."""

from __future__ import annotations

from typing import Any

COMPONENT_KEYS = ("algorithm", "dataset", "partition", "model", "availability", "attack", "system")
"""Config keys that name a component (a string or a mapping with ``name``)."""


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``{"local": {"lr": 0.1}}`` → ``{"local.lr": 0.1}``); lists stay values.
    The ``track`` and ``derived`` keys are left out: trackers are not part of what a run computes, and derived
    values follow from the others."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not prefix and key in ("track", "derived"):
            continue
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
