"""What a sweep's executor does for one point in a worker process (importable by spawned workers: tests/ is on the
path, a test module is not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.experiments.tracking import tracking_callbacks


def sweep_point(args: tuple[dict[str, Any], str, str, str, str]) -> str:
    """Run point `raw` into `out` with its trackers grouped under `group` (shared stores in `root`)."""
    raw, out, root, group, name = args
    config = parse_config(raw)
    run(config, Path(out), tracking_callbacks(config, Path(out), group, root=Path(root), name=name))
    return out
