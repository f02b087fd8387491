"""Reproducing a paper's experiment (`fedhet reproduce`): the `Recipe` type (the definitions live in `fedhet.recipes`)
and the runner that turns one into runs, a markdown table and figures.

`fedhet reproduce NAME` describes every (method, seed) run first, runs them through an `Executor` (serially, in
worker processes or on Ray) into ``OUT/<method>/seed<k>/`` (a normal run folder, so `fedhet compare` works on
them), then writes ``OUT/table.md`` (mean ± std over seeds) and the figures from the runs' results.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError
from fedhet.experiments.executor import (
    Executor,
    Outcome,
    Task,
    raise_failures,
    refuse_linked_folders,
    reuse,
    write_index,
    write_text,
)
from fedhet.experiments.naming import safe_name
from fedhet.experiments.runfolder import FolderLock, check_claimable
from fedhet.experiments.state import RunState
from fedhet.experiments.sweep import mean_std
from fedhet.registry import closest
from fedhet.report.tables import markdown_table

__all__ = ["Recipe", "RecipeResult", "deep_merge", "get_recipe", "mean_std", "register_recipe", "run_recipe"]


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
    # extra per-run numbers for the table, from the run's final state (called where the run ran: picklable, e.g. a
    # module-level function, for runs in worker processes)
    summarise: Callable[[RunState], dict[str, float]] | None = None
    fallback: dict[str, Any] | None = None  # changes to an embedded dataset when the paper's files are missing
    # a study of its own: (out, quick, seeds, embedded, executor) → markdown table
    custom: Callable[[Path, bool, tuple[int, ...], bool | None, Executor], str] | None = None
    # figures other than mean curves (violins, log scales): (recipe, method → runs, out) → None
    extra_figures: Callable[[Recipe, dict[str, list[Outcome]], Path], None] | None = None
    # a study of its own that reads dataset files: the config keys naming them (``{"dataset": "cifar10"}``), loaded
    # once before anything is written (a missing file is refused in one line)
    data: dict[str, Any] | None = None

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
    runs: dict[str, list[Outcome]]  # method → its finished runs


def run_recipe(
    recipe: Recipe,
    out: Path,
    *,
    quick: bool = False,
    seeds: tuple[int, ...] | None = None,
    embedded: bool | None = None,
    executor: Executor | None = None,
    say: Callable[[str], None] = print,
) -> RecipeResult:
    """Run every method over every seed and write ``table.md`` and the figures into `out`.

    The runs go through `executor` (default: one after another in this process), into ``OUT/<method>/seed<k>/``
    with the method's label made shell-safe (`safe_name`); ``OUT/runs.json`` lists label, folder and status.
    `embedded`: True forces the embedded fallback dataset, None uses it only when the paper's dataset files
    are missing (and says so). A run that diverges leaves a gap in the table; one that fails otherwise too, and
    the recipe ends with an error once the table is written.
    """
    if seeds is not None and not seeds:
        raise ConfigError("--seeds 0: give at least 1 seed (or leave it out for the recipe's seeds)")
    seeds = seeds or recipe.seeds
    executor = executor or Executor(1)
    check_claimable(out, "recipe")
    if recipe.custom is not None:
        if recipe.data is not None:
            if embedded:
                raise ConfigError(
                    f"'{recipe.name}' reads the {recipe.data.get('dataset')} files: it has no --embedded version"
                )
            executor.check_data([Task(dict(recipe.data), out, recipe.name, {})])
        with FolderLock.claim(out, "recipe"):
            start = len(executor.history)
            table = recipe.custom(out, quick, seeds, embedded, executor)
            write_text(out / "table.md", table)
            if len(executor.history) > start:
                write_index(out / "runs.json", executor.history[start:])
        return RecipeResult(table, {}, {})
    if embedded is None:
        embedded = recipe.fallback is not None and not dataset_available(recipe.base)
        if embedded:
            say(
                f"the paper's dataset ({recipe.base.get('dataset')}) is not in "
                f"'{recipe.base.get('data_dir', 'data')}'; running on the embedded fallback: "
                f"{recipe.fallback.get('dataset') if recipe.fallback else ''}"
            )
    tasks = [
        Task(
            recipe.config(method, seed, quick, embedded),
            out / safe_name(method) / f"seed{seed}",
            f"{method}, seed {seed}",
            {"recipe": recipe.name, "method": method, "seed": seed},
        )
        for method in recipe.methods
        for seed in seeds
    ]
    refuse_linked_folders(out, tasks)
    executor.check_data([t for t in tasks if reuse(t) is None])  # the paper's files, before anything is written
    with FolderLock.claim(out, "recipe"):
        return _run_methods(recipe, out, quick, seeds, embedded, tasks, executor, say)


def _run_methods(
    recipe: Recipe,
    out: Path,
    quick: bool,
    seeds: tuple[int, ...],
    embedded: bool,
    tasks: list[Task],
    executor: Executor,
    say: Callable[[str], None],
) -> RecipeResult:
    outcomes = executor.run(tasks, post=recipe.summarise)
    write_index(out / "runs.json", outcomes)
    values: dict[str, dict[str, list[float]]] = {}
    runs: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        method, seed, folder = outcome.task.meta["method"], outcome.task.meta["seed"], outcome.task.out
        numbers: dict[str, float] = {}
        if outcome.ok:  # at the run's selected round (its best by a validation metric), else its last
            numbers = {**outcome.selected, **(outcome.result or {})}
            runs.setdefault(method, []).append(outcome)
        else:  # one failing run leaves a gap in the table, not a lost recipe
            say(f"{method}, seed {seed}: {outcome.error} (its run folder {folder} is kept)")
        for column in recipe.columns:
            values.setdefault(method, {}).setdefault(column, []).append(numbers.get(column, float("nan")))
    header = ["method", *recipe.columns.values()]
    rows = [[method, *(mean_std(values[method][c]) for c in recipe.columns)] for method in recipe.methods]
    data_note = f"; embedded data: {recipe.fallback.get('dataset')}" if embedded and recipe.fallback else ""
    table = f"### {recipe.description}\n\nseeds: {', '.join(map(str, seeds))}" + (" (quick)" if quick else "")
    table += data_note
    table += "\n\n" + markdown_table(header, rows)
    write_text(out / "table.md", table)
    _figures(recipe, runs, out)
    if recipe.extra_figures is not None:
        recipe.extra_figures(recipe, runs, out)
    raise_failures(outcomes)
    return RecipeResult(table, values, runs)


def dataset_available(base: dict[str, Any]) -> bool:
    """Whether the (base) config's dataset loads from its data folder (files present)."""
    from fedhet.catalog import DATASETS
    from fedhet.errors import DataError

    try:
        DATASETS.build(base.get("dataset", "digits"), where="dataset").load(Path(base.get("data_dir", "data")))
    except DataError:
        return False
    return True


def mean_curves(
    runs: dict[str, list[Outcome]], metric: str
) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """`metric` per method and seed against the round (NaN where a round lacks it), and each method's rounds."""
    curves = {
        method: [[row.get(metric, float("nan")) for row in s.history] for s in states]
        for method, states in runs.items()
    }
    rounds = {method: [row["round"] for row in states[0].history] for method, states in runs.items()}
    return curves, rounds


def _figures(recipe: Recipe, runs: dict[str, list[Outcome]], out: Path) -> None:
    if not recipe.figures:
        return
    from fedhet.report.plots import plot_mean_curves

    for metric, filename in recipe.figures.items():
        curves, rounds = mean_curves(runs, metric)
        plot_mean_curves(curves, rounds, metric, out / filename, context=f"{recipe.name}: {recipe.description}.")
