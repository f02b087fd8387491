"""Import a user's code by name: a module (``my_package.my_module``) or a Python file (``path/to/file.py``).

A file is imported under a stable module name derived from its resolved path, so the same file imported twice
is the same module, and worker processes (spawn) and Flower nodes that import it again get the same names.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fedhet.errors import ConfigError


def _file_module_name(path: Path) -> str:
    digest = hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()
    return f"fedhet_user_{path.stem}_{digest}"


def import_module_or_file(spec: str) -> ModuleType:
    """The module `spec` names (a dotted module name, or a path to a ``.py`` file), imported once."""
    text = spec.strip()
    if not text:
        raise ConfigError("an empty import: give a module name (my_package.my_module) or a .py file path")
    if text.endswith(".py") or "/" in text or "\\" in text:
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"import '{spec}': no such file; give a .py file path or a module name")
        name = _file_module_name(path)
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ConfigError(f"import '{spec}': not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise ConfigError(f"import '{spec}' failed: {type(err).__name__}: {_first_line(err)}") from None
        return module
    try:
        return importlib.import_module(text)
    except ModuleNotFoundError as err:
        if err.name and text.startswith(err.name):
            raise ConfigError(
                f"import '{spec}': no module named '{err.name}'; check the name and that it is installed or on "
                "PYTHONPATH (or give a .py file path)"
            ) from None
        raise ConfigError(f"import '{spec}' failed: {type(err).__name__}: {_first_line(err)}") from None
    except Exception as err:
        raise ConfigError(f"import '{spec}' failed: {type(err).__name__}: {_first_line(err)}") from None


def load_object(spec: str) -> Any:
    """The object ``module:attribute`` names (``my_package.nets:Net`` or ``path/to/file.py:Net``)."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(f"'{spec}' must look like 'my_package.module:Name' or 'path/to/file.py:Name'")
    module = import_module_or_file(module_part)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"'{spec}': module '{module_part}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no message"
