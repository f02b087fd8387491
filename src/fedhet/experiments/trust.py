"""Code named in a config fedhet did not get from you: a run folder's ``config.yaml``.

A config you pass (``fedhet run CONFIG``, ``fedhet.run(config)``, a sweep's or a recipe's) is your own request: its
``imports`` and its model ``target`` are imported. A run folder's config (``fedhet run --resume``,
``fedhet.load_run``) may have been edited or sent by someone else, so the code it names runs only when you say that
you trust the folder (``--trust-imports``, ``trust=True``); otherwise it is refused in one line before anything is
imported (docs/reliability.md, "What can run code").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError
from fedhet.imports import ImportPolicy, import_policy
from fedhet.models.torch_model import IN_MEMORY


def named_code(raw: Mapping[str, Any]) -> list[str]:
    """What the raw config `raw` names to import: its ``imports`` and its torch model's ``target``."""
    imports = raw.get("imports")
    names = [str(spec) for spec in imports] if isinstance(imports, list) else []
    model = raw.get("model")
    if isinstance(model, Mapping) and model.get("name") == "torch":
        target = model.get("target")
        if isinstance(target, str) and not target.startswith(f"{IN_MEMORY}:"):
            names.append(target)
    return names


@contextmanager
def code_of_folder(raw: Mapping[str, Any], where: Path, trust: bool, how: str) -> Iterator[None]:
    """While inside, build the run folder config `raw` (read from `where`): with `trust`, as any config; without,
    refuse in one line a config that names code (`how`: how to say you trust it), and import nothing."""
    if trust:
        yield
        return
    code = named_code(raw)
    if code:
        raise ConfigError(
            f"'{where}' names code to import ({', '.join(code)}); fedhet runs code named in a run folder only when you "
            f"trust it: {how}"
        )
    with import_policy(ImportPolicy((), how)):
        yield
