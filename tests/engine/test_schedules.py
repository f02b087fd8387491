"""Learning-rate schedules against their formulas, and what a run does with them."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest

import fedhet
from fedhet.catalog import SCHEDULES
from fedhet.engine.schedules import MAX_NESTING, Schedule
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.state import RunState
from fedhet.methods.fedmgda.strategy import FedMGDAPlus, step_size


def factors(spec: dict[str, object], rounds: int) -> list[float]:
    schedule = SCHEDULES.build(spec)
    return [schedule.factor(t, rounds) for t in range(rounds)]


def test_each_schedule_is_its_formula() -> None:
    assert factors({"name": "constant"}, 3) == [1.0, 1.0, 1.0]
    assert factors({"name": "step", "every": 2, "gamma": 0.5}, 5) == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert factors({"name": "exponential", "gamma": 0.9}, 3) == pytest.approx([1.0, 0.9, 0.81])
    cosine = factors({"name": "cosine", "min_factor": 0.1}, 4)  # 0.1 + 0.9 · ½(1 + cos(π t / 4))
    assert cosine == pytest.approx([0.1 + 0.45 * (1 + math.cos(math.pi * t / 4)) for t in range(4)])
    assert factors({"name": "cosine", "period": 2}, 4) == pytest.approx([1.0, 0.5, 0.0, 0.0])  # flat after its period
    # warm-up over 2 rounds from 0.2 (as torch's LinearLR: 0.2, 0.6), then a step schedule from its own round 0
    warm = factors({"name": "warmup", "rounds": 2, "start": 0.2, "then": {"name": "step", "every": 1, "gamma": 0.5}}, 5)
    assert warm == pytest.approx([0.2, 0.6, 1.0, 0.5, 0.25])
    cooled = factors({"name": "warmup", "rounds": 1, "then": {"name": "cosine"}}, 3)  # cosine over the other 2 rounds
    assert cooled == pytest.approx([0.1, 1.0, 0.5])


def test_fedmgda_plus_decay_is_the_step_schedule() -> None:
    strategy = FedMGDAPlus(server_lr=2.0, lr_decay=0.5, decay_every=100)
    assert strategy.server_schedule() == SCHEDULES.build({"name": "step", "every": 100, "gamma": 0.5})
    for t in (0, 99, 100, 250):
        assert strategy.server_lr_at(t) == step_size(2.0, 0.5, t)
    assert step_size(2.0, 0.5, 250) == 0.5


class LearningRates(Callback):
    """Records the round's local and server learning rates as the strategy sees them."""

    def __init__(self) -> None:
        self.local: list[float] = []
        self.server: list[float] = []

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        ctx = state.experiment.strategy.ctx
        self.local.append(ctx.local.lr)
        self.server.append(state.experiment.strategy.server_lr_at(ctx.round))
        return False


SMALL = {"num_clients": 4, "clients_per_round": 2, "rounds": 4, "local": {"steps": 2, "lr": 0.2}}


def test_a_run_scales_its_rates_by_the_schedules() -> None:
    seen = LearningRates()
    schedules = {
        "local_lr": {"name": "step", "every": 2, "gamma": 0.1},
        "server_lr": {"name": "exponential", "gamma": 0.5},
    }
    fedhet.run({**SMALL, "schedules": schedules}, callbacks=[seen])
    assert seen.local == pytest.approx([0.2, 0.2, 0.02, 0.02])
    assert seen.server == pytest.approx([1.0, 0.5, 0.25, 0.125])


def test_a_constant_schedule_changes_nothing_and_a_schedule_changes_the_run() -> None:
    plain = fedhet.run(SMALL)
    constant = fedhet.run({**SMALL, "schedules": {"local_lr": "constant"}})
    assert plain.history == constant.history
    assert "schedules" not in plain.config and "schedules" not in constant.config  # config.yaml as before
    decayed = fedhet.run({**SMALL, "schedules": {"local_lr": {"name": "exponential", "gamma": 0.5}}})
    assert decayed.history[0] == plain.history[0] and decayed.history[-1]["test_loss"] != plain.history[-1]["test_loss"]
    assert decayed.config["schedules"]["local_lr"] == {"name": "exponential", "gamma": 0.5}


def test_a_server_schedule_and_fedmgda_plus_decay_together_are_refused() -> None:
    spec = {"name": "fedmgda_plus", "lr_decay": 0.5}
    with pytest.raises(ConfigError, match=r"algorithm\.lr_decay and schedules\.server_lr both schedule"):
        fedhet.run({**SMALL, "algorithm": spec, "schedules": {"server_lr": "cosine"}})


@SCHEDULES.register
class HalvingOnce(Schedule):
    """A schedule of one's own (a registered plugin): halves the rate after the first round."""

    name: ClassVar[str] = "test_halving_once"
    description: ClassVar[str] = "halves the rate after round 1"

    def factor(self, round_: int, rounds: int) -> float:
        return 1.0 if round_ < 1 else 0.5


def test_a_schedule_of_ones_own() -> None:
    seen = LearningRates()
    fedhet.run({**SMALL, "rounds": 2, "schedules": {"local_lr": "test_halving_once"}}, callbacks=[seen])
    assert seen.local == pytest.approx([0.2, 0.1])


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "exponential", "gamma": 1e200}, "less than or equal to 1"),
        ({"name": "exponential", "gamma": math.inf}, "finite number"),
        ({"name": "step", "gamma": 2.0}, "less than or equal to 1"),
        ({"name": "step", "gamma": math.nan}, "finite number"),
        ({"name": "warmup", "start": math.inf}, "finite number"),
        ({"name": "cosine", "min_factor": math.nan}, "finite number"),
    ],
)
def test_a_schedule_grows_no_rate_beyond_the_configured_one(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SCHEDULES.build(spec, where="schedules.local_lr")


def nested(depth: int) -> dict[str, object]:
    """`depth` warm-ups of one round, each wrapping the next, around the constant schedule."""
    spec: dict[str, object] = {"name": "constant"}
    for _ in range(depth):
        spec = {"name": "warmup", "rounds": 1, "start": 0.5, "then": spec}
    return spec


def test_schedules_nest_to_a_bounded_depth() -> None:
    # 16 deep is allowed: round t is the last warm-up round of the t-th warm-up, so each starts at 0.5
    assert factors(nested(MAX_NESTING), 3) == pytest.approx([0.5, 0.5, 0.5])
    with pytest.raises(ConfigError, match=f"nested more than {MAX_NESTING} deep"):
        SCHEDULES.build(nested(MAX_NESTING + 1), where="schedules.local_lr")
    with pytest.raises(ConfigError, match=f"nested more than {MAX_NESTING} deep"):  # refused before any recursion
        SCHEDULES.build(nested(2000), where="schedules.local_lr")
