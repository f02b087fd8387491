"""How different the clients' data are, without training (`fedhet describe`): label distributions, their distance
to the global one, client sizes, and a figure of it all.

For client k with label distribution p_k (the shares of its training samples in each class) and the global
distribution p (all clients' training samples pooled):

* total variation TV(p_k, p) = ½ Σ_c |p_kc − p_c|, in [0, 1];
* Jensen–Shannon distance JS(p_k, p) = √(½ KL(p_k ‖ m) + ½ KL(p ‖ m)), m = ½(p_k + p), logarithms base 2, in [0, 1]
  (Lin 1991; the square root is a metric, Endres & Schindelin 2003).

Both are 0 for an IID split and reach 1 for a client whose classes the others share none of.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from fedhet.report.plots import add_caption


def label_shares(counts: np.ndarray) -> np.ndarray:
    """(K, C) each client's class counts as shares of its samples (a client without samples: zeros)."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def global_shares(counts: np.ndarray) -> np.ndarray:
    """(C,) the class shares of all clients' samples pooled."""
    pooled = np.asarray(counts, dtype=np.float64).sum(axis=0)
    return pooled / max(pooled.sum(), 1.0)


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """½ Σ_c |p_c − q_c| along the last axis."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(axis=-1)


def js_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """√JSD(p, q) in bits along the last axis (0 · log 0 = 0)."""
    p, q = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64))
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        ratio = np.divide(a, m, out=np.ones_like(a), where=a > 0)
        return (a * np.log2(ratio)).sum(axis=-1)

    return np.sqrt(np.clip(0.5 * kl(p) + 0.5 * kl(q), 0.0, None))


@dataclass
class Heterogeneity:
    """One federation's clients, as `fedhet describe` reports them."""

    train_sizes: np.ndarray  # (K,)
    test_sizes: np.ndarray  # (K,)
    seen: np.ndarray  # (K,) bool
    counts: np.ndarray | None  # (K, C) training samples per class (None: a task without classes)
    groups: np.ndarray | None = None  # (K,) the shift's ground-truth group
    levels: np.ndarray | None = None  # (K,) the shift's level
    examples: list[tuple[str, np.ndarray]] | None = None  # a (C, H, W) training image of each group, with a caption
    group_names: tuple[str, ...] | None = None  # each group's name (a domain's), by group id

    @property
    def tv(self) -> np.ndarray | None:
        """(K,) each client's TV distance to the global label distribution."""
        if self.counts is None:
            return None
        return total_variation(label_shares(self.counts), global_shares(self.counts))

    @property
    def js(self) -> np.ndarray | None:
        """(K,) each client's Jensen–Shannon distance to the global label distribution."""
        if self.counts is None:
            return None
        return js_distance(label_shares(self.counts), global_shares(self.counts))

    def summary(self) -> list[tuple[str, str]]:
        """(what, value) lines: sizes, label skew, groups."""
        sizes = self.train_sizes
        lines = [
            ("clients", f"{len(sizes)} ({int(self.seen.sum())} train, {int((~self.seen).sum())} unseen)"),
            ("training samples", f"{int(sizes.sum())} (test {int(self.test_sizes.sum())})"),
            (
                "per client",
                f"min {int(sizes.min())}, median {np.median(sizes):g}, max {int(sizes.max())}, "
                f"coefficient of variation {sizes.std() / max(sizes.mean(), 1e-12):.3f}",
            ),
        ]
        if self.counts is not None and self.tv is not None and self.js is not None:
            present = (self.counts > 0).sum(axis=1)
            lines += [
                ("classes per client", f"mean {present.mean():.2f} of {self.counts.shape[1]} (min {present.min()})"),
                ("mean TV distance to global labels", f"{self.tv.mean():.4f} (max {self.tv.max():.4f})"),
                ("mean JS distance to global labels", f"{self.js.mean():.4f} (max {self.js.max():.4f})"),
            ]
        if self.groups is not None:
            for g in np.unique(self.groups).tolist():
                mine = self.groups == g
                level = ""
                if self.levels is not None:
                    values = np.unique(np.round(self.levels[mine], 6))
                    shown = f"{values[0]:g}" if len(values) == 1 else f"{values.min():g}..{values.max():g}"
                    level = f", level {shown}"
                name = f" ({self.group_names[g]})" if self.group_names is not None else ""
                lines.append((f"group {g}{name}", f"{int(mine.sum())} clients{level}"))
        return lines

    def csv_text(self) -> str:
        """A row per client: client, group, shift_level, seen, sizes, distances, training samples per class."""
        header = ["client"]
        header += ["group"] if self.groups is not None else []
        header += ["shift_level"] if self.levels is not None else []
        header += ["seen", "train_samples", "test_samples"]
        classes = 0 if self.counts is None else self.counts.shape[1]
        header += ["tv_distance", "js_distance", *[f"label_{c}" for c in range(classes)]] if classes else []
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        tv, js = self.tv, self.js
        for k in range(len(self.train_sizes)):
            row: list[object] = [k]
            row += [int(self.groups[k])] if self.groups is not None else []
            row += [f"{self.levels[k]:.6g}"] if self.levels is not None else []
            row += [int(self.seen[k]), int(self.train_sizes[k]), int(self.test_sizes[k])]
            if self.counts is not None and tv is not None and js is not None:
                row += [f"{tv[k]:.6f}", f"{js[k]:.6f}", *[int(c) for c in self.counts[k]]]
            writer.writerow(row)
        return out.getvalue()


