"""FedGSNR's experiments (§5, Appendix D) as recipes: Tables 1 and 3, Table 2, and Figs. 3, 5b, 6/10 and 7.

Paper settings: CIFAR-10 with LeNet, 30 clients (all active), batch 64, E_const = 20 local steps, FedProx μ = 0.01,
rounds to reach 0.5 test accuracy and the speedup S = T_old / T_new over the same base strategy (Table 1), the best
test accuracy (Table 3); NonBalance with 100 clients and 10/20/100% active (Table 2). Not given by the paper and
chosen here: learning rate 0.05 (constant), 1000 rounds, evaluation every 5 rounds (its round counts are multiples
of 5), each client's data split 5:1 into train and test (a 10,000-image test set overall, as CIFAR-10's), p_k by
sample count, and the accuracy of the global model on all clients' test data pooled (a global test set).

Without the CIFAR-10 files the recipes run on scikit-learn's digits (1,797 images, 8×8) and say so: an MLP with
one hidden layer of 64, batch 10 (clients hold ≈ 48 training images), learning rate 0.01, 60 rounds evaluated
every round, and a target of 0.85 (the paper's 0.5 is 75–85% of its best accuracies, 0.85 is ≈ 90% of digits').

Speedups are paired by seed (same partition and initialisation) and averaged over the seeds where both methods
reached the target; the "average speedup" is the mean over the table's finite cells, as the paper's 1.69×.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fedhet import atomic
from fedhet.experiments.executor import Executor, Task, raise_failures
from fedhet.experiments.naming import safe_name
from fedhet.experiments.reproduce import Recipe, dataset_available, deep_merge, mean_std, register_recipe
from fedhet.experiments.state import RunState
from fedhet.methods.fedgsnr.contribution import Contribution, contribution_scores, label_counts, plot_contribution
from fedhet.metrics.speed import speedup
from fedhet.report.tables import markdown_table

ACCURACY = "test_accuracy_pooled"
PAPER: dict[str, Any] = {
    "dataset": "cifar10",
    "model": "lenet_cifar",
    "num_clients": 30,
    "clients_per_round": 30,
    "test_fraction": 1 / 6,
    "rounds": 1000,
    "eval_every": 5,
    "local": {"steps": 20, "lr": 0.05, "batch_size": 64},
    "metrics": [{"name": "target_accuracy", "target": 0.5, "column": ACCURACY}],
}
EMBEDDED: dict[str, Any] = {
    "dataset": "digits",
    "model": {"name": "mlp", "hidden": [64]},
    "rounds": 60,
    "eval_every": 1,
    "local": {"steps": 20, "lr": 0.01, "batch_size": 10},
    "metrics": [{"name": "target_accuracy", "target": 0.85, "column": ACCURACY}],
}
# Fig. 5: CIFAR-100 with VGG-16 under the Pareto partition. The paper gives no target accuracy for it; 0.3 is ours.
PAPER_CIFAR100: dict[str, Any] = {
    **PAPER,
    "dataset": "cifar100",
    "model": "vgg16",
    "metrics": [{"name": "target_accuracy", "target": 0.3, "column": ACCURACY}],
}
QUICK_PAPER: dict[str, Any] = {"rounds": 100}
QUICK_EMBEDDED: dict[str, Any] = {"rounds": 25}
SEEDS = (0, 1, 2)

# App. D.1: Dirichlet as Hsu et al. (2019) define it (a class distribution per client, equal sizes), Label 2, and the
# paper's NonBalance and Pareto (numbers of classes per client from tiers or from a Pareto law).
PARTITIONS: dict[str, dict[str, Any]] = {
    "α = 0.5": {"name": "dirichlet", "alpha": 0.5, "scheme": "per_client", "min_size": 10},
    "α = 0.1": {"name": "dirichlet", "alpha": 0.1, "scheme": "per_client", "min_size": 10},
    "Label 2": {"name": "label_k", "labels_per_client": 2},
    "NonBalance": {"name": "nonbalance"},
    "Pareto": {"name": "pareto"},
}
IID: dict[str, Any] = {"name": "iid"}
BASES: dict[str, str | dict[str, Any]] = {
    "FedAvg": "fedavg",
    "FedProx": {"name": "fedprox", "mu": 0.01},
    "Scaffold": "scaffold",
}

# The paper's numbers, shown next to ours (CIFAR-10, LeNet).
PAPER_TABLE1 = {
    "FedAvg": ["170 (1.0×)", "355 (1.0×)", "470 (1.0×)", "210 (1.0×)", "550 (1.0×)"],
    "FedGSNR with FedAvg": ["115 (1.5×)", "285 (1.3×)", "340 (1.4×)", "155 (1.4×)", "170 (3.2×)"],
    "FedProx": ["185 (1.0×)", "430 (1.0×)", "500 (1.0×)", "220 (1.0×)", "385 (1.0×)"],
    "FedGSNR with FedProx": ["140 (1.3×)", "300 (1.4×)", "405 (1.2×)", "180 (1.2×)", "210 (1.8×)"],
    "Scaffold": ["385 (1.0×)", "770 (1.0×)", "870 (1.0×)", "390 (1.0×)", ">1K"],
    "FedGSNR with Scaffold": ["140 (2.7×)", "425 (1.8×)", "770 (1.1×)", "170 (2.3×)", ">1K"],
}
PAPER_TABLE3 = {
    "FedAvg": ["67.06", "57.44", "58.25", "65.48", "57.23"],
    "FedGSNR with FedAvg": ["66.23", "61.41", "57.69", "66.42", "63.38"],
    "FedProx": ["63.14", "57.80", "58.84", "63.87", "56.96"],
    "FedGSNR with FedProx": ["63.5", "59.39", "58.39", "68.17", "63.39"],
    "Scaffold": ["62.05", "53.98", "50.38", "62.79", "40.73"],
    "FedGSNR with Scaffold": ["63.53", "58.95", "55.48", "64.96", "39.83"],
}
PAPER_TABLE2 = {
    "FedAvg": ["210 (1.0×)", "140 (1.0×)", "100 (1.0×)"],
    "FedNova": ["235 (0.9×)", "140 (1.0×)", "80 (1.2×)"],
    "Scaffold": ["230 (0.9×)", "-", "-"],
    "FedGSNR with FedAvg": ["150 (1.4×)", "80 (1.7×)", "55 (1.8×)"],
}
PARTITION_NOTE = (
    "Partitions (App. D.1): Dirichlet per client as Hsu et al. (equal sizes); Label 2; NonBalance: 10%/40%/50% of the "
    "clients hold 100%/50%/20% of the classes; Pareto: max(1, round(C·x/max x)) classes, x ~ Pareto(1.16). A class's "
    "samples are split evenly among the clients holding it. See docs/fedgsnr.md."
)


def gsnr(base: str | dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The FedGSNR wrapper around `base` (with `options` of the `gsnr` strategy, e.g. ``{"batch": 64}``)."""
    return {"name": "gsnr", "base": base, **(options or {})}


