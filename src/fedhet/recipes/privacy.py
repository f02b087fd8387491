"""Client-level differential privacy across methods: test accuracy against ε for FedAvg, FedProx and MaxFL.

scikit-learn's digits (embedded), logistic regression, 100 clients of Dirichlet(0.1) label skew, 20 clients a round
(Poisson sampling, q = 0.2), 100 rounds of 10 local steps. Each method runs without DP (its plain form), with
clipping alone (C = 0.5, no noise: ε = ∞), and under DP-FedAvg's mechanism at ε = 32 down to 1 (δ = 1e-5, RDP
accountant): the `dp` wrapper clips every update to C on the clients, the server adds N(0, (zC max_k p_k)²) to the
aggregate, and z is set before the run from the target ε (``privacy.target_epsilon``). FedAvg and FedProx weigh
clients uniformly (DP-FedAvg's choice: weighting by samples would multiply the noise by m max_k p_k); MaxFL weighs
them by appeal and pays for its largest weight. MaxFL's weights read the clients' losses, which the accountant does
not cover (docs/privacy.md).

The table gives, per ε, each method's final test accuracy (mean ± std over seeds), its worst 10% of clients, the
clients of the smallest training sets (first size quartile) and those whose updates were clipped in at least half
of their rounds; the figure plots accuracy and worst-10% accuracy against ε.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.experiments.executor import Executor, Outcome, Task, raise_failures
from fedhet.experiments.naming import safe_name
from fedhet.experiments.reproduce import Recipe, deep_merge, mean_std, register_recipe
from fedhet.report.tables import markdown_table

SETTING: dict[str, Any] = {
    "dataset": "digits",
    "model": "logistic",
    "partition": {"name": "dirichlet", "alpha": 0.1, "min_size": 10},
    "num_clients": 100,
    "clients_per_round": 20,
    "rounds": 100,
    "eval_every": 10,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
    "requirements": {"steps": 50},  # MaxFL's ρ_k: each client's own model after 50 local steps
}
QUICK: dict[str, Any] = {"rounds": 20, "eval_every": 5}
BASES: dict[str, dict[str, Any]] = {
    "FedAvg": {"name": "fedavg", "weighting": "uniform"},
    "FedProx": {"name": "fedprox", "mu": 0.1, "weighting": "uniform"},  # μ from the paper's grid {0.001, ..., 1}
    "MaxFL": {"name": "maxfl"},
}
CLIP = 0.5  # C: about the median update norm of the first rounds without DP
EPSILONS = (32.0, 16.0, 8.0, 4.0, 2.0, 1.0)
QUICK_EPSILONS = (8.0, 2.0)
NON_PRIVATE, CLIP_ONLY = "no DP", "clipping only (ε = ∞)"
COLUMNS = {
    "test_accuracy": "test accuracy",
    "test_accuracy_worst10": "worst 10%",
    "test_accuracy_size_q1": "smallest clients (size q1)",
    "test_accuracy_clipped_often": "often-clipped clients",
}


def levels(quick: bool) -> dict[str, float | None]:
    """The privacy levels: a label → the target ε (None: no noise, ∞ for clipping only)."""
    chosen = QUICK_EPSILONS if quick else EPSILONS
    return {NON_PRIVATE: None, CLIP_ONLY: math.inf, **{f"ε = {e:g}": e for e in chosen}}


def cell(base: dict[str, Any], target: float | None) -> dict[str, Any]:
    """The config changes of one method at one privacy level. Without DP the method runs in the wrapper with no
    bound and no noise (the bare method, tests/privacy/test_strategy.py), so its runs report the same client groups."""
    dp = {"name": "dp", "base": base, "clip": CLIP, "sampling": "poisson"}
    if target is None:
        return {"algorithm": {**dp, "clip": math.inf, "noise_multiplier": 0.0}}
    if math.isinf(target):
        return {"algorithm": {**dp, "noise_multiplier": 0.0}}
    return {"algorithm": dp, "privacy": {"target_epsilon": target}}


def tasks(out: Path, quick: bool, seeds: tuple[int, ...], changes: dict[str, Any] | None = None) -> list[Task]:
    setting = deep_merge(SETTING, QUICK) if quick else SETTING
    setting = deep_merge(setting, changes or {})
    return [
        Task(
            {**deep_merge(setting, cell(base, target)), "seed": seed},
            out / safe_name(method) / safe_name(level) / f"seed{seed}",
            f"{method}, {level}, seed {seed}",
            {"recipe": "dp-digits", "method": method, "level": level, "seed": seed},
        )
        for method, base in BASES.items()
        for level, target in levels(quick).items()
        for seed in seeds
    ]


def values(outcomes: list[Outcome]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(method, level) → metric → one final value per seed."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for outcome in outcomes:
        key = (outcome.task.meta["method"], outcome.task.meta["level"])
        final = outcome.final if outcome.ok else {}
        for metric in (*COLUMNS, "dp_epsilon", "dp_noise_multiplier"):
            out.setdefault(key, {}).setdefault(metric, []).append(float(final.get(metric, math.nan)))
    return out


def privacy_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
) -> str:
    """Every method at every privacy level over `seeds`: the tables (markdown) and accuracy_vs_epsilon.png."""
    del embedded  # the digits are embedded
    outcomes = (executor or Executor(1)).run(tasks(out, quick, seeds, changes))
    found = values(outcomes)
    labels = list(levels(quick))
    text = f"### {DESCRIPTION}\n\nseeds: {', '.join(map(str, seeds))}" + (" (quick)" if quick else "")
    text += f"; C = {CLIP}, Poisson sampling q = 0.2, δ = 1e-5, RDP accountant; mean ± std over seeds\n"
    for metric, title in COLUMNS.items():
        rows = [[level, *(mean_std(found[(m, level)][metric]) for m in BASES)] for level in labels]
        text += f"\n#### {title}\n\n" + markdown_table(["privacy", *BASES], rows)
    noise = [[level, *(mean_std(found[(m, level)]["dp_noise_multiplier"]) for m in BASES)] for level in labels[2:]]
    text += "\n#### noise multiplier z set by the target ε\n\n" + markdown_table(["privacy", *BASES], noise)
    plot_accuracy_against_epsilon(found, labels, out / "accuracy_vs_epsilon.png", len(seeds))
    raise_failures(outcomes)  # a run that diverged under the noise leaves a gap, as in every recipe
    return text


def plot_accuracy_against_epsilon(
    found: dict[tuple[str, str], dict[str, list[float]]], labels: list[str], out: Path, seeds: int
) -> Path:
    """Mean test accuracy (left) and worst-10% accuracy (right) against ε (log scale), ± 1 std over seeds as error
    bars; each method's accuracy without DP as a dotted line of its colour."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import add_caption, outside_legend, write_figure

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0), dpi=120, sharey=True)
    private = [label for label in labels if label.startswith("ε")]
    eps = [float(label.split("=")[1]) for label in private]
    styles = [("o", "-", ":"), ("s", "--", (0, (1, 3))), ("^", "-.", (0, (3, 3)))]
    for ax, metric, title in zip(
        axes, ("test_accuracy", "test_accuracy_worst10"), ("all clients", "worst 10% of clients"), strict=True
    ):
        private_drawn: dict[str, np.ndarray] = {}  # each curve's means, to name one that lies on an earlier one
        plain_drawn: dict[str, np.ndarray] = {}
        for i, method in enumerate(BASES):
            colour, (marker, line, dotted) = f"C{i}", styles[i % len(styles)]
            runs = [np.asarray(found[(method, label)][metric], dtype=float) for label in private]
            means = np.asarray([np.nanmean(r) if np.isfinite(r).any() else math.nan for r in runs])
            spread = [float(np.nanstd(r, ddof=1)) if np.isfinite(r).sum() > 1 else 0.0 for r in runs]
            same = _alike(means, private_drawn)
            label = f"{method}, DP" + (f" (≈ {same})" if same else "")
            ax.errorbar(eps, means, yerr=spread, color=colour, marker=marker, linestyle=line, capsize=3, label=label)
            private_drawn[method] = means
            plain = np.asarray(found[(method, NON_PRIVATE)][metric], dtype=float)
            if np.isfinite(plain).any():
                level = np.full(len(eps), float(np.nanmean(plain)))
                same = _alike(level, plain_drawn)
                label = f"{method}, no DP" + (f" (≈ {same})" if same else "")
                ax.axhline(level[0], color=colour, linestyle=dotted, label=label)
                plain_drawn[method] = level
        ax.set_xscale("log")
        ax.set_xticks(eps, [f"{e:g}" for e in eps])
        ax.set_xlabel("privacy budget ε (δ = 1e-5; log scale)")
        ax.set_title(f"Test accuracy of the global model, {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (mean over clients)")
    fig.tight_layout()
    outside_legend(axes[1])
    add_caption(
        fig,
        f"Client-level DP (DP-FedAvg's clipping and central Gaussian noise) on each method; points: mean over "
        f"{seeds} seed(s), error bars ± 1 std over seeds; horizontal lines: the method without DP. {DESCRIPTION}.",
    )
    return write_figure(fig, out)


def _alike(values: np.ndarray, drawn: dict[str, np.ndarray], tolerance: float = 0.005) -> str:
    """The first earlier curve within `tolerance` of `values` at every point ("" if none)."""
    for name, other in drawn.items():
        if len(other) == len(values) and np.allclose(other, values, atol=tolerance, rtol=0, equal_nan=True):
            return name
    return ""


DESCRIPTION = "client-level DP on digits (Dirichlet 0.1): test accuracy against ε for FedAvg, FedProx and MaxFL"


@register_recipe
def dp_digits() -> Recipe:
    return Recipe(
        name="dp-digits",
        description=DESCRIPTION,
        base={},
        methods={},
        columns={},
        custom=lambda out, quick, seeds, embedded, executor: privacy_study(out, quick, seeds, embedded, executor),
    )
