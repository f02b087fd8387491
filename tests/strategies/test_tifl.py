"""TiFL: clients grouped by speed, one tier a round (Chai et al. 2020)."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalSettings
from fedhet.strategies.base import ServerContext
from fedhet.strategies.tifl import TiFL, speed_tiers
from fedhet.systems.base import Trace
from helpers.tiny import linear_model, tiny_data


def test_tiers_cut_the_clients_by_speed() -> None:
    seconds = torch.tensor([5.0, 1.0, 3.0, 2.0, 4.0, 1.0])
    assert speed_tiers(seconds, 3).tolist() == [2, 0, 1, 1, 2, 0]


def _tifl(tmp_path: object, **params: object) -> TiFL:
    path = tmp_path / "speeds.csv"  # type: ignore[operator]
    path.write_text("sample_ms,download_mbps,upload_mbps\n" + "".join(f"{ms},100,100\n" for ms in [9, 1, 5, 3, 7, 2]))
    system = Trace(path=str(path))
    system.setup(6, 0)
    engine = Engine(linear_model(), tiny_data([8] * 6))
    strategy = TiFL(tiers=3, **params)
    strategy.setup(ServerContext(engine, LocalSettings(5, 0.1, 4), 0, 2, system=system))
    return strategy


def test_each_round_selects_within_one_tier(tmp_path: object) -> None:
    strategy = _tifl(tmp_path)
    assert strategy._tier is not None and strategy._tier.tolist() == [2, 0, 1, 1, 2, 0]  # by ms a sample
    everyone = torch.ones(6, dtype=torch.bool)
    for round_ in range(10):
        chosen = strategy.select(round_, everyone)
        assert len(chosen) == 2 and len(set(strategy._tier[chosen].tolist())) == 1


def test_adaptive_tiers_follow_the_loss_and_spend_their_credits(tmp_path: object) -> None:
    strategy = _tifl(tmp_path, adaptive=True, interval=1, credits=1)
    strategy.ctx.params = strategy.ctx.engine.initial_params()
    everyone = torch.ones(6, dtype=torch.bool)
    tiers = [int(strategy._tier[strategy.select(r, everyone)][0]) for r in range(3)]  # type: ignore[index]
    assert sorted(tiers) == [0, 1, 2]  # one credit each: every tier once
    losses = strategy.ctx.engine.losses_at(strategy.ctx.params, torch.arange(6)).double()
    means = torch.stack([losses[strategy._tier == t].mean() for t in range(3)])  # type: ignore[index]
    torch.testing.assert_close(strategy._probs, means / means.sum())
