"""Privacy, utility and measured leakage on one table: FedAvg, DP-FedAvg at several ε, SecAgg+ and Ditto.

scikit-learn's digits (embedded), an MLP (64-32-10), 100 clients of Dirichlet(0.5) label skew, 20 a round, 60
rounds of 10 local steps. Each method's utility (final test accuracy, worst 10% of clients) beside two attacks
(docs/attacks.md):

- **gradient inversion** (Geiping et al. 2020's cosine objective, which a clipped gradient's scale does not fool)
  of client 0's gradient on one training image at the model that starts round 1,
  as the party that sees it would mount it. Without DP and with Ditto, the server sees the client's update: the
  attack runs on the gradient itself. Under DP-FedAvg, it runs on the clipped gradient plus the noise the
  mechanism adds to the sum, N(0, (zC)²) — the view of anyone who sees the release and knows every other
  client's contribution, DP's worst case. With SecAgg+ the server sees only the sum of the cohort's updates: no
  single update to invert (the cell says so).
- **membership inference** (loss threshold, Yeom et al. 2018) on the final global model; for Ditto also on the
  clients' personal models, which leak differently.

DP-FedAvg weighs clients uniformly, samples them by Poisson sampling (q = 0.2) and calibrates z to the target ε
(δ = 1e-5, RDP accountant) before the run; the recipe computes the same z for the attack's noise and checks it
against the one the run reports.

``privacy-leakage-cifar10``: the same study on CIFAR-10 from its python batches in ``data/cifar10/`` (refused in
one line when they are missing), with the zoo's LeNet-5 (``lenet_cifar``), lr 0.05 and batches of 20; the clients,
rounds, sampling and C are the digits study's (C is not re-tuned to CIFAR-10's update norms).
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

CLIP = 1.0  # C: about the median update norm of the first rounds without DP
DELTA = 1e-5
SETTING: dict[str, Any] = {
    "dataset": "digits",
    "model": {"name": "mlp", "hidden": [32]},
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 10},
    "num_clients": 100,
    "clients_per_round": 20,
    "rounds": 60,
    "eval_every": 10,
    "local": {"steps": 10, "lr": 0.1, "batch_size": 10},
    "privacy": {"delta": DELTA},
}
CIFAR10: dict[str, Any] = {
    **SETTING,
    "dataset": "cifar10",
    "model": {"name": "lenet_cifar"},
    "local": {"steps": 10, "lr": 0.05, "batch_size": 20},
}
SETTINGS = {"digits": SETTING, "cifar10": CIFAR10}  # the same clients, rounds and sampling: the same z for an ε
QUICK: dict[str, Any] = {"rounds": 20, "eval_every": 5}
EPSILONS = (32.0, 8.0, 2.0)
DLG: dict[str, Any] = {"name": "dlg", "round": 1, "client": 0, "method": "geiping", "iterations": 300}
MIA: dict[str, Any] = {"name": "mia", "samples": 500}
FEDAVG: dict[str, Any] = {"name": "fedavg", "weighting": "uniform"}
COLUMNS = {
    "test_accuracy": "test accuracy",
    "test_accuracy_worst10": "worst 10%",
    "dlg_psnr": "inversion PSNR (dB)",
    "mia_auc": "MIA AUC, global model",
    "mia_personal_auc": "MIA AUC, personal models",
    "dp_epsilon": "ε spent",
}
SUM_ONLY = "the server sees only the sum"


def noise_multiplier(target: float, quick: bool, rounds: int | None = None) -> float:
    """z that DP-FedAvg's accounting sets for `target` ε over the setting's rounds, or `rounds` (Poisson sampling,
    q = m/K)."""
    from fedhet.privacy.accounting import Release, calibrate, epsilon

    setting = deep_merge(SETTING, QUICK) if quick else SETTING
    rate, rounds = setting["clients_per_round"] / setting["num_clients"], rounds or setting["rounds"]
    return calibrate(lambda z: epsilon(Release(z, "poisson", rate=rate), rounds, DELTA), target)


def methods(quick: bool) -> dict[str, dict[str, Any]]:
    """Each method's config changes: its algorithm, privacy and attack plugins."""
    dp = {"name": "dp", "base": FEDAVG, "clip": CLIP, "sampling": "poisson"}
    out: dict[str, dict[str, Any]] = {
        "FedAvg": {"algorithm": FEDAVG, "metrics": [MIA, DLG]},
        "DP-FedAvg, ε = ∞ (clipping)": {
            "algorithm": {**dp, "noise_multiplier": 0.0},
            "metrics": [MIA, {**DLG, "clip": CLIP}],
        },
    }
    for target in EPSILONS:
        attack = {**DLG, "clip": CLIP, "noise_multiplier": noise_multiplier(target, quick)}
        out[f"DP-FedAvg, ε = {target:g}"] = {
            "algorithm": dp,
            "privacy": {"target_epsilon": target},
            "metrics": [MIA, attack],
        }
    out["SecAgg+"] = {"algorithm": {"name": "secagg", "base": FEDAVG}, "metrics": [MIA]}
    out["Ditto"] = {"algorithm": {"name": "ditto"}, "metrics": [{**MIA, "target": "both"}, DLG]}
    return out