def paired_methods(
    bases: dict[str, str | dict[str, Any]], options: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Each base strategy followed by FedGSNR with it (Table 1's rows)."""
    methods: dict[str, dict[str, Any]] = {}
    for name, spec in bases.items():
        methods[name] = {"algorithm": spec}
        methods[f"FedGSNR with {name}"] = {"algorithm": gsnr(spec, options)}
    return methods


def slug(text: str) -> str:
    """A folder name for a table label ("α = 0.5" → "alpha-0.5", "FedGSNR with FedAvg" → "fedgsnr-with-fedavg")."""
    return safe_name(text.lower())


# ----------------------------------------------------------------------------------------------------------------
# Running a grid of runs
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RunSummary:
    """What the tables and figures need from one run (the run's data is not kept)."""

    history: list[dict[str, float]]
    final: dict[str, float]
    contribution: Tensor | None = None  # (R, K) GSNR per evaluated round and client
    corrupted: Tensor | None = None  # (K,) bool
    label_counts: Tensor | None = None  # (K, C) training labels per client

    def curve(self, metric: str) -> tuple[list[float], list[float]]:
        rows = [row for row in self.history if metric in row]
        return [row["round"] for row in rows], [row[metric] for row in rows]


def summarise(state: RunState) -> RunSummary:
    data = state.experiment.data
    plugin = next((m for m in state.experiment.metrics if isinstance(m, Contribution)), None)
    return RunSummary(
        history=list(state.history),
        final=dict(state.final),
        contribution=plugin.history()[1] if plugin is not None else None,
        corrupted=data.info.get("corrupted"),
        label_counts=label_counts(state.experiment.engine),
    )


def setting(
    quick: bool, embedded: bool | None, changes: dict[str, Any] | None, paper: dict[str, Any] = PAPER
) -> tuple[dict[str, Any], str]:
    """The base config (the paper's, or the embedded fallback), and a line saying which data is used."""
    if embedded is None:
        embedded = not dataset_available(paper)
    raw = deep_merge(paper, EMBEDDED) if embedded else dict(paper)
    if quick:
        raw = deep_merge(raw, QUICK_EMBEDDED if embedded else QUICK_PAPER)
    raw = deep_merge(raw, changes or {})
    target = next(m["target"] for m in raw["metrics"] if isinstance(m, dict) and m["name"] == "target_accuracy")
    name = paper["dataset"]
    note = f"embedded data: digits (the {name} files are missing)" if embedded else f"data: {name}"
    note += f"; {raw['num_clients']} clients; target test accuracy {target}; {raw['rounds']} rounds"
    return raw, note + (" (quick)" if quick else "")


Cells = dict[tuple[str, str], dict[str, Any]]  # (row, column) → config


def cell_tasks(out: Path, cells: Cells, seeds: tuple[int, ...]) -> list[Task]:
    """One task per cell and seed, into ``out/<column>/<row>/seed<k>/``."""
    return [
        Task(
            {**raw, "seed": seed},
            out / slug(col) / slug(row) / f"seed{seed}",
            f"{col} | {row} | seed {seed}",
            {"row": row, "column": col, "seed": seed},
        )
        for (row, col), raw in cells.items()
        for seed in seeds
    ]


def run_cells(
    executor: Executor | None,
    groups: list[tuple[Path, Cells]],
    seeds: tuple[int, ...],
    say: Callable[[str], None] = print,
) -> list[dict[tuple[str, str], list[RunSummary]]]:
    """Run every cell's config for every seed, of every (folder, cells) group at once, through `executor`."""
    tasks = [cell_tasks(out, cells, seeds) for out, cells in groups]
    outcomes = (executor or Executor(1)).run([t for group in tasks for t in group], post=summarise)
    raise_failures(outcomes, diverged=True)
    results: list[dict[tuple[str, str], list[RunSummary]]] = []
    start = 0
    for group in tasks:
        mine: dict[tuple[str, str], list[RunSummary]] = {}
        for outcome in outcomes[start : start + len(group)]:
            meta, summary = outcome.task.meta, outcome.result
            mine.setdefault((meta["row"], meta["column"]), []).append(summary)
            reached, best = summary.final.get("rounds_to_target"), summary.final.get("best_test_accuracy")
            say(f"{outcome.task.label}: rounds to target {reached}, best accuracy {best:.4f}")
        results.append(mine)
        start += len(group)
    return results


# ----------------------------------------------------------------------------------------------------------------
# Table cells
# ----------------------------------------------------------------------------------------------------------------


def rounds_of(runs: list[RunSummary]) -> list[float]:
    return [float(r.final.get("rounds_to_target", float("nan"))) for r in runs]


def paired_speedups(old: list[float], new: list[float]) -> list[float]:
    """S = T_old / T_new per seed, where both methods reached the target."""
    pairs = [speedup(a, b) for a, b in zip(old, new, strict=True)]
    return [s for s in pairs if not math.isnan(s)]


def format_rounds(values: list[float], cap: int) -> str:
    """Mean ± std of the rounds to target over the seeds that reached it; ">cap" when none did."""
    reached = np.asarray([v for v in values if not math.isnan(v)])
    if len(reached) == 0:
        return f">{cap}"
    text = f"{reached.mean():.1f}" + (f" ± {reached.std(ddof=1):.1f}" if len(reached) > 1 else "")
    return text + (f" [{len(reached)}/{len(values)} reached]" if len(reached) < len(values) else "")


def format_speedup(values: list[float]) -> str:
    return f"{np.mean(values):.2f}×" if values else "–"


def format_accuracy(values: list[float]) -> str:
    return mean_std(values, digits=2, scale=100)


def speed_table(
    results: dict[tuple[str, str], list[RunSummary]],
    rows: list[str],
    columns: list[str],
    baseline: Callable[[str], str],
    cap: int,
) -> tuple[str, list[float]]:
    """Rounds to target with the speedup against each row's baseline (Table 1/2 layout), and the finite cell
    speedups (for the average)."""
    body, finite = [], []
    for row in rows:
        cells = []
        for col in columns:
            mine = rounds_of(results[(row, col)])
            base = baseline(row)
            if base == row:
                cells.append(f"{format_rounds(mine, cap)} (1.0×)")
                continue
            s = paired_speedups(rounds_of(results[(base, col)]), mine)
            if s:
                finite.append(float(np.mean(s)))
            cells.append(f"{format_rounds(mine, cap)} ({format_speedup(s)})")
        body.append([row, *cells])
    return markdown_table(["Algorithms", *columns], body), finite


def accuracy_table(results: dict[tuple[str, str], list[RunSummary]], rows: list[str], columns: list[str]) -> str:
    """Best test accuracy in % (Table 3 layout)."""
    body = [
        [row, *(format_accuracy([r.final["best_test_accuracy"] for r in results[(row, col)]]) for col in columns)]
        for row in rows
    ]
    return markdown_table(["Algorithms", *columns], body)


def write_results(out: Path, results: dict[tuple[str, str], list[RunSummary]], seeds: tuple[int, ...]) -> None:
    """``results.csv``: one line per run with its rounds to target and best accuracy."""
    lines = ["row,column,seed,rounds_to_target,best_test_accuracy"]
    for (row, col), runs in results.items():
        for seed, summary in zip(seeds, runs, strict=True):
            f = summary.final
            lines.append(f'"{row}","{col}",{seed},{f.get("rounds_to_target")},{f.get("best_test_accuracy")}')
    atomic.write_text(out / "results.csv", "\n".join(lines) + "\n")


def accuracy_figures(out: Path, results: dict[tuple[str, str], list[RunSummary]], rows: list[str], col: str) -> None:
    from fedhet.report.plots import plot_mean_curves

    curves = {row: [r.curve(ACCURACY)[1] for r in results[(row, col)]] for row in rows}
    rounds = {row: results[(row, col)][0].curve(ACCURACY)[0] for row in rows}
    plot_mean_curves(
        curves,
        rounds,
        ACCURACY,
        out / f"accuracy_{slug(col)}.png",
        title=f"Test accuracy of the global model, partition {col}",
        context="FedGSNR: each base strategy with and without FedGSNR's per-client local steps.",
    )


# ----------------------------------------------------------------------------------------------------------------
# Studies
# ----------------------------------------------------------------------------------------------------------------


def table1_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    *,
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
    partitions: dict[str, dict[str, Any]] | None = None,
    bases: dict[str, str | dict[str, Any]] | None = None,
    gsnr_options: dict[str, Any] | None = None,
) -> str:
    """Tables 1 and 3: every base strategy with and without FedGSNR on every partition."""
    base, note = setting(quick, embedded, changes)
    partitions = partitions or PARTITIONS
    methods = paired_methods(bases or BASES, gsnr_options)
    if gsnr_options:
        note += f"; FedGSNR options {gsnr_options}"
    cells = {
        (m, p): deep_merge(deep_merge(base, {"partition": spec}), change)
        for p, spec in partitions.items()
        for m, change in methods.items()
    }
    [results] = run_cells(executor, [(out, cells)], seeds)
    rows, columns = list(methods), list(partitions)
    speed, finite = speed_table(results, rows, columns, lambda r: r.removeprefix("FedGSNR with "), base["rounds"])
    for col in columns:
        accuracy_figures(out, results, rows, col)
    write_results(out, results, seeds)
    average = f"{np.mean(finite):.2f}×" if finite else "–"
    text = f"### FedGSNR Table 1: rounds to reach the target test accuracy (speedup S = T_old/T_new)\n\n{note}; "
    text += f"seeds: {', '.join(map(str, seeds))}; mean ± std over seeds\n\n{speed}\n"
    text += f"Average speedup over the finite cells: {average} (paper: 1.69×)\n\n"
    text += "### FedGSNR Table 3: best test accuracy (%)\n\n" + accuracy_table(results, rows, columns)
    text += f"\n{PARTITION_NOTE}\n\n### The paper's Table 1 (CIFAR-10, LeNet, target 0.5)\n\n"
    text += markdown_table(["Algorithms", *PARTITIONS], [[k, *v] for k, v in PAPER_TABLE1.items()])
    text += "\n### The paper's Table 3 (best test accuracy, %)\n\n"
    text += markdown_table(["Algorithms", *PARTITIONS], [[k, *v] for k, v in PAPER_TABLE3.items()])
    return text


TABLE2_METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"algorithm": "fedavg"},
    "FedNova": {"algorithm": "fednova"},
    "Scaffold": {"algorithm": "scaffold"},
    "FedGSNR with FedAvg": {"algorithm": gsnr("fedavg")},
}
TABLE2_FRACTIONS = {"10%": 0.1, "20%": 0.2, "100%": 1.0}


