"""YAML read safely: no Python objects, no key given twice, a bounded size, no alias bomb, no traceback.

Every YAML file fedhet reads (a config you pass, a run folder's ``config.yaml``, one read by ``fedhet compare``)
goes through `load_yaml`; `check_expanded` bounds what a mapping holds once YAML's aliases are expanded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedhet.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config file larger than 1 MiB is not a config
MAX_CONFIG_VALUES = 100_000  # values in a config once YAML aliases are expanded


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader (no Python objects) that also refuses a key given twice in one mapping, which YAML would
    keep silently (the last one wins); keys merged with ``<<`` may be overridden as YAML allows."""


def _unique_keys(loader: StrictLoader, node: yaml.MappingNode) -> Any:
    seen: list[Any] = []
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"found the key {key!r} twice", key_node.start_mark
            )
        seen.append(key)
    return loader.construct_yaml_map(node)


StrictLoader.add_constructor("tag:yaml.org,2002:map", _unique_keys)


def safe_yaml(text: str) -> Any:
    """`text` parsed as YAML with `StrictLoader` (no Python objects, no key twice)."""
    return yaml.load(text, Loader=StrictLoader)


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping; one-line errors for a missing, non-text, oversized or invalid file."""
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"config file '{path}' {what}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read config file '{path}': {err.strerror or err}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file '{path}' is {len(data):,} bytes; a config is at most {MAX_CONFIG_BYTES:,}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file '{path}' is not UTF-8 text (byte 0x{data[err.start]:02x} at position {err.start}); "
            "save it as UTF-8"
        ) from None
    try:
        loaded = safe_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {' '.join(str(err).split())}") from None
    except RecursionError:
        raise ConfigError(f"config file '{path}' is nested too deeply to be a config") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    return loaded


def check_expanded(raw: Any, where: str = "the config") -> None:
    """Refuse `raw` when it holds more than `MAX_CONFIG_VALUES` values once YAML aliases are expanded (an alias bomb)
    or is nested too deeply to walk."""
    try:
        size = _expanded_size(raw, {})
    except RecursionError:
        raise ConfigError(f"{where} is nested too deeply to be a config") from None
    if size > MAX_CONFIG_VALUES:
        raise ConfigError(
            f"{where} expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases?); write it out plainly"
        )


def _expanded_size(value: Any, seen: dict[int, int]) -> int:
    """How many values `value` holds once shared (aliased) parts are counted every time they appear."""
    if not isinstance(value, dict | list):
        return 1
    if id(value) in seen:
        return seen[id(value)]
    seen[id(value)] = MAX_CONFIG_VALUES + 1  # a cycle (a recursive alias) counts as too large
    items = list(value.values()) if isinstance(value, dict) else value
    total = 1
    for item in items:
        total += _expanded_size(item, seen)
        if total > MAX_CONFIG_VALUES:
            break
    seen[id(value)] = total
    return total
