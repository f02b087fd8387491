"""Experiment trackers: TensorBoard, MLflow and Weights & Biases as metric sinks of a run (optional extras).

A tracker is a `Callback`: at the start of a run it opens (or, after ``--resume``, re-opens) its record, logs every
evaluated round's metrics at step = round, and at the end writes the config and final metrics. It only reads the
run's state, so metrics.csv and the run's numbers are the same with or without it. Turn trackers on with the
config key ``track`` (a list of names or ``{name: ..., <settings>}`` mappings) or ``fedhet run --track NAME``.

Each tracker keeps what it needs to continue the same record after a resume in ``tracking.json`` in the run folder
(the MLflow run id, the W&B run id, the last round each logged), so a resumed run logs no round twice.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from fedhet.atomic import write_text
from fedhet.config_keys import flatten
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.trackers import (
    STATE_FILE,
    TRACKERS,
    MLflowSpec,
    TensorBoardSpec,
    TrackerSpec,
    WandbSpec,
    Where,
    read_state,
    validate_track,
)

if TYPE_CHECKING:
    from fedhet.experiments.config import RunConfig
    from fedhet.experiments.state import RunState
FINAL_STATUSES = ("finished", "stopped early", "diverged")


class Tracker(Callback):
    """Base of the tracker callbacks: logs each evaluated round once (also across resumes) and finishes the record.

    Subclasses implement `open`, `log` and `close`; `self.saved` is their entry in ``tracking.json``.
    """

    key: ClassVar[str] = ""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.active = False
        self.saved: dict[str, Any] = {}

    @property
    def last_round(self) -> int:
        return int(self.saved.get("last_round", 0))

    def on_run_start(self, state: RunState) -> None:
        self.active = state.round < state.config.rounds  # a finished run that is "resumed" has nothing to log
        if not self.active:
            return
        # a run that starts from round 0 gets a new record, even where an earlier attempt left one
        self.saved = read_state(self.where.out).get(self.key, {}) if state.round > 0 else {}
        self.open(state, resumed=bool(self.saved))
        self.save()
        for row in state.history:  # rounds run before this tracker was added (fedhet run --resume DIR --track ...)
            self.record(int(row["round"]), row)

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if self.active and metrics is not None:
            self.record(state.round, metrics)
        return False

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Log round `step` unless this record has it already."""
        if step > self.last_round:
            self.log(step, {k: float(v) for k, v in metrics.items() if k != "round"})
            self.saved["last_round"] = step
            self.save()

    def on_run_end(self, state: RunState) -> None:
        if self.active:
            self.close(state)
            self.active = False

    def save(self) -> None:
        """Write this tracker's entry of ``tracking.json`` (atomically; other trackers' entries are kept)."""
        data = read_state(self.where.out)
        data[self.key] = self.saved
        write_text(self.where.out / STATE_FILE, json.dumps(data, indent=1) + "\n")

    def open(self, state: RunState, resumed: bool) -> None:
        raise NotImplementedError

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, state: RunState) -> None:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------- TensorBoard


class TensorBoardTracker(Tracker):
    """Scalars tagged with the metric names (metrics.csv's columns) at step = round; at the end the resolved config
    as hparams whose metrics are those tags (TensorBoard's HParams tab shows their final values)."""

    key = "tensorboard"

    def __init__(self, where: Where, spec: TensorBoardSpec) -> None:
        super().__init__(where)
        self.log_dir = where.out / spec.dir
        self.writer: Any = None

    def open(self, state: RunState, resumed: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # TensorBoard drops what an earlier session (an attempt interrupted before its first checkpoint, or rounds
        # after the last checkpoint) wrote from this step on
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=self.last_round + 1, flush_secs=10)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, state: RunState) -> None:
        if state.status in FINAL_STATUSES and state.history:
            from torch.utils.tensorboard.summary import hparams

            final = {k: v for k, v in state.final.items() if k != "round"}
            for summary in hparams(hparam_values(state), final):
                self.writer.file_writer.add_summary(summary)
        self.writer.close()


