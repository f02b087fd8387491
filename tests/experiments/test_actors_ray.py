"""`fedhet run --actors` on real Ray actors: two actors of a local Ray instance write the one-process run folder, byte
for byte (Ditto's personal models included); on a ``ray start --head`` cluster given by address, a run whose driver
is killed -9 resumes there (``--resume --actors 2 --ray ADDRESS``) to the one-process numbers.

Skipped only when Ray is not installed and FEDHET_RAY_TESTS is unset (``make test-ray`` sets it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run

if not os.environ.get("FEDHET_RAY_TESTS"):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fedhet[ray]'")
from fedhet.experiments.actors import ActorPool
from helpers import ray_cluster

cluster = ray_cluster.cluster  # the fixture: a Ray head on loopback
pytestmark = pytest.mark.slow
FILES = ("metrics.csv", "clients.csv", "config.yaml")
CONFIG: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [32]},
    "num_clients": 20,
    "clients_per_round": 16,
    "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
    "chunk_size": 4,  # one process's chunks, which the cohort is cut at
}


def same_files(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_two_local_actors_write_the_one_process_run_folder(tmp_path: Path) -> None:
    config = parse_config({**CONFIG, "algorithm": "ditto", "rounds": 3})
    run(config, tmp_path / "one")
    with ActorPool(2) as pool:
        state = run(config, tmp_path / "two", builder=pool.builder)
        assert len(pool.handles) == 2
    assert state.experiment.engine.client_state.keys()  # Ditto's personal models, kept by the driver
    same_files(tmp_path / "one", tmp_path / "two")


def fedhet(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedhet", "run", *args, "--quiet", "--threads", "1"]


def subprocess_env() -> dict[str, str]:
    """This environment, with this checkout's fedhet first on the path."""
    paths = [str(ray_cluster.ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_a_run_on_a_ray_cluster_whose_driver_is_killed_resumes_there(cluster: str, tmp_path: Path) -> None:
    config = {**CONFIG, "algorithm": "scaffold", "rounds": 40}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run(parse_config(config), tmp_path / "one")
    out = tmp_path / "two"
    env = subprocess_env()
    driver = subprocess.Popen(
        fedhet(str(path), "--out", str(out), "--actors", "2", "--ray", cluster), env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.csv").is_file() or len((out / "metrics.csv").read_text().splitlines()) < 4:
            assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
            assert time.monotonic() < deadline, "no third round in 300 s"
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
    rows = len((out / "metrics.csv").read_text().splitlines()) - 1
    assert 3 <= rows < 40, rows  # cut off mid-run
    resumed = subprocess.run(
        fedhet("--resume", str(out), "--actors", "2", "--ray", cluster), env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    same_files(tmp_path / "one", out)


def test_more_actors_than_the_cluster_has_cores_for_are_refused(cluster: str, tmp_path: Path) -> None:
    env = subprocess_env()
    out = tmp_path / "run"
    done = subprocess.run(
        fedhet("--rounds", "1", "--out", str(out), "--actors", "3", "--ray", cluster),
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and not out.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--actors 3 need 3 CPUs (1 each) and the Ray cluster has 2" in lines[0], done.stderr
