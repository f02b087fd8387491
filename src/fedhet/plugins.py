"""Plugins: components from a user's module, a file, or an installed package, usable by name like built-ins.

A plugin module registers its components with fedhet's registries when it is imported (the same decorators the
built-ins use: ``@STRATEGIES.register``, ``@TERMS.register``, ``@MODELS.register``, ...). Three ways in:

* ``imports: [my_package.my_module, path/to/file.py]`` in a config (and so on every Flower node, which reads the
  same config);
* ``fedhet run --import MODULE`` (repeatable; the run's config records it in ``imports``);
* an installed package's entry points in the ``fedhet.plugins`` group (loaded the first time the registries are
  used): ``[project.entry-points."fedhet.plugins"] my_plugin = "my_package.fedhet_plugin"``.

`fedhet list` shows each component's origin (``fedhet``, the module that registered it, or the entry point).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from fedhet.errors import ConfigError
from fedhet.imports import import_module_or_file

ENTRY_POINT_GROUP = "fedhet.plugins"
_entry_points_loaded = False


def load_entry_points() -> list[str]:
    """Import every installed ``fedhet.plugins`` entry point once; their names."""
    global _entry_points_loaded
    names: list[str] = []
    if _entry_points_loaded:
        return names
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as err:
            raise ConfigError(
                f"plugin entry point '{point.name}' ({point.value}) failed to load: {type(err).__name__}: {err}; "
                "fix or uninstall that package"
            ) from None
        names.append(point.name)
    return names


def load_plugins(imports: Iterable[str]) -> None:
    """Import the installed plugins and the modules/files in `imports` (each once)."""
    load_entry_points()
    for spec in imports:
        import_module_or_file(spec)
