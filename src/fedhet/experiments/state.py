"""`RunState`: a run between two rounds, as the round loop keeps it and callbacks, trackers and writers see it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.experiments.asynchronous import AsyncQueue
from fedhet.experiments.build import Experiment
from fedhet.experiments.config import RunConfig
from fedhet.experiments.runfolder import RunFolder
from fedhet.experiments.selection import Rule, better
from fedhet.systems.clock import SimulatedTime


def pack_columns(columns: dict[str, Tensor], evaluated: Tensor | None = None) -> dict[str, Tensor | dict[str, Tensor]]:
    """Per-client columns as a checkpoint keeps them: a column that is mostly one value (NaN for the clients a
    sampled evaluation left out, 1 in ``seen``) as that value and the other clients' rows and values, so that a
    round's checkpoint grows with the clients evaluated, not with K; other columns as they are. `evaluated` (the
    clients the last evaluation scored, when a sample) spares the search for the rows of its NaN-filled columns."""
    packed: dict[str, Tensor | dict[str, Tensor]] = {}
    for name, column in columns.items():
        kept = _PACKED.get(id(column))
        if kept is not None and kept[0]() is column and kept[1] == column._version:  # ``seen``, the sizes
            packed[name] = kept[2]
            continue
        values = column.detach().cpu()
        if values.dtype not in _NUMPY_TYPES:  # (bfloat16, complex: kept whole)
            packed[name] = values
            continue
        array = values.numpy()  # NumPy's scans over K are several times faster than torch's on one thread
        rows = _rows_of_sample(array, evaluated) if values.is_floating_point() else None
        fill = values.new_full((1,), float("nan")) if rows is not None else values[:1].clone()
        if rows is None:  # mostly its first value? (bit for bit: -0.0 is not 0.0)
            bits = array.view(f"i{array.itemsize}") if values.is_floating_point() else array
            rows = np.flatnonzero(bits != bits[0]) if len(bits) else np.zeros(0, dtype=np.int64)
        if len(values) < 16 or 4 * len(rows) > len(values):
            packed[name] = values
        else:
            index = torch.from_numpy(rows.astype(np.int64, copy=False))
            packed[name] = {"fill": fill, "rows": index, "values": values[index], "size": torch.tensor(len(values))}
        _PACKED[id(column)] = (weakref.ref(column, _forget(id(column))), column._version, packed[name])
    return packed


_NUMPY_TYPES = {
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
}

# the packed form of each column tensor still alive, by id, with its version: a column that is the same unchanged
# tensor every evaluation (``seen``, the clients' sizes) is packed once, not once per round
_PACKED: dict[int, tuple[weakref.ref[Tensor], int, Tensor | dict[str, Tensor]]] = {}


def _forget(key: int) -> Callable[[weakref.ref[Tensor]], None]:
    """Drops a dead column's entry from `_PACKED`."""

    def forget(_: weakref.ref[Tensor]) -> None:
        _PACKED.pop(key, None)

    return forget


def _rows_of_sample(values: np.ndarray, evaluated: Tensor | None) -> np.ndarray | None:
    """The rows of a float column that are not NaN, when most are NaN (else None): found among `evaluated` when
    they all lie there (one count over the column, no search), else searched for."""
    present = len(values) - int(np.count_nonzero(np.isnan(values)))
    if 4 * present > len(values):
        return None
    if evaluated is not None:
        sample = evaluated.numpy()
        among = sample[~np.isnan(values[sample])]
        if len(among) == present:
            return among
    return np.flatnonzero(~np.isnan(values))


def unpack_columns(packed: dict[str, Any]) -> dict[str, Tensor]:
    """The columns `pack_columns` packed (a column kept as it was passes through); TypeError if it is not that."""
    if not isinstance(packed, dict):
        raise TypeError("its client columns are not a mapping")
    columns = {}
    for name, item in packed.items():
        if isinstance(item, dict):
            parts = [item.get(k) for k in ("fill", "rows", "values", "size")]
            fill, rows, values, size = (t if isinstance(t, Tensor) else None for t in parts)
            if fill is None or rows is None or values is None or size is None:
                raise TypeError(f"its client column '{name}' is not a packed column")
            item = fill.expand(int(size)).clone()
            item[rows] = values
        if not isinstance(item, Tensor):
            raise TypeError("its client columns are not tensors")
        columns[name] = item
    return columns


def selection_rule(config: RunConfig) -> Rule | None:
    """The config's rule for the best round (``selection``), or None when it selects none (the last round)."""
    metric = config.selection_metric()
    if metric is None:
        return None
    mode = better(metric) if config.selection.mode == "auto" else config.selection.mode
    return Rule(metric, mode, config.selection.min_delta)


@dataclass
class RunState:
    """The state of a run between rounds; `round` counts completed rounds."""

    experiment: Experiment
    params: Tensor
    round: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    wall_time_s: float = 0.0
    local_training_s: float = 0.0  # the last round's local training (the engine's `train`), seconds
    status: str = "running"
    out: Path | None = None
    client_columns: dict[str, Tensor] = field(default_factory=dict)
    folder: RunFolder | None = field(default=None, repr=False)  # the open, locked run folder (with `out`)
    already_finished: bool = False  # resumed a run that had run all its rounds: nothing was run or rewritten
    score_sample_only: bool = False  # `run`'s argument: ``--estimate`` times sampled evaluations
    clock: SimulatedTime | None = None  # the simulated clock of a run with a system model (None: rounds only)
    pending: AsyncQueue | None = None  # an asynchronous run's clients in flight and buffer (None: synchronous)
    best_round: int = 0  # the selected round so far (``selection``; 0: none yet, or no selection)
    best_params: Tensor | None = None  # its evaluated model
    initial_loss: float | None = None  # the initial model's largest training loss (the divergence test's scale)
    flops: Tensor | None = None  # (P,) forward FLOPs per parameter, for sub-models on the clock (worked out once)
    evaluated: Tensor | None = None  # the clients the last evaluation scored, sorted (None: every client)

    @property
    def rule(self) -> Rule | None:
        """How the run selects its best round (None: it does not; the last round is its result)."""
        return selection_rule(self.config)

    @staticmethod
    def start(experiment: Experiment, **fields: Any) -> RunState:
        """A run at its start: a clock where the experiment simulates time, a queue where it is asynchronous."""
        asynchronous = experiment.strategy.asynchronous
        timed = experiment.system.simulates_time or asynchronous
        clock = SimulatedTime() if timed else None
        pending = AsyncQueue() if asynchronous else None
        return RunState(experiment, experiment.engine.initial_params(), clock=clock, pending=pending, **fields)

    @property
    def config(self) -> RunConfig:
        return self.experiment.config

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}

    def client_table(self) -> dict[str, np.ndarray | list[str]]:
        """clients.csv column by column: each client's number, its user's name where each client is one user, and
        its columns as float64 arrays (empty before any evaluation)."""
        if not self.client_columns:
            return {}
        k = len(next(iter(self.client_columns.values())))
        names = self.experiment.data.client_names
        return {
            "client": np.arange(k, dtype=np.float64),
            **({"user": list(names)} if names is not None else {}),
            **{c: v.detach().cpu().double().numpy() for c, v in self.client_columns.items()},
        }

    def client_rows(self) -> list[dict[str, float | str]]:
        """One row per client at the end (clients.csv): its number, its user's name where each client is one user,
        and its columns (none before any evaluation)."""
        table = self.client_table()
        columns = [v.tolist() if isinstance(v, np.ndarray) else v for v in table.values()]
        return [dict(zip(table, row, strict=True)) for row in zip(*columns, strict=True)]
