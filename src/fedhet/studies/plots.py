"""Figures of the analytic studies."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedhet.report.plots import same_as, save_figure
from fedhet.studies.mean_estimation import MAXFL_LOWER_BOUND, AppealCurve, fedavg_bound

TWO_CLIENTS = "Expected GM-appeal against heterogeneity, two clients (MaxFL Fig. 2a)"


def plot_two_client_curve(
    curve: AppealCurve, out: Path, bounds: bool = True, title: str = TWO_CLIENTS, runs: int = 0
) -> Path:
    """Expected GM-appeal against γ_G², with the two-client bounds of Lemma 2.1 and Theorem 2.1 (MaxFL Fig. 2a).
    `runs`: the Monte-Carlo draws behind each point (for the caption). A curve equal to an earlier one is named so
    in the legend ("= standard FL"); its markers keep both visible."""
    lines = {
        "standard FL (FedAvg)": (curve.fedavg, "o-"),
        "MaxFL (ReLU)": (curve.maxfl_relu, "x--"),
        "MaxFL": (curve.maxfl, "s-"),
    }
    notes = same_as({name: np.asarray(y) for name, (y, _) in lines.items()}, scale=1.0)
    fig, ax = plt.subplots(figsize=(7.5, 4.0), dpi=120)
    for name, (y, style) in lines.items():
        label = f"{name} ({notes[name]})" if name in notes else name
        ax.plot(curve.gamma_g2, y, style, label=label, markersize=5 if name in notes else 4)
    if bounds:
        ax.plot(curve.gamma_g2, fedavg_bound(curve.gamma_g2), ":", color="grey", label="FedAvg bound 2exp(-γ_G²/5)")
        ax.axhline(MAXFL_LOWER_BOUND, color="black", linestyle=":", label="MaxFL bound e⁻¹/16")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("heterogeneity γ_G² (squared half-distance between the clients' true means)")
    ax.set_ylabel("expected GM-appeal (share of clients)")
    ax.set_ylim(0, 1)
    draws = f"{runs:,} draws" if runs else "many draws"
    caption = (
        f"Each point: the mean over {draws} of the clients' empirical means (Monte Carlo; no band). GM-appeal: share "
        "of clients for whom the global model beats their own estimate. Bounds: Lemma 2.1 (FedAvg, upper) and "
        "Theorem 2.1 (MaxFL, lower)."
    )
    if not bounds:
        caption = caption.rsplit(" Bounds:", 1)[0]
    return save_figure(fig, ax, out, caption=caption)
