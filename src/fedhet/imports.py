"""Import user code named in a config: a dotted module name or a ``.py`` file, and ``"module:Attr"`` objects.

A dotted name is imported as Python would; when it is not found on ``sys.path``, the current directory is
searched too (as ``python -m`` does), so ``target: my_nets:Net`` finds ``./my_nets.py`` from the ``fedhet``
command. A path to a ``.py`` file (relative to the current directory) is imported under a stable module name
derived from its absolute path, so the same file is imported once per process and objects defined in it
pickle by reference in that process. Every failure is a one-line `ConfigError`.

What may be imported is set by the `ImportPolicy` in force (`import_policy`): anything (the default: a config you
pass is your own request), nothing (a run folder you did not say you trust), or an allowlist (a Flower node's
``allow-imports``). A name the policy does not permit is refused before anything is imported
(docs/reliability.md, "What can run code").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from fedhet.errors import ConfigError
from fedhet.registry import closest

FILE_MODULE_PREFIX = "fedhet_user_"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_file_spec(spec: str) -> bool:
    """True when `spec` names a file (ends in ``.py`` or holds a path separator) rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def file_module_name(path: Path) -> str:
    """The stable module name a ``.py`` file is imported under: its stem and a hash of its absolute path."""
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", resolved.stem)
    return f"{FILE_MODULE_PREFIX}{stem}_{digest}"


@dataclass(frozen=True)
class ImportPolicy:
    """Which modules and ``.py`` files may be imported: any (`allowed` None) or those `allowed` lists: a dotted
    name permits itself and its submodules, a file or folder path permits that file or the files under it.
    `refusal` ends the one-line error for a name not permitted (what to do about it)."""

    allowed: tuple[str, ...] | None = None
    refusal: str = ""

    def permits(self, spec: str) -> bool:
        if self.allowed is None:
            return True
        if is_file_spec(spec):
            path = Path(spec).resolve()
            return any(is_file_spec(a) and path.is_relative_to(Path(a).resolve()) for a in self.allowed)
        return any(not is_file_spec(a) and (spec == a or spec.startswith(f"{a}.")) for a in self.allowed)


ANY = ImportPolicy()
_POLICY: ContextVar[ImportPolicy | None] = ContextVar("fedhet_import_policy", default=None)


@contextmanager
def import_policy(policy: ImportPolicy) -> Iterator[None]:
    """While inside (this thread or task), import only what `policy` permits."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def _check_permitted(spec: str) -> None:
    policy = _POLICY.get() or ANY
    if not policy.permits(spec):
        allowed = "nothing" if not policy.allowed else ", ".join(policy.allowed)
        raise ConfigError(f"refused to import '{spec}' (allowed here: {allowed}); {policy.refusal}".rstrip("; "))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _import_file(spec: str) -> ModuleType:
    path = Path(spec)
    if path.suffix != ".py":
        raise ConfigError(f"cannot import '{spec}': a file to import must end in .py")
    if not path.is_file():
        raise ConfigError(f"cannot import '{spec}': no such file (relative paths start at '{Path.cwd()}')")
    name = file_module_name(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    module_spec = importlib.util.spec_from_file_location(name, path.resolve())
    if module_spec is None or module_spec.loader is None:  # pragma: no cover - a .py file always has a loader
        raise ConfigError(f"cannot import '{spec}': Python has no loader for it")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:
        del sys.modules[name]
        raise ConfigError(f"importing '{spec}' failed: {_first_line(err)}") from err
    return module


def _import_dotted(spec: str) -> ModuleType:
    if not _DOTTED.match(spec):
        raise ConfigError(f"cannot import '{spec}': not a module name (like 'package.module') nor a .py file")
    top = spec.split(".")[0]
    if importlib.util.find_spec(top) is None:
        here = Path.cwd()
        if (here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file():
            sys.path.append(str(here))
            importlib.invalidate_caches()
        else:
            raise ConfigError(
                f"cannot import module '{spec}': no module named '{top}' on the Python path or in '{here}'; "
                "install it, set PYTHONPATH, or give a path to a .py file"
            )
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        missing = err.name or "?"
        if spec == missing or spec.startswith(f"{missing}."):
            raise ConfigError(f"cannot import module '{spec}': no module named '{missing}'") from err
        raise ConfigError(f"importing '{spec}' failed: it needs module '{missing}', which is not installed") from err
    except (Exception, SystemExit) as err:
        raise ConfigError(f"importing '{spec}' failed: {_first_line(err)}") from err


def import_module_or_file(spec: str) -> ModuleType:
    """Import `spec`: a dotted module name (``my_package.nets``) or a path to a ``.py`` file
    (``nets/cnn.py``, relative to the current directory). A file is imported once per process, under the
    name `file_module_name` gives it."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("cannot import '': give a module name or a path to a .py file")
    _check_permitted(spec)
    return _import_file(spec) if is_file_spec(spec) else _import_dotted(spec)


def load_object(spec: str) -> Any:
    """The object ``"module:Name"`` or ``"path/to/file.py:Name"`` names (``Name`` may be dotted:
    ``Outer.Inner``)."""
    where, sep, attr = spec.strip().rpartition(":")
    if not sep or not where or not attr:
        raise ConfigError(f"'{spec}' must look like 'package.module:Name' or 'path/to/file.py:Name'")
    obj: Any = import_module_or_file(where)
    walked: list[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            options = [n for n in dir(obj) if not n.startswith("_")]
            owner = ".".join(walked) or where
            raise ConfigError(f"'{owner}' has no attribute '{part}'{closest(part, options)} (from '{spec}')")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def object_path(obj: Any) -> str | None:
    """The ``"module:Name"`` (or ``"file.py:Name"``) string that `load_object` turns back into `obj`, or None
    when there is none (objects defined in ``__main__``, inside functions, or without a name)."""
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    module = sys.modules.get(module_name)
    if module is None or module_name == "__main__":
        return None
    where = module_name
    if module_name.startswith(FILE_MODULE_PREFIX):
        file = getattr(module, "__file__", None)
        if file is None:
            return None
        where = file
    try:
        found = load_object(f"{where}:{qualname}")
    except ConfigError:
        return None
    return f"{where}:{qualname}" if found is obj else None