def table2_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    *,
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
    fractions: dict[str, float] | None = None,
) -> str:
    """Table 2: NonBalance with 100 clients, 10/20/100% of them active each round."""
    base, note = setting(
        quick, embedded, deep_merge({"num_clients": 100, "partition": PARTITIONS["NonBalance"]}, changes or {})
    )
    fractions = fractions or TABLE2_FRACTIONS
    cells = {
        (m, f): deep_merge(base, {**change, "clients_per_round": max(1, round(frac * base["num_clients"]))})
        for f, frac in fractions.items()
        for m, change in TABLE2_METHODS.items()
    }
    [results] = run_cells(executor, [(out, cells)], seeds)
    rows, columns = list(TABLE2_METHODS), list(fractions)
    speed, _ = speed_table(results, rows, columns, lambda r: "FedAvg", base["rounds"])
    for col in columns:
        accuracy_figures(out, results, rows, col)
    write_results(out, results, seeds)
    text = "### FedGSNR Table 2: rounds to the target test accuracy, NonBalance, varying active clients\n\n"
    text += f"{note}; seeds: {', '.join(map(str, seeds))}; speedup against FedAvg in the same column\n\n{speed}\n"
    text += "### Best test accuracy (%)\n\n" + accuracy_table(results, rows, columns)
    text += f"\n{PARTITION_NOTE}\n\n### The paper's Table 2 (CIFAR-10, 100 clients, target 0.5)\n\n"
    text += markdown_table(["Algorithms", *TABLE2_FRACTIONS], [[k, *v] for k, v in PAPER_TABLE2.items()])
    return text


