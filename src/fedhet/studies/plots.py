"""Figures of the analytic studies."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedhet.report.plots import save_figure
from fedhet.studies.mean_estimation import MAXFL_LOWER_BOUND, AppealCurve, fedavg_bound


def plot_two_client_curve(curve: AppealCurve, out: Path, bounds: bool = True, title: str = "") -> Path:
    """Expected GM-appeal against γ_G², with the two-client bounds of Lemma 2.1 and Theorem 2.1 (MaxFL Fig. 2a)."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    ax.plot(curve.gamma_g2, curve.fedavg, "o-", label="standard FL (FedAvg)")
    ax.plot(curve.gamma_g2, curve.maxfl_relu, "x--", label="MaxFL (ReLU)")
    ax.plot(curve.gamma_g2, curve.maxfl, "s-", label="MaxFL")
    if bounds:
        ax.plot(curve.gamma_g2, fedavg_bound(curve.gamma_g2), ":", color="grey", label="FedAvg bound 2exp(-γ_G²/5)")
        ax.axhline(MAXFL_LOWER_BOUND, color="black", linestyle=":", label="MaxFL bound e⁻¹/16")
    if title:
        ax.set_title(title, fontsize=10)
    ax.set_xlabel("heterogeneity γ_G²")
    ax.set_ylabel("expected GM-appeal")
    ax.set_ylim(0, 1)
    return save_figure(fig, ax, out)
