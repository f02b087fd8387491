"""fedhet's long-lived node worker (`python -m fedhet.flower.worker`) beside a SuperNode in `--isolation process`:
the version guard, and a loopback deployment in each isolation giving the native numbers, where the worker (or, in
`none`, the SuperNode itself) runs every task of its node in one process. (tests/flower/test_deployment.py kills
servers and nodes of the default isolation, `none`.)"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from flower_helpers import assert_same_metrics, read_metrics, small_config
from test_deployment import SCRIPT

from fedhet.errors import ConfigError
from fedhet.experiments.runner import run
from fedhet.flower import worker
from fedhet.flower.ports import free_port_block


def deployment_of(port: int) -> list[str]:
    """The SuperLink, SuperNodes (Flower's or fedhet's launcher) and node workers of the test's ports still running."""
    listing = subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    ours = re.compile(rf"(127\.0\.0\.1:|--port )({port}|{port + 1}|{port + 2})\b")
    return [line for line in listing.splitlines() if ("flower" in line or "flwr" in line) and ours.search(line)]


def test_the_worker_refuses_a_flwr_release_whose_task_protocol_it_does_not_speak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker.require_flwr_worker()  # the installed flwr is the pinned one
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.43.0")
    with pytest.raises(ConfigError, match=r"flwr 1\.42\.x.*1\.43\.0.*without --isolation process"):
        worker.require_flwr_worker()


def test_worker_arguments_need_a_security_choice() -> None:
    with pytest.raises(SystemExit):
        worker.main(["--runtime-api-address", "127.0.0.1:1"])  # neither --insecure nor --root-certificates


def test_the_worker_stops_when_its_supernode_is_gone_or_when_asked() -> None:
    """Nothing listens at the address (the SuperNode is gone): the worker keeps asking, once a second, and still
    stops when its parent process ends or on SIGTERM, instead of hanging in Flower's endless retries."""
    address = f"127.0.0.1:{free_port_block(1)}"
    command = [sys.executable, "-m", "fedhet.flower.worker", "--runtime-api-address", address, "--insecure"]
    parent = subprocess.Popen(["sleep", "3"])
    orphan = subprocess.Popen([*command, "--parent-pid", str(parent.pid)], stderr=subprocess.PIPE, text=True)
    parent.wait()  # reaped: gone
    _, log = orphan.communicate(timeout=60)
    assert orphan.returncode == 0 and "does not answer" in log and "stopped after 0 tasks" in log
    asked = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert asked.stderr is not None
    first = asked.stderr.readline()  # its first complaint: it runs its loop, its SIGTERM handler is in place
    while first and "does not answer" not in first:  # (a busy machine can take seconds to import flwr and torch)
        first = asked.stderr.readline()
    asked.terminate()
    _, rest = asked.communicate(timeout=30)
    log = first + rest
    assert asked.returncode == 0 and "does not answer" in log and "stopped after 0 tasks" in log


def test_the_worker_exits_while_a_task_thread_is_stuck() -> None:
    """A task pulling from a SuperNode that is gone retries in Flower's non-daemon threads for ever; the worker's
    exit does not wait for them (found as workers left behind by a loaded deployment test)."""
    code = (
        "import threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
        "from fedhet.flower.worker import exit_now; exit_now(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]


@pytest.mark.parametrize("isolation", ["none", "process", "subprocess"])
def test_deployment_in_each_isolation_gives_the_native_numbers(tmp_path: Path, isolation: str) -> None:
    config = small_config("fedavg", rounds=2)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    out, port = tmp_path / "run", free_port_block(4)
    env = {**os.environ, "VENV": sys.prefix, "PORT": str(port), "TIMEOUT": "120", "ISOLATION": isolation}
    done = subprocess.run(
        [str(SCRIPT), "demo", str(path), str(out), "2"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "fedhet run finished | 2 of 2 rounds" in done.stdout
    run(config, tmp_path / "native")
    assert_same_metrics(read_metrics(tmp_path / "native"), read_metrics(out))
    logs = sorted((out / "deploy").glob("worker-*.log"))
    if isolation == "subprocess":
        assert logs == []
        return
    if isolation == "none":  # each SuperNode answered its tasks itself
        assert logs == []
        logs = sorted((out / "deploy").glob("node-*.log"))
    assert len(logs) == 2
    deadline = time.monotonic() + 30  # `stop` ended the SuperLink and SuperNodes; their workers follow them
    while deployment_of(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert deployment_of(port) == []
    for log in logs:  # meta, then per round: train and scores; every one answered by this one process
        tasks = re.findall(r"task (\d+): completed", log.read_text())
        assert len(tasks) >= 5 and tasks == [str(i) for i in range(1, len(tasks) + 1)]