def heterogeneity_figure(report: Heterogeneity, title: str) -> bytes:
    """A PNG: a heatmap of each client's label shares (clients × classes) beside a histogram of the clients'
    training sizes (the histogram alone for a task without classes)."""
    with_labels = report.counts is not None
    examples = report.examples or []
    fig = plt.figure(figsize=(11 if with_labels else 5.5, 6.6 if examples else 4.8))
    grid = fig.add_gridspec(2 if examples else 1, 2 if with_labels else 1, height_ratios=[3, 1.3] if examples else [1])
    axes = np.array([[fig.add_subplot(grid[0, i]) for i in range(2 if with_labels else 1)]])
    caption = "How many clients have how many training samples. Nothing was trained."
    if report.counts is not None and report.tv is not None:
        ax = axes[0, 0]
        shares = label_shares(report.counts)
        image = ax.imshow(shares, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"label shares per client (mean TV distance to global {report.tv.mean():.3f})", fontsize=10)
        ax.set_xlabel("class")
        ax.set_ylabel("client")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if shares.shape[1] <= 20:
            ax.set_xticks(range(shares.shape[1]))
        if report.groups is not None and len(shares) <= 40:
            ax.set_yticks(range(len(shares)), [f"{k} (g{g})" for k, g in enumerate(report.groups.tolist())])
            ax.set_ylabel("client (ground-truth group)")
        bar = fig.colorbar(image, ax=ax)
        bar.set_label("share of the client's training samples")
        caption = (
            "Left: a row per client, a column per class, coloured by the class's share of the client's training "
            "samples. Right: " + caption[0].lower() + caption[1:]
        )
    ax = axes[0, -1]
    ax.hist(report.train_sizes, bins=min(30, max(5, len(report.train_sizes) // 2)), color="#4c72b0")
    ax.set_title("client sizes", fontsize=10)
    ax.set_xlabel("training samples per client")
    ax.set_ylabel("clients")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if examples:
        strip = grid[1, :].subgridspec(1, len(examples))
        low = min(float(image.min()) for _, image in examples)
        high = max(float(image.max()) for _, image in examples)
        for i, (label, image) in enumerate(examples):
            shown = fig.add_subplot(strip[0, i])
            shown.imshow(_displayable(image, low, high), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            shown.set_title(label, fontsize=8)
            shown.set_axis_off()
        caption += " Bottom: a training image of each group as the shift made it, all on one grey (or colour) scale."
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    add_caption(fig, caption)
    image_bytes = io.BytesIO()
    fig.savefig(image_bytes, format="png", bbox_inches="tight", dpi=110)
    plt.close(fig)
    return image_bytes.getvalue()


def _displayable(image: np.ndarray, low: float, high: float) -> np.ndarray:
    """A (C, H, W) image as (H, W) grey or (H, W, 3) colour values in [0, 1], [low, high] stretched to [0, 1]."""
    scaled = (image - low) / (high - low) if high > low else np.zeros_like(image)
    return scaled[0] if scaled.shape[0] == 1 else np.moveaxis(scaled[:3], 0, -1)