def hparam_values(state: RunState) -> dict[str, Any]:
    """The resolved config, flattened, as TensorBoard hparams (numbers, strings and booleans)."""
    values: dict[str, Any] = {}
    for key, value in flatten(state.experiment.resolved_config()).items():
        values[key] = value if isinstance(value, bool | int | float | str) else json.dumps(value)
    return values


# ---------------------------------------------------------------------------------------------------------- MLflow


def mlflow_client(uri: str) -> Any:
    """An MlflowClient on `uri`, with MLflow's INFO lines (database set-up) kept off the console."""
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def mlflow_experiment(client: Any, name: str) -> str:
    """The id of experiment `name`, created if needed (another process may create it at the same time)."""
    for _ in range(3):
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(client.create_experiment(name))
        except Exception:  # created by a concurrent worker between the two calls: look it up again
            time.sleep(0.2)
    raise ConfigError(f"could not create the MLflow experiment '{name}'")


class MLflowTracker(Tracker):
    """One MLflow run per fedhet run: params = the flattened resolved config, metrics at step = round, tags with
    the group (sweep), seed, algorithm and status. A resume continues the run whose id ``tracking.json`` holds."""

    key = "mlflow"
    MAX_PARAMS = 100  # per log_batch call (MLflow's limit)

    def __init__(self, where: Where, spec: MLflowSpec) -> None:
        super().__init__(where)
        self.uri, self.experiment = spec.tracking_uri(where.root), spec.experiment_name(where.group)
        self.client: Any = None
        self.run_id = ""

    def open(self, state: RunState, resumed: bool) -> None:
        from mlflow.entities import Param

        self.client = mlflow_client(self.saved.get("uri", self.uri))
        if resumed and self.saved.get("run_id"):
            self.run_id = self.saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        cfg = state.config
        tags = {
            "fedhet.algorithm": cfg.spec("algorithm")["name"],
            "fedhet.dataset": cfg.spec("dataset")["name"],
            "fedhet.seed": str(cfg.seed),
            "fedhet.run_folder": str(self.where.out.resolve()),
        }
        if self.where.group:
            tags["fedhet.group"] = self.where.group
        run = self.client.create_run(
            mlflow_experiment(self.client, self.experiment), run_name=self.where.name, tags=tags
        )
        self.run_id = run.info.run_id
        self.saved.update(run_id=self.run_id, uri=self.uri, experiment=self.experiment)
        params = [Param(k, param_text(v)) for k, v in flatten(state.experiment.resolved_config()).items()]
        for i in range(0, len(params), self.MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + self.MAX_PARAMS])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, state: RunState) -> None:
        status = {"finished": "FINISHED", "stopped early": "FINISHED", "diverged": "FAILED"}.get(state.status, "KILLED")
        self.client.set_tag(self.run_id, "fedhet.status", state.status)
        self.client.set_terminated(self.run_id, status=status)


def param_text(value: Any) -> str:
    """An MLflow param value: strings as they are, anything else as JSON, cut to MLflow's 6000 characters."""
    return (value if isinstance(value, str) else json.dumps(value))[:6000]


# ------------------------------------------------------------------------------------------------ Weights & Biases


class WandbTracker(Tracker):
    """One W&B run per fedhet run (group = the sweep), under ``<run folder>/wandb``; history at step = round, the
    resolved config as the run's config, final metrics and status in its summary. A resume reopens the same run id
    (resume='allow'); offline records are uploaded later with ``wandb sync <run folder>/wandb/offline-run-*``."""

    key = "wandb"

    def __init__(self, where: Where, spec: WandbSpec) -> None:
        super().__init__(where)
        self.project, self.entity, self.mode, self.tags = spec.project, spec.entity, spec.wandb_mode(), spec.tags
        self.run: Any = None

    def open(self, state: RunState, resumed: bool) -> None:
        import wandb

        run_id = self.saved.get("run_id") or secrets.token_hex(6)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True, reinit="create_new")
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.where.group,
            name=self.where.name,
            id=run_id,
            resume="allow",
            dir=str(self.where.out),
            mode=self.mode,  # type: ignore[arg-type,unused-ignore]  # wandb may be absent
            config=state.experiment.resolved_config(),
            tags=self.tags or None,
            settings=settings,
        )
        self.saved.update(run_id=run_id, project=self.project)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, state: RunState) -> None:
        self.run.summary["status"] = state.status
        self.run.summary["wall_time_s"] = round(state.wall_time_s, 3)
        self.run.finish(exit_code=0 if state.status in ("finished", "stopped early") else 1)


