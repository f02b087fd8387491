"""A Ray head on loopback for the Ray tests (``make test-ray``): ``ray start --head`` on a free port with 2 CPUs, its
processes in a process group of their own, stopped at the end by that group (`ray stop` would stop every Ray
instance of the machine's user)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

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
    # Ray >= 2.5x turns token authentication on for a head that finds ~/.ray/auth_token (which a local
    # `ray.init()` writes), while a driver connecting by address stays in the mode its RAY_AUTH_MODE says: the head
    # takes the driver's mode, so the tests pass whatever an earlier Ray run left in the home folder
    env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")
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
