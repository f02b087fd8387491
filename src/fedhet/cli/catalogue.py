"""What `fedhet list` shows: every component's name, description and origin, group by group.

The built-in components are read from ``catalogue.json`` beside this module, so that listing them does not import
the modules that define them (and torch with them): ``fedhet list`` answers at once. The file is written from the
registries themselves by ``python -m fedhet.cli.catalogue`` and a test checks that it matches them. With plugins
(``--import``, or an installed ``fedhet.plugins`` entry point) the registries are read instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from fedhet.atomic import write_text
from fedhet.plugins import ENTRY_POINT_GROUP, load_plugins

CATALOGUE = Path(__file__).with_name("catalogue.json")

# group name → the name of its registry in `fedhet.catalog`, in the order `fedhet list` shows them
REGISTRIES = {
    "algorithms": "STRATEGIES",
    "terms": "TERMS",
    "optimizers": "OPTIMIZERS",
    "server-optimizers": "SERVER_OPTIMIZERS",
    "rules": "RULES",
    "schedules": "SCHEDULES",
    "tasks": "TASKS",
    "datasets": "DATASETS",
    "partitioners": "PARTITIONERS",
    "shifts": "SHIFTS",
    "models": "MODELS",
    "availability": "AVAILABILITY",
    "attacks": "ATTACKS",
    "systems": "SYSTEMS",
    "deadlines": "DEADLINE_POLICIES",
    "staleness": "STALENESS",
    "mechanisms": "MECHANISMS",
    "plugins": "METRIC_PLUGINS",
}
GROUPS = (*REGISTRIES, "metrics", "recipes")

Groups = dict[str, dict[str, tuple[str, str]]]  # group → name → (description, origin)


def component_groups(imports: Sequence[str] = ()) -> Groups:
    """Every group's components: the built-ins from ``catalogue.json``, or, with plugins to load (`imports`, or
    installed entry points), everything the registries hold once the plugins are imported."""
    if imports or entry_points(group=ENTRY_POINT_GROUP):
        load_plugins(imports)
        return registered_groups()
    with CATALOGUE.open(encoding="utf-8") as file:
        listed: dict[str, dict[str, str]] = json.load(file)
    groups = {group: {name: (text, "fedhet") for name, text in listed[group].items()} for group in REGISTRIES}
    return {**groups, "metrics": _metrics(), "recipes": {n: (t, "fedhet") for n, t in listed["recipes"].items()}}


def registered_groups() -> Groups:
    """Every group's components as the registries hold them (importing every built-in component, and torch)."""
    from fedhet import catalog
    from fedhet.recipes import RECIPES

    groups: Groups = {}
    for group, attribute in REGISTRIES.items():
        registry: Any = getattr(catalog, attribute)
        groups[group] = {c.name: (c.description, registry.origin(c.name)) for c in registry}
    groups["metrics"] = _metrics()
    groups["recipes"] = {name: (factory().description, "fedhet") for name, factory in sorted(RECIPES.items())}
    return groups


def _metrics() -> dict[str, tuple[str, str]]:
    from fedhet.metrics import METRICS

    return {name: (text, "fedhet") for name, text in METRICS.items()}


def builtin_catalogue() -> dict[str, dict[str, str]]:
    """The content of ``catalogue.json``: each registry's built-in components, and the recipes, with their
    descriptions (the metrics are listed from `fedhet.metrics`, which imports nothing heavy)."""
    return {
        group: {name: text for name, (text, origin) in entries.items() if origin == "fedhet"}
        for group, entries in registered_groups().items()
        if group != "metrics"
    }


def write_catalogue(path: Path = CATALOGUE) -> None:
    """Write ``catalogue.json`` from the registries (after adding or changing a built-in component)."""
    write_text(path, json.dumps(builtin_catalogue(), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":  # pragma: no cover - python -m fedhet.cli.catalogue
    write_catalogue()
    print(f"wrote {CATALOGUE}")
