"""A real `fedhet sweep --workers 2` in its own process: a second sweep into its folder is refused (the folder's
lock), Ctrl-C ends it at once with its runs resumable (their workers are terminated, not waited for), and killing
it outright (kill -9) ends its workers too: no process outlives the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fedhet
from fedhet.experiments.runner import resume

SLOW_PLUGIN = """
import time
from typing import ClassVar

from fedhet.metrics.base import METRIC_PLUGINS, Metric


@METRIC_PLUGINS.register
class Slow(Metric):
    name: ClassVar[str] = "slow"
    needs_all_clients: ClassVar[bool] = False

    def compute(self, view):
        time.sleep(0.2)  # each run takes minutes: long after the test has stopped it
        return {}, {}
"""
CONFIG = """imports: [slow.py]
metrics: [slow]
dataset: digits
model: logistic
num_clients: 4
rounds: 1000
local: {steps: 1}
sweep: {grid: {local.lr: [0.01, 0.02]}}
"""
RUNS = ("lr-0.01/seed0", "lr-0.02/seed0")


def _sweep(root: Path) -> subprocess.Popen[str]:
    src = str(Path(fedhet.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "fedhet", "sweep", "c.yaml", "--out", "s", "--workers", "2", "--quiet"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _setup(root: Path) -> None:
    (root / "slow.py").write_text(SLOW_PLUGIN)
    (root / "c.yaml").write_text(CONFIG)


def _rows(path: Path) -> int:
    try:
        return max(0, len(path.read_bytes().split(b"\r\n")) - 2)
    except FileNotFoundError:
        return 0


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _both_running(root: Path, proc: subprocess.Popen[str]) -> list[int]:
    """Wait until both runs have written rows; the sweep's worker processes."""
    deadline = time.monotonic() + 180
    while not all(_rows(root / "s" / run / "metrics.csv") >= 2 for run in RUNS):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep's runs did not start"
        time.sleep(0.2)
    workers = _children(proc.pid)  # the two workers (and multiprocessing's resource tracker)
    assert len(workers) >= 2, workers
    return workers


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if _alive(pid)]
        time.sleep(0.2)


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_at_once_and_a_second_sweep_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup(tmp_path)
    proc = _sweep(tmp_path)
    workers = _both_running(tmp_path, proc)
    second = _sweep(tmp_path)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and f"in use by another fedhet process (pid {proc.pid})" in err
    proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the sweep; its workers ignore it and are stopped by it
    out, err = proc.communicate(timeout=60)  # the runs would take minutes more
    assert proc.returncode == 130, (out, err)
    assert " ".join(err.split()).startswith("interrupted; run the same command again"), err  # and nothing else
    _wait_gone(workers, 5)
    for run in RUNS:
        folder = tmp_path / "s" / run
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["rounds"] < 1000
        monkeypatch.chdir(tmp_path)  # the config imports slow.py, relative to the sweep's folder
        state = resume(folder, rounds=summary["rounds"] + 1, trust=True)  # the run goes on from its checkpoint
        assert state.status == "finished" and state.round == summary["rounds"] + 1


@pytest.mark.slow  # about a minute on 2 busy cores: a sweep's workers start, then end with it
def test_the_workers_end_with_a_killed_sweep(tmp_path: Path) -> None:
    _setup(tmp_path)
    proc = _sweep(tmp_path)
    workers = _both_running(tmp_path, proc)
    proc.kill()  # kill -9: the sweep cannot stop them itself
    proc.communicate(timeout=30)
    _wait_gone(workers, 60)  # a worker learns of its parent's death at once (Linux) or within a second
    for run in RUNS:
        assert json.loads((tmp_path / "s" / run / "summary.json").read_text())["status"] == "interrupted"
