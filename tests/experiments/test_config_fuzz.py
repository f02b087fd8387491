"""A fuzz test of the config schema (issue 43): every numeric key, top-level and of every built-in component, set to
0, a negative number, NaN, ±inf, 1e300, a string and a list, one at a time, on a tiny run.

Each generated config must end in one of two ways: a finished run, or one line on stderr with exit code 2 and no
run folder. A traceback, a hang (more than `HANG_S` seconds), a second line or a folder left behind by a refusal
fails. The configs are generated from the schema itself (`numeric_keys`), so a key added later is fuzzed too.
"""

from __future__ import annotations

import json
import signal
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from fedhet import catalog  # noqa: F401  (every built-in component registered)
from fedhet.cli.main import app
from fedhet.experiments.config import RunConfig
from fedhet.registry import Registry

VALUES = ["0", "-1", ".nan", ".inf", "-.inf", "1e300", "abc", "[1, 2]"]
HANG_S = 60
TINY = ["--dataset", "digits", "--rounds", "2", "--quiet"]
TINY_SETS = {"num_clients": "4", "clients_per_round": "2", "model": "{name: mlp, hidden: [4]}", "local.steps": "2"}
# Components that read the user's files or the network: their parameters are fuzzed through other checks
# (tests/data): here they would only say the file is missing.
NEEDS_FILES = {"arrays", "table", "image_folder", "image_domains", "huggingface", "torchvision", "in_memory", "trace"}
SKIP_KINDS = {"tracker"}  # trackers write to outside services; tests/experiments/test_tracking.py


def _numeric(annotation: Any) -> bool:
    """Whether a field takes a number (int or float, possibly optional or in a union)."""
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in typing.get_args(annotation))
    return False


def _model_keys(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _model_keys(annotation, f"{prefix}{name}.")
        elif _numeric(annotation):
            yield f"{prefix}{name}"


def registries() -> dict[str, tuple[Registry[Any], str]]:
    """Each registry of components with the config key its components are set at."""
    from fedhet.attacks.base import ATTACKS
    from fedhet.availability.base import AVAILABILITY
    from fedhet.data.partition import PARTITIONERS
    from fedhet.data.shift_config import SHIFTS
    from fedhet.data.sources import DATASETS
    from fedhet.engine.objective import TERMS
    from fedhet.engine.optimizers import OPTIMIZERS
    from fedhet.engine.schedules import SCHEDULES
    from fedhet.engine.task import TASKS
    from fedhet.models.base import MODELS
    from fedhet.strategies.base import STRATEGIES
    from fedhet.strategies.server import SERVER_OPTIMIZERS
    from fedhet.systems.base import SYSTEMS

    return {
        "algorithm": (STRATEGIES, "algorithm"),
        "dataset": (DATASETS, "dataset"),
        "partition": (PARTITIONERS, "partition"),
        "shift": (SHIFTS, "shift"),
        "model": (MODELS, "model"),
        "availability": (AVAILABILITY, "availability"),
        "attack": (ATTACKS, "attack"),
        "system": (SYSTEMS, "system"),
        "task": (TASKS, "task"),
        "schedule": (SCHEDULES, "schedules.local_lr"),
        "optimizer": (OPTIMIZERS, "local.optimizer"),
        "server optimizer": (SERVER_OPTIMIZERS, "algorithm.server_optimizer"),
        "term": (TERMS, "local.terms"),
    }


def cases() -> list[tuple[str, dict[str, str]]]:
    """(id, --set overrides) for every numeric key × value: the run config's own keys, then every component's."""
    found: list[tuple[str, dict[str, str]]] = []
    for key in _model_keys(RunConfig, ""):
        found += [(f"{key}={value}", {key: value}) for value in VALUES]
    for kind, (registry, key) in registries().items():
        for cls in registry:
            if cls.name in NEEDS_FILES or kind in SKIP_KINDS:
                continue
            for param in _model_keys(cls, ""):
                for value in VALUES:
                    if key == "local.terms":
                        sets = {key: f"[{{name: {cls.name}, {param}: {value}}}]"}
                    else:
                        sets = {key: f"{{name: {cls.name}, {param}: {value}}}"}
                    found.append((f"{key}={cls.name}.{param}={value}", sets))
    return found


CASES = cases()


def test_the_fuzz_covers_the_schema() -> None:
    """At least 2,000 configs, from the run config and every kind of component (the issue's bar)."""
    assert len(CASES) >= 2000, len(CASES)
    kinds = {case.split("=")[0].split(".")[0] for case, _ in CASES}
    assert {"local", "algorithm", "partition", "model", "system", "schedules", "privacy", "deadline"} <= kinds


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def outcome(sets: dict[str, str], out: Path) -> str:
    """'finished', 'refused', or what was wrong."""
    args = ["run", *TINY, "--out", str(out)]
    for key, value in {**TINY_SETS, **sets}.items():
        args += ["--set", f"{key}={value}"]
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "500"})
    except Hang:
        return f"hang (over {HANG_S} s)"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if isinstance(result.exception, Hang):
        return f"hang (over {HANG_S} s)"
    if result.exit_code == 0:
        summary = out / "summary.json"
        if not summary.is_file():
            return "exit 0 without summary.json"
        status = json.loads(summary.read_text())["status"]
        return "finished" if status in ("finished", "stopped early") else f"exit 0 with status {status}"
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("note:")]
    if result.exit_code != 2:
        return f"exit {result.exit_code}: {result.exception!r} {result.output[-300:]!r}"
    if len(lines) != 1:
        return f"{len(lines)} lines: {result.output[-500:]!r}"
    if out.exists() and any(out.iterdir()):
        return f"refused ({lines[0]}) but wrote {sorted(p.name for p in out.iterdir())}"
    return "refused"


@pytest.mark.slow
def test_every_generated_config_finishes_or_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = []
    for i, (case, sets) in enumerate(CASES):
        result = outcome(sets, tmp_path / f"run{i}")
        if result not in ("finished", "refused"):
            bad.append(f"{case}: {result}")
    assert not bad, f"{len(bad)} of {len(CASES)} configs:\n" + "\n".join(bad)
