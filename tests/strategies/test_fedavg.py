"""FedAvg's weights and server step, by hand."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.fedavg import FedAvg, fedavg_weights
from helpers.tiny import linear_model, make_context, tiny_data


def fake_result(clients: list[int], params: torch.Tensor) -> LocalResult:
    m = len(clients)
    return LocalResult(torch.tensor(clients), params, torch.zeros(m), torch.full((m,), 2), torch.full((m,), 0.1))


def test_weights_by_samples_and_uniform() -> None:
    sizes = torch.tensor([1, 3])
    torch.testing.assert_close(fedavg_weights(sizes, "samples"), torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(fedavg_weights(sizes, "uniform"), torch.tensor([0.5, 0.5]))


def test_aggregate_is_weighted_average_with_server_lr() -> None:
    data = tiny_data([2, 6, 4])  # train sizes 2, 6, 4
    engine = Engine(linear_model(), data)
    size = engine.model.size
    w = torch.zeros(size)
    local = torch.stack([torch.full((size,), 1.0), torch.full((size,), 3.0)])
    for server_lr, weighting, expected in (
        (1.0, "samples", 0.25 * 1 + 0.75 * 3),  # clients 0 and 1: sizes 2 and 6
        (0.5, "samples", 0.5 * (0.25 * 1 + 0.75 * 3)),
        (1.0, "uniform", 2.0),
    ):
        strategy = FedAvg(server_lr=server_lr, weighting=weighting)
        strategy.setup(make_context(engine))
        new = strategy.aggregate(0, w, fake_result([0, 1], local))
        torch.testing.assert_close(new, torch.full((size,), expected))


def test_select_samples_m_available_without_replacement() -> None:
    data = tiny_data([3] * 10)
    strategy = FedAvg()
    strategy.setup(make_context(Engine(linear_model(), data), m=4))
    available = torch.tensor([True, False] * 5)
    chosen = strategy.select(7, available)
    assert len(chosen) == 4 and len(set(chosen.tolist())) == 4
    assert all(available[chosen])
    assert torch.equal(chosen, strategy.select(7, available))
    assert len(strategy.select(0, torch.tensor([True] + [False] * 9))) == 1
