"""`python -m fedhet.bench.submodels`: the HeteroFL round against the FLOP share of a FedAvg round runs and gives
its ratio (timings are not asserted)."""

from __future__ import annotations

import pytest

from fedhet.bench.submodels import heterofl_round, matmul_limit_s
from fedhet.bench.workloads import Workload

SMALL = Workload("small", "MLP, 10 clients", {"name": "mlp", "hidden": [16]}, (6,), 3, clients=10, samples=12, steps=2)


def test_the_round_is_timed_against_the_flop_share_of_fedavgs() -> None:
    row, share = heterofl_round(reps=1, workload=SMALL)
    # 2 clients at each level: hidden 16, 8, 4, 2, 1 of 16 units (6·h + h + 3·h + 3 weights of 6·16 + 16 + 3·16 + 3)
    assert share == pytest.approx(sum(10 * h + 3 for h in (16, 8, 4, 2, 1)) / (5 * (10 * 16 + 3)))
    assert row.ratio > 0 and row.goal == 1.3


def test_the_machines_limit_is_the_share_of_fedavgs_flops_at_the_matmul_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedhet.bench.submodels as submodels

    monkeypatch.setattr(submodels, "matmul_flop_rate", lambda: 1e9)
    # a step of 10 samples: forward and weight gradients 2·10·(6·16 + 16·3) FLOPs each, the input gradient of the
    # second layer 2·10·16·3 (the first layer's is not needed); × 2 steps × 10 clients
    flops = (2 * 2 * 10 * (6 * 16 + 16 * 3) + 2 * 10 * 16 * 3) * 2 * 10
    assert matmul_limit_s(0.5, SMALL) == pytest.approx(0.5 * flops / 1e9)
