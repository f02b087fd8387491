"""Metric plugins: extra numbers computed at each evaluated round (GM-appeal, improved users, ...).

A run lists them in its config (``metrics: [improved_users, {name: appeal, ...}]``); each returns round
metrics (columns of ``metrics.csv``) and optional per-client columns (of ``clients.csv``). A plugin declares the
columns it writes (`Metric.columns`, `Metric.client_columns`): a run whose plugins would write a built-in column
(`fedhet.metrics.METRICS`, `fedhet.metrics.CLIENT_COLUMNS`) or one another plugin writes is refused before it
starts (`check_columns`), and a column written but not declared stops the run (`compute_checked`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict, PrivateAttr
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.protocol import EngineProtocol
from fedhet.engine.task import Task
from fedhet.errors import ConfigError, FedhetError
from fedhet.metrics import CLIENT_COLUMNS, METRICS
from fedhet.registry import Component, Registry
from fedhet.seeding import RunAware


@dataclass
class RoundView:
    """What a metric may look at after round `round` (1-based count of completed rounds)."""

    round: int
    engine: EngineProtocol
    params: Tensor  # global model after the round
    previous: Tensor  # global model before the round
    result: LocalResult | None  # the cohort's local training (None when nobody trained)
    test: ClientScores  # of `params` on every client's test data
    train: ClientScores  # of `params` on every client's train data
    history: list[dict[str, float]]  # earlier evaluated rounds
    final: bool = False  # the last round of the run
    val: ClientScores | None = None  # of `params` on every client's validation data (with ``val_fraction``)
    personal: LocalPlan | None = None  # the plan that makes the evaluated clients' personalised models (if any)

    @property
    def task(self) -> Task:
        """What the model learns (`fedhet.engine.task`: its loss, whether it has an accuracy, its own metrics)."""
        return self.engine.model.task


class Metric(Component, RunAware):
    """Base of metric plugins; may keep state across rounds in private attributes (then override
    ``state_dict``/``load_state_dict``). After `setup`, `num_clients` and `seed` are the run's, and
    ``self.rng(purpose, round_)`` draws from the run's seed."""

    model_config = ConfigDict(extra="forbid", frozen=False)
    needs_all_clients: ClassVar[bool] = True
    """Whether `compute` needs every client scored (``RoundView.test``/``train``); while one plugin of a run
    does, ``eval_clients`` sampling is off (set False where a sample's scores are enough)."""

    _num_clients: int | None = PrivateAttr(None)
    _seed: int | None = PrivateAttr(None)

    def columns(self) -> tuple[str, ...]:
        """The ``metrics.csv`` columns `compute` may write (all it writes; none may be another's)."""
        return ()

    def client_columns(self) -> tuple[str, ...]:
        """The ``clients.csv`` columns `compute` may write (all it writes; none may be another's)."""
        return ()

    def needs_personal_models(self) -> bool:
        """Whether `compute` looks at the clients' stored personalised models (``RoundView.personal``): a run whose
        strategy keeps none is refused before it starts."""
        return False

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        """Called once before the first round (precompute per-client thresholds and the like; an override calls
        ``super().setup(engine, seed)`` first)."""
        self._num_clients, self._seed = engine.data.num_clients, seed

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        """This round's metrics (columns of `columns`) and per-client values (columns of `client_columns`)."""
        raise NotImplementedError

    def save(self, out: Path) -> None:
        """Write extra files into the run folder `out` when the run ends (default: nothing)."""

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        del state


def check_columns(plugins: Sequence[Metric]) -> None:
    """Refuse, in one line, plugins that declare a built-in column or one that another of them declares."""
    for file, builtin, declared in (
        ("metrics.csv", METRICS, [p.columns() for p in plugins]),
        ("clients.csv", CLIENT_COLUMNS, [p.client_columns() for p in plugins]),
    ):
        owner: dict[str, str] = {}
        for i, (plugin, columns) in enumerate(zip(plugins, declared, strict=True)):
            for column in columns:
                if column in builtin or column in owner:
                    who = "fedhet writes itself" if column in builtin else f"metric plugin '{owner[column]}' writes too"
                    raise ConfigError(
                        f"metrics[{i}] ('{plugin.name}') writes the {file} column '{column}', which {who}; "
                        "give the plugin's column another name"
                    )
                owner[column] = plugin.name


def compute_checked(
    plugin: Metric, view: RoundView, row: dict[str, float]
) -> tuple[dict[str, float], dict[str, Tensor]]:
    """`plugin`'s metrics and client columns of this round, checked: each declared, none already in `row`
    (a strategy's round metrics)."""
    metrics, columns = plugin.compute(view)
    for written, declared, file in (
        (metrics, plugin.columns(), "metrics.csv"),
        (columns, plugin.client_columns(), "clients.csv"),
    ):
        undeclared = [c for c in written if c not in declared]
        if undeclared:
            method = "columns()" if file == "metrics.csv" else "client_columns()"
            raise FedhetError(
                f"metric plugin '{plugin.name}' wrote the {file} column '{undeclared[0]}' that it does not declare; "
                f"list it in the plugin's {method}"
            )
    taken = [c for c in metrics if c in row]
    if taken:
        raise FedhetError(
            f"metric plugin '{plugin.name}' writes the metrics.csv column '{taken[0]}', which the strategy writes "
            "too; give the plugin's column another name"
        )
    return metrics, columns


def needs_all_clients(metrics: Iterable[Metric]) -> bool:
    """Whether one of `metrics` needs every client scored (`Metric.needs_all_clients`)."""
    return any(plugin.needs_all_clients for plugin in metrics)


METRIC_PLUGINS: Registry[Metric] = Registry("metric")
