"""Each client's capacity from the system model, and a sub-model's work and bytes on the clock, by hand."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedhet.engine.plan import LocalPlan
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.systems.base import Capacity, Constant, LogNormal, NoSystem, Profiles, assign_capacity
from fedhet.systems.clock import FLOAT_BYTES, RoundClock

# two clients: 1 and 2 ms a sample, 1 MB/s both ways, 0.5 s latency; 100 samples each
PROFILES = Profiles(
    torch.tensor([0.001, 0.002], dtype=torch.float64),
    torch.full((2,), 1e6, dtype=torch.float64),
    torch.full((2,), 1e6, dtype=torch.float64),
    torch.full((2,), 0.5, dtype=torch.float64),
)
SIZES = torch.tensor([100, 100])


def test_by_speed_the_fastest_clients_hold_the_largest_levels() -> None:
    """Shares 1/4, 1/2, 1/4 of 5 clients: 1.25, 2.5, 1.25 → 1, 2, 1, and the largest remainder (0.5) one more at
    level 1: three clients at 1, one at 0.5, one at 0.25, from the fastest down."""
    speeds = torch.tensor([0.5, 0.1, 0.4, 0.2, 0.3])  # client 1 fastest, then 3, 4, 2, 0
    capacity = Capacity(levels=[0.25, 1.0, 0.5], proportions=[1, 2, 1], by="speed")
    levels = assign_capacity(capacity, 5, np.random.default_rng(0), speeds)
    assert levels.tolist() == [0.25, 1.0, 0.5, 1.0, 1.0]  # 1, 3, 4 at 1; 2 at 0.5; 0 at 0.25


def test_at_random_the_shares_hold_and_the_seed_decides() -> None:
    capacity = Capacity(levels=[1.0, 0.5], proportions=[3, 1])
    a = assign_capacity(capacity, 4000, np.random.default_rng(1))
    assert float((a == 1.0).double().mean()) == pytest.approx(0.75, abs=0.03)
    assert torch.equal(a, assign_capacity(capacity, 4000, np.random.default_rng(1)))
    system = LogNormal(capacity={"levels": [1.0, 0.5, 0.25]})
    system.setup(30, seed=3)
    again = LogNormal(capacity={"levels": [1.0, 0.5, 0.25]})
    again.setup(30, seed=3)
    assert torch.equal(system.capacities(), again.capacities())
    plain = Constant()
    plain.setup(5, 0)
    assert plain.capacities().tolist() == [1.0] * 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"levels": [1.0, 0.0]}, "must be in \\(0, 1\\]"),
        ({"levels": [1.0, 0.5], "proportions": [1.0]}, "one share"),
        ({"levels": [1.0], "proportions": [-1.0]}, "one share"),
    ],
)
def test_bad_capacities_are_refused(spec: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Capacity(**spec)


def test_capacity_by_speed_needs_a_system_model() -> None:
    with pytest.raises(ValidationError, match="needs the clients' speeds"):
        NoSystem(capacity={"by": "speed"})


def test_a_sub_model_computes_and_sends_its_share_on_the_clock() -> None:
    """Two clients of a 4-parameter model whose FLOPs are 2, 2, 2, 2: client 0 trains all of it, client 1 half
    (coordinates 0 and 1). Client 1's compute is half of client 0's, and it sends and receives 2 floats, not 4."""
    flops = torch.tensor([2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    clients = torch.tensor([0, 1])
    masks = torch.tensor([[True, True, True, True], [True, True, False, False]])
    plan = LocalPlan(clients, torch.tensor([10, 10]), torch.full((2,), 0.1), 10, masks=masks)
    profiles = PROFILES  # 1 ms a sample for client 0, 2 ms for client 1; 1 MB/s; 0.5 s latency
    clock = RoundClock(profiles, clients, SIZES, flops=flops)
    clock.schedule(plan, 4, 0)
    assert clock.compute.tolist() == pytest.approx([10 * 10 * 0.001, 10 * 10 * 0.002 * 0.5])
    assert clock.down.tolist() == [4 * FLOAT_BYTES, 2 * FLOAT_BYTES] and clock.up.tolist() == clock.down.tolist()
    full = RoundClock(profiles, clients, SIZES)  # without FLOPs (no sub-models): every client the whole model
    full.schedule(plan, 4, 0)
    assert full.compute.tolist() == pytest.approx([0.1, 0.2])


def test_a_run_reports_each_client_s_capacity(tmp_path: Path) -> None:
    cfg = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 1,
        "system": {"name": "lognormal", "capacity": {"levels": [1, 0.5, 0.25], "by": "speed"}},
    }
    state = run(parse_config(cfg), tmp_path / "r")
    rows = list(csv.DictReader((tmp_path / "r" / "clients.csv").open()))
    levels = [float(r["system_capacity"]) for r in rows]
    assert sorted(levels) == [0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
    speeds = state.experiment.system.profiles(0).sample_s
    assert levels[int(speeds.argmin())] == 1.0 and levels[int(speeds.argmax())] == 0.25
