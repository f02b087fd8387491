"""The issue's performance targets, checked on a benchmark's rows (ratios measured in the same run)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class _Row(Protocol):
    workload: str
    backend: str
    median_s: float
    flop_fraction: float
    peak_mem_mb: float
    base_mem_mb: float
    ratio_to_naive: float | None
    ratio_to_flower: float | None
    ratio_to_best_backend: float | None


@dataclass(frozen=True)
class Target:
    """One target: what is asked, what was measured, and whether it is met (None: not measured)."""

    name: str
    goal: str
    measured: str
    met: bool | None


GIB = 1024.0


def _auto(rows: Sequence[_Row], workload: str) -> _Row | None:
    return next((r for r in rows if r.workload == workload and r.backend.startswith("auto")), None)


def _ratio(name: str, goal: str, row: _Row | None, value: float | None, at_least: float, unit: str = "×") -> Target:
    if row is None or value is None:
        return Target(name, goal, "not measured", None)
    text = f"{value:.2f}{unit}" if unit == "×" else f"{100 * value:.0f}%"
    return Target(name, goal, text, value >= at_least)


def check_targets(rows: Sequence[_Row]) -> list[Target]:
    """Every target of the performance issue that these rows measure (the others say "not measured")."""
    logreg, mlp = _auto(rows, "logreg"), _auto(rows, "mlp")
    out = [
        _ratio("logreg vs naive", "≥ 10×", logreg, logreg.ratio_to_naive if logreg else None, 10),
        _ratio("logreg vs Flower", "≥ 100×", logreg, logreg.ratio_to_flower if logreg else None, 100),
        _ratio("mlp FLOP rate", "≥ 50% of matmul", mlp, mlp.flop_fraction if mlp else None, 0.5, unit="%"),
        _ratio("mlp vs naive", "≥ 2×", mlp, mlp.ratio_to_naive if mlp else None, 2),
    ]
    autos = [r for r in rows if r.backend.startswith("auto") and r.ratio_to_best_backend is not None]
    if autos:
        worst = max(autos, key=lambda r: r.ratio_to_best_backend or 0.0)
        slow = worst.ratio_to_best_backend or 1.0
        text = f"worst {slow:.2f}× the best backend ({worst.workload}, {worst.backend})"
        out.append(Target("auto vs best backend", "≤ 1.10× on every workload", text, slow <= 1.10))
    else:
        out.append(Target("auto vs best backend", "≤ 1.10× on every workload", "not measured", None))
    sweep = sorted(
        (r for r in rows if r.workload.startswith("cohort-") and r.backend.startswith("auto")),
        key=lambda r: int(r.workload.split("-")[1]),
    )
    if len(sweep) >= 2:
        per_k = [
            (int(r.workload.split("-")[1]), (r.peak_mem_mb - r.base_mem_mb) / int(r.workload.split("-")[1]))
            for r in sweep
        ]
        text = ", ".join(f"{n}: {1000 * mb:.1f} MB" for n, mb in per_k) + " per 1,000 clients"
        # linear (or better): the largest cohort needs no more memory per client than the one before it (+50%)
        out.append(
            Target("memory linear in clients", "no super-linear growth", text, per_k[-1][1] <= 1.5 * per_k[-2][1])
        )
    else:
        out.append(Target("memory linear in clients", "no super-linear growth", "not measured", None))
    big = next((r for r in sweep if r.workload == "cohort-10000"), None)
    if big is None:
        out.append(Target("10,000 clients", "< 4 GiB", "not measured (full run only)", None))
    else:
        text = f"{big.peak_mem_mb / GIB:.2f} GiB peak (whole process)"
        out.append(Target("10,000 clients", "< 4 GiB", text, big.peak_mem_mb < 4 * GIB))
    return out