def tasks(
    out: Path, quick: bool, seeds: tuple[int, ...], changes: dict[str, Any] | None = None, dataset: str = "digits"
) -> list[Task]:
    base = SETTINGS[dataset]
    setting = deep_merge(deep_merge(base, QUICK) if quick else base, changes or {})
    return [
        Task(
            {**deep_merge(setting, cell), "seed": seed},
            out / safe_name(method) / f"seed{seed}",
            f"{method}, seed {seed}",
            {"recipe": f"privacy-leakage ({dataset})", "method": method, "seed": seed},
        )
        for method, cell in methods(quick).items()
        for seed in seeds
    ]


def values(outcomes: list[Outcome]) -> dict[str, dict[str, list[float]]]:
    """method → column → one value per seed: the final row's, and the attack's round for dlg_psnr."""
    out: dict[str, dict[str, list[float]]] = {}
    for outcome in outcomes:
        found = out.setdefault(outcome.task.meta["method"], {})
        history = outcome.history if outcome.ok else []
        final = history[-1] if history else {}
        for column in (*COLUMNS, "dp_noise_multiplier"):
            seen = [row[column] for row in history if not math.isnan(row.get(column, math.nan))]
            value = final.get(column, math.nan) if column != "dlg_psnr" else (seen[0] if seen else math.nan)
            found.setdefault(column, []).append(float(value))
    return out


def check_noise(found: dict[str, dict[str, list[float]]], quick: bool) -> None:
    """The attack's noise is the run's: z computed here equals the z each DP run reports (1e-6)."""
    for target in EPSILONS:
        reported = [z for z in found[f"DP-FedAvg, ε = {target:g}"]["dp_noise_multiplier"] if not math.isnan(z)]
        expected = noise_multiplier(target, quick)
        if any(abs(z - expected) > 1e-6 * max(1.0, expected) for z in reported):
            raise AssertionError(f"ε = {target:g}: the runs' z {reported} differ from the attack's {expected}")


