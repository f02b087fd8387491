"""Figures (matplotlib, headless) that a reader can take in without the code: a title naming the plotted quantity,
axes labelled in words, legends beside the data, a caption saying what lines and bands are, and curves that lie on
top of each other marked ("= FedAvg") and drawn so that both show."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator

from fedhet.atomic import write_bytes
from fedhet.errors import ConfigError
from fedhet.report.labels import MetricInfo, metric_info
from fedhet.report.runs import RunGroup, RunRecord, as_groups, common_description, metric_names

ROUND_LABEL = "communication round"
TIME_LABEL = "simulated time (s)"
X_AXES = {"round": "round", "time": "time_s"}  # `fedhet plot --x`: the column each choice reads
WIDTH = 8.0  # inches: the axes and a legend column beside them


def save_figure(fig: Figure, ax: Axes, out: Path, legend: bool = True, caption: str = "") -> Path:
    """Grid, a legend outside the axes (right, or below for many or long labels: `outside_legend`), a caption
    below everything, write `out` (creating its folder), close."""
    kind = out.suffix.lower().lstrip(".")
    formats = fig.canvas.get_supported_filetypes()
    if kind not in formats:
        plt.close(fig)
        raise ConfigError(
            f"cannot write '{out}': '{out.suffix or out.name}' is not an image format matplotlib writes; end the file "
            f"name in one of: {', '.join('.' + k for k in sorted(formats))}"
        )
    ax.grid(alpha=0.3)
    fig.tight_layout()  # before the legend: the axes keep their size, the saved image grows to hold the legend
    if legend:
        outside_legend(ax)
    add_caption(fig, caption)
    return write_figure(fig, out, kind)


def write_figure(fig: Figure, out: Path, kind: str = "png") -> Path:
    """Render `fig` as `kind` and write it to `out` atomically (creating its folder), then close it."""
    image = io.BytesIO()
    fig.savefig(image, format=kind, bbox_inches="tight")
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(out, image.getbuffer())
    return out


LEGEND_BESIDE = 32  # characters: a legend whose labels are all this short, and at most `LEGEND_ROWS`, goes beside
LEGEND_ROWS = 14


def outside_legend(ax: Axes, **kwargs: Any) -> None:
    """The legend of `ax` outside it, so that it never hides data: a column to its right, or, for long labels or
    many of them, columns under the axes (as wide as the axes, the figure keeps its width)."""
    _, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    longest = max(len(text) for text in labels)
    if longest <= LEGEND_BESIDE and len(labels) <= LEGEND_ROWS:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, frameon=False, **kwargs)
        return
    width = ax.get_position().width * ax.figure.bbox.width / ax.figure.dpi  # inches
    columns = max(1, min(len(labels), int(width / (0.35 + 0.062 * longest))))  # 8-point type: ~0.062 in a character
    below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.14), "ncol": columns}
    ax.legend(**{**below, "borderaxespad": 0.0, "fontsize": 8, "frameon": False, **kwargs})


def add_caption(fig: Figure, caption: str) -> None:
    """`caption` in small type under the figure and any legend below the axes (kept in the saved image by
    ``bbox_inches='tight'``)."""
    if not caption:
        return
    bottom = 0.0
    legends = [lg for ax in fig.axes if (lg := ax.get_legend()) is not None]
    if legends:
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        to_figure = fig.transFigure.inverted()
        bottom = min(bottom, *(lg.get_window_extent(renderer).transformed(to_figure).y0 - 0.02 for lg in legends))
    fig.text(0.01, bottom, caption, ha="left", va="top", fontsize=7.5, wrap=True, color="0.25")


def check_target(target: float | None) -> None:
    """Refuse a target that no curve can reach or be drawn at (inf, nan), in one line."""
    if target is not None and not math.isfinite(target):
        raise ConfigError(f"--target {target}: give a finite number, e.g. --target 0.8")


def target_line(ax: Axes, target: float | None) -> None:
    """A horizontal dashed line at `target` (the accuracy to reach), named in the legend."""
    if target is not None:
        ax.axhline(target, color="0.35", linestyle=(0, (6, 3)), linewidth=1.0, label=f"target {target:g}", zorder=1)


def log_x(ax: Axes, on: bool) -> str:
    """A logarithmic x-axis with `on` (points at x ≤ 0, a round 0, are not drawn); what the caption says of it."""
    if not on:
        return ""
    ax.set_xscale("log", nonpositive="mask")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, not 2×10¹
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel(f"{ax.get_xlabel()} (log scale)")
    return " x: log scale (points at 0 not drawn)."


def round_axis(ax: Axes, x: str = "round") -> None:
    """x is the communication round (labelled so, integer ticks) or, with `x` "time", the simulated clock."""
    if x == "time":
        ax.set_xlabel(TIME_LABEL)
        return
    ax.set_xlabel(ROUND_LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def x_column(x: str, records: list[RunRecord]) -> str:
    """The metrics.csv column of x-axis `x`, refused in one line where no run has it (time needs a system model)."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x}: choose one of {', '.join(X_AXES)}")
    column = X_AXES[x]
    if column != "round" and not any(column in row for rec in records for row in rec.rows):
        raise ConfigError(
            "--x time: no run has a simulated clock (time_s); run with a system model, e.g. --set system=lognormal"
        )
    return column


