"""Model selection over a run's rounds (the best round by a validation metric, kept in best.pt) and early stopping
from the config, on hand-computed sequences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from pydantic import Field
from torch import Tensor

import fedhet
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.checkpoint import loads
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.experiments.selection import Rule, best_index, better, rounds_without_improvement, selected_row
from fedhet.experiments.state import RunState
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView


@METRIC_PLUGINS.register
class Scripted(Metric):
    """Writes `values[round − 1]` as the column ``scripted``: a metric whose course the test decides."""

    name: ClassVar[str] = "test_scripted"
    needs_all_clients: ClassVar[bool] = False
    values: list[float] = Field(default_factory=list)

    def columns(self) -> tuple[str, ...]:
        return ("scripted",)

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        return {"scripted": self.values[view.round - 1]}, {}


class Models(Callback):
    """The global model after each round."""

    def __init__(self) -> None:
        self.params: dict[int, Tensor] = {}

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.params[state.round] = state.params.clone()
        return False


VALUES = [5.0, 4.0, 4.2, 3.97, 4.1, 4.3, 3.0, 2.0]
BASE = {
    "num_clients": 4,
    "clients_per_round": 2,
    "rounds": 8,
    "local": {"steps": 2},
    "metrics": [{"name": "test_scripted", "values": VALUES}],
}


def rows(values: list[float]) -> list[dict[str, float]]:
    return [{"round": float(i + 1), "m": v} for i, v in enumerate(values)]


def test_the_rule_by_hand() -> None:
    rule = Rule("m", "min", min_delta=0.05)
    # 5 → 4 improves; 4.2 does not; 3.97 is within min_delta of 4: not an improvement
    assert best_index(rows([5.0, 4.0, 4.2, 3.97]), rule) == 1
    assert rounds_without_improvement(rows([5.0, 4.0, 4.2, 3.97]), rule) == 2
    assert best_index(rows([5.0, 4.0, 4.2, 3.97]), Rule("m", "min")) == 3  # without min_delta it does
    assert best_index(rows([float("nan"), 0.2, 0.2]), Rule("m", "max")) == 1  # NaN never; ties keep the first
    assert best_index(rows([]), rule) is None and selected_row(rows([1.0, 2.0]), None) == {"round": 2.0, "m": 2.0}
    assert better("val_loss") == "min" and better("val_rmse") == "min" and better("val_auc") == "max"


def test_early_stopping_stops_at_the_hand_computed_round_and_keeps_the_best_model(tmp_path: Path) -> None:
    """patience 2, min_delta 0.05 on 5, 4, 4.2, 3.97, ...: the best is round 2 (4.0); rounds 3 and 4 do not beat it
    by more than 0.05, so the run stops after round 4 and its result is round 2's model."""
    selection = {"metric": "scripted", "mode": "min", "patience": 2, "min_delta": 0.05}
    models = Models()
    state = run(parse_config({**BASE, "selection": selection}), tmp_path / "run", [models])
    assert state.status == "stopped early" and state.round == 4 and len(state.history) == 4
    assert state.best_round == 2 and torch.equal(state.best_params, models.params[2])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["selection"] == {"metric": "scripted", "mode": "min", "round": 2}
    assert summary["selected"]["scripted"] == 4.0 and summary["final"]["round"] == 4
    best = loads(tmp_path / "run" / "best.pt", "best.pt")
    assert best["round"] == 2 and best["value"] == 4.0 and torch.equal(best["params"], models.params[2])
    again = resume(tmp_path / "run")  # stopped by its patience: nothing more to run
    assert again.already_finished and again.status == "stopped early" and again.round == 4
    # without min_delta 3.97 is the new best (round 4); 4.1 and 4.3 do not beat it: stops after round 6
    plain = run(parse_config({**BASE, "selection": {**selection, "min_delta": 0.0}}))
    assert plain.round == 6 and plain.best_round == 4