def leakage_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
    dataset: str = "digits",
) -> str:
    """Every method over `seeds` on `dataset` (digits, cifar10): the table (markdown) and
    privacy_utility_leakage.png."""
    del embedded  # the digits are embedded; the CIFAR-10 recipe refuses --embedded before (`Recipe.data`)
    outcomes = (executor or Executor(1)).run(tasks(out, quick, seeds, changes, dataset))
    found = values(outcomes)
    if not changes:
        check_noise(found, quick)
    text = f"### {DESCRIPTIONS[dataset]}\n\nseeds: {', '.join(map(str, seeds))}" + (" (quick)" if quick else "")
    text += f"; C = {CLIP}, Poisson sampling q = 0.2, δ = {DELTA:g}, RDP accountant; mean ± std over seeds\n\n"
    rows = []
    for method, columns in found.items():
        cells = []
        for column in COLUMNS:
            if column == "dlg_psnr" and method == "SecAgg+":
                cells.append(SUM_ONLY)
            else:
                cells.append(mean_std(columns[column]) if np.isfinite(columns[column]).any() else "—")
        rows.append([method, *cells])
    text += markdown_table(["method", *COLUMNS.values()], rows)
    plot_leakage(found, out / "privacy_utility_leakage.png", len(seeds), DESCRIPTIONS[dataset])
    raise_failures(outcomes)
    return text


def plot_leakage(
    found: dict[str, dict[str, list[float]]], out: Path, seeds: int, description: str | None = None
) -> Path:
    """Test accuracy (left), iDLG PSNR (middle) and MIA AUC (right) per method, ± 1 std over seeds."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import add_caption, outside_legend, write_figure

    names = list(found)
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.4), dpi=120)
    panels = (
        ("test_accuracy", "test accuracy (mean over clients)", "Utility"),
        ("dlg_psnr", "reconstruction PSNR (dB; higher: more leaked)", "Gradient inversion (Geiping et al.)"),
        ("mia_auc", "attack AUC (0.5: a coin flip)", "Membership inference"),
    )
    for ax, (column, ylabel, title) in zip(axes, panels, strict=True):
        runs = [np.asarray(found[name][column], dtype=float) for name in names]
        means = [float(np.nanmean(r)) if np.isfinite(r).any() else 0.0 for r in runs]
        spread = [float(np.nanstd(r, ddof=1)) if np.isfinite(r).sum() > 1 else 0.0 for r in runs]
        ax.bar(range(len(names)), means, yerr=spread, capsize=3, color=[f"C{i}" for i in range(len(names))])
        if column == "mia_auc":
            personal = np.asarray(found.get("Ditto", {}).get("mia_personal_auc", [math.nan]), dtype=float)
            if np.isfinite(personal).any():
                ax.plot([names.index("Ditto")], [float(np.nanmean(personal))], "k*", ms=12, label="Ditto, personal")
            ax.axhline(0.5, color="grey", linestyle=":")
            ax.set_ylim(0.4, 1.0)
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set_xlabel("method")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    if axes[2].get_legend_handles_labels()[0]:
        outside_legend(axes[2])
    add_caption(
        fig,
        f"Bars: mean over {seeds} seed(s), error bars ± 1 std. PSNR: client 0's gradient on one image at the initial "
        f"model (SecAgg+: no single update is seen, no bar). {description or DESCRIPTION}.",
    )
    return write_figure(fig, out)


DESCRIPTION = "privacy, utility and measured leakage on digits: FedAvg, DP-FedAvg by ε, SecAgg+ and Ditto"
DESCRIPTIONS = {"digits": DESCRIPTION, "cifar10": DESCRIPTION.replace("on digits", "on CIFAR-10 (LeNet-5)")}


@register_recipe
def privacy_leakage() -> Recipe:
    return Recipe(
        name="privacy-leakage",
        description=DESCRIPTION,
        base={},
        methods={},
        columns={},
        custom=lambda out, quick, seeds, embedded, executor: leakage_study(out, quick, seeds, embedded, executor),
    )


@register_recipe
def privacy_leakage_cifar10() -> Recipe:
    return Recipe(
        name="privacy-leakage-cifar10",
        description=DESCRIPTIONS["cifar10"] + "; needs data/cifar10",
        base={},
        methods={},
        columns={},
        custom=lambda out, quick, seeds, embedded, executor: leakage_study(
            out, quick, seeds, embedded, executor, dataset="cifar10"
        ),
        data={"dataset": "cifar10"},
    )
