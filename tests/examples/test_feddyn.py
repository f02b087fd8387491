"""The FedDyn plugin (examples/feddyn/feddyn.py): its update by hand on every backend, on in-process Flower nodes,
and from the command line with --import."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fedhet.catalog import STRATEGIES
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.plugins import load_plugins
from helpers.tiny import make_context

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "feddyn" / "feddyn.py"


@pytest.fixture(autouse=True)
def _plugin() -> None:
    load_plugins([str(PLUGIN)])


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


@pytest.mark.parametrize("backend", ["sequential", "vectorised", "dense"])
def test_two_rounds_by_hand(backend: str) -> None:
    """One client holding x = 1 with label 0, a zero-initialised Linear(1, 2), one step of size η per round.

    Every parameter is ±w (class 0 up, class 1 down); the loss gradient of a class-0 parameter is σ(4w) − 1.
    Round 1: g = 0, the step is plain: θ₁ = η/2. State g ← −α θ₁. Server (m = 1): h = −α θ₁,
    θ¹ = θ₁ − h/α = 2θ₁. Round 2 from θ¹ (where α(θ − θ¹) = 0): θ₂ = θ¹ − η (σ(4θ¹) − 1 + α θ₁);
    h ← h − α (θ₂ − θ¹), θ² = θ₂ − h/α."""
    eta, alpha = 0.1, 0.3
    part = ClientData(torch.ones(1, 1), torch.zeros(1, dtype=torch.long), torch.tensor([0, 1]))
    data = FederatedData("one", part, part, 2, torch.ones(1, dtype=torch.bool))
    module = nn.Linear(1, 2)
    nn.init.zeros_(module.weight)
    nn.init.zeros_(module.bias)
    engine = Engine(FlatModel(module), data, backend=backend)  # type: ignore[arg-type]
    strategy = STRATEGIES.build({"name": "feddyn", "alpha": alpha})
    strategy.setup(make_context(engine, steps=1, lr=eta, batch=1, m=1))
    w, models = engine.initial_params(), []
    for t in range(2):
        clients = torch.tensor([0])
        w = strategy.aggregate(t, w, engine.train(w, strategy.configure(t, clients, w), t))
        models.append(float(w[0]))
    t1 = eta / 2
    h = -alpha * t1
    g1 = t1 - h / alpha
    t2 = g1 - eta * (sigmoid(4 * g1) - 1 + alpha * t1)
    h = h - alpha * (t2 - g1)
    assert models == pytest.approx([g1, t2 - h / alpha], rel=1e-5)
    torch.testing.assert_close(w, torch.tensor([1.0, -1.0, 1.0, -1.0]) * models[1])


def config(**extra: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "imports": [str(PLUGIN)],
        "algorithm": {"name": "feddyn", "alpha": 0.1},
        "dataset": "digits",
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": "logistic",
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 4,
        "local": {"steps": 3, "lr": 0.05, "batch_size": 8},
        "seed": 2,
    }
    raw.update(extra)
    return raw


def test_in_process_flower_nodes_give_the_native_numbers_and_keep_the_state(tmp_path: Path) -> None:
    from fedhet.flower.node import NodeWorker, config_text, derived_partition
    from fedhet.flower.remote import InProcessTransport, Settings, remote_builder

    cfg = parse_config(config())
    native = run(cfg)
    text = config_text(cfg)
    workers = {}
    for p in range(2):
        part, clients = derived_partition(cfg, text, p, 2)
        workers[10 + p] = NodeWorker(cfg, part, clients)
    remote = run(cfg, builder=remote_builder(InProcessTransport(workers), Settings()))
    for a, b in zip(native.history, remote.history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    kept = sorted(k for w in workers.values() for k in w.engine.client_state.clients("feddyn.grad"))
    assert kept and kept == sorted(set(kept))  # every client's g_k lives on the node that holds it, once


def test_a_resumed_run_is_byte_identical(tmp_path: Path) -> None:
    run(parse_config(config()), tmp_path / "straight")
    run(parse_config(config(rounds=2)), tmp_path / "cut")
    text = (tmp_path / "cut" / "config.yaml").read_text().replace("rounds: 2", "rounds: 4")
    (tmp_path / "cut" / "config.yaml").write_text(text)
    resume(tmp_path / "cut", trust=True)  # its config.yaml imports the plugin: this test wrote it
    assert (tmp_path / "cut" / "metrics.csv").read_bytes() == (tmp_path / "straight" / "metrics.csv").read_bytes()


def test_the_cli_runs_it_with_import(tmp_path: Path) -> None:
    from fedhet.cli.main import app

    out = tmp_path / "run"
    args = ["run", "--import", str(PLUGIN), "--algorithm", "feddyn", "--rounds", "2", "--quiet", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--set", "num_clients=4", "--set", "clients_per_round=2"])
    assert result.exit_code == 0, result.output
    assert "feddyn" in (out / "config.yaml").read_text() and str(PLUGIN) in (out / "config.yaml").read_text()
    listed = CliRunner().invoke(app, ["list", "algorithms", "--import", str(PLUGIN)])
    assert listed.exit_code == 0 and "feddyn" in listed.output
