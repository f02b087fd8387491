"""Sweeps: a base config, a grid of values for its dotted keys and some seeds; one run folder per point and seed,
a summary table (mean ± std over the seeds of each point) and the best point by a metric.

Each run's numbers are those of its selected round: with a validation split (``val_fraction``), the best round by
its ``selection.metric`` (val_loss by default), and the sweep then picks its best point by that validation metric
too and reports the test metrics at those rounds; without one, the last round's (and the summary says that the
choice was made on test data). Runs that score personalised models pick the best point by their clients'
personalised test accuracy unless a metric was chosen (`ranked_by`).

``OUT/<point>/seed<k>/`` is a normal run folder (`fedhet compare` works on it); ``OUT/<point>/point.json`` holds
the point's label and values, ``OUT/sweep.json`` the sweep, ``OUT/summary.md`` and ``OUT/summary.csv`` the results.
The summary is read from the run folders, so it is the same however the runs were made (serially, in worker
processes, on Ray) and after any number of interruptions.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedhet.atomic import refuse_link
from fedhet.errors import ConfigError
from fedhet.experiments.assembly import set_key
from fedhet.experiments.build import components
from fedhet.experiments.config import parse_config
from fedhet.experiments.executor import (
    DONE,
    Executor,
    Outcome,
    Task,
    refuse_linked_folders,
    reuse,
    write_index,
    write_text,
)
from fedhet.experiments.naming import MAX_LENGTH, safe_name
from fedhet.experiments.runfolder import FolderLock, check_claimable, read_marker
from fedhet.experiments.selection import better
from fedhet.registry import closest
from fedhet.summary_json import read_summary

SWEEP_KEYS = ("grid", "seeds", "metric", "mode", "show")
SWEEP_FILES = ("sweep.json", "runs.json", "summary.md", "summary.csv", "errors.log")
BASE_POINT = "base"


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


# ---------------------------------------------------------------------------------------------------- the grid


def flow(value: Any) -> str:
    """`value` as one line of YAML (how a grid value is written back to people)."""
    if isinstance(value, str):
        return value
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
    return text.removesuffix("\n...\n").strip()


def parse_grid(entries: Sequence[str]) -> dict[str, list[Any]]:
    """``--grid key=v1,v2`` entries as {key: [values]}; the values are one YAML flow list, so a list value is
    written in brackets (``model.hidden=[64],[64,32]``) and a mapping in braces."""
    grid: dict[str, list[Any]] = {}
    for entry in entries:
        if "=" not in entry:
            raise ConfigError(f"--grid '{entry}' must look like key=value1,value2, e.g. --grid local.lr=0.01,0.05")
        key, text = (part.strip() for part in entry.split("=", 1))
        try:
            values = yaml.safe_load(f"[{text}]")
        except yaml.YAMLError:
            raise ConfigError(
                f"--grid '{entry}': the values are not a comma-separated list (a list value goes in brackets, "
                "e.g. model.hidden=[64],[64,32])"
            ) from None
        if key in grid:
            raise ConfigError(f"--grid '{key}' is given twice; list all its values in one --grid {key}=...")
        grid[key] = check_axis(key, values, f"--grid '{entry}'")
    return grid


def check_axis(key: str, values: Any, where: str) -> list[Any]:
    """The values of one grid key, checked: a non-empty list without repeats, and not the seed."""
    if not key or not all(key.split(".")):
        raise ConfigError(f"{where}: empty key")
    if key == "seed":
        raise ConfigError(f"{where}: the seed is not a grid key; use --seeds N (seeds: N in the sweep section)")
    if not isinstance(values, list) or not values or any(v is None for v in values):
        raise ConfigError(f"{where}: give a list of values, e.g. {key}: [0.01, 0.05] (--grid {key}=0.01,0.05)")
    texts = [json.dumps(v, sort_keys=True) for v in values]
    repeated = next((v for v, t in zip(values, texts, strict=True) if texts.count(t) > 1), None)
    if repeated is not None:
        raise ConfigError(f"{where}: the value {flow(repeated)} is listed twice")
    return values


@dataclass(frozen=True)
class Point:
    """One point of the grid: a folder name (shell-safe), a human label, and its value for each grid key."""

    name: str
    label: str
    values: dict[str, Any]


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's last part ("local.lr" → "lr"), or the whole key where two keys share their last part."""
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def _value_text(value: Any) -> str:
    if isinstance(value, dict):
        head = [str(value["name"])] if "name" in value else []
        return "-".join(head + [f"{k}-{_value_text(v)}" for k, v in value.items() if k != "name"])
    if isinstance(value, list):
        return "-".join(_value_text(v) for v in value)
    return flow(value)


