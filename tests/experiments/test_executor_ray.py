"""A sweep on a local Ray cluster (``ray start --head`` on loopback, two CPUs) gives the serial run folders, and a
run whose Ray worker is killed mid-run is retried and resumes from its checkpoint.

Skipped only when Ray is not installed and FEDHET_RAY_TESTS is unset (CI sets it, so a missing Ray fails there).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from fedhet.experiments.executor import Executor
from fedhet.experiments.sweep import make_sweep, run_sweep
from helpers.sweeps import TINY, Probe, assert_same_run_folders, log_lines

if not os.environ.get("FEDHET_RAY_TESTS"):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fedhet[ray]'")
from helpers import ray_cluster

cluster = ray_cluster.cluster  # the fixture: a Ray head on loopback

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def kill_when_running(log: Path, label: str, after_round: int, killed: list[int], stop: threading.Event) -> None:
    """Kill -9 the process running `label` once it has finished `after_round` rounds."""
    while not stop.is_set():
        rows = [r for r in log_lines(log) if r[0] == label and r[2] == "round" and r[3] >= after_round]
        if rows:
            os.kill(rows[0][1], signal.SIGKILL)
            killed.append(rows[0][1])
            return
        time.sleep(0.05)


def test_a_ray_sweep_gives_the_serial_run_folders_and_survives_a_killed_worker(cluster: str, tmp_path: Path) -> None:
    sweep = make_sweep({**TINY, "rounds": 6}, grid=["local.lr=0.02,0.1"], seeds=2)
    with Executor(1) as serial:
        run_sweep(sweep, tmp_path / "serial", serial)
    log, target = tmp_path / "log.txt", "local.lr=0.1, seed 0"
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_when_running, args=(log, target, 2, killed, stop), daemon=True)
    killer.start()
    try:
        with Executor(ray=cluster, callbacks=Probe(log, target, sleep=0.5)) as on_ray:
            result = run_sweep(sweep, tmp_path / "ray", on_ray)
    finally:
        stop.set()
        killer.join(5)
    assert killed, "the slow run finished before it could be killed"
    assert all(o.ok for o in result.outcomes), [o.error for o in result.outcomes]
    starts = [(pid, r) for label, pid, event, r in log_lines(log) if label == target and event == "start"]
    assert starts[0] == (killed[0], 0) and len(starts) == 2
    assert starts[1][0] != killed[0] and starts[1][1] >= 2  # retried in another worker, resumed from a checkpoint
    assert_same_run_folders(tmp_path / "serial", tmp_path / "ray")
    assert (tmp_path / "serial" / "summary.md").read_text() == (tmp_path / "ray" / "summary.md").read_text()