def figures_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    *,
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
    partitions: dict[str, dict[str, Any]] | None = None,
    flip_partitions: tuple[str, ...] = ("IID", "NonBalance"),
) -> str:
    """Fig. 3 (entropy of the step allocation per partition), Figs. 5b/7 (GSNR per client and partition) and
    Figs. 6/10 (GSNR and accuracy when one client's labels are shifted)."""
    base, note = setting(quick, embedded, changes)
    base = deep_merge(base, {"metrics": [*base["metrics"], "contribution"]})
    partitions = {"IID": IID, **(partitions or PARTITIONS)}
    entropy_cells = {
        ("FedGSNR with FedAvg", p): deep_merge(base, {"partition": spec, "algorithm": gsnr("fedavg")})
        for p, spec in partitions.items()
    }
    flip = {"fraction": 1 / base["num_clients"], "mapping": "shift"}
    flip_methods: dict[str, dict[str, Any]] = {
        "FedAvg": {"algorithm": "fedavg"},
        "FedGSNR with FedAvg": {"algorithm": gsnr("fedavg")},
    }
    flip_cells = {
        (m, p): deep_merge(base, {"partition": partitions[p], "label_noise": flip, **change})
        for p in flip_partitions
        for m, change in flip_methods.items()
    }
    # the same clients with their true labels: FedGSNR's entropy runs, and FedAvg's runs here
    true_cells = {("FedAvg", p): deep_merge(base, {"partition": partitions[p]}) for p in flip_partitions}
    groups = [(out / "entropy", entropy_cells), (out / "label-flip", flip_cells), (out / "true-labels", true_cells)]
    entropy, flipped, truth = run_cells(executor, groups, seeds)
    truth.update({("FedGSNR with FedAvg", p): entropy[("FedGSNR with FedAvg", p)] for p in flip_partitions})

    log_n = math.log(base["clients_per_round"])
    plot_entropy({p: entropy[("FedGSNR with FedAvg", p)] for p in partitions}, log_n, out / "entropy.png")
    plot_partition_gsnr({p: entropy[("FedGSNR with FedAvg", p)] for p in partitions}, out / "gsnr_partitions.png")
    pareto = entropy.get(("FedGSNR with FedAvg", "Pareto"))
    if pareto:
        plot_summary_contribution(pareto[0], out / "contribution_pareto.png", "GSNR per client, Pareto (seed 0)")
    rows = []
    for p in partitions:
        runs = entropy[("FedGSNR with FedAvg", p)]
        h = [np.nanmean([row.get("gsnr_entropy", float("nan")) for row in r.history]) for r in runs]
        mean_r = [float(contribution_scores(r.contribution).nanmean()) for r in runs if r.contribution is not None]
        rho = [label_correlation(r) for r in runs]
        rho_text = f"{np.nanmean(rho):.2f}" if not all(math.isnan(v) for v in rho) else "– (equal)"
        rows.append([p, f"{np.mean(h):.3f}", f"{log_n:.3f}", f"{np.mean(mean_r):.3f}", rho_text])
    text = f"### FedGSNR Fig. 3 / Fig. 7: allocation entropy and GSNR per partition (FedGSNR with FedAvg)\n\n{note}; "
    text += f"seeds: {', '.join(map(str, seeds))}\n\n"
    header = [
        "partition",
        "mean entropy H over rounds",
        "log N (uniform)",
        "mean client GSNR",
        "Spearman(GSNR, classes)",
    ]
    text += markdown_table(header, rows)
    flip_rows, drops = [], []
    for (m, p), flip_runs in flipped.items():
        for seed, r, t in zip(seeds, flip_runs, truth[(m, p)], strict=True):
            assert r.contribution is not None and r.corrupted is not None and t.contribution is not None
            score = contribution_scores(r.contribution)
            bad = r.corrupted
            mine, before = float(score[bad].mean()), float(contribution_scores(t.contribution)[bad].mean())
            drops.append(mine < before)
            rank = int((score < score[bad].max()).sum()) + 1  # 1 = lowest score
            clean = score[~bad]
            flip_rows.append(
                [
                    p,
                    m,
                    str(seed),
                    f"{mine:.3f}",
                    f"{before:.3f} ({100 * (mine / before - 1):+.0f}%)",
                    f"{float(clean.mean()):.3f} ± {float(clean.std()):.3f}",
                    f"{rank} of {len(score)}",
                    f"{r.final['best_test_accuracy']:.4f}",
                    f"{t.final['best_test_accuracy']:.4f}",
                ]
            )
        plot_summary_contribution(
            flip_runs[0], out / f"contribution_flip_{slug(p)}_{slug(m)}.png", f"GSNR per client, {p}, {m}"
        )
    for p in flip_partitions:
        accuracy_figures(out / "label-flip", flipped, ["FedAvg", "FedGSNR with FedAvg"], p)
    text += "\n### FedGSNR Figs. 6 / 10: one client's labels shifted (l → l + 1 mod C): its GSNR and the accuracy\n\n"
    text += markdown_table(
        [
            "partition",
            "method",
            "seed",
            "flipped client's score",
            "same client, true labels",
            "other clients' score",
            "rank (1 = lowest)",
            "best acc",
            "best acc, true labels",
        ],
        flip_rows,
    )
    text += f"\nThe flipped client's score fell below its true-label score in {sum(drops)} of {len(drops)} runs.\n"
    text += f"\n{PARTITION_NOTE}\n"
    return text


