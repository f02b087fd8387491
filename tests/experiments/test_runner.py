"""The round loop: run folders, determinism, resume after an interruption, divergence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedhet.errors import DivergenceError
from fedhet.experiments.callbacks import Callback, EarlyStopping
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run, run_or_resume

SMALL = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [16], "dropout": 0.1},
    "num_clients": 10,
    "clients_per_round": 4,
    "rounds": 6,
    "local": {"steps": 3, "lr": 0.1, "batch_size": 8},
    "seed": 2,
}


def small(**changes: object) -> dict:
    return {**SMALL, **changes}


class Interrupt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == self.at:
            raise KeyboardInterrupt
        return False


def test_run_folder_files(tmp_path: Path) -> None:
    state = run(parse_config(small()), tmp_path / "r")
    out = tmp_path / "r"
    for name in ("config.yaml", "metrics.csv", "clients.csv", "summary.json", "checkpoint.pt"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "fedavg" and summary["dataset"] == "digits" and summary["rounds"] == 6
    assert summary["status"] == "finished" and summary["wall_time_s"] > 0
    assert summary["final"]["test_accuracy"] == pytest.approx(state.final["test_accuracy"])
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for column in (
        "round",
        "test_accuracy",
        "test_loss",
        "train_loss",
        "test_accuracy_std",
        "test_accuracy_worst10",
        "test_accuracy_best10",
    ):
        assert column in header
    assert len((out / "metrics.csv").read_text().splitlines()) == 7
    assert len((out / "clients.csv").read_text().splitlines()) == 11
    assert "hidden:\n  - 16" in (out / "config.yaml").read_text()  # resolved component params


def test_same_seed_same_metrics_and_backends_agree(tmp_path: Path) -> None:
    run(parse_config(small()), tmp_path / "a")
    run(parse_config(small()), tmp_path / "b")
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()
    seq = run(parse_config(small(backend="sequential")))
    vec = run(parse_config(small(backend="vectorised")))
    torch.testing.assert_close(seq.params, vec.params, atol=1e-5, rtol=1e-5)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_resume_after_interruption_matches_uninterrupted(tmp_path: Path, algorithm: str) -> None:
    cfg = parse_config(small(algorithm=algorithm, availability={"name": "bernoulli", "p": 0.7}))
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=3)])
    summary = json.loads((tmp_path / "cut/summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 3
    resumed = resume(tmp_path / "cut")
    assert resumed.round == 6
    assert (tmp_path / "cut/metrics.csv").read_text() == (tmp_path / "full/metrics.csv").read_text()
    assert (tmp_path / "cut/clients.csv").read_text() == (tmp_path / "full/clients.csv").read_text()


def test_divergence_stops_with_message_and_keeps_files(tmp_path: Path) -> None:
    cfg = parse_config(small(local={"steps": 5, "lr": 1e6, "batch_size": 8}, rounds=5))
    with pytest.raises(DivergenceError, match=r"diverged.*lower local.lr"):
        run(cfg, tmp_path / "d")
    summary = json.loads((tmp_path / "d/summary.json").read_text())
    assert summary["status"] == "diverged"
    assert (tmp_path / "d/config.yaml").is_file()


def test_early_stopping_callback() -> None:
    state = run(parse_config(small(rounds=30)), callbacks=[EarlyStopping("test_accuracy", 0.3)])
    assert state.status == "stopped early" and state.round < 30
    assert state.final["test_accuracy"] >= 0.3


class CountRounds(Callback):
    def __init__(self) -> None:
        self.rounds = 0

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.rounds += 1
        return False


def test_run_or_resume_loads_a_finished_run_and_continues_an_interrupted_one(tmp_path: Path) -> None:
    full = run(parse_config(small()), tmp_path / "full")
    counter = CountRounds()
    loaded = run_or_resume(parse_config(small()), tmp_path / "full", [counter])
    assert counter.rounds == 0 and loaded.history == full.history and torch.equal(loaded.params, full.params)

    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small()), tmp_path / "cut", [Interrupt(at=2)])
    counter = CountRounds()
    finished = run_or_resume(parse_config(small()), tmp_path / "cut", [counter])
    assert counter.rounds == 4 and finished.history == full.history

    counter = CountRounds()  # another config in the same folder starts afresh
    other = run_or_resume(parse_config(small(seed=3)), tmp_path / "full", [counter])
    assert counter.rounds == 6 and other.history != full.history
