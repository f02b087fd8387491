from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners


def test_in_turns_times_each_system_alternately_after_one_untimed_call() -> None:
    calls: list[str] = []
    first, second = in_turns(lambda: calls.append("a"), lambda: calls.append("b"), reps=3)
    assert calls == ["a", "b"] * 4  # one untimed turn each, then three timed turns, alternating
    assert first >= 0 and second >= 0


def test_rows_print_their_ratio_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        CostRow("fast", "ref", 0.1, 0.1, 1.1),
        CostRow("slow", "ref", 0.3, 0.1, 2.0),
        CostRow("limit", "ref", 0.2, 0.1, float("nan")),
    ]
    assert rows[1].ratio == pytest.approx(3.0)
    print_rows(rows, "the limit")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("1.00x (goal <= 1.1x, met)")
    assert lines[1].endswith("3.00x (goal <= 2x, NOT met)")
    assert lines[2].endswith("(goal <= nanx, the limit)")


@dataclass
class _Seen:
    rounds: list[int] = field(default_factory=list)

    def local_training(self, round_: int, clients: torch.Tensor, w: torch.Tensor, train: object) -> None:
        self.rounds.append(round_)

    def aggregate(self, round_: int, w: torch.Tensor, result: object) -> None:
        pass


class _Engine:
    def initial_params(self) -> torch.Tensor:
        return torch.zeros(2)


def test_rounds_timed_against_each_other_never_share_a_number() -> None:
    """The engine's `reuse` keeps a round's products: two systems' rounds of one number would let the second reuse
    what the first computed."""
    one, other = _Seen(), _Seen()
    first, second = round_runners([one, other], _Engine(), torch.arange(2))  # type: ignore[list-item, arg-type]
    in_turns(first, second, reps=2)
    assert sorted(one.rounds + other.rounds) == [1, 2, 3, 4, 5, 6]