def label_correlation(summary: RunSummary) -> float:
    """Spearman correlation between a client's contribution score and the number of classes it holds (Fig. 5b:
    "the GSNR of different participants resemble their label distribution")."""
    from scipy.stats import spearmanr

    assert summary.contribution is not None and summary.label_counts is not None
    score = contribution_scores(summary.contribution).numpy()
    classes = (summary.label_counts > 0).sum(1).numpy()
    if np.ptp(classes) == 0 or np.ptp(score) == 0:
        return float("nan")
    return float(spearmanr(score, classes).statistic)


def fig5_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    *,
    embedded: bool | None = None,
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
    bases: dict[str, str | dict[str, Any]] | None = None,
) -> str:
    """Fig. 5: CIFAR-100 (VGG-16) under the Pareto partition, every base strategy with and without FedGSNR:
    (a) the accuracy curves, (b) each client's GSNR above its label histogram."""
    base, note = setting(quick, embedded, changes, PAPER_CIFAR100)
    base = deep_merge(base, {"partition": PARTITIONS["Pareto"]})
    methods = paired_methods(bases or BASES)
    cells = {(m, "Pareto"): deep_merge(base, change) for m, change in methods.items()}
    measured = ("FedGSNR with FedAvg", "Pareto")
    if measured in cells:
        cells[measured]["metrics"] = [*base["metrics"], "contribution"]
    [results] = run_cells(executor, [(out, cells)], seeds)
    rows = list(methods)
    speed, _ = speed_table(results, rows, ["Pareto"], lambda r: r.removeprefix("FedGSNR with "), base["rounds"])
    accuracy_figures(out, results, rows, "Pareto")
    write_results(out, results, seeds)
    text = f"### FedGSNR Fig. 5: Pareto partition, every base strategy with and without FedGSNR\n\n{note}; "
    text += f"seeds: {', '.join(map(str, seeds))}\n\n{speed}\n"
    text += "### Best test accuracy (%)\n\n" + accuracy_table(results, rows, ["Pareto"])
    if measured in results:
        runs = results[measured]
        plot_summary_contribution(runs[0], out / "contribution_pareto.png", "GSNR per client, Pareto (seed 0)")
        rho = [label_correlation(r) for r in runs]
        text += "\nSpearman correlation of a client's GSNR score with the number of classes it holds (Fig. 5b), "
        text += f"per seed: {', '.join(f'{v:.2f}' for v in rho)}\n"
    return text


