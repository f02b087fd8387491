"""Asynchronous runs on the simulated clock: the order of events, clients trained together, resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.strategies.fedasync import FedAsync
from fedhet.systems.base import SYSTEMS, Profiles, SystemModel


@SYSTEMS.register
class ExactSpeeds(SystemModel):
    """Clients 0, 1, 2 take 1, 2 and 5 units of 1/1024 s a sample, no communication time: exact sums."""

    name: ClassVar[str] = "t_exact_speeds"

    def profiles(self, round_: int) -> Profiles:
        k = self.num_clients
        unit = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)[:k] / 1024
        inf = torch.full((k,), float("inf"), dtype=torch.float64)
        return Profiles(unit, inf, inf, torch.zeros(k, dtype=torch.float64))


SMALL: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": "logistic",
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},  # 100 samples a round: 100, 200 and 500 units
    "seed": 1,
}


def test_events_arrive_in_the_order_of_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedAsync, C = 3 of 3 clients: hand-computed arrivals (client, staleness) and server times."""
    seen: list[tuple[int, int]] = []
    step = FedAsync.aggregate_buffer

    def record(self: FedAsync, version: int, w: torch.Tensor, result: Any, starts: Any, staleness: Any) -> Any:
        seen.append((int(result.clients[0]), int(staleness[0])))
        return step(self, version, w, result, starts, staleness)

    monkeypatch.setattr(FedAsync, "aggregate_buffer", record)
    config = {**SMALL, "algorithm": {"name": "fedasync", "concurrency": 3}, "num_clients": 3, "rounds": 7}
    state = run(parse_config({**config, "system": "t_exact_speeds"}))
    # t = 100: 0 (fresh); 0 goes again from v1. t = 200: 1 (from v0), then 0 (from v1): both one version stale;
    # 0 and 1 go again from v3. t = 300: 0; t = 400: 1 (from v3), 0 (from v4); t = 500: 2, sent at version 0
    assert seen == [(0, 0), (1, 1), (0, 1), (0, 0), (1, 1), (0, 1), (2, 6)]
    times = [row["time_s"] * 1024 for row in state.history]
    assert times == [100, 200, 200, 300, 400, 400, 500]


def test_clients_in_flight_train_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain local SGD looks at the received model only as its start: the clients in flight train together, each
    from the version it was sent, when the first of them is needed."""
    sizes: list[int] = []
    train = Engine.train

    def record(self: Engine, params: torch.Tensor, plan: Any, round_: int) -> Any:
        sizes.append(len(plan.clients))
        return train(self, params, plan, round_)

    monkeypatch.setattr(Engine, "train", record)
    config = {**SMALL, "algorithm": {"name": "fedbuff", "concurrency": 12, "buffer_size": 4}, "num_clients": 16}
    state = run(parse_config({**config, "system": "lognormal", "rounds": 6}))
    assert sizes[0] == 12  # the first 12, all from version 0, in one call
    assert max(sizes[1:]) > 1  # later ones, sent from several versions, together too
    queue = state.pending
    assert queue is not None
    untrained = [f for f in queue.flights if f.seq not in queue.results]
    assert sum(sizes) == queue.dispatched - len(untrained)  # every client trained once, none twice


class Interrupt(Callback):
    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 3:
            raise KeyboardInterrupt
        return False


@pytest.mark.parametrize("algorithm", [{"name": "fedbuff", "concurrency": 6, "buffer_size": 3}, "fedasync"])
def test_a_resumed_asynchronous_run_is_byte_identical(tmp_path: Path, algorithm: Any) -> None:
    config = parse_config({**SMALL, "algorithm": algorithm, "num_clients": 8, "rounds": 6, "system": "lognormal"})
    run(config, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(config, tmp_path / "cut", callbacks=[Interrupt()])
    assert json.loads((tmp_path / "cut/summary.json").read_text())["status"] == "interrupted"
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()


def test_a_plan_that_looks_at_the_received_model_trains_by_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedBuff with a proximal term (towards the model each client received): clients of one version only."""
    starts_seen: list[bool] = []
    train = Engine.train

    def record(self: Engine, params: torch.Tensor, plan: Any, round_: int) -> Any:
        starts_seen.append(plan.starts is not None)
        return train(self, params, plan, round_)

    monkeypatch.setattr(Engine, "train", record)
    algorithm = {"name": "fedbuff", "concurrency": 12, "buffer_size": 4}
    local = {**SMALL["local"], "terms": [{"name": "proximal", "mu": 0.1}]}
    run(
        parse_config(
            {**SMALL, "algorithm": algorithm, "num_clients": 16, "rounds": 6, "system": "lognormal", "local": local}
        )
    )
    assert starts_seen and not any(starts_seen)
