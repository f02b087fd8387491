"""Read run folders back (summary.json, metrics.csv, config.yaml) and name runs by what distinguishes them."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.config_keys import COMPONENT_KEYS, flatten
from fedhet.errors import ConfigError
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
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
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


def run_labels(records: list[RunRecord]) -> list[str]:
    """A label per run from what differs between the runs' configs: the algorithm (with the parameters that differ
    among runs of the same algorithm), other components and keys that differ (``local.lr=0.1``), then the seed.
    Runs whose configs are all equal (or unknown) keep their folder names; equal labels get the folder name added.
    E.g. fedavg seed 0, fedprox(mu=0.01) seed 0 and fedprox(mu=0.1) seed 1 are "fedavg, seed 0",
    "fedprox mu=0.01, seed 0" and "fedprox mu=0.1, seed 1".
    """
    if len(records) == 1:
        cfg = records[0].config
        algorithm = flatten(cfg).get("algorithm.name", cfg.get("algorithm"))
        return [f"{algorithm}, seed {cfg['seed']}" if algorithm and "seed" in cfg else records[0].path.name]
    flats = [flatten(r.config) for r in records]
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