def metric_axis(ax: Axes, info: MetricInfo) -> None:
    """y is metric `info`: its label in words, integer ticks for counts."""
    ax.set_ylabel(info.label)
    if info.count:  # from 0, with room for a few integer ticks even when every curve is flat
        top = max(math.ceil(ax.get_ylim()[1]), 1)
        ax.set_ylim(-0.03 * top, 1.05 * top + 0.3)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def colours(n: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def same_as(curves: dict[str, np.ndarray], scale: float) -> dict[str, str]:
    """For each curve equal to an earlier one, "= <earlier>" (equal to rounding) or "≈ <earlier>" (nowhere more
    than 1% of the axis range `scale` apart: a few pixels, one line hides the other on the figure)."""
    notes: dict[str, str] = {}
    names = list(curves)
    for i, name in enumerate(names):
        for other in names[:i]:
            if other in notes:
                continue
            a, b = curves[name], curves[other]
            if a.shape != b.shape:
                continue
            if np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True):
                notes[name] = f"= {other}"
                break
            both = ~(np.isnan(a) | np.isnan(b))
            if (np.isnan(a) == np.isnan(b)).all() and both.any() and np.abs(a[both] - b[both]).max() <= 0.01 * scale:
                notes[name] = f"≈ {other}"
                break
    return notes