def grid_points(grid: dict[str, list[Any]]) -> list[Point]:
    """Every combination of the grid's values (the first key varies slowest), named for folders."""
    if not grid:
        return [Point(BASE_POINT, "base config", {})]
    short = _short_keys(list(grid))
    points = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo, strict=True))
        label = ", ".join(f"{k}={flow(v)}" for k, v in values.items())
        text = "_".join(f"{short[k]}-{_value_text(v)}" for k, v in values.items())
        name = safe_name(text)
        if len(text) > MAX_LENGTH:  # a cut name gets a digest of the whole label, to stay unique
            name = f"{name[: MAX_LENGTH - 9]}-{hashlib.sha1(label.encode()).hexdigest()[:8]}"
        points.append(Point(name, label, values))
    names = [p.name for p in points]
    for point in points:
        if names.count(point.name) > 1:
            other = next(p for p in points if p.name == point.name and p is not point)
            raise ConfigError(f"grid points '{point.label}' and '{other.label}' would share the folder '{point.name}'")
    return points


# --------------------------------------------------------------------------------------------------- the sweep


def default_mode(metric: str) -> str:
    """ "min" for losses, errors, spreads and round counts, "max" otherwise."""
    return better(metric)


def selection_of(base: dict[str, Any]) -> str | None:
    """The metric the base config's runs select their best round by (val_loss with a validation split), or None."""
    try:
        return parse_config(base).selection_metric()
    except ConfigError:
        return None


@dataclass
class Sweep:
    """A base config (raw, as YAML gives it), a grid, the seeds, and the metric that picks the best point."""

    base: dict[str, Any]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: tuple[int, ...] = (0,)
    metric: str = "test_accuracy"
    mode: str = "max"
    show: tuple[str, ...] = ()  # more metrics for the summary table
    chosen: bool = True  # whether `metric` was chosen (--metric, sweep.metric, a validation split), not the default

    def points(self) -> list[Point]:
        return grid_points(self.grid)

    def config(self, point: Point, seed: int) -> dict[str, Any]:
        raw = copy.deepcopy(self.base)
        for key, value in point.values.items():
            set_key(raw, key, copy.deepcopy(value), f"grid key '{key}'")
        raw["seed"] = seed
        return raw

    def folder(self, out: Path, point: Point, seed: int) -> Path:
        return out / point.name / f"seed{seed}"

    def tasks(self, out: Path) -> list[Task]:
        """One task per point and seed; every point's config is checked first (a bad one stops the sweep)."""
        tasks = []
        for point in self.points():
            for seed in self.seeds:
                raw = self.config(point, seed)
                if seed == self.seeds[0]:
                    try:
                        components(parse_config(raw))
                    except ConfigError as err:
                        raise ConfigError(f"grid point {point.label}: {err}") from None
                meta = {"sweep": out.name, "point": point.name, "values": point.values, "seed": seed}
                tasks.append(Task(raw, self.folder(out, point, seed), f"{point.label}, seed {seed}", meta))
        return tasks


