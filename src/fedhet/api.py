"""fedhet from Python: `run` a config, `load_run` a run folder back, `Config` to validate one.

A config is what ``fedhet run`` reads from YAML: a dict, a YAML file, or a `Config`. From Python it may also
hold objects: ``dataset`` a `fedhet.datasets.Dataset` or a tuple ``(x, y)`` / ``(x, y, users)`` of arrays or
tensors, ``model`` an `nn.Module` class, a function returning one, or an instance; any component may be a
component object (e.g. a `Strategy` instance).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import yaml
from pydantic import ValidationError

from fedhet.config_keys import COMPONENT_KEYS
from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import RunConfig, load_yaml
from fedhet.registry import Component, format_validation_error, spec_of

if TYPE_CHECKING:
    from torch import Tensor


__all__ = ["Callback", "ClientTable", "Config", "RunResult", "load_run", "run"]

MODEL_FILE = "model.pt"


def _from_python(key: str, value: Any) -> Any:
    """A component value given from Python as the name-or-mapping a config holds."""
    if isinstance(value, str | Mapping) and not (key == "model" and _is_torch_mapping(value)):
        return value
    if isinstance(value, Component):
        return spec_of(value)
    if key == "dataset":
        from fedhet.data.dataset import Dataset
        from fedhet.data.in_memory import hold
        from fedhet.datasets import from_arrays

        if isinstance(value, tuple) and len(value) in (2, 3):
            value = from_arrays(*value)
        if isinstance(value, Dataset):
            return {"name": "in_memory", "ref": hold(value)}
        raise ConfigError(
            f"'dataset' must be a name, a mapping, a fedhet.datasets.Dataset or a tuple (x, y[, users]); "
            f"got a {type(value).__name__}"
        )
    if key == "model":
        from torch import nn

        from fedhet.models.torch_model import hold_model

        if isinstance(value, Mapping):
            return {**value, "target": hold_model(value["target"])}
        if isinstance(value, nn.Module) or callable(value):
            return {"name": "torch", "target": hold_model(value)}
        raise ConfigError("'model' must be a name, a mapping, an nn.Module or a class/function building one")
    return value


def _is_torch_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("name") == "torch" and not isinstance(value.get("target"), str)


def _normalise(data: Mapping[str, Any]) -> dict[str, Any]:
    raw = dict(data)
    for key in COMPONENT_KEYS:
        if key in raw and raw[key] is not None:
            raw[key] = _from_python(key, raw[key])
    if isinstance(raw.get("metrics"), Sequence) and not isinstance(raw["metrics"], str):
        raw["metrics"] = [spec_of(m) if isinstance(m, Component) else m for m in raw["metrics"]]
    return raw


class Config(RunConfig):
    """A validated run configuration: every key of ``fedhet run``'s YAML (see the configuration reference).

    ``Config(rounds=5, dataset={"name": "table", "path": "data.csv", "label": "y"})``; invalid values raise
    `fedhet.errors.ConfigError` with the one-line message the CLI prints. Python objects are accepted where
    `fedhet.api` says.
    """

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**_normalise(data))
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, "", RunConfig)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> Config:
        """The config in a YAML file (as ``fedhet run CONFIG``)."""
        return cls(**load_yaml(Path(path)))

    def replace(self, **changes: Any) -> Config:
        """A new, validated config with `changes` (Python objects allowed as in the constructor):
        ``config.replace(model=Net, rounds=5)``."""
        return type(self)(**{**self.model_dump(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The config as plain YAML-able values."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def as_config(config: Config | RunConfig | Mapping[str, Any] | str | Path) -> RunConfig:
    """`config` (a Config, a mapping, or a YAML file path) as a validated config."""
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, str | Path):
        return Config.from_yaml(config)
    if isinstance(config, Mapping):
        return Config(**config)
    raise ConfigError(f"config must be a dict, a YAML file path or a fedhet.Config; got a {type(config).__name__}")


class ClientTable(Sequence[dict[str, Any]]):
    """``clients.csv`` as columns: ``table["test_accuracy"]`` is a float64 NumPy array over the clients (``user``: a
    list of names), ``table.columns`` their names in the file's order; and, as before, a sequence of one row per
    client: ``table[i]`` (a dict of that client's values, NaN where it was not scored), ``len``, iteration. A column
    costs one array, not a dict per client, so a million clients' table is built in milliseconds."""

    def __init__(self, columns: Mapping[str, np.ndarray | list[str]] | None = None) -> None:
        self._columns: dict[str, np.ndarray | list[str]] = dict(columns or {})
        lengths = {len(v) for v in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"the columns of a client table must be equally long; got lengths {sorted(lengths)}")
        self._len = lengths.pop() if lengths else 0

    @property
    def columns(self) -> list[str]:
        """The columns' names, in clients.csv's order."""
        return list(self._columns)

    def column(self, name: str) -> np.ndarray | list[str]:
        """One column (float64 array; ``user``: names); a one-line `ConfigError` naming the known ones."""
        if name not in self._columns:
            raise ConfigError(f"no client column '{name}' in this run; it has: {', '.join(self._columns)}")
        return self._columns[name]

    @overload
    def __getitem__(self, key: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, key: str) -> np.ndarray | list[str]: ...
    @overload
    def __getitem__(self, key: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, key: int | str | slice) -> Any:
        if isinstance(key, str):
            return self.column(key)
        if isinstance(key, slice):
            return [self[i] for i in range(*key.indices(self._len))]
        i = range(self._len)[key]  # negative indices, and IndexError past the end
        return {c: v[i] if isinstance(v, list) else float(v[i]) for c, v in self._columns.items()}

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._len))

    def __eq__(self, other: object) -> bool:
        """Equal columns (NaN equal to NaN); a list of rows compares row by row."""
        if isinstance(other, ClientTable):
            return self.columns == other.columns and all(
                _same(self._columns[c], other._columns[c]) for c in self._columns
            )
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ClientTable({self._len} clients; columns {', '.join(self._columns)})"