# ----------------------------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------------------------


def plot_entropy(runs: dict[str, list[RunSummary]], log_n: float, out: Path) -> Path:
    """Fig. 3: the entropy H of the step allocation per round (mean over seeds, ± std band) per partition, and
    log N (equal steps)."""
    from dataclasses import replace

    import matplotlib.pyplot as plt

    from fedhet.report.labels import metric_info
    from fedhet.report.plots import band_caption, draw_lines, round_axis, save_figure

    fig, ax = plt.subplots(figsize=(8.0, 4.0), dpi=120)
    series, bands, seeds = {}, {}, 1
    for partition, summaries in runs.items():
        curves = [s.curve("gsnr_entropy") for s in summaries]
        length = min(len(c[1]) for c in curves)
        arr = np.asarray([c[1][:length] for c in curves], dtype=float)
        mean = arr.mean(0)
        series[partition] = (curves[0][0][:length], mean)
        seeds = max(seeds, len(arr))
        if len(arr) > 1:
            std = arr.std(0, ddof=1)
            bands[partition] = (np.clip(mean - std, 0, log_n), np.clip(mean + std, 0, log_n))
    draw_lines(ax, series, bands)
    ax.axhline(log_n, color="black", linestyle=":", linewidth=1.0, label="equal steps for all: log N")
    round_axis(ax)
    ax.set_ylabel("entropy H of the step shares (nats)")
    ax.set_title("How evenly FedGSNR spreads local steps over the clients (Fig. 3)", fontsize=10)
    caption = band_caption(seeds, replace(metric_info("gsnr_entropy"), high=round(log_n, 2)))
    caption += (
        f" H is the entropy of p(C_k) = n_k / Σ n_i, n_k the local steps FedGSNR gives client k; log N = {log_n:.2f}:"
        " equal steps for all clients."
    )
    return save_figure(fig, ax, out, caption=caption)


