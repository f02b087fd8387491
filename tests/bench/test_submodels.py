"""`python -m fedhet.bench.submodels`: the HeteroFL round against the FLOP share of a FedAvg round runs and gives
its ratio (timings are not asserted)."""

from __future__ import annotations

import pytest

from fedhet.bench.submodels import heterofl_round
from fedhet.bench.workloads import Workload

SMALL = Workload("small", "MLP, 10 clients", {"name": "mlp", "hidden": [16]}, (6,), 3, clients=10, samples=12, steps=2)


def test_the_round_is_timed_against_the_flop_share_of_fedavgs() -> None:
    row, share = heterofl_round(reps=1, workload=SMALL)
    # 2 clients at each level: hidden 16, 8, 4, 2, 1 of 16 units (6·h + h + 3·h + 3 weights of 6·16 + 16 + 3·16 + 3)
    assert share == pytest.approx(sum(10 * h + 3 for h in (16, 8, 4, 2, 1)) / (5 * (10 * 16 + 3)))
    assert row.ratio > 0 and row.goal == 1.3
