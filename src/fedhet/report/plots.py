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
    yscale: str = "linear",
) -> Path:
    """Mean over seeds (line) and ±1 std (band) of `metric` per method; `yscale` "log" for losses spanning
    decades (FedMGDA+ Fig. 7)."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for method, per_seed in curves.items():
        arr = np.asarray(per_seed, dtype=float)
        x = rounds[method][: arr.shape[1]]
        mean, std = arr.mean(0), arr.std(0)
        ax.plot(x, mean, label=method, linewidth=1.5)
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(metric + (" (log scale)" if yscale == "log" else ""))
    ax.set_yscale(yscale)
    ax.set_title(title or metric, fontsize=9)
    return save_figure(fig, ax, out)


def plot_violins(groups: dict[str, list[float]], out: Path, title: str, ylabel: str) -> Path:
    """One violin per group with its points on top and σ (std over the points) in the tick label: the
    distribution of per-user accuracy (FedMGDA+ Fig. 3). Groups without finite values are left out."""
    import numpy as np

    data = {name: np.asarray(v, dtype=float) for name, v in groups.items()}
    data = {name: v[np.isfinite(v)] for name, v in data.items() if np.isfinite(v).any()}
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(data) + 1), 4.4), dpi=120)
    if data:
        positions = np.arange(1, len(data) + 1)
        ax.violinplot(list(data.values()), positions=positions, showmeans=True, showextrema=False)
        jitter = np.random.default_rng(0)  # fixed: the same figure for the same numbers
        for pos, values in zip(positions, data.values(), strict=True):
            ax.scatter(pos + jitter.uniform(-0.12, 0.12, len(values)), values, s=4, alpha=0.5, color="black")
        ax.set_xticks(positions)
        labels = [f"{name}\nσ = {np.std(values):.3f}" for name, values in data.items()]
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, ax, out, legend=False)