def make_sweep(
    raw: dict[str, Any],
    grid: Sequence[str] = (),
    seeds: int | None = None,
    metric: str | None = None,
    mode: str | None = None,
    show: Sequence[str] = (),
) -> Sweep:
    """A `Sweep` from a raw config that may hold a ``sweep:`` section, and the command line's flags (which
    replace the section's keys: a ``--grid`` key replaces that key's values)."""
    base = copy.deepcopy(raw)
    section = base.pop("sweep", None) or {}
    if not isinstance(section, dict):
        raise ConfigError("the sweep section must be a mapping with keys: " + ", ".join(SWEEP_KEYS))
    unknown = [k for k in section if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(
            f"sweep.{unknown[0]} is not a sweep key{closest(unknown[0], list(SWEEP_KEYS))}; "
            f"use: {', '.join(SWEEP_KEYS)}"
        )
    axes = section.get("grid") or {}
    if not isinstance(axes, dict):
        raise ConfigError("sweep.grid must map dotted keys to lists of values, e.g. local.lr: [0.01, 0.05]")
    combined = {str(k): check_axis(str(k), v, f"sweep.grid.{k}") for k, v in axes.items()}
    combined.update(parse_grid(grid))
    count = seeds if seeds is not None else section.get("seeds", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        where = "--seeds" if seeds is not None else "sweep.seeds"
        raise ConfigError(f"{where} {count}: give the number of seeds, at least 1")
    first = base.get("seed", 0)
    if not isinstance(first, int) or first < 0:
        raise ConfigError(f"seed {first!r}: give a whole number ≥ 0 (the first seed of the sweep)")
    runs_select = selection_of(base)
    chosen = metric or str(section.get("metric", runs_select or "test_accuracy"))
    order = mode or str(section.get("mode", default_mode(chosen)))
    if order not in ("max", "min"):
        raise ConfigError(f"--mode {order}: choose max or min (whether a larger {chosen} is better)")
    extra = tuple(show) or tuple(str(m) for m in section.get("show", ()))
    if not extra and chosen.startswith("val_"):  # chosen on validation: report the test values at those rounds
        extra = tuple(dict.fromkeys(("test_accuracy", f"test_{chosen[4:]}")))
    given = metric is not None or "metric" in section or runs_select is not None
    return Sweep(base, combined, tuple(range(first, first + count)), chosen, order, extra, given)


# ------------------------------------------------------------------------------------------------- the summary


@dataclass
class PointResult:
    """One point's runs: their statuses and each final metric per seed (NaN where a run did not finish)."""

    point: Point
    statuses: list[str]
    values: dict[str, list[float]]

    @property
    def ok(self) -> int:
        return sum(s in DONE for s in self.statuses)

    def mean(self, metric: str) -> float:
        arr = np.asarray(self.values.get(metric, [math.nan]), dtype=float)
        return float(np.nanmean(arr)) if not np.isnan(arr).all() else math.nan


def read_results(sweep: Sweep, out: Path) -> list[PointResult]:
    """Every point's runs, read from their folders (``summary.json``)."""
    results = []
    for point in sweep.points():
        statuses, finals = [], []
        for seed in sweep.seeds:
            path = sweep.folder(out, point, seed) / "summary.json"
            try:
                summary = read_summary(path)
            except (OSError, ValueError, RecursionError):
                summary = {"status": "missing"}
            statuses.append(str(summary.get("status", "missing")))
            row = summary.get("selected") or summary.get("final", {})  # the selected round's, else the last
            finals.append(row if statuses[-1] in DONE else {})
        metrics = sorted({k for f in finals for k in f if k != "round"})
        values = {m: [float(f.get(m, math.nan)) for f in finals] for m in metrics}
        results.append(PointResult(point, statuses, values))
    return results


PERSONAL = "personal_test_accuracy"


def ranked_by(sweep: Sweep, results: list[PointResult]) -> Sweep:
    """The sweep as its summary ranks it: by ``personal_test_accuracy`` (max) where its runs score personalised
    models and no metric was chosen (their clients use those, not the global model), else as it is."""
    if sweep.chosen or sweep.metric != "test_accuracy" or not any(PERSONAL in r.values for r in results):
        return sweep
    show = tuple(dict.fromkeys(("test_accuracy", *(m for m in sweep.show if m != PERSONAL))))
    return replace(sweep, metric=PERSONAL, mode="max", show=show)


def best_point(results: list[PointResult], metric: str, mode: str) -> PointResult | None:
    """The point with the best mean of `metric` over its finished seeds (the first of equals); None when no run
    has the metric."""
    scored = [(r.mean(metric), i) for i, r in enumerate(results) if not math.isnan(r.mean(metric))]
    if not scored:
        return None
    sign = -1.0 if mode == "max" else 1.0
    return results[min(scored, key=lambda s: (sign * s[0], s[1]))[1]]


def selection_rule_text(sweep: Sweep) -> str:
    """How the sweep's numbers and best point were chosen, in one sentence."""
    runs_select = selection_of(sweep.base)
    rounds = (
        f"each run's numbers are those of its best round by {runs_select} (selection)"
        if runs_select
        else "each run's numbers are those of its last round"
    )
    text = f"Best point by the mean of {sweep.metric} ({sweep.mode}) over seeds; {rounds}."
    if sweep.metric == PERSONAL and not sweep.chosen:
        text += " Personalised runs: ranked by their personalised models' accuracy (--metric test_accuracy: the global"
        text += " model's)."
    if not sweep.metric.startswith("val_"):
        text += " Chosen on a metric that is not a validation one: set val_fraction to choose on validation data."
    return text


def summary_markdown(sweep: Sweep, results: list[PointResult], best: PointResult | None) -> str:
    from fedhet.report.tables import markdown_table

    columns = [sweep.metric, *(m for m in sweep.show if m != sweep.metric)]
    if PERSONAL not in columns and any(PERSONAL in r.values for r in results):  # personalised runs: their accuracy
        columns.insert(1, PERSONAL)
    columns = [c for c in columns if c == sweep.metric or any(c in r.values for r in results)]
    rows = [
        [
            ("**" + r.point.label + "**") if r is best else r.point.label,
            *(mean_std(r.values.get(c, [math.nan] * len(r.statuses))) for c in columns),
            f"{r.ok}/{len(r.statuses)}",
            r.point.name,
        ]
        for r in results
    ]
    text = f"### Sweep: {len(results)} points × {len(sweep.seeds)} seeds ({', '.join(map(str, sweep.seeds))})\n\n"
    text += "mean ± std over seeds. " + selection_rule_text(sweep) + "\n\n"
    text += markdown_table(["point", *columns, "runs finished", "folder"], rows)
    if best is not None:
        others = "".join(f"; {c} {mean_std(best.values[c])}" for c in columns[1:] if c in best.values)
        text += (
            f"\nbest by {sweep.metric} ({sweep.mode}): {best.point.label}: "
            f"{mean_std(best.values[sweep.metric])}{others} (folder {best.point.name})\n"
        )
    return text


def summary_csv(sweep: Sweep, results: list[PointResult]) -> str:
    """One row per point: its grid values, runs finished, and mean and std over seeds of every final metric."""
    metrics = sorted({m for r in results for m in r.values})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    stats = [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
    writer.writerow(["point", "label", *sweep.grid, "runs", "finished", *stats])
    for r in results:
        cells = []
        for m in metrics:
            arr = np.asarray(r.values.get(m, []), dtype=float)
            ok = arr[~np.isnan(arr)]
            cells += [repr(float(ok.mean())) if len(ok) else "", repr(float(ok.std(ddof=1))) if len(ok) > 1 else ""]
        values = [flow(r.point.values[k]) for k in sweep.grid]
        writer.writerow([r.point.name, r.point.label, *values, len(r.statuses), r.ok, *cells])
    return buffer.getvalue()


@dataclass
class SweepResult:
    results: list[PointResult]
    best: PointResult | None
    outcomes: list[Outcome]
    table: str


def run_sweep(sweep: Sweep, out: Path, executor: Executor) -> SweepResult:
    """Run (or finish) every point × seed of `sweep` into `out`, then write and return its summary. `out` must be new,
    empty or a sweep folder of fedhet's (its marker), which this process locks while the sweep runs: a second sweep
    into it is refused. A folder that holds a sweep of another base config is refused (the grid and the seeds may
    change: finished runs are reused). Everything is checked before anything is written."""
    check_claimable(out, "sweep")
    _check_base(sweep, out)
    tasks = sweep.tasks(out)
    refuse_linked_folders(out, tasks)
    executor.check_data([t for t in tasks if reuse(t) is None])  # before anything is written
    with FolderLock.claim(out, "sweep") as lock:
        _check_base(sweep, out)  # again under the lock: another sweep may have written it meanwhile
        write_plan(sweep, out, lock)
        result = finish_sweep(sweep, out, executor.run(tasks, stage="sweep"))
    if result.best is None and any(r.ok for r in result.results):
        names = sorted({m for r in result.results for m in r.values})
        raise ConfigError(
            f"no run reports '{sweep.metric}'{closest(sweep.metric, names)}; the runs are kept: summarise them by "
            f"rerunning with --metric one of {', '.join(names)}"
        )
    return result


def _check_base(sweep: Sweep, out: Path) -> None:
    """Refuse a folder holding a sweep of another base config."""
    record = out / "sweep.json"
    if read_marker(out) is None or not record.is_file():
        return
    try:
        before = json.loads(record.read_bytes().decode("utf-8")).get("base")
    except (UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        before = None
    if before != sweep.base:
        raise ConfigError(
            f"'{out}' holds a sweep of another base config; choose another --out (a sweep of the same base "
            "config may change its grid and seeds: finished runs are reused)"
        )


def write_plan(sweep: Sweep, out: Path, lock: FolderLock | None = None) -> None:
    """``sweep.json`` and each point's ``point.json`` in `out`: the sweep folder that `lock` holds (a point folder
    its marker does not list, a folder of yours with a point's name, is refused), or, without `lock`, a folder
    inside one of fedhet's that the caller holds (a recipe's)."""
    points = sweep.points()
    for point in points:
        refuse_link(out / point.name)  # never followed: it would put runs into another folder
    if lock is not None:
        for point in points:
            if (out / point.name).exists() and point.name not in lock.marker.files:
                raise ConfigError(
                    f"'{out / point.name}' was not made by this sweep (its marker does not list it); move it away, or "
                    "choose another --out"
                )
        lock.record([*SWEEP_FILES, *(p.name for p in points)])
    out.mkdir(parents=True, exist_ok=True)
    spec = {"base": sweep.base, "grid": sweep.grid, "seeds": list(sweep.seeds), "metric": sweep.metric}
    write_text(out / "sweep.json", json.dumps({**spec, "mode": sweep.mode}, indent=1) + "\n")
    for point in points:
        (out / point.name).mkdir(exist_ok=True)
        write_text(out / point.name / "point.json", json.dumps(point.__dict__, indent=1) + "\n")


def prepare_sweep(sweep: Sweep, out: Path) -> list[Task]:
    """The sweep's tasks (every point checked), with its plan written into `out`, a folder inside a folder of
    fedhet's that the caller holds (a recipe's)."""
    tasks = sweep.tasks(out)
    write_plan(sweep, out)
    return tasks


def finish_sweep(sweep: Sweep, out: Path, outcomes: list[Outcome]) -> SweepResult:
    """Read the sweep's results from its run folders; write ``runs.json``, ``summary.md`` and ``summary.csv``."""
    write_index(out / "runs.json", outcomes)
    details = "".join(f"{o.task.label}\n{o.detail}\n" for o in outcomes if o.status == "failed" and o.detail)
    if details:
        write_text(out / "errors.log", details)
    results = read_results(sweep, out)
    sweep = ranked_by(sweep, results)
    best = best_point(results, sweep.metric, sweep.mode)
    table = summary_markdown(sweep, results, best)
    write_text(out / "summary.md", table)
    write_text(out / "summary.csv", summary_csv(sweep, results))
    return SweepResult(results, best, outcomes, table)
