"""Figures of runs (fedhet plot / compare --plot) and of recipes (mean over seeds): read as the issue asks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from fedhet.errors import ConfigError
from fedhet.report.labels import metric_info
from fedhet.report.plots import draw_lines, plot_curves, plot_mean_curves, same_as
from fedhet.report.runs import RunGroup, RunRecord, run_labels
from helpers.figures import check_figure, kept_figures, legend_texts, marked


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def record(path: str, algorithm: str, seed: int, accuracy: list[float], **params: float) -> RunRecord:
    rows = [{"round": float(r + 1), "test_accuracy": a, "participants": 3.0} for r, a in enumerate(accuracy)]
    config = {"algorithm": {"name": algorithm, **params}, "dataset": {"name": "digits"}, "seed": seed, "rounds": 3}
    return RunRecord(Path(path), {"rounds": len(rows), "final": rows[-1]}, rows, config)


def test_same_as_names_equal_and_indistinguishable_curves() -> None:
    curves = {"a": np.array([0.1, 0.2, 0.3]), "b": np.array([0.1, 0.2, 0.3]), "c": np.array([0.1, 0.2, 0.301])}
    assert same_as(curves, scale=1.0) == {"b": "= a", "c": "≈ a"}
    assert same_as(curves, scale=0.01) == {"b": "= a"}  # on an axis 0.01 high, 0.001 apart shows
    assert same_as({"a": np.array([np.nan, 1.0]), "b": np.array([np.nan, 1.0])}, 1.0) == {"b": "= a"}
    assert same_as({"a": np.array([0.0, 1.0]), "b": np.array([0.0, 2.0])}, 1.0) == {}


def test_run_curves_are_labelled_by_what_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [
        record("runs/fedavg_digits_seed0_1717", "fedavg", 0, [0.2, 0.4, 0.5]),
        record("runs/fedprox_digits_seed0_1718", "fedprox", 0, [0.2, 0.4, 0.5], mu=0.01),
        record("runs/fedprox_digits_seed1_1719", "fedprox", 1, [0.1, 0.3, 0.45], mu=0.1),
    ]
    for rec, label in zip(records, run_labels(records), strict=True):
        rec.label = label
    with kept_figures(monkeypatch) as figures:
        plot_curves(records, "test_accuracy", tmp_path / "plot.png")
    (fig,) = figures
    check_figure(fig)
    assert fig.axes[0].get_title() == metric_info("test_accuracy").title
    assert legend_texts(fig)[0] == "fedavg, seed 0"
    assert marked(fig, "fedprox mu=0.01, seed 0", "fedavg, seed 0")  # equal curves: named, not hidden
    assert "All runs: fedavg" not in fig.texts[0].get_text() and "dataset digits" in fig.texts[0].get_text()
    with pytest.raises(ConfigError, match="no run has metric 'nope'"):
        plot_curves(records, "nope", tmp_path / "x.png")


def test_mean_curves_band_is_clipped_and_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = {m: [5.0, 10.0, 15.0] for m in ("FedAvg", "FedProx", "MaxFL")}
    curves = {
        "FedAvg": [[0.9, 0.95, 1.0], [0.5, 0.6, 0.8]],
        "FedProx": [[0.9, 0.95, 1.0], [0.5, 0.6, 0.8]],
        "MaxFL": [[0.2, 0.3, 0.4], [0.25, 0.35, 0.45]],
    }
    with kept_figures(monkeypatch) as figures:
        plot_mean_curves(curves, rounds, "gm_appeal", tmp_path / "f.png", context="maxfl-table1: MaxFL Table 1.")
    (fig,) = figures
    check_figure(fig)
    ax = fig.axes[0]
    assert ax.get_title() == "Global-model appeal (GM-appeal)"  # the quantity, not the recipe
    assert ax.get_ylabel() == "GM-appeal (share of clients)"
    text = fig.texts[0].get_text()
    assert "mean over 2 seeds" in text and "± 1 standard deviation" in text and "[0, 1]" in text
    assert "maxfl-table1" in text
    assert marked(fig, "FedProx", "FedAvg")
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() <= 1.0 + 1e-12  # mean + std reaches 1.18 at round 15: clipped to the metric's range
    assert band.max() == pytest.approx(1.0)


def test_counts_get_integer_ticks_from_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with kept_figures(monkeypatch) as figures:
        plot_mean_curves({"a": [[3.0, 3.0, 3.0]]}, {"a": [1.0, 2.0, 3.0]}, "participants", tmp_path / "p.png")
    (fig,) = figures
    check_figure(fig)
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low <= 0 <= 3 <= high
    assert all(float(t).is_integer() for t in ax.get_yticks())
    assert "one seed (no band)" in fig.texts[0].get_text()


def test_identical_lines_stay_visible() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    notes = draw_lines(ax, {"a": ([1, 2], np.array([1.0, 2.0])), "b": ([1, 2], np.array([1.0, 2.0]))})
    assert notes == {"b": "= a"}
    first, second = ax.lines
    assert second.get_label() == "b (= a)" and second.get_marker() == "o" and second.get_linestyle() == "--"
    assert second.get_zorder() > first.get_zorder()
    plt.close(fig)


def test_groups_of_seeds_are_mean_lines_with_std_bands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = [record(f"s{s}", "fedavg", s, [0.1 + 0.1 * s, 0.3, 0.5 + 0.1 * s], mu=0.0) for s in range(3)]
    fast = [record(f"f{s}", "fedprox", s, [0.4, 0.6 + 0.05 * s, 0.7]) for s in range(2)]
    groups = [RunGroup("slow", slow), RunGroup("fast", fast)]
    with kept_figures(monkeypatch) as figs:
        plot_curves(groups, "test_accuracy", tmp_path / "groups.png")
    (fig,) = figs
    check_figure(fig)
    ax = fig.axes[0]
    assert legend_texts(fig) == ["slow", "fast"]
    assert np.allclose(ax.lines[0].get_ydata(), [0.2, 0.3, 0.6])  # the mean over 3 seeds
    assert len(ax.collections) == 2  # a band per group of several seeds
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert np.isclose(band.max(), 0.6 + 0.1)  # mean + std at round 3 (0.5, 0.6, 0.7: std 0.1)
    text = " ".join(t.get_text() for t in fig.texts)
    assert "One line per configuration" in text and "the mean over its 2/3 seeds" in text and "± 1 standard" in text


def test_long_labels_go_below_the_axes_and_the_caption_below_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [record(f"r{i}", "fedavg", i, [0.1 * i, 0.2 * i, 0.3 * i]) for i in range(1, 5)]
    groups = [RunGroup(f"method {i} with a rather long name, lr=0.{i}", [r]) for i, r in enumerate(runs)]
    with kept_figures(monkeypatch) as figs:
        plot_curves(groups, "test_accuracy", tmp_path / "long.png", target=0.5, logx=True)
    (fig,) = figs
    check_figure(fig, rounds=False)  # no legend on the data
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = ax.get_legend().get_window_extent(renderer)
    area = ax.get_window_extent(renderer)
    assert legend.y1 < area.y0 and legend.x1 <= fig.bbox.x1 + 1  # below the axes, within the figure's width
    assert fig.texts[0].get_window_extent(renderer).y1 <= legend.y0 + 1  # the caption under the legend
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "communication round (log scale)"
    assert ax.xaxis.get_major_formatter()(10.0, 0) == "10"
    target = [line for line in ax.lines if line.get_label() == "target 0.5"]
    assert target and np.allclose(target[0].get_ydata(), 0.5) and "target 0.5" in legend_texts(fig)
    assert "Dashed grey line: the target 0.5" in fig.texts[0].get_text()
    short = [RunGroup("fedavg", runs[:1]), RunGroup("ditto", runs[1:2])]
    with kept_figures(monkeypatch) as figs:
        plot_curves(short, "test_accuracy", tmp_path / "short.png")
    (fig,) = figs
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend, area = fig.axes[0].get_legend().get_window_extent(renderer), fig.axes[0].get_window_extent(renderer)
    assert legend.x0 >= area.x1  # short names: a column beside the axes