# ---------------------------------------------------------------------------------------------------------- factory


def make_tracker(spec: TrackerSpec, where: Where) -> Tracker:
    """The callback that logs one run (in `where`) to the tracker `spec` describes."""
    for tracker in (TensorBoardTracker, MLflowTracker, WandbTracker):
        if tracker.key == spec.name:
            return tracker(where, spec)  # type: ignore[arg-type]
    raise ValueError(f"no tracker callback for '{spec.name}'")


def tracker_specs(config: RunConfig) -> list[TrackerSpec]:
    """The validated ``track`` entries of `config` (one-line errors such as ``track[1].uri``)."""
    return validate_track(config.track)


def tracking_callbacks(
    config: RunConfig,
    out: Path,
    group: str | None = None,
    *,
    root: Path | None = None,
    name: str | None = None,
) -> list[Callback]:
    """The tracker callbacks of the run of `config` in folder `out` (none when ``track`` is empty).

    For a sweep, `group` is the sweep's name (W&B group, MLflow experiment and tag), `root` the sweep's folder (where
    the default MLflow database goes, shared by its runs) and `name` the point's label and seed (default: the run
    folder's path below `root`). Safe to call in worker processes; call `prepare_tracking` once first.
    """
    return trackers_for(config.track, out, group, root=root, name=name)


def trackers_for(
    track: list[str | dict[str, Any]],
    out: Path,
    group: str | None = None,
    *,
    root: Path | None = None,
    name: str | None = None,
) -> list[Callback]:
    """The callbacks of the ``track`` entries `track` (see `tracking_callbacks`)."""
    specs = validate_track(track)
    for spec in specs:
        spec.require()
    where = Where(out=out, root=root or out, group=group, name=name or run_name(out, root))
    return [make_tracker(spec, where) for spec in specs]


def run_name(out: Path, root: Path | None) -> str:
    """A run's display name: its folder's path below `root` ("<label> seed0"), or the folder's name."""
    if root is not None and out.resolve().is_relative_to(root.resolve()):
        parts = out.resolve().relative_to(root.resolve()).parts
        if parts:
            return " ".join(parts)
    return out.name


def tracking_hints(track: list[str | dict[str, Any]], out: Path) -> list[str]:
    """One line per tracker of a run in `out`: where its records are and the command that shows them."""
    lines = []
    for spec in validate_track(track):
        lines.append(f"{spec.name}: {spec.hint(out)}")
    return lines


def prepare_tracking(config: RunConfig, root: Path, group: str | None = None) -> None:
    """Before runs start in parallel: create what they share (the MLflow database and experiment), so that workers
    do not race to set it up."""
    for spec in tracker_specs(config):
        spec.require()
        if isinstance(spec, MLflowSpec):
            root.mkdir(parents=True, exist_ok=True)
            mlflow_experiment(mlflow_client(spec.tracking_uri(root)), spec.experiment_name(group))


def with_trackers(callbacks: list[Callback], config: RunConfig, out: Path) -> list[Callback]:
    """`callbacks` plus the trackers `config` asks for that are not among them already (a sweep passes its own,
    with a group; ``fedhet run --resume --track`` adds some)."""
    present = {cb.key for cb in callbacks if isinstance(cb, Tracker)}
    wanted = [spec for spec in config.track if TRACKERS.build(spec).name not in present] if config.track else []
    return [*callbacks, *trackers_for(wanted, out)] if wanted else callbacks