def plot_partition_gsnr(runs: dict[str, list[RunSummary]], out: Path) -> Path:
    """Fig. 7: the spread of the clients' contribution scores (mean GSNR over rounds) per partition."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    data = [
        np.concatenate([contribution_scores(s.contribution).numpy() for s in summaries if s.contribution is not None])
        for summaries in runs.values()
    ]
    ax.boxplot(data)
    ax.set_xticks(range(1, len(runs) + 1), list(runs), fontsize=8)
    ax.set_xlabel("partition of the data among the clients")
    ax.set_ylabel("client GSNR score (mean over rounds)")
    ax.set_title("Clients' gradient signal-to-noise ratio per partition (Fig. 7)", fontsize=10)
    seeds = max(len(summaries) for summaries in runs.values())
    caption = (
        f"One score per client and seed ({seeds} seed{'s' if seeds > 1 else ''} pooled). Box: the middle half of the "
        "clients (25th to 75th percentile), line: median, whiskers: up to 1.5 × the box height, circles: outliers."
    )
    return save_figure(fig, ax, out, legend=False, caption=caption)


def plot_summary_contribution(summary: RunSummary, out: Path, title: str) -> Path:
    """Figs. 5b / 6 for one run of a study (see `fedhet.methods.fedgsnr.contribution.plot_contribution`); the title
    says what the bars and whiskers are."""
    assert summary.contribution is not None and summary.label_counts is not None
    title = f"{title}: bars mean over rounds, whiskers 25–75% of rounds"
    return plot_contribution(summary.contribution, summary.label_counts, summary.corrupted, out, title)


def study_recipe(name: str, description: str, study: Callable[..., str]) -> Recipe:
    """A recipe that is one of the studies above over the paper's seeds (the study makes its runs and table)."""

    def go(out: Path, quick: bool, seeds: tuple[int, ...], embedded: bool | None, executor: Executor) -> str:
        return study(out, quick, seeds, embedded=embedded, executor=executor)

    return Recipe(name=name, description=description, base={}, methods={}, columns={}, seeds=SEEDS, custom=go)


STUDIES: dict[str, tuple[str, Callable[..., str]]] = {
    "fedgsnr-table1": (
        "FedGSNR Tables 1 and 3: rounds to target, speedup and best accuracy per partition and base",
        table1_study,
    ),
    "fedgsnr-table2": (
        "FedGSNR Table 2: NonBalance with 100 clients, rounds to target for 10/20/100% active clients",
        table2_study,
    ),
    "fedgsnr-fig5": (
        "FedGSNR Fig. 5: CIFAR-100/VGG-16 Pareto, accuracy of each base with and without FedGSNR, GSNR per client",
        fig5_study,
    ),
    "fedgsnr-figures": (
        "FedGSNR figures: step-allocation entropy, GSNR per client and partition, label-flip detection",
        figures_study,
    ),
}
for _name, (_description, _study) in STUDIES.items():
    register_recipe(partial(study_recipe, _name, _description, _study))