def draw_lines(
    ax: Axes,
    series: Mapping[str, tuple[Sequence[float], Any]],
    bands: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    styles: Mapping[str, str] | None = None,
    colour: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """One line per entry of `series` (name → x, y), with optional bands (name → low, high). A line equal to an
    earlier one is labelled "name (= other)" and drawn dashed with markers on top, so both stay visible. Returns the
    notes ({name: "= other"})."""
    values = np.concatenate([np.asarray(y, dtype=float).ravel() for _, y in series.values()] or [np.zeros(1)])
    finite = values[np.isfinite(values)]
    scale = float(np.ptp(finite)) if len(finite) else 1.0
    notes = same_as({n: np.asarray(y, dtype=float) for n, (_, y) in series.items()}, scale or 1.0)
    palette = colours(len(series))
    for i, (name, (x, y)) in enumerate(series.items()):
        c = (colour or {}).get(name, palette[i])
        style = (styles or {}).get(name, "-" if i < 10 else "--")
        kwargs: dict[str, Any] = {"color": c, "linewidth": 1.5, "linestyle": style, "label": name}
        if name in notes:
            kwargs.update(
                linestyle=(0, (4, 3)),
                marker="o",
                markevery=max(1, len(x) // 12),
                markersize=3.5,
                zorder=3,
                label=f"{name} ({notes[name]})",
            )
        ax.plot(x, y, **kwargs)
        if bands is not None and name in bands:
            low, high = bands[name]
            ax.fill_between(x, low, high, color=c, alpha=0.15, linewidth=0)
    return notes


def clip(values: np.ndarray, info: MetricInfo) -> np.ndarray:
    """`values` clipped to the metric's range (a band never shows an accuracy above 1 or a negative loss)."""
    low = -np.inf if info.low is None else info.low
    high = np.inf if info.high is None else info.high
    return np.clip(values, low, high)


def range_text(info: MetricInfo) -> str:
    """ ", clipped to [0, 1]" / ", clipped at 0" for a metric with a range, "" without."""
    if info.low is not None and info.high is not None:
        return f", clipped to the metric's range [{info.low:g}, {info.high:g}]"
    if info.low is not None:
        return f", clipped at {info.low:g} (the metric's lowest value)"
    if info.high is not None:
        return f", clipped at {info.high:g} (the metric's highest value)"
    return ""


def band_caption(seeds: int, info: MetricInfo) -> str:
    """What the lines and bands of a mean-over-seeds figure are."""
    if seeds <= 1:
        return "Lines: one seed (no band)."
    return f"Lines: mean over {seeds} seeds; bands: ± 1 standard deviation over seeds{range_text(info)}."


def plot_curves(
    records: list[RunRecord] | list[RunGroup],
    metric: str,
    out: Path,
    title: str | None = None,
    x: str = "round",
    target: float | None = None,
    logx: bool = False,
) -> Path:
    """One line per run, or per group of seeds (`RunGroup`: the mean over its seeds, with a band of ± 1 std):
    `metric` against the round (or, `x` "time", the simulated clock: a group's mean time at each round), each
    labelled by its ``label`` (`read_runs`/`read_groups` set it: the method and what distinguishes it), with a
    dashed line at `target` and, with `logx`, a logarithmic x-axis; saved as PNG (or any format matplotlib knows)."""
    check_target(target)
    groups = as_groups(records)
    runs = [r for g in groups for r in g.runs]
    available = metric_names(runs)
    if metric not in available:
        raise ConfigError(f"no run has metric '{metric}'; available: {', '.join(available)}")
    info = metric_info(metric)
    column = x_column(x, runs)
    fig, ax = plt.subplots(figsize=(WIDTH, 4.0), dpi=120)
    series: dict[str, tuple[Sequence[float], np.ndarray]] = {}
    bands: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for group in groups:
        xs, mean, std = group_curve(group, metric, column)
        series[group.label] = (xs, mean)
        if std is not None:
            bands[group.label] = (clip(mean - std, info), clip(mean + std, info))
    draw_lines(ax, series, bands)
    target_line(ax, target)
    round_axis(ax, x)
    metric_axis(ax, info)
    scale = log_x(ax, logx)
    ax.set_title(title or info.title)
    common = common_description(runs)
    seeds = max(g.seeds for g in groups)
    differ = " (named by its method and what differs between the configs)" if len(groups) > 1 else ""
    if seeds > 1:
        counts = "/".join(map(str, sorted({g.seeds for g in groups})))
        caption = (
            f"One line per configuration{differ}: the mean over its {counts} seeds; bands: ± 1 standard deviation "
            f"over seeds{range_text(info)}."
        )
        if x == "time":
            caption += " x: the mean over seeds of the simulated time at each round."
    else:
        caption = "One line per run" + differ + "."
    caption += scale
    if target is not None:
        caption += f" Dashed grey line: the target {target:g}."
    caption += f" All runs: {common}." if common else ""
    if info.description:
        caption += f" {metric}: {info.description}."
    return save_figure(fig, ax, out, legend=True, caption=caption)


def group_curve(group: RunGroup, metric: str, column: str) -> tuple[list[float], np.ndarray, np.ndarray | None]:
    """A group's x values, its mean of `metric` over its seeds and their std (None for one run), over the
    evaluated rounds that every seed has (NaN where a seed lacks the metric)."""
    if group.seeds == 1:
        xs, y = group.runs[0].curve(metric, column)
        return xs, np.asarray(y, dtype=float), None
    common = sorted(set.intersection(*({row["round"] for row in r.rows if metric in row} for r in group.runs)))
    values = np.full((group.seeds, len(common)), np.nan)
    where = np.full((group.seeds, len(common)), np.nan)
    for i, run in enumerate(group.runs):
        by_round = {row["round"]: row for row in run.rows}
        for j, round_ in enumerate(common):
            values[i, j] = by_round[round_].get(metric, np.nan)
            where[i, j] = by_round[round_].get(column, np.nan)
    at = np.nanmean(where, 0) if column != "round" else np.asarray(common, dtype=float)
    return [float(v) for v in at], np.nanmean(values, 0), np.nanstd(values, 0, ddof=1)


def plot_mean_curves(
    curves: dict[str, list[list[float]]],
    rounds: dict[str, list[float]],
    metric: str,
    out: Path,
    title: str | None = None,
    context: str = "",
    yscale: str = "linear",
    x: str = "round",
) -> Path:
    """Mean over seeds (line) and ± 1 std over seeds (band, clipped to the metric's range) of `metric` per method.
    The title names the quantity (`title` or the metric's); `context` (the recipe, the data) goes in the caption;
    `yscale` "log" for losses spanning decades (FedMGDA+ Fig. 7); `x` "time": `rounds` hold simulated seconds."""
    info = metric_info(metric)
    fig, ax = plt.subplots(figsize=(WIDTH, 4.0), dpi=120)
    series: dict[str, tuple[Sequence[float], np.ndarray]] = {}
    bands: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seeds = 0
    for method, per_seed in curves.items():
        length = min(len(c) for c in per_seed)
        arr = np.asarray([c[:length] for c in per_seed], dtype=float)
        mean = arr.mean(0)
        series[method] = (rounds[method][:length], mean)
        seeds = max(seeds, len(arr))
        if len(arr) > 1:
            std = arr.std(0, ddof=1)
            low = clip(mean - std, info)
            if yscale == "log":  # no lower edge at or below 0 on a log axis: the band is left out there
                low = np.where(low > 0, low, np.nan)
            bands[method] = (low, clip(mean + std, info))
    draw_lines(ax, series, bands)
    round_axis(ax, x)
    metric_axis(ax, info)
    ax.set_yscale(yscale)
    if yscale == "log":
        ax.set_ylabel(f"{info.label} (log scale)")
    ax.set_title(title or info.title)
    caption = band_caption(seeds, info)
    if yscale == "log" and seeds > 1:
        caption += " Where mean − std ≤ 0 the band is not drawn (log scale)."
    if info.description:
        caption += f" {metric}: {info.description}."
    if context:
        caption += f" {context}"
    return save_figure(fig, ax, out, caption=caption)


def plot_violins(
    groups: dict[str, list[float]], out: Path, title: str, ylabel: str, caption: str = "", xlabel: str = "method"
) -> Path:
    """One violin per group with its points on top and σ (std over the points) in the tick label: the
    distribution of per-user accuracy (FedMGDA+ Fig. 3). Groups without finite values are left out."""
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
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    shape = "Each violin: the distribution of the points (one per user), its horizontal line the mean; dots: the points"
    shape += "; σ: their standard deviation."
    return save_figure(fig, ax, out, legend=False, caption=f"{shape} {caption}".strip())
