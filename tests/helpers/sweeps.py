"""What the sweep and executor tests share: a tiny base config, a callbacks factory that worker processes and Ray
workers can import by name (it logs, slows, interrupts or kills chosen runs), and run-folder comparisons."""

from __future__ import annotations

import filecmp
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from fedhet.experiments.callbacks import Callback
from fedhet.experiments.executor import Task
from fedhet.experiments.runner import RunState

TINY: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [8]},
    "num_clients": 6,
    "clients_per_round": 3,
    "rounds": 4,
    "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
}


class Probe:
    """A picklable callbacks factory. Every run appends ``label<TAB>pid<TAB>event<TAB>round`` lines to `log` (event
    ``start`` or ``round``); the run labelled `label` also sleeps `sleep` s per round, raises KeyboardInterrupt after
    round `interrupt_at`, or kills its own process after round `kill_at` (the first time only)."""

    def __init__(
        self,
        log: Path,
        label: str = "",
        sleep: float = 0.0,
        interrupt_at: int = 0,
        kill_at: int = 0,
    ) -> None:
        self.log, self.label, self.sleep = log, label, sleep
        self.interrupt_at, self.kill_at = interrupt_at, kill_at

    def __call__(self, task: Task) -> list[Callback]:
        return [_ProbeCallback(self, task.label)]


class _ProbeCallback(Callback):
    def __init__(self, probe: Probe, label: str) -> None:
        self.probe, self.label = probe, label

    def _write(self, event: str, round_: int) -> None:
        with self.probe.log.open("a") as f:
            f.write(f"{self.label}\t{os.getpid()}\t{event}\t{round_}\n")

    def on_run_start(self, state: RunState) -> None:
        self._write("start", state.round)

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self._write("round", state.round)
        if self.label != self.probe.label:
            return False
        time.sleep(self.probe.sleep)
        if state.round == self.probe.interrupt_at:
            raise KeyboardInterrupt
        marker = self.probe.log.with_suffix(".killed")
        if state.round == self.probe.kill_at and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return False


def log_lines(log: Path) -> list[tuple[str, int, str, int]]:
    if not log.is_file():
        return []
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.count("\t") == 3]
    return [(label, int(pid), event, int(round_)) for label, pid, event, round_ in rows]


def run_folders(root: Path) -> list[Path]:
    return sorted(p.parent.relative_to(root) for p in root.rglob("config.yaml"))


def assert_same_run_folders(a: Path, b: Path) -> None:
    """The same run folders under `a` and `b`, with byte-identical config.yaml, metrics.csv and clients.csv and
    the same summary.json but for its wall time."""
    folders = run_folders(a)
    assert folders and folders == run_folders(b)
    for folder in folders:
        for name in ("config.yaml", "metrics.csv", "clients.csv"):
            assert filecmp.cmp(a / folder / name, b / folder / name, shallow=False), folder / name
        summaries = [json.loads((root / folder / "summary.json").read_text()) for root in (a, b)]
        for summary in summaries:
            summary.pop("wall_time_s")
        assert summaries[0] == summaries[1], folder
