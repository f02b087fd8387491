"""A run's config assembled from where it comes from, and where its run folder (a sweep's, a recipe's) goes by
default.

The sources, each over the one before: a YAML file; components chosen by name (a flag such as ``--algorithm``:
the file's parameters are kept when it names the same component); top-level values (``--rounds``, ``--seed``...);
nested settings (``--target-epsilon``);
plugin modules to import (after the file's); ``--set dotted.key=value`` overrides; trackers to add. The command line
only parses its flags and hands them here; `parse_config` validates the result (a mapping of a component's
parameters without a ``name`` completes the component's default there, see `fedhet.registry.with_defaults`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fedhet.config_keys import COMPONENT_KEYS
from fedhet.errors import ConfigError
from fedhet.experiments.config import RunConfig, load_yaml


def assemble(
    file: Path | None = None,
    *,
    components: Mapping[str, str | None] | None = None,
    values: Mapping[str, Any] | None = None,
    settings: Mapping[str, tuple[Any, str]] | None = None,
    imports: Iterable[str] = (),
    overrides: Iterable[str] = (),
    track: Iterable[str] = (),
) -> dict[str, Any]:
    """The raw config mapping from its sources (see the module docstring); a None component or value is not given.

    `settings` maps a dotted key to ``(value, flag)``: a flag that sets a nested key (``--target-epsilon``).
    A path among `values` (``data_dir``) is written as text.
    """
    raw: dict[str, Any] = load_yaml(file) if file is not None else {}
    for key, name in (components or {}).items():
        if name is not None:
            set_component(raw, key, name)
    for key, value in (values or {}).items():
        if value is not None:
            raw[key] = str(value) if isinstance(value, Path) else value
    for key, (value, flag) in (settings or {}).items():
        if value is not None:
            set_key(raw, key, value, flag)
    imports = list(imports)
    if imports:
        raw["imports"] = [*raw.get("imports", []), *imports]
    for assignment in overrides:
        apply_override(raw, assignment)
    for name in track:
        listed = raw.setdefault("track", [])
        if name not in [t if isinstance(t, str) else t.get("name") for t in listed]:
            listed.append(name)
    return raw


def default_run_folder(config: RunConfig, now: float | None = None) -> Path:
    """``runs/<algorithm>_<dataset>_seed<seed>_<unix time>``: where a run goes when no folder is given (``_2``,
    ``_3``, ... after it when a run of the same second is there already)."""
    stamp = int(time.time() if now is None else now)
    name = f"{config.spec('algorithm')['name']}_{config.spec('dataset')['name']}_seed{config.seed}_{stamp}"
    path, count = Path("runs") / name, 1
    while path.exists():
        count += 1
        path = Path("runs") / f"{name}_{count}"
    return path


def default_sweep_folder(file: Path | None) -> Path:
    """``runs/sweep-<config file's name>`` (``runs/sweep-default`` without a file): where a sweep goes by default."""
    return Path("runs") / f"sweep-{file.stem if file is not None else 'default'}"


def default_recipe_folder(recipe: str) -> Path:
    """``runs/<recipe>``: where ``fedhet reproduce`` writes by default."""
    return Path("runs") / recipe


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` (value parsed as YAML) to the raw config mapping in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set '{assignment}' must look like key=value, e.g. local.lr=0.1")
    key, text = assignment.split("=", 1)
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        value = text
    set_key(raw, key, value, f"--set '{assignment}'")


def set_key(raw: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set the ``dotted.key`` of the raw config mapping to `value` in place (a component given by name becomes a
    mapping when one of its parameters is set; a missing section starts empty, and validation completes a
    component's parameters from its default); `where` names the source in error messages."""
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{where}: empty key")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, str) and depth == 0 and part in (*COMPONENT_KEYS, "task"):
            child = {"name": child}
        elif child is None:
            child = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{where}: '{part}' is not a section")
        node[part] = child
        node = child
    node[parts[-1]] = value


def set_component(raw: dict[str, Any], key: str, name: str) -> None:
    """Choose component `name` for `key` (a flag such as --algorithm), keeping params only if it is unchanged."""
    current = raw.get(key)
    if isinstance(current, dict) and current.get("name") == name:
        return
    raw[key] = name