def test_an_interrupted_run_resumes_to_the_same_selection(tmp_path: Path) -> None:
    class Stop(Callback):
        def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
            if state.round == 5:
                raise KeyboardInterrupt
            return False

    config = parse_config({**BASE, "selection": {"metric": "scripted", "mode": "min"}, "checkpoint_every": 3})
    whole = run(config, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(config, tmp_path / "cut", [Stop()])
    resumed = resume(tmp_path / "cut")
    assert resumed.best_round == whole.best_round == 8 and torch.equal(resumed.best_params, whole.best_params)
    for name in ("metrics.csv", "best.pt"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_a_validation_split_selects_by_validation_loss_and_reports_test_there(tmp_path: Path) -> None:
    result = fedhet.run({**BASE, "metrics": [], "val_fraction": 0.2, "rounds": 6}, out=tmp_path / "run")
    losses = [row["val_loss"] for row in result.history]
    best = losses.index(min(losses))
    assert result.selected == result.history[best] and "test_accuracy" in result.selected
    assert result.best_state_dict is not None
    loaded = fedhet.load_run(tmp_path / "run")
    assert loaded.selected["round"] == best + 1
    for key, value in result.best_state_dict.items():
        assert torch.equal(loaded.best_state_dict[key], value)  # type: ignore[index]
    clients = (tmp_path / "run" / "clients.csv").read_text().splitlines()[0]
    assert "val_samples" in clients and "val_loss" in clients


def test_a_run_without_validation_writes_what_it_wrote_before(tmp_path: Path) -> None:
    result = fedhet.run({**BASE, "metrics": [], "rounds": 2}, out=tmp_path / "run")
    assert not any(k.startswith("val_") for k in result.final) and not (tmp_path / "run" / "best.pt").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "selection" not in summary and "selected" not in summary
    assert result.selected == result.final  # no selection: the last round


def test_selection_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"selection\.patience stops a run when selection\.metric stops improving"):
        parse_config({"selection": {"patience": 3}})
    with pytest.raises(ConfigError, match=r"test_fraction \(0.5\) \+ val_fraction \(0.5\) leave no training data"):
        parse_config({"test_fraction": 0.5, "val_fraction": 0.5})
    assert parse_config({"val_fraction": 0.1}).selection_metric() == "val_loss"


# ---- a selection metric the run does not write is refused before it starts ------------------------------------

TINY = {"num_clients": 6, "rounds": 1, "model": {"name": "mlp", "hidden": [8]}, "local": {"steps": 1}}


def _patients(tmp_path: Path) -> dict[str, object]:
    from helpers.tables import write_patients

    path = write_patients(tmp_path / "patients.csv")
    table = {"name": "table", "path": str(path), "label": "pressure", "user": "site", "missing": "drop"}
    return {
        "dataset": table,
        "task": "regression",
        "num_clients": 4,
        "max_loss": 1e9,
        "local": {"steps": 1, "lr": 0.003},
    }


LAYOUTS = {
    "plain": {},
    "validation, unseen clients, a sample evaluated": {"val_fraction": 0.2, "unseen_clients": 2, "eval_clients": 3},
    "binary task": {"dataset": "breast_cancer", "task": "binary", "val_fraction": 0.2, "unseen_clients": 1},
    "regression": "patients",
    "clock with a deadline": {"system": "lognormal", "deadline": {"seconds": 1.0, "policy": "partial"}},
    "asynchronous": {"algorithm": "fedbuff", "system": "constant"},
    "personalised": {"algorithm": "ditto", "unseen_clients": 1},
    "metric plugin": {"metrics": [{"name": "test_scripted", "values": [1.0]}]},
}


SLOW_LAYOUTS = ("binary task", "personalised")  # about 3 s each


@pytest.mark.parametrize(
    "layout", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_LAYOUTS else k for k in LAYOUTS]
)
def test_the_columns_a_run_announces_are_the_columns_it_writes(layout: str, tmp_path: Path) -> None:
    from fedhet.experiments.build import build
    from fedhet.experiments.selection import run_columns, task_metric_names

    extra = LAYOUTS[layout]
    cfg = parse_config({**TINY, **(_patients(tmp_path) if extra == "patients" else extra)})  # type: ignore[dict-item]
    exp = build(cfg)
    names = task_metric_names(exp)
    assert names is not None
    announced = run_columns(exp, names)
    written = run(cfg).history[-1]
    assert set(written) == set(announced)


def test_the_task_names_its_own_metrics() -> None:
    from fedhet.experiments.build import build
    from fedhet.experiments.selection import task_metric_names

    assert task_metric_names(build(parse_config(TINY))) == []
    binary = build(parse_config({**TINY, "dataset": "breast_cancer", "task": "binary"}))
    assert task_metric_names(binary) == ["auc", "f1", "balanced_accuracy"]


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"selection": {"metric": "val_loss"}}, r"'val_loss' is not a column this run writes \(val_ columns need a"),
        ({"selection": {"metric": "val_auc"}, "val_fraction": 0.2}, r"\(task classification, algorithm fedavg\)"),
        ({"selection": {"metric": "val_auc"}, "val_fraction": 0.2, "dataset": "breast_cancer", "task": "binary"}, ""),
        ({"selection": {"metric": "time_s"}}, r"the clock's columns need a system model"),
        ({"selection": {"metric": "unseen_test_loss"}}, r"unseen_ columns need held-out clients"),
        ({"selection": {"metric": "val_acc"}, "val_fraction": 0.2}, r"metrics are: round, test_accuracy, .*val_loss"),
        ({"selection": {"metric": "test_rmse", "patience": 2}}, r"'test_rmse' is not a column"),
    ],
)  # fmt: skip
def test_a_selection_metric_the_run_does_not_write_is_refused(settings: dict[str, object], message: str) -> None:
    from fedhet.experiments.build import build
    from fedhet.experiments.selection import check_selection

    if not message:  # the control: a metric the run writes is accepted
        check_selection(build(parse_config({**TINY, **settings})))
        return
    with pytest.raises(ConfigError, match=message):
        check_selection(build(parse_config({**TINY, **settings})))


def test_a_strategys_own_column_may_be_selected_and_an_unknown_one_is_a_note() -> None:
    from fedhet.errors import FedhetNote

    state = run(parse_config({**TINY, "rounds": 2, "algorithm": "afl", "selection": {"metric": "afl_lambda_max"}}))
    assert state.best_round in (1, 2)
    with pytest.warns(FedhetNote, match=r"selection.metric 'nope' is not a column .*afl_lambda_max"):
        state = run(parse_config({**TINY, "algorithm": "afl", "selection": {"metric": "nope"}}))
    assert state.best_round == 0
