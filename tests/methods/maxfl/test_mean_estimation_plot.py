"""The mean-estimation figure reads well: title, words on the axes, equal curves named, legend beside the data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from fedhet.methods.maxfl.mean_estimation import AppealCurve, plot_two_client_curve
from helpers.figures import caption, check_figure, kept_figures, marked


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def test_two_client_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = np.linspace(0, 20, 5)
    fedavg = np.exp(-grid / 3)
    curve = AppealCurve(grid, fedavg, fedavg.copy(), np.maximum(fedavg, 0.2))
    with kept_figures(monkeypatch) as figures:
        plot_two_client_curve(curve, tmp_path / "two.png", runs=2000)
        plot_two_client_curve(curve, tmp_path / "three.png", bounds=False, title="Expected GM-appeal, three clients")
    two, three = figures
    for fig in figures:
        check_figure(fig, rounds=False)
    assert marked(two, "MaxFL (ReLU)", "standard FL (FedAvg)")
    assert "2,000 draws" in caption(two) and "Lemma 2.1" in caption(two)
    assert "Lemma" not in caption(three) and three.axes[0].get_title() == "Expected GM-appeal, three clients"
