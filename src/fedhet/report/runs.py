"""Read run folders back (summary.json, metrics.csv, config.yaml), gather them into groups of seeds (`RunGroup`: a
sweep's points, a recipe's methods, the runs of one config), and name runs by what distinguishes them."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.config_keys import COMPONENT_KEYS, flatten
from fedhet.errors import ConfigError
from fedhet.summary_json import read_summary
from fedhet.yaml_text import check_expanded, load_yaml


@dataclass
class RunRecord:
    """A finished (or interrupted) run read from its folder; `label` names it among the runs shown with it."""

    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, float]]
    config: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or self.path.name

    def curve(self, metric: str, x: str = "round") -> tuple[list[float], list[float]]:
        """`metric` against `x` ("round", or "time_s": the simulated clock of a run with a system model)."""
        pairs = [(r[x], r[metric]) for r in self.rows if metric in r and x in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def selected(self) -> dict[str, float]:
        """The row of the run's selected round (the best by its ``selection`` metric), or its final row."""
        chosen = self.summary.get("selected")
        if isinstance(chosen, dict) and chosen:
            return {str(k): float(v) for k, v in chosen.items() if type(v) in (int, float)}
        return {str(k): float(v) for k, v in self.summary.get("final", {}).items()}

    @property
    def selection(self) -> str:
        """The run's selection rule in words ("val_loss (min)"), or "" for a run whose result is its last round."""
        rule = self.summary.get("selection")
        return f"{rule.get('metric')} ({rule.get('mode')})" if isinstance(rule, dict) else ""

    def reaches(self, metric: str, target: float) -> dict[str, float]:
        """The first evaluated round (and simulated time) at which `metric` reached `target` (≥; ≤ for losses),
        NaN when it never did: rounds- and time-to-accuracy."""
        lower = "loss" in metric
        for row in self.rows:
            value = row.get(metric)
            if value is not None and (value <= target if lower else value >= target):
                return {"round": row["round"], "time_s": row.get("time_s", float("nan"))}
        return {"round": float("nan"), "time_s": float("nan")}


