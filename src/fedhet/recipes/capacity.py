"""Clients of different capacity (docs/capacity.md): HeteroFL, FedRolex and FjORD against FedAvg, as recipes.

HeteroFL (Diao, Ding, Tarokh, ICLR 2021; its scaler on and off), FedRolex and FjORD, each with the five levels
r ∈ {1, 1/2, 1/4, 1/8, 1/16} in equal shares, assigned once per run (``fix``) or redrawn every round
(``dynamic``), against FedAvg on the full model and FedAvg with every client at the smallest level (1/16, no
scaler). The table gives the final test accuracy of the global model restricted to each level (the first ⌈r·d⌉
units or channels of every hidden layer), mean ± std over seeds, beside each level's parameters and forward FLOPs
per sample (`fedhet.models.flops`), as HeteroFL's tables list them.

The direction checks, per seed (runs paired by seed: the same partition and initial model):

(i) HeteroFL's reading of its tables (§4, Tables 2–4: a combination such as "a–e" is scored by its global model,
    the largest level, beside a model trained at one level alone such as "e"): the mixed run's full model beats
    FedAvg with every client at 1/16, evaluated at 1/16;
(ii) graceful degradation: the mixed run's full model loses at most `GRACEFUL` accuracy to FedAvg's full model;
(iii) per level: the mixed run's own 1/16 slice beats the 1/16 baseline.

``capacity``: scikit-learn's digits (embedded), 20 clients of Dirichlet(0.3) label skew, an MLP with 64 hidden
units, 10 clients a round, 30 rounds of 10 local steps. ``capacity-cifar10``: CIFAR-10 from its python batches in
``data/cifar10/`` (refused in one line when they are missing), the zoo's ``cnn_cifar`` sliced by channels, 50
rounds; HeteroFL only without its scaler there (without normalisation layers its 1/r factors compound over the
CNN's three sliced layers, 16³ at 1/16, and the run diverges: docs/capacity.md).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from fedhet import atomic
from fedhet.experiments.executor import Executor, Outcome, Task, raise_failures
from fedhet.experiments.naming import safe_name
from fedhet.experiments.reproduce import Recipe, deep_merge, mean_std, register_recipe
from fedhet.report.tables import markdown_table

LEVELS = (1.0, 0.5, 0.25, 0.125, 0.0625)
SMALLEST = LEVELS[-1]
GRACEFUL = 0.05  # (ii): the most accuracy the mixed run's full model may lose to FedAvg's
ASSIGNMENTS = ("fix", "dynamic")
FULL = "FedAvg, full model"
SMALL = "FedAvg, all at 1/16"
DIGITS: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.3, "min_size": 20},
    "model": {"name": "mlp", "hidden": [64]},
    "num_clients": 20,
    "clients_per_round": 10,
    "rounds": 30,
    "eval_every": 10,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
}
CIFAR10: dict[str, Any] = {
    "dataset": "cifar10",
    "partition": {"name": "dirichlet", "alpha": 0.3, "min_size": 20},
    "model": {"name": "cnn_cifar"},
    "num_clients": 20,
    "clients_per_round": 10,
    "rounds": 50,
    "eval_every": 10,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 32},
}
SETTINGS = {"digits": DIGITS, "cifar10": CIFAR10}
QUICK: dict[str, Any] = {"rounds": 10, "eval_every": 5}
SCHEMES: dict[str, dict[str, Any]] = {
    "HeteroFL": {"name": "heterofl"},
    "HeteroFL, no scaler": {"name": "heterofl", "scaler": False},
    "FedRolex": {"name": "fedrolex"},
    "FjORD": {"name": "fjord"},
}
CHECKS = {  # the 1/16 baseline: FedAvg with every client at 1/16, scored at 1/16
    "i": "(i) full model > 1/16 baseline",
    "ii": f"(ii) full model ≥ FedAvg's full − {GRACEFUL:g}",
    "iii": "(iii) own 1/16 slice > 1/16 baseline",
}


def fraction(level: float) -> str:
    """1 → "1", 0.0625 → "1/16"."""
    return str(Fraction(level).limit_denominator(1024))


def column(level: float) -> str:
    """The metrics.csv column of the global model at `level` (`fedhet.strategies.submodels`)."""
    return f"test_accuracy_level{level:g}"


def mixed_name(scheme: str, assignment: str) -> str:
    return f"{scheme} ({assignment})"


def methods(dataset: str = "digits") -> dict[str, dict[str, Any]]:
    """Each method's config changes: every scheme × assignment over `LEVELS`, then the two FedAvg baselines.
    CIFAR-10 leaves out HeteroFL with its scaler (it diverges on the CNN, whose layers have no normalisation)."""
    out: dict[str, dict[str, Any]] = {}
    for scheme, algorithm in SCHEMES.items():
        if dataset != "digits" and algorithm.get("name") == "heterofl" and algorithm.get("scaler", True):
            continue
        for assignment in ASSIGNMENTS:
            out[mixed_name(scheme, assignment)] = {
                "algorithm": {**algorithm, "levels": list(LEVELS), "assignment": assignment}
            }
    out[FULL] = {"algorithm": {"name": "fedavg"}}
    out[SMALL] = {"algorithm": {"name": "heterofl", "levels": [SMALLEST], "scaler": False}}
    return out


def mixed(found: dict[str, Any]) -> list[str]:
    """The mixed-capacity methods of `found` (every method but the two baselines)."""
    return [m for m in found if m not in (FULL, SMALL)]


def setting(dataset: str, quick: bool, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = deep_merge(SETTINGS[dataset], QUICK) if quick else SETTINGS[dataset]
    return deep_merge(raw, changes or {})


def tasks(
    out: Path, dataset: str, quick: bool, seeds: tuple[int, ...], changes: dict[str, Any] | None = None
) -> list[Task]:
    base = setting(dataset, quick, changes)
    return [
        Task(
            {**deep_merge(base, cell), "seed": seed},
            out / safe_name(method) / f"seed{seed}",
            f"{method}, seed {seed}",
            {"recipe": f"capacity ({dataset})", "method": method, "seed": seed},
        )
        for method, cell in methods(dataset).items()
        for seed in seeds
    ]


INPUT_SHAPES = {"digits": ((64,), 10), "cifar10": ((3, 32, 32), 10)}  # each dataset's input shape and classes


def level_costs(config: dict[str, Any]) -> dict[str, float]:
    """``parameters<r>`` and ``flops<r>``: the parameters and the forward FLOPs per sample of the sub-model of
    level r (the first ⌈r·d⌉ units of every hidden layer) of the model of `config` (a digits or CIFAR-10 run)."""
    from fedhet.catalog import MODELS
    from fedhet.engine.functional import FlatModel
    from fedhet.models.flops import parameter_flops
    from fedhet.strategies.submodels import sliced_layers, width_mask

    shape, classes = INPUT_SHAPES[config["dataset"]]
    model = FlatModel(MODELS.build(config["model"], where="model").build(shape, classes))
    flops = parameter_flops(model.module, shape)
    layers = sliced_layers(model, "the capacity recipe")
    out = {}
    for level in LEVELS:
        mask = width_mask(model, layers, level)
        out[f"parameters{level:g}"] = float(mask.sum())
        out[f"flops{level:g}"] = float(flops[mask].sum())
    return out


Found = dict[str, dict[float, list[float]]]  # method → level → final accuracy per seed (NaN: no value)


def last(history: list[dict[str, float]], key: str) -> float:
    """The last value of `key` in `history` (NaN when no row has one)."""
    values = [row[key] for row in history if key in row and not math.isnan(row[key])]
    return float(values[-1]) if values else math.nan


def accuracies(outcomes: list[Outcome]) -> Found:
    """Each method's final accuracy at each level per seed (FedAvg full: its whole model at level 1; the 1/16
    baseline: at 1/16 only)."""
    found: Found = {}
    for outcome in outcomes:
        method = outcome.task.meta["method"]
        history = outcome.history if outcome.ok else []
        row = found.setdefault(method, {})
        for level in LEVELS:
            if method == FULL:
                value = last(history, "test_accuracy") if level == 1.0 else math.nan
            elif method == SMALL:
                value = last(history, column(level)) if level == SMALLEST else math.nan
            else:
                value = last(history, column(level))
            row.setdefault(level, []).append(value)
    return found


Check = tuple[list[float], list[float], list[bool | None]]  # the mixed run's value, the baseline's, holds (per seed)


def compare(ours: list[float], theirs: list[float], rule: Callable[[float, float], bool]) -> Check:
    """`rule` (ours, theirs) seed by seed (None where either is NaN)."""
    holds = [None if math.isnan(a) or math.isnan(b) else rule(a, b) for a, b in zip(ours, theirs, strict=True)]
    return list(ours), list(theirs), holds


def checks(found: Found) -> dict[str, dict[str, Check]]:
    """method → check (i, ii, iii) → per seed: the mixed run's number, the baseline's, and whether it holds (None
    where a run has no value). (ii) compares the drop FedAvg full − mixed full with `GRACEFUL`."""
    small, full = found[SMALL][SMALLEST], found[FULL][1.0]
    out: dict[str, dict[str, Check]] = {}
    for method in mixed(found):
        own_full, own_small = found[method][1.0], found[method][SMALLEST]
        pairs = {
            "i": (own_full, small, lambda a, b: a > b),
            "ii": (own_full, full, lambda a, b: b - a <= GRACEFUL),
            "iii": (own_small, small, lambda a, b: a > b),
        }
        out[method] = {key: compare(a, b, rule) for key, (a, b, rule) in pairs.items()}
    return out


def mark(holds: bool | None) -> str:
    return "–" if holds is None else ("✓" if holds else "✗")


def check_cell(key: str, check: Check) -> str:
    """Per seed ✓/✗ (in seed order), how many hold, and the means compared."""
    ours, theirs, holds = check
    known = [h for h in holds if h is not None]
    mean_ours, mean_theirs = float(np.nanmean(ours)) if known else math.nan, float(np.nanmean(theirs))
    numbers = f"drop {mean_theirs - mean_ours:.3f}" if key == "ii" else f"{mean_ours:.3f} vs {mean_theirs:.3f}"
    return f"{' '.join(map(mark, holds))} ({sum(known)}/{len(holds)}; {numbers})"


def costs_cells(costs: dict[str, float], level: float) -> list[str]:
    params, flops = costs[f"parameters{level:g}"], costs[f"flops{level:g}"]
    return [f"{params:,.0f}", f"{flops:,.0f} ({flops / costs['flops1']:.1%})"]


def tables(found: Found, costs: dict[str, float], verdicts: dict[str, dict[str, Check]]) -> str:
    """One accuracy table per assignment (rows: levels), then the direction checks."""
    text = ""
    for assignment in ASSIGNMENTS:
        names = [m for m in mixed(found) if m.endswith(f"({assignment})")]
        header = ["level", "parameters", "FLOPs/sample", *(m.rsplit(" (", 1)[0] for m in names), FULL, SMALL]
        rows = []
        for level in LEVELS:
            cells = [mean_std(found[m][level], 3) if not np.isnan(found[m][level]).all() else "–" for m in names]
            for base in (FULL, SMALL):
                values = found[base][level]
                cells.append(mean_std(values, 3) if not np.isnan(values).all() else "–")
            rows.append([fraction(level), *costs_cells(costs, level), *cells])
        text += f"\n\n**assignment: {assignment}** (final test accuracy of the global model at each level)\n\n"
        text += markdown_table(header, rows)
    rows = [[method, *(check_cell(k, verdicts[method][k]) for k in CHECKS)] for method in verdicts]
    text += (
        f"\n\n**direction checks**, per seed in seed order (✓ holds, ✗ does not, – no value); the 1/16 baseline: "
        f"{SMALL}, scored at 1/16\n\n"
    )
    return text + markdown_table(["method", *CHECKS.values()], rows)


def write_csvs(
    out: Path, found: Found, costs: dict[str, float], verdicts: dict[str, dict[str, Check]], seeds: tuple[int, ...]
) -> None:
    """accuracy.csv (method, level, parameters, flops, seed, accuracy) and checks.csv (method, check, seed, the
    mixed run's value, the baseline's, holds)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["method", "level", "parameters", "flops", "seed", "test_accuracy"])
    for method, levels in found.items():
        for level, values in levels.items():
            for seed, value in zip(seeds, values, strict=True):
                writer.writerow([method, level, costs[f"parameters{level:g}"], costs[f"flops{level:g}"], seed, value])
    atomic.write_text(out / "accuracy.csv", buffer.getvalue())
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["method", "check", "seed", "mixed", "baseline", "holds"])
    for method, found_checks in verdicts.items():
        for key, (ours, theirs, holds) in found_checks.items():
            for seed, a, b, h in zip(seeds, ours, theirs, holds, strict=True):
                writer.writerow([method, key, seed, a, b, "" if h is None else h])
    atomic.write_text(out / "checks.csv", buffer.getvalue())


