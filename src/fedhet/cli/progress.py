"""A rich progress bar as a callback: round, time left and the headline metric."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from fedhet.experiments.callbacks import Callback
from fedhet.experiments.runner import RunState


class ProgressBar(Callback):
    def __init__(self, console: Console, headline: str = "test_accuracy") -> None:
        self.headline = headline
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rounds"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metric]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("", total=1, metric="")

    def on_run_start(self, state: RunState) -> None:
        name = state.config.spec("algorithm")["name"]
        self.progress.update(
            self.task,
            description=name,
            total=state.config.rounds,
            completed=state.round,
            metric=self._text(state),
        )
        self.progress.start()

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.progress.update(self.task, completed=state.round, metric=self._text(state))
        return False

    def on_run_end(self, state: RunState) -> None:
        self.progress.stop()

    def _text(self, state: RunState) -> str:
        value = state.final.get(self.headline)
        return f"{self.headline} {value:.4f}" if value is not None else ""