def read_run(path: Path) -> RunRecord:
    summary_file, metrics_file, config_file = path / "summary.json", path / "metrics.csv", path / "config.yaml"
    if not summary_file.is_file() or not metrics_file.is_file():
        raise ConfigError(f"'{path}' is not a run folder (needs summary.json and metrics.csv from fedhet run)")
    try:
        summary = read_summary(summary_file)
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"'{summary_file}' is not valid JSON ({err}); rerun or resume that run") from None
    except RecursionError:
        raise ConfigError(f"'{summary_file}' is nested too deeply to be a run summary") from None
    final = summary.get("final", {}) if isinstance(summary, dict) else None
    if not isinstance(final, dict) or not all(type(v) in (int, float) for v in final.values()):
        raise ConfigError(
            f"'{summary_file}' does not hold a run summary (an object whose 'final' maps names to numbers)"
        )
    try:
        with metrics_file.open(encoding="utf-8", newline="") as f:
            rows = [{str(k): float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    except (UnicodeDecodeError, ValueError, TypeError, csv.Error) as err:
        reason = str(err).splitlines()[0][:100] if str(err) else type(err).__name__
        raise ConfigError(f"'{metrics_file}' is not a metrics table of numbers ({reason})") from None
    try:  # at most 1 MiB and 100,000 values once aliases are expanded (no alias bomb), no Python objects
        config = load_yaml(config_file) if config_file.is_file() else {}
        check_expanded(config)
    except ConfigError:
        config = {}  # config.yaml only names the run; a damaged one leaves it named by its folder
    return RunRecord(path, summary, rows, config)


def read_runs(paths: list[Path]) -> list[RunRecord]:
    """The runs in `paths`, each labelled by what distinguishes it from the others (`run_labels`)."""
    records = [read_run(p) for p in paths]
    for record, label in zip(records, run_labels(records), strict=True):
        record.label = label
    return records


def is_run(path: Path) -> bool:
    return (path / "summary.json").is_file() and (path / "metrics.csv").is_file()


def run_folders(path: Path) -> list[Path]:
    """`path` itself when it is a run folder, else every run folder below it (a sweep's points × seeds, a recipe's
    methods × seeds), in name order."""
    if is_run(path):
        return [path]
    if not path.is_dir():
        raise ConfigError(f"'{path}' is not a run folder (needs summary.json and metrics.csv from fedhet run)")
    found = sorted(p.parent for p in path.rglob("summary.json") if is_run(p.parent))
    if not found:
        raise ConfigError(f"'{path}' holds no run folder (summary.json and metrics.csv from fedhet run)")
    return found


@dataclass
class RunGroup:
    """Runs of one configuration over seeds (or one run), shown as one line (mean ± std) or one table row."""

    label: str
    runs: list[RunRecord]

    @property
    def seeds(self) -> int:
        return len(self.runs)

    @property
    def selection(self) -> str:
        return next((r.selection for r in self.runs if r.selection), "")


def as_groups(runs: list[RunRecord] | list[RunGroup]) -> list[RunGroup]:
    """Runs as groups of one (each keeps its label), or the groups as they are."""
    return [r if isinstance(r, RunGroup) else RunGroup(r.label, [r]) for r in runs]


def config_key(record: RunRecord) -> str:
    """What identifies a run's configuration but its seed (runs that share it are seeds of one configuration)."""
    flat = {
        k: v for k, v in flatten(record.config).items() if k not in ("seed", "derived") and not k.startswith("derived.")
    }
    return json.dumps(flat, sort_keys=True, default=str) if flat else f"folder:{record.path}"


def read_groups(paths: list[Path], labels: list[str] | None = None) -> list[RunGroup]:
    """The runs under `paths` (run folders, sweep or recipe folders: `run_folders`), gathered into groups of the same
    configuration over seeds, in the order first met. Each group is named by what distinguishes it from the others
    (`run_labels` without the seed when a group has several), or by `labels`: one per path (a path whose runs hold
    several configurations gets the label, then what distinguishes them)."""
    if labels and len(labels) != len(paths):
        raise ConfigError(f"{len(labels)} --label for {len(paths)} paths; give one --label per path, in order")
    keyed: dict[tuple[int, str], list[RunRecord]] = {}
    for i, path in enumerate(paths):
        for folder in run_folders(path):
            record = read_run(folder)
            keyed.setdefault((i if labels else 0, config_key(record)), []).append(record)
    groups = list(keyed.values())
    several = any(len(g) > 1 for g in groups)
    names = run_labels([g[0] for g in groups], ignore=("seed",) if several else ())
    if labels:
        per_path = [sum(1 for (i, _) in keyed if i == j) for j in range(len(paths))]
        names = [
            labels[i] if per_path[i] == 1 else f"{labels[i]}: {name}" for (i, _), name in zip(keyed, names, strict=True)
        ]
    for group, name in zip(groups, names, strict=True):
        for record in group:
            record.label = name
    return [RunGroup(name, group) for group, name in zip(groups, names, strict=True)]


def metric_names(records: list[RunRecord]) -> list[str]:
    names: list[str] = []
    for rec in records:
        for row in rec.rows:
            names.extend(k for k in row if k not in names and k != "round")
    return names


# ------------------------------------------------------------------------------------------------------ labels


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def _component(key: str) -> str | None:
    head = key.split(".", 1)[0]
    return head if head in COMPONENT_KEYS else None


def run_labels(records: list[RunRecord], ignore: tuple[str, ...] = ()) -> list[str]:
    """A label per run from what differs between the runs' configs: the algorithm (with the parameters that differ
    among runs of the same algorithm), other components and keys that differ (``local.lr=0.1``), then the seed.
    Runs whose configs are all equal (or unknown) keep their folder names; equal labels get the folder name added.
    E.g. fedavg seed 0, fedprox(mu=0.01) seed 0 and fedprox(mu=0.1) seed 1 are "fedavg, seed 0",
    "fedprox mu=0.01, seed 0" and "fedprox mu=0.1, seed 1". Keys in `ignore` (the seed, for groups of seeds) are not
    named.
    """
    if len(records) == 1:
        cfg = records[0].config
        algorithm = flatten(cfg).get("algorithm.name", cfg.get("algorithm"))
        seed = f", seed {cfg['seed']}" if "seed" in cfg and "seed" not in ignore else ""
        return [f"{algorithm}{seed}" if algorithm and "seed" in cfg else records[0].path.name]
    flats = [{k: v for k, v in flatten(r.config).items() if k not in ignore} for r in records]
    if not all(flats):
        return [r.path.name for r in records]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))
    differ = [k for k in keys if len({_text(flat.get(k)) for flat in flats}) > 1]
    labels = []
    for flat in flats:
        parts: list[str] = []
        for comp in COMPONENT_KEYS:
            mine = [k for k in differ if _component(k) == comp]
            if not mine:
                continue
            name_key = f"{comp}.name"
            same_name = [f for f in flats if f.get(name_key) == flat.get(name_key)]
            params = [k for k in mine if k != name_key and k in flat and len({_text(f.get(k)) for f in same_name}) > 1]
            shown = [f"{k.split('.', 1)[1] if comp == 'algorithm' else k}={_text(flat[k])}" for k in params]
            if name_key in differ:
                name = _text(flat.get(name_key, "-"))
                parts.append(" ".join([name if comp == "algorithm" else f"{comp} {name}", *shown]))
            elif shown:
                parts.append(" ".join(shown))
        parts += [f"{k}={_text(flat.get(k, '-'))}" for k in differ if _component(k) is None and k != "seed"]
        if "seed" in differ:
            parts.append(f"seed {flat.get('seed')}")
        labels.append(", ".join(parts))
    if not any(labels):
        return [r.path.name for r in records]
    return [
        f"{label} ({rec.path.name})" if labels.count(label) > 1 else label
        for label, rec in zip(labels, records, strict=True)
    ]


def common_description(records: list[RunRecord]) -> str:
    """What all `records` share, in a few words ("fedavg on digits, model mlp, 20 clients, 50 rounds, seed 0")."""
    flats = [flatten(r.config) for r in records]
    if not flats or not all(flats):
        return ""

    def same(key: str) -> Any:
        values = {_text(f.get(key)) for f in flats}
        return flats[0].get(key) if len(values) == 1 and key in flats[0] else None

    parts = []
    for key, words in (
        ("algorithm.name", "{}"),
        ("dataset.name", "dataset {}"),
        ("model.name", "model {}"),
        ("num_clients", "{} clients"),
        ("rounds", "{} rounds"),
        ("seed", "seed {}"),
    ):
        if same(key) is not None:
            parts.append(words.format(_text(same(key))))
    return ", ".join(parts)
