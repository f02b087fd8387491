"""Figures (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedhet.errors import ConfigError
from fedhet.report.runs import RunRecord, metric_names


def save_figure(fig: Figure, ax: Axes, out: Path, legend: bool = True) -> Path:
    """Grid, legend, tight layout, write `out` (creating its folder) and close the figure."""
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_curves(records: list[RunRecord], metric: str, out: Path, title: str | None = None) -> Path:
    """One line per run: `metric` against the round; saved as PNG (or any format matplotlib knows)."""
    available = metric_names(records)
    if metric not in available:
        raise ConfigError(f"no run has metric '{metric}'; available: {', '.join(available)}")
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for rec in records:
        x, y = rec.curve(metric)
        ax.plot(x, y, label=rec.label, linewidth=1.5)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.set_title(title or metric)
    return save_figure(fig, ax, out, legend=len(records) > 1)


def plot_mean_curves(
    curves: dict[str, list[list[float]]],
    rounds: dict[str, list[float]],
    metric: str,
    out: Path,
    title: str | None = None,
) -> Path:
    """Mean over seeds (line) and ±1 std (band) of `metric` per method."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for method, per_seed in curves.items():
        arr = np.asarray(per_seed, dtype=float)
        x = rounds[method][: arr.shape[1]]
        mean, std = arr.mean(0), arr.std(0)
        ax.plot(x, mean, label=method, linewidth=1.5)
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.set_title(title or metric, fontsize=9)
    return save_figure(fig, ax, out)
