"""Checks that a figure reads well (issue 16 part 4), on the matplotlib objects that a plotting function saved: a
title, axes labelled in words, legends outside the data, integer ticks on round axes, a caption explaining any band,
and curves equal to another named so in the legend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

ROUND = "communication round"


@contextmanager
def kept_figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """The figures closed inside the block (plotting functions close what they save), kept open to inspect."""
    kept: list[Figure] = []
    real_close = plt.close

    def keep(fig: Any = None) -> None:
        if isinstance(fig, Figure):
            kept.append(fig)
        else:
            real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    try:
        yield kept
    finally:
        monkeypatch.setattr(plt, "close", real_close)


def words(text: str) -> bool:
    """A label in words: several letters, not a bare column name such as 'gm_appeal'."""
    return sum(c.isalpha() for c in text) >= 4 and ("_" not in text or " " in text.strip())


def data_axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if ax.lines or ax.patches or ax.images or ax.collections]


def caption(fig: Figure) -> str:
    return " ".join(t.get_text() for t in fig.texts)


def legend_texts(fig: Figure) -> list[str]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def check_figure(fig: Figure, rounds: bool = True) -> None:
    """The part-4 rules on `fig`; `rounds`: the bottom data axes' x is the communication round."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    axes = data_axes(fig)
    assert axes, "the figure shows nothing"
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""  # type: ignore[attr-defined]
    titles = [ax.get_title() for ax in axes if ax.get_title()]
    assert suptitle or titles, "no title"
    for title in [suptitle, *titles]:
        assert not title or words(title), title
    for ax in axes:
        assert words(ax.get_ylabel()) or not ax.get_yticklabels() or not ax.get_yticks().size, ax.get_ylabel()
    bottom = axes[-1]
    assert words(bottom.get_xlabel()), bottom.get_xlabel()
    for ax in axes:
        if ax.get_xlabel() == ROUND:
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    if rounds:
        assert any(ax.get_xlabel() == ROUND for ax in axes)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in axes:
            area = ax.get_window_extent(renderer)
            overlap_w = min(box.x1, area.x1) - max(box.x0, area.x0)
            overlap_h = min(box.y1, area.y1) - max(box.y0, area.y0)
            assert overlap_w <= 1 or overlap_h <= 1, "a legend lies on the data"
    bands = any(type(c).__name__ == "FillBetweenPolyCollection" for ax in axes for c in ax.collections)
    if bands:
        assert "band" in caption(fig) or "violin" in caption(fig), "a band without a caption saying what it is"
    assert caption(fig) or titles, "no caption"


def marked(fig: Figure, name: str, other: str) -> bool:
    """Whether the legend names `name` as equal (or indistinguishable) to `other`."""
    return any(t.startswith(name) and (f"= {other})" in t or f"≈ {other})" in t) for t in legend_texts(fig))
