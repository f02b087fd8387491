"""The progress bar of one run: it ends full when the run stops early (its clock does not stay frozen)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from fedhet.cli.progress import ProgressBar


def state(round_: int, status: str = "running") -> Any:
    config = SimpleNamespace(rounds=10, spec=lambda key: {"name": "fedavg"})
    return SimpleNamespace(config=config, round=round_, final={"test_accuracy": 0.5}, clock=None, status=status)


def bar_after(status: str) -> tuple[ProgressBar, str]:
    out = io.StringIO()
    bar = ProgressBar(Console(file=out, width=200, force_terminal=False))
    bar.on_run_start(state(0))
    for r in (1, 2, 3):
        bar.on_round_end(state(r), {})
    bar.on_run_end(state(3, status))
    return bar, out.getvalue()


def test_a_run_stopped_early_ends_its_bar_full_with_no_time_left() -> None:
    bar, text = bar_after("stopped early")
    task = bar.progress.tasks[0]
    assert task.finished and task.time_remaining == 0
    assert "3/3 rounds" in text and "stopped early (3 of 10 rounds)" in text


def test_an_interrupted_run_leaves_its_bar_where_it_stopped() -> None:
    bar, text = bar_after("interrupted")
    task = bar.progress.tasks[0]
    assert not task.finished and task.completed == 3 and task.total == 10
    assert "3/10 rounds" in text and "stopped early" not in text
