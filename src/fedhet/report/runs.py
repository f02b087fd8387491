"""Read run folders back (summary.json, metrics.csv, config.yaml), gather them into groups of seeds (`RunGroup`: a
sweep's points, a recipe's methods, the runs of one config), and name runs by what distinguishes them."""

from __future__ import annotations

import csv
import json
import re
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


SEED_FOLDER = re.compile(r"seed\d+")
INDEX_LIMIT = 10 * 2**20  # bytes: a larger runs.json is not read for names
NAME_LIMIT = 60  # characters of a name read from runs.json


def group_folder(group: RunGroup) -> Path:
    """The folder that holds a group: a sweep point's or a recipe method's (above its ``seed<k>`` run folders),
    else its run folder."""
    path = group.runs[0].path
    return path.parent if SEED_FOLDER.fullmatch(path.name) else path


def _index(file: Path, cache: dict[Path, dict[Path, str]]) -> dict[Path, str]:
    """runs.json of a recipe folder as {run folder: label}; empty when unreadable or not such a list."""
    if file not in cache:
        cache[file] = {}
        try:
            rows = json.loads(file.read_bytes().decode("utf-8")) if file.stat().st_size <= INDEX_LIMIT else []
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            rows = []
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and isinstance(row.get("label"), str) and isinstance(row.get("folder"), str):
                try:
                    cache[file][(file.parent / row["folder"]).resolve()] = row["label"]
                except (OSError, ValueError, RuntimeError):
                    continue
    return cache[file]


def given_name(folder: Path, cache: dict[Path, dict[Path, str]]) -> str | None:
    """The name a recipe gave the run in `folder` (its label in the recipe's runs.json, without the seed: "FedAvg +
    FT"); None outside a recipe folder (a sweep's points are named from what differs, `run_labels`)."""
    where = folder.resolve()
    for parent in list(folder.parents)[:3]:
        index = parent / "runs.json"
        if index.is_file() and not (parent / "sweep.json").exists():
            text = "".join(c if c.isprintable() else " " for c in _index(index, cache).get(where, ""))
            label = " ".join(text.split())  # one line of printable characters
            name = re.sub(r"[\s,;:|]*\bseed \d+$", "", label).strip()  # "FedAvg, seed 0", "a | b | seed 0"
            return (name if len(name) <= NAME_LIMIT else name[: NAME_LIMIT - 1] + "…") or None
    return None


def _grouped(found: list[tuple[int, RunRecord]], paths: list[Path], per_path: bool) -> list[tuple[int, RunGroup]]:
    """`found` (path index, run) gathered into groups of one configuration over seeds (per path with `per_path`),
    each named by its recipe's name for it or else by what distinguishes it (`run_labels`); a name two groups
    share gets the path given, then what distinguishes them."""
    cache: dict[Path, dict[Path, str]] = {}
    keyed: dict[tuple[int, str, str], list[RunRecord]] = {}
    origin: dict[tuple[int, str, str], int] = {}
    for i, record in found:
        name = given_name(record.path, cache) or ""
        key = (i if per_path else 0, name, config_key(record))
        keyed.setdefault(key, []).append(record)
        origin.setdefault(key, i)
    groups = list(keyed.values())
    several = any(len(g) > 1 for g in groups)
    auto = run_labels([g[0] for g in groups], ignore=("seed",) if several else ())
    names = [k[1] or a for k, a in zip(keyed, auto, strict=True)]
    if len(set(paths)) > 1:
        names = [
            f"{n} ({paths[origin[k]].name})" if k[1] and names.count(n) > 1 else n
            for k, n in zip(keyed, names, strict=True)
        ]
    names = [f"{n}, {a}" if names.count(n) > 1 and n != a else n for n, a in zip(names, auto, strict=True)]
    out = []
    for key, group, name in zip(keyed, groups, names, strict=True):
        for record in group:
            record.label = name
        out.append((origin[key], RunGroup(name, group)))
    return out


