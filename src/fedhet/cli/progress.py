"""Progress displays: a rich bar per run as a callback (round, time left, the headline metric), and one display
for the many runs of a sweep or recipe."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedhet.experiments.callbacks import Callback
from fedhet.experiments.executor import Monitor, Outcome, Task
from fedhet.experiments.state import RunState


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
        """Stop the bar where the run ended; a run stopped early (``selection.patience``) ends it full, its time
        left at zero, and says so (else its clock would stay at the time the planned rounds had left)."""
        if state.status == "stopped early":
            planned = state.config.rounds
            text = f"{self._text(state)}, stopped early ({state.round} of {planned} rounds)".lstrip(", ")
            self.progress.update(self.task, total=state.round, completed=state.round, metric=text)
        self.progress.stop()

    def _text(self, state: RunState) -> str:
        value = state.final.get(self.headline)
        text = f"{self.headline} {value:.4f}" if value is not None else ""
        if state.clock is not None:  # a run with a system model: where its simulated clock is
            text += f"{', ' if text else ''}simulated {state.clock.seconds:,.1f} s"
        return text


class RunsProgress(Monitor):
    """One display for many runs (a sweep, a recipe): a bar over the runs that advances with the rounds of the
    runs in progress, runs done / running / left / failed, and the time left; a line per failed run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.tasks: Sequence[Task] = ()
        self.running: dict[int, float] = {}
        self.done = self.failed = 0

    def start(self, stage: str, tasks: Sequence[Task], done: int, where: str) -> None:
        self.tasks, self.running, self.done, self.failed = tasks, {}, done, 0
        reused = f"; {done} already finished" if done else ""
        self.console.print(f"[bold]{stage}[/]: {len(tasks)} runs on {where}{reused}", highlight=False)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TextColumn("elapsed,"),
            TimeRemainingColumn(),
            TextColumn("left"),
            console=self.console,
        )
        self.bar = self.progress.add_task(stage, total=len(tasks), completed=done, counts=self._counts())
        self.progress.start()

    def started(self, key: int) -> None:
        self.running[key] = 0.0
        self._update()

    def rounds(self, key: int, done: int, total: int) -> None:
        if key in self.running and total > 0:
            self.running[key] = min(done / total, 1.0)
            self._update()

    def finished(self, key: int, outcome: Outcome) -> None:
        self.running.pop(key, None)
        self.done += 1
        if not outcome.ok:
            self.failed += 1
            self.console.print(f"[yellow]{escape(outcome.task.label)}: {outcome.status}[/]: {escape(outcome.error)}")
        self._update()

    def stop(self) -> None:
        if self.progress is not None:
            self._update()
            self.progress.stop()
            self.progress = None

    def _counts(self) -> str:
        left = len(self.tasks) - self.done - len(self.running)
        text = f"{self.done}/{len(self.tasks)} done, {len(self.running)} running, {left} left"
        return text + (f", [red]{self.failed} failed[/]" if self.failed else "")

    def _update(self) -> None:
        if self.progress is not None:
            completed = self.done + sum(self.running.values())
            self.progress.update(self.bar, completed=completed, counts=self._counts())