def _same(a: np.ndarray | list[str], b: np.ndarray | list[str]) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return list(a) == list(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@dataclass(frozen=True)
class RunResult:
    """What a run produced: its numbers and its final global model."""

    config: dict[str, Any]
    """The resolved config (every component's parameters filled in; what ``config.yaml`` holds)."""
    status: str
    """``finished``, ``stopped early``, ``diverged`` or ``interrupted``."""
    rounds: int
    """Rounds completed."""
    final: dict[str, float]
    """The last evaluated round's metrics (``test_accuracy``, ``test_loss``, ...)."""
    history: list[dict[str, float]]
    """One row of metrics per evaluated round (``metrics.csv``)."""
    clients: ClientTable
    """Each client at the end (``clients.csv``), as columns: ``clients["test_accuracy"]`` an array over the clients,
    ``clients[i]`` client i's row (its accuracy, loss, size, ... and ``user``, its user's name, where each client is
    one user), ``len(clients)``, iteration over the rows (`ClientTable`)."""
    state_dict: dict[str, Tensor] | None
    """The final global model as a state dict (``module.load_state_dict(result.state_dict)``)."""
    wall_time_s: float = 0.0
    out: Path | None = None
    """The run folder, when one was written."""
    extra: dict[str, Any] = field(default_factory=dict)
    selected: dict[str, float] = field(default_factory=dict)
    """The selected round's metrics: the best by ``selection.metric`` (val_loss with a validation split), or the
    last round's when the run selects none; its ``test_*`` values are the run's result."""
    best_state_dict: dict[str, Tensor] | None = None
    """The selected round's global model (``best.pt``), when the run selects one."""

    def metric(self, name: str) -> list[float]:
        """A metric's values over the evaluated rounds (missing rounds skipped)."""
        if not any(name in row for row in self.history):
            known = sorted({k for row in self.history for k in row})
            raise ConfigError(f"no metric '{name}' in this run; it has: {', '.join(known)}")
        return [row[name] for row in self.history if name in row]


def _write_model(out: Path, state_dict: dict[str, Tensor]) -> None:
    """model.pt, atomically, listed in the run folder's marker (so that overwrite removes it too)."""
    import io

    import torch

    from fedhet.atomic import write_bytes
    from fedhet.experiments.runfolder import RunFolder

    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    with RunFolder.open(out) as folder:
        folder.record([MODEL_FILE])
        write_bytes(out / MODEL_FILE, buffer.getbuffer())


def _client_table(path: Path) -> ClientTable:
    """clients.csv as columns: numbers as float64 arrays (an empty cell: NaN), the ``user`` column (each client's
    user or site name) as text; a one-line `DataError` naming the file when it is not that."""
    import csv

    from fedhet.errors import DataError

    if not path.is_file():
        return ClientTable()
    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            cells = list(zip(*reader, strict=True)) or [() for _ in header]
        columns: dict[str, np.ndarray | list[str]] = {}
        for name, values in zip(header, cells, strict=True):
            if name == "user":
                columns[name] = list(values)
                continue
            text = np.array(values, dtype=object)
            text[text == ""] = "nan"
            columns[name] = text.astype(np.float64) if len(text) else np.zeros(0)
        return ClientTable(columns)
    except (UnicodeDecodeError, ValueError, TypeError, csv.Error) as err:
        reason = str(err).splitlines()[0][:100] if str(err) else type(err).__name__
        raise DataError(f"'{path}' is not a table of numbers and user names ({reason})") from None


def run(
    config: Config | RunConfig | Mapping[str, Any] | str | Path,
    out: str | Path | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    progress: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Run one experiment, as ``fedhet run``, and return its results.

    `config` is a dict, a YAML file or a `Config`. With `out`, the run folder is written there (config.yaml,
    metrics.csv, clients.csv, summary.json, checkpoint.pt, and the final model as ``model.pt``); a folder that
    already holds a run is an error unless `overwrite` (which removes fedhet's files only, as ``--overwrite``).
    `callbacks` are told about every round (see `Callback`); `progress` shows a progress bar.
    """
    from fedhet.experiments.runfolder import holds_run
    from fedhet.experiments.runner import run as start

    cfg = as_config(config)
    folder = Path(out) if out is not None else None
    if folder is not None and not overwrite and holds_run(folder):
        raise FedhetError(
            f"'{folder}' already holds a run; read it with fedhet.load_run('{folder}'), choose another out, "
            "or pass overwrite=True"
        )
    hooks = list(callbacks)
    if progress:
        from rich.console import Console

        from fedhet.cli.progress import ProgressBar

        hooks.insert(0, ProgressBar(Console()))
    state = start(cfg, folder, hooks, overwrite=overwrite)
    from fedhet.engine.functional import state_dict_of

    model = state_dict_of(state.experiment.engine.model, state.params)
    if folder is not None:
        _write_model(folder, model)

    from fedhet.experiments.selection import selected_row

    best = state_dict_of(state.experiment.engine.model, state.best_params) if state.best_params is not None else None
    return RunResult(
        config=state.experiment.resolved_config(),
        status=state.status,
        rounds=state.round,
        final=dict(state.final),
        history=[dict(row) for row in state.history],
        clients=ClientTable(state.client_table()),
        state_dict=model,
        wall_time_s=state.wall_time_s,
        out=folder,
        selected=selected_row(state.history, state.rule),
        best_state_dict=best,
    )


def load_run(folder: str | Path, *, model: bool = True, trust: bool = False) -> RunResult:
    """Read a run folder (from `run` or ``fedhet run``) back as a `RunResult`.

    The final model comes from ``model.pt`` (written by `run`); for a folder without it (``fedhet run``), it is
    rebuilt from ``checkpoint.pt`` and the config, which loads the dataset; ``model=False`` skips it. Rebuilding a
    model whose config names code (``imports``, a torch ``target``) imports that code: only with ``trust=True``,
    if you trust the folder (else a one-line `ConfigError`). Nothing read can execute code otherwise
    (``torch.load(weights_only=True)``, YAML and JSON without Python objects).
    """
    from fedhet.report.runs import read_run

    path = Path(folder)
    record = read_run(path)
    config_file = path / "config.yaml"
    config = load_yaml(config_file) if config_file.is_file() else {}
    summary = record.summary
    final = dict(summary.get("final") or (record.rows[-1] if record.rows else {}))
    return RunResult(
        config=config,
        status=str(summary.get("status", "unknown")),
        rounds=int(summary.get("rounds", len(record.rows))),
        final=final,
        history=record.rows,
        clients=_client_table(path / "clients.csv"),
        state_dict=_load_model(path, config, trust) if model else None,
        wall_time_s=float(summary.get("wall_time_s", 0.0)),
        out=path,
        selected=dict(summary.get("selected") or final),
        best_state_dict=_load_best(path, config, trust) if model else None,
    )


def _load_best(path: Path, config: dict[str, Any], trust: bool) -> dict[str, Tensor] | None:
    """The selected round's model from ``best.pt`` (None without one), as a state dict."""
    from fedhet.experiments.checkpoint import CheckpointError, loads

    best = path / "best.pt"
    if not best.is_file():
        return None
    try:
        params = loads(best, f"best model '{best}'").get("params")
    except CheckpointError as err:
        raise ConfigError(f"cannot read the best model: {err}") from None
    return _as_state_dict(path, config, trust, params, best)


def _as_state_dict(path: Path, config: dict[str, Any], trust: bool, params: Any, source: Path) -> dict[str, Tensor]:
    """`params` (flat, read from `source`) as the state dict of the run's model, built as the run built it (the
    dataset is loaded for its shapes and task; code the folder names is imported only with `trust`)."""
    import torch

    from fedhet.engine.functional import state_dict_of
    from fedhet.experiments.build import build_model, federate_dataset, prepared
    from fedhet.experiments.config import parse_config
    from fedhet.experiments.trust import code_of_folder

    how = f"if you do, pass trust=True (fedhet.load_run('{path}', trust=True)), or model=False to skip the model"
    with code_of_folder(config, path / "config.yaml", trust, how):
        cfg, parts, dataset, _ = prepared(parse_config(config))
        data = federate_dataset(cfg, parts, dataset)
        model = build_model(cfg, parts, data.input_shape, data.num_classes, data.task)
    if not isinstance(params, torch.Tensor) or params.shape != model.initial_params().shape:
        raise ConfigError(f"'{source}' holds parameters of another model than its config.yaml describes")
    return state_dict_of(model, params)


def _load_model(path: Path, config: dict[str, Any], trust: bool) -> dict[str, Tensor] | None:
    import torch

    if (path / MODEL_FILE).is_file():
        try:
            loaded = torch.load(path / MODEL_FILE, weights_only=True)
        except Exception as err:  # truncated, garbled, or holding Python objects
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
            raise ConfigError(f"cannot read the model in '{path / MODEL_FILE}' ({reason})") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
            raise ConfigError(f"'{path / MODEL_FILE}' is not a state dict of tensors")
        return loaded
    checkpoint = path / "checkpoint.pt"
    if not checkpoint.is_file():
        return None
    from fedhet.experiments.checkpoint import CheckpointError, loads

    try:
        saved = loads(checkpoint, f"checkpoint '{checkpoint}'")
    except CheckpointError as err:
        raise ConfigError(f"cannot read the model: {err}") from None
    return _as_state_dict(path, config, trust, saved.get("params"), checkpoint)
