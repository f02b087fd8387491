"""Recipes: a paper's experiment as several methods × seeds, summarised as a markdown table and figures.

`fedhet reproduce NAME` runs every (method, seed) into ``OUT/<method>/seed<k>/`` (a normal run folder, so
`fedhet compare` works on them), then writes ``OUT/table.md`` (mean ± std over seeds) and the figures.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import ConfigError, DivergenceError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, run_or_resume
from fedhet.registry import closest
from fedhet.report.tables import markdown_table


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `changes` merged in (nested mappings merged, other values replaced; a component
    mapping whose ``name`` changes replaces the old one, whose parameters would not fit it)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        current = out.get(key)
        renamed = (
            isinstance(value, dict)
            and isinstance(current, dict)
            and value.get("name", current.get("name")) != current.get("name")
        )
        if isinstance(value, dict) and isinstance(current, dict) and not renamed:
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Recipe:
    """An experiment: a base config, the methods (config changes), seeds, and what to report."""

    name: str
    description: str
    base: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    columns: dict[str, str]  # metric → column header
    seeds: tuple[int, ...] = (0, 1, 2)
    quick: dict[str, Any] = field(default_factory=dict)  # changes for --quick (fewer rounds, clients)
    figures: dict[str, str] = field(default_factory=dict)  # metric → figure file name
    summarise: Callable[[RunState], dict[str, float]] | None = None  # extra per-run numbers for the table
    fallback: dict[str, Any] | None = None  # changes to an embedded dataset when the paper's files are missing
    # a study that is not a set of runs: (out, quick, seeds, embedded) → markdown table
    custom: Callable[[Path, bool, tuple[int, ...], bool | None], str] | None = None
    # figures other than mean curves (violins, log scales): (recipe, method → runs, out) → None
    extra_figures: Callable[[Recipe, dict[str, list[RunState]], Path], None] | None = None

    def config(self, method: str, seed: int, quick: bool, embedded: bool = False) -> dict[str, Any]:
        raw = deep_merge(self.base, self.methods[method])
        if embedded and self.fallback is not None:
            raw = deep_merge(raw, self.fallback)
        if quick:
            raw = deep_merge(raw, self.quick)
        raw["seed"] = seed
        return raw


RECIPES: dict[str, Callable[[], Recipe]] = {}


def register_recipe(factory: Callable[[], Recipe]) -> Callable[[], Recipe]:
    RECIPES[factory().name] = factory
    return factory


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ConfigError(
            f"unknown recipe '{name}'{closest(name, sorted(RECIPES))}; choose one of: {', '.join(sorted(RECIPES))}"
        )
    return RECIPES[name]()


@dataclass
class RecipeResult:
    table: str
    values: dict[str, dict[str, list[float]]]  # method → column → one value per seed
    runs: dict[str, list[RunState]]


def run_recipe(
    recipe: Recipe,
    out: Path,
    *,
    quick: bool = False,
    seeds: tuple[int, ...] | None = None,
    embedded: bool | None = None,
    callbacks: Callable[[str, int], list[Callback]] | None = None,
    say: Callable[[str], None] = print,
) -> RecipeResult:
    """Run every method over every seed and write ``table.md`` and the figures into `out`.

    `embedded`: True forces the embedded fallback dataset, None uses it only when the paper's dataset files
    are missing (and says so).
    """
    seeds = seeds or recipe.seeds
    out.mkdir(parents=True, exist_ok=True)
    if recipe.custom is not None:
        table = recipe.custom(out, quick, seeds, embedded)
        (out / "table.md").write_text(table)
        return RecipeResult(table, {}, {})
    if embedded is None:
        embedded = recipe.fallback is not None and not _dataset_available(recipe.base)
        if embedded:
            say(
                f"the paper's dataset ({recipe.base.get('dataset')}) is not in "
                f"'{recipe.base.get('data_dir', 'data')}'; running on the embedded fallback: "
                f"{recipe.fallback.get('dataset') if recipe.fallback else ''}"
            )
    values: dict[str, dict[str, list[float]]] = {}
    runs: dict[str, list[RunState]] = {}
    for method in recipe.methods:
        for seed in seeds:
            cfg = parse_config(recipe.config(method, seed, quick, embedded))
            folder = out / method / f"seed{seed}"
            try:
                state = run_or_resume(cfg, folder, callbacks(method, seed) if callbacks else None)
            except DivergenceError as err:  # one diverging run leaves a gap in the table, not a lost recipe
                say(f"{method}, seed {seed}: {err} (its run folder {folder} is kept)")
                numbers: dict[str, float] = {}
            else:
                numbers = dict(state.final)
                if recipe.summarise is not None:
                    numbers.update(recipe.summarise(state))
                runs.setdefault(method, []).append(state)
            for column in recipe.columns:
                values.setdefault(method, {}).setdefault(column, []).append(numbers.get(column, float("nan")))
    header = ["method", *recipe.columns.values()]
    rows = [[method, *(mean_std(values[method][c]) for c in recipe.columns)] for method in recipe.methods]
    data_note = f"; embedded data: {recipe.fallback.get('dataset')}" if embedded and recipe.fallback else ""
    table = f"### {recipe.description}\n\nseeds: {', '.join(map(str, seeds))}" + (" (quick)" if quick else "")
    table += data_note
    table += "\n\n" + markdown_table(header, rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    _figures(recipe, runs, out)
    if recipe.extra_figures is not None:
        recipe.extra_figures(recipe, runs, out)
    return RecipeResult(table, values, runs)


def _dataset_available(base: dict[str, Any]) -> bool:
    """Whether the base config's dataset loads (files present)."""
    from fedhet.catalog import DATASETS
    from fedhet.errors import DataError

    try:
        DATASETS.build(base.get("dataset", "digits"), where="dataset").load(Path(base.get("data_dir", "data")))
    except DataError:
        return False
    return True


def mean_std(values: list[float], digits: int = 4, scale: float = 1.0) -> str:
    """ "mean ± std" of `scale`·values over the seeds (sample std); seeds without a value (NaN: a diverged run, a
    target never reached) are left out and counted."""
    arr = scale * np.asarray(values, dtype=float)
    ok = arr[~np.isnan(arr)]
    missing = f" ({len(arr) - len(ok)} of {len(arr)} missing)" if len(ok) < len(arr) else ""
    if len(ok) == 0:
        return "n/a" + missing
    if len(ok) == 1:
        return f"{ok[0]:.{digits}f}" + missing
    return f"{ok.mean():.{digits}f} ± {ok.std(ddof=1):.{digits}f}" + missing


def mean_curves(
    runs: dict[str, list[RunState]], metric: str
) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """`metric` per method and seed against the round (NaN where a round lacks it), and each method's rounds."""
    curves = {
        method: [[row.get(metric, float("nan")) for row in s.history] for s in states]
        for method, states in runs.items()
    }
    rounds = {method: [row["round"] for row in states[0].history] for method, states in runs.items()}
    return curves, rounds


def _figures(recipe: Recipe, runs: dict[str, list[RunState]], out: Path) -> None:
    if not recipe.figures:
        return
    from fedhet.report.plots import plot_mean_curves

    for metric, filename in recipe.figures.items():
        curves, rounds = mean_curves(runs, metric)
        plot_mean_curves(curves, rounds, metric, out / filename, title=recipe.description)