def _rename(entry: str, names: set[str]) -> tuple[str, str] | None:
    """`entry` as OLD=NEW where OLD is one of `names` (split at the first '=' that makes it one), else None."""
    for at in (i for i, c in enumerate(entry) if c == "="):
        if entry[:at].strip() in names:
            return entry[:at].strip(), entry[at + 1 :].strip()
    return None


def _names_text(groups: list[RunGroup]) -> str:
    shown = ", ".join(f"'{g.label}'" for g in groups[:12])
    return shown + (f" and {len(groups) - 12} more" if len(groups) > 12 else "")


def read_groups(paths: list[Path], labels: list[str] | None = None) -> list[RunGroup]:
    """The runs under `paths` (run folders, sweep or recipe folders: `run_folders`), gathered into groups of the same
    configuration over seeds, in the order first met. Each group is named by its recipe's name for it (a recipe
    folder's runs.json), else by what distinguishes it from the others (`run_labels`, without the seed when a group
    has several). `labels` rename them, either each ``OLD=NEW`` (OLD: a group's name or its folder's, e.g. a sweep
    point's ``lr-0.1``), or one name per path (a path whose runs hold several configurations gets the name, then
    what distinguishes them), or one per group in the order first met."""
    found = [(i, read_run(folder)) for i, path in enumerate(paths) for folder in run_folders(path)]
    grouped = _grouped(found, paths, per_path=False)
    groups = [g for _, g in grouped]
    if not labels:
        return groups
    known = {g.label for g in groups} | {group_folder(g).name for g in groups}
    renames = [_rename(entry, known) for entry in labels]
    if all(renames):
        new = {old: name for old, name in (r for r in renames if r)}
        for group in groups:
            group.label = new.get(group.label, new.get(group_folder(group).name, group.label))
    elif any(renames):
        raise ConfigError("--label: give either OLD=NEW renames or plain names (one per path or per group), not both")
    elif len(labels) == len(paths):
        grouped = _grouped(found, paths, per_path=True)
        groups = [g for _, g in grouped]
        per_path = [sum(1 for i, _ in grouped if i == j) for j in range(len(paths))]
        for i, group in grouped:
            group.label = labels[i] if per_path[i] == 1 else f"{labels[i]}: {group.label}"
    elif len(labels) == len(groups):
        for group, name in zip(groups, labels, strict=True):
            group.label = name
    else:
        hint = " (an OLD=NEW --label renames the group called OLD)" if any("=" in e for e in labels) else ""
        raise ConfigError(
            f"{len(labels)} --label for {len(paths)} paths and {len(groups)} groups{hint}: give one per path or one "
            f"per group in order, or rename with --label OLD=NEW; the groups: {_names_text(groups)}"
        )
    final = [g.label for g in groups]
    if not all(final):
        raise ConfigError("--label: a name cannot be empty")
    twice = next((n for n in final if final.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"--label: two groups would be called '{twice}'; give each its own name")
    for group in groups:
        for record in group.runs:
            record.label = group.label
    return groups


def metric_names(records: list[RunRecord]) -> list[str]:
    names: list[str] = []
    for rec in records:
        for row in rec.rows:
            names.extend(k for k in row if k not in names and k != "round")
    return names


# ------------------------------------------------------------------------------------------------------ labels


MAX_KEYS = 2  # a label names at most this many keys besides the method (and the seed)
MAX_VALUE = 16  # characters of a value in a label (longer ones are cut with "…")


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def _short(value: Any) -> str:
    """A value as a label shows it: numbers as %g, lists without spaces, at most `MAX_VALUE` characters."""
    text = _text(value) if not isinstance(value, list | dict) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _component(key: str) -> str | None:
    head = key.split(".", 1)[0]
    return head if head in COMPONENT_KEYS else None


def _flat(config: dict[str, Any], ignore: tuple[str, ...]) -> dict[str, Any]:
    """A config's dotted keys, a component given as a bare name (``algorithm: fedavg``) as ``algorithm.name``."""
    flat = flatten(config)
    for comp in COMPONENT_KEYS:
        if comp in flat:
            flat[f"{comp}.name"] = flat.pop(comp)
    return {k: v for k, v in flat.items() if k not in ignore}


def _key_names(keys: list[str]) -> dict[str, str]:
    """How a label names each of `keys`: its last part (``local.lr`` → ``lr``; an algorithm's parameter by its
    own name), the whole key where two of them share their last part."""
    parts = [k.split(".") for k in keys]
    last = [p[-2] if p[-1] == "name" and len(p) > 2 else p[-1] for p in parts]  # a sub-component by its key
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def distinguishing_keys(flats: list[dict[str, Any]], keys: list[str], start: list[tuple[Any, ...]]) -> list[str]:
    """At most `MAX_KEYS` of `keys`, chosen one at a time, each the one that tells apart the most runs not told
    apart yet (`start`: what already tells them apart, the method); among equals, the key more runs have (a key that
    most runs lack says little), then the first. None is chosen once every run is told apart or no key helps."""
    chosen: list[str] = []
    present = {k: sum(k in f for f in flats) for k in keys}
    rows = list(start)
    while len(chosen) < MAX_KEYS and len(set(rows)) < len(rows):
        best: tuple[int, int, int] | None = None
        for i, key in enumerate(keys):
            if key in chosen:
                continue
            split = len({(*row, _text(f.get(key, None))) for row, f in zip(rows, flats, strict=True)})
            score = (split, present[key], -i)
            if split > len(set(rows)) and (best is None or score > best):
                best = score
        if best is None:
            break
        key = keys[-best[2]]
        chosen.append(key)
        rows = [(*row, _text(f.get(key, None))) for row, f in zip(rows, flats, strict=True)]
    return chosen


def run_labels(records: list[RunRecord], ignore: tuple[str, ...] = ()) -> list[str]:
    """A label per run as a person would name it: the method (the algorithm's name), then the one or two keys that
    tell the runs apart (`distinguishing_keys`), by their last part and with short values (``fedprox mu=0.01,
    lr=0.1``), then the seed where it differs. A key a run lacks is left out of its label (never ``key=-``); a
    component's name reads ``partition dirichlet``. Runs whose configs are all equal (or unknown) keep their folder
    names; equal labels get the folder name added. E.g. fedavg seed 0, fedprox(mu=0.01) seed 0 and fedprox(mu=0.1)
    seed 1 are "fedavg, seed 0", "fedprox mu=0.01, seed 0" and "fedprox mu=0.1, seed 1". Keys in `ignore` (the seed,
    for groups of seeds) are not named."""
    if len(records) == 1:
        cfg = _flat(records[0].config, ())
        algorithm = cfg.get("algorithm.name")
        seed = f", seed {cfg['seed']}" if "seed" in cfg and "seed" not in ignore else ""
        return [f"{algorithm}{seed}" if algorithm and "seed" in cfg else records[0].path.name]
    flats = [_flat(r.config, ignore) for r in records]
    if not all(flats):
        return [r.path.name for r in records]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))
    differ = [k for k in keys if len({_text(flat.get(k)) for flat in flats}) > 1]
    if not differ:
        return [r.path.name for r in records]
    method = [(_text(f.get("algorithm.name", "")),) for f in flats]
    candidates = [k for k in differ if k not in ("algorithm.name", "seed")]
    chosen = distinguishing_keys(flats, candidates, method)
    names = _key_names(chosen)
    labels = []
    for flat, (name,) in zip(flats, method, strict=True):
        own = [f"{names[k]}={_short(flat[k])}" for k in chosen if k in flat and _component(k) == "algorithm"]
        parts = [" ".join([name, *own]).strip()]
        for key in (k for k in chosen if k in flat and _component(k) != "algorithm"):
            is_name = key.endswith(".name") and _component(key) is not None
            parts.append(
                f"{key.split('.', 1)[0]} {_short(flat[key])}" if is_name else f"{names[key]}={_short(flat[key])}"
            )
        if "seed" in differ:
            parts.append(f"seed {flat.get('seed')}")
        labels.append(", ".join(p for p in parts if p))
    return [
        f"{label} ({rec.path.name})" if labels.count(label) > 1 or not label else label
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
