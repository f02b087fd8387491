"""The trackers a run may log to (the config's ``track`` list): their settings, validated with the config.

The callbacks that do the logging are `fedhet.experiments.tracking`'s; this module holds what the config needs to
know before anything runs (the settings, whether the library is installed, where the records go).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry

STATE_FILE = "tracking.json"


@dataclass(frozen=True)
class Where:
    """Where a tracker writes for one run: the run folder, the folder of shared stores (the sweep's folder for a
    sweep, else the run folder), the sweep's name (a group of runs) and the run's display name."""

    out: Path
    root: Path
    group: str | None
    name: str


class TrackerSpec(Component):
    """A tracker's settings (a component of the ``track`` list); `fedhet.experiments.tracking.make_tracker` gives
    the callback of one run."""

    module: ClassVar[str] = ""  # the import the tracker needs
    extra: ClassVar[str] = ""  # the fedhet extra that installs it

    def require(self) -> None:
        """Raise a one-line ConfigError naming the extra when the tracker's library is not installed."""
        if importlib.util.find_spec(self.module) is None:
            raise ConfigError(
                f"the {self.name} tracker needs the '{self.module}' package: pip install 'fedhet[{self.extra}]'"
            )

    def hint(self, out: Path) -> str:
        """Where the records of the run in `out` are, and how to look at them."""
        raise NotImplementedError


TRACKERS: Registry[TrackerSpec] = Registry("tracker")


@TRACKERS.register
class TensorBoardSpec(TrackerSpec):
    name: ClassVar[str] = "tensorboard"
    description: ClassVar[str] = "event files in <run folder>/tensorboard: per-round scalars, config as hparams"
    module: ClassVar[str] = "tensorboard"
    extra: ClassVar[str] = "tensorboard"
    dir: str = Field("tensorboard", description="folder of the event files, relative to the run folder")

    def hint(self, out: Path) -> str:
        return f"tensorboard --logdir {out / self.dir}"


@TRACKERS.register
class MLflowSpec(TrackerSpec):
    name: ClassVar[str] = "mlflow"
    description: ClassVar[str] = "an MLflow run: config as params, per-round metrics (default store: mlflow.db)"
    module: ClassVar[str] = "mlflow"
    extra: ClassVar[str] = "mlflow"
    uri: str | None = Field(
        None,
        description="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<run or sweep folder>/mlflow.db)",
    )
    experiment: str | None = Field(None, description="MLflow experiment (default: the sweep's name, else 'fedhet')")

    def tracking_uri(self, root: Path) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root.resolve() / 'mlflow.db'}"

    def experiment_name(self, group: str | None) -> str:
        return self.experiment or group or "fedhet"

    def hint(self, out: Path) -> str:
        uri = read_state(out).get("mlflow", {}).get("uri") or self.tracking_uri(out)
        return f"mlflow ui --backend-store-uri {uri}"


@TRACKERS.register
class WandbSpec(TrackerSpec):
    name: ClassVar[str] = "wandb"
    description: ClassVar[str] = "a Weights & Biases run (offline by default: no account needed; wandb sync uploads)"
    module: ClassVar[str] = "wandb"
    extra: ClassVar[str] = "wandb"
    project: str = Field("fedhet", description="W&B project")
    entity: str | None = Field(None, description="W&B entity (team or user); default: yours")
    mode: Literal["offline", "online", "disabled"] | None = Field(
        None, description="offline (default, or $WANDB_MODE when set), online or disabled"
    )
    tags: list[str] = Field(default_factory=list, description="W&B tags of the run")

    def wandb_mode(self) -> str:
        """The mode the run logs in: `mode`, else $WANDB_MODE, else offline."""
        return self.mode or os.environ.get("WANDB_MODE") or "offline"

    def hint(self, out: Path) -> str:
        if self.wandb_mode() == "offline":
            return f"offline run in {out / 'wandb'}; upload it with: wandb sync {out / 'wandb'}/offline-run-*"
        return f"project '{self.project}' on W&B"


def validate_track(track: list[str | dict[str, Any]]) -> list[TrackerSpec]:
    """The validated entries of a ``track`` list (one-line errors such as ``track[1].uri``)."""
    specs = [TRACKERS.build(spec, where=f"track[{i}]") for i, spec in enumerate(track)]
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"track lists {', '.join(twice)} more than once; keep one entry per tracker")
    return specs


def read_state(out: Path) -> dict[str, Any]:
    """``tracking.json`` of run folder `out` (empty when absent)."""
    path = out / STATE_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(
            f"'{path}' is damaged (not the trackers' JSON record); delete it, and the trackers continue in new records"
        )
    return data
