"""A sweep on a local Ray cluster (``ray start --head`` on loopback, two CPUs) gives the serial run folders, and a
run whose Ray worker is killed mid-run is retried and resumes from its checkpoint.

Skipped only when Ray is not installed and FEDHET_RAY_TESTS is unset (CI sets it, so a missing Ray fails there).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhet.experiments.executor import Executor
from fedhet.experiments.sweep import make_sweep, run_sweep
from helpers.sweeps import TINY, Probe, assert_same_run_folders, log_lines

if not os.environ.get("FEDHET_RAY_TESTS"):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fedhet[ray]'")
import ray

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head on 127.0.0.1 with 2 CPUs, its processes in a process group of their own (stopped at the end by
    that group: `ray stop` would stop every Ray instance of the machine's user)."""
    command = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="fhray", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    ray_cli = str(command if command.exists() else shutil.which("ray"))
    options = ["--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2", "--temp-dir", temp]
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", *options, "--include-dashboard=false", "--disable-usage-stats"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # until the head answers
            try:
                ray.init(address=address, log_to_driver=False)
                ray.shutdown()
                break
            except Exception:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address
    finally:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)
                head.wait(wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        shutil.rmtree(temp, ignore_errors=True)


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
