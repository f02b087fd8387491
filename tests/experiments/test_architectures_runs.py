"""Runs of several architectures (model: architectures): resumed runs are byte-identical, the per-architecture
columns are written, and what cannot apply is refused in one line before anything is written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from helpers.hostile import assert_refused

MIX = {
    "name": "architectures",
    "dim": 8,
    "members": [{"name": "mlp", "hidden": [8]}, {"name": "cnn_mnist", "channels": [2, 4], "hidden": 8}],
}
SMALL = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": MIX,
    "num_clients": 8,
    "clients_per_round": 4,
    "rounds": 4,
    "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
    "availability": {"name": "bernoulli", "p": 0.7},
    "seed": 2,
}


class Interrupt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == self.at:
            raise KeyboardInterrupt
        return False


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedproto", "fedgh", "local_only", "feddf"])
def test_a_resumed_run_is_byte_identical(tmp_path: Path, algorithm: str) -> None:
    cfg = parse_config({**SMALL, "algorithm": algorithm, "unseen_clients": 2})
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=2)])
    assert json.loads((tmp_path / "cut/summary.json").read_text())["status"] == "interrupted"
    assert resume(tmp_path / "cut").round == 4
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    header = (tmp_path / "full/metrics.csv").read_text().splitlines()[0].split(",")
    personal = "" if algorithm == "feddf" else "personal_"  # FedDF: a global model per architecture
    for column in ("test_accuracy_arch0", "test_accuracy_arch1", "test_accuracy_worst10"):
        assert personal + column in header
    clients = (tmp_path / "full/clients.csv").read_text().splitlines()
    assert clients[0].split(",")[1] == "architecture"
    assert {line.split(",")[1] for line in clients[1:]} == {"0", "1"}


def test_the_clock_charges_each_client_its_architecture(tmp_path: Path) -> None:
    """With a system model whose capacity picks the architectures, a deadline runs; the clock's columns are written."""
    system = {"name": "lognormal", "capacity": {"levels": [1.0, 0.3], "by": "speed"}}
    model = {**MIX, "assignment": "system", "levels": [0.3, 1.0]}
    config = {**SMALL, "algorithm": "fedgh", "model": model, "system": system, "rounds": 2}
    state = run(parse_config({**config, "deadline": {"seconds": 1000.0}}), tmp_path / "r")
    assert state.round == 2
    rows = list(csv.DictReader((tmp_path / "r/metrics.csv").open()))
    sent = 0.0
    for row in rows:  # FedGH sends each client the header alone (8 × 10 + 10 floats), whatever its architecture
        assert float(row["bytes_down"]) - sent == 4 * 90 * float(row["participants"]) > 0  # the run's total so far
        sent = float(row["bytes_down"])
        assert float(row["time_s"]) > 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--algorithm", "fedavg"], "algorithm 'fedavg' averages weights of one model"),
        (["--algorithm", "fedproto", "--set", "model.assignment=system"], "set system.capacity"),
        (["--algorithm", "fedgh", "--set", "model.members=[{name: resnet8}]"], "batch-norm running statistics"),
        (["--algorithm", "fedproto", "--set", "model={name: mlp}"], "use model: architectures"),
        (["--algorithm", "fedproto", "--set", "personal_state=disk"], "in memory"),
        (["--algorithm", "feddf"], "set unseen_clients"),
    ],
)
def test_what_cannot_apply_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mix.yaml").write_text(json.dumps(SMALL))
    assert_refused(["run", "mix.yaml", *args, "--out", "runs/x"], fragment, tmp_path)
