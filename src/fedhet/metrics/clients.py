"""Summaries of per-client numbers: average, spread, worst and best 10% (fairness)."""

from __future__ import annotations

import math

from torch import Tensor


def tail_mean(values: Tensor, fraction: float, worst: bool) -> float:
    """Mean of the lowest (`worst`) or highest `fraction` of values (at least one value)."""
    k = max(1, math.ceil(fraction * len(values)))
    ordered = values.sort(descending=not worst).values
    return float(ordered[:k].mean())


def distribution(values: Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}``: client mean; ``_std`` (population), ``_worst10``/``_best10``: mean of the tails."""
    v = values.double()
    if len(v) == 0:
        return {}
    return {
        prefix: float(v.mean()),
        f"{prefix}_std": float(v.std(unbiased=False)),
        f"{prefix}_worst10": tail_mean(v, 0.1, worst=True),
        f"{prefix}_best10": tail_mean(v, 0.1, worst=False),
    }


def pooled(values: Tensor, counts: Tensor) -> float:
    """Sample-weighted mean (as if all clients' samples were pooled)."""
    c = counts.double()
    return float((values.double() * c).sum() / c.sum().clamp_min(1))