def capacity_study(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    dataset: str = "digits",
    executor: Executor | None = None,
    changes: dict[str, Any] | None = None,
) -> str:
    """Every method over `seeds` on `dataset`: the tables (markdown, returned), accuracy.csv, checks.csv and
    accuracy_by_level.png in `out`."""
    cells = tasks(out, dataset, quick, seeds, changes)
    outcomes = (executor or Executor(1)).run(cells)
    found, costs = accuracies(outcomes), level_costs(cells[0].config)
    verdicts = checks(found)
    base = setting(dataset, quick, changes)
    text = f"### {DESCRIPTIONS[dataset]}\n\nseeds: {', '.join(map(str, seeds))}" + (" (quick)" if quick else "")
    text += (
        f"; {base['num_clients']} clients, {base['clients_per_round']} a round, {base['rounds']} rounds; levels "
        f"{', '.join(map(fraction, LEVELS))} in equal shares; mean ± std over seeds; FLOPs: forward, per sample"
    )
    text += tables(found, costs, verdicts)
    write_csvs(out, found, costs, verdicts, seeds)
    plot_capacity(found, out / "accuracy_by_level.png", len(seeds), DESCRIPTIONS[dataset])
    raise_failures(outcomes)
    return text


def plot_capacity(found: Found, out: Path, seeds: int, description: str) -> Path:
    """Final test accuracy against the level (log scale), one line per method, ± 1 std; a panel per assignment;
    FedAvg's full model and the all-at-1/16 model as single markers."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import add_caption, outside_legend, write_figure

    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.4), dpi=120, sharey=True)
    xs = np.asarray(LEVELS)
    styles = {scheme: (f"C{i}", "osD^v<>"[i % 7]) for i, scheme in enumerate(SCHEMES)}
    for ax, assignment in zip(axes, ASSIGNMENTS, strict=True):
        for method in mixed(found):
            scheme, _, kind = method.rpartition(" (")
            if kind != f"{assignment})":
                continue
            values = [np.asarray(found[method][level], dtype=float) for level in LEVELS]
            means = np.array([np.nanmean(v) if np.isfinite(v).any() else np.nan for v in values])
            spread = np.array([np.nanstd(v, ddof=1) if np.isfinite(v).sum() > 1 else 0.0 for v in values])
            color, marker = styles[scheme]
            ax.errorbar(xs, means, yerr=spread, color=color, marker=marker, capsize=3, label=scheme)
        for method, level, marker in ((FULL, 1.0, "*"), (SMALL, SMALLEST, "X")):
            seen = np.asarray(found[method][level], dtype=float)
            if np.isfinite(seen).any():
                std = float(np.nanstd(seen, ddof=1)) if np.isfinite(seen).sum() > 1 else 0.0
                ax.errorbar(
                    [level],
                    [np.nanmean(seen)],
                    yerr=[std],
                    color="k",
                    marker=marker,
                    ms=11,
                    capsize=3,
                    linestyle="none",
                    zorder=5,
                    label=method,
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(LEVELS), [fraction(level) for level in LEVELS])
        ax.minorticks_off()
        ax.set_xlabel("capacity level r (share of every hidden layer's units kept)")
        ax.set_title(f"assignment: {assignment}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final test accuracy of the global model at level r")
    fig.suptitle("Accuracy of the global model at each capacity level")
    fig.tight_layout()
    outside_legend(axes[1])
    add_caption(
        fig,
        f"Mean over {seeds} seed(s), error bars ± 1 std. Each level scores the first ⌈r·d⌉ units (channels) of every "
        f"hidden layer of the global model. Setting: {description}.",
    )
    return write_figure(fig, out)


DESCRIPTIONS = {
    "digits": "clients of different capacity on digits: HeteroFL, FedRolex and FjORD against FedAvg (MLP 64)",
    "cifar10": "clients of different capacity on CIFAR-10: HeteroFL, FedRolex and FjORD against FedAvg (cnn_cifar)",
}


def _digits(out: Path, quick: bool, seeds: tuple[int, ...], embedded: bool | None, executor: Executor) -> str:
    del embedded  # the digits are embedded
    return capacity_study(out, quick, seeds, "digits", executor)


def _cifar(out: Path, quick: bool, seeds: tuple[int, ...], embedded: bool | None, executor: Executor) -> str:
    del embedded  # refused before it gets here (`Recipe.data`: the files are read)
    return capacity_study(out, quick, seeds, "cifar10", executor)


@register_recipe
def capacity() -> Recipe:
    return Recipe(name="capacity", description=DESCRIPTIONS["digits"], base={}, methods={}, columns={}, custom=_digits)


@register_recipe
def capacity_cifar10() -> Recipe:
    return Recipe(
        name="capacity-cifar10",
        description=DESCRIPTIONS["cifar10"] + "; needs data/cifar10",
        base={},
        methods={},
        columns={},
        custom=_cifar,
        data={"dataset": "cifar10"},
    )
