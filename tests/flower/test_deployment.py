"""A real Flower deployment on loopback (scripts/flower_local.sh): a SuperLink, three SuperNodes each loading its
own partition file, fedhet's SCAFFOLD across them; the ServerApp is killed after round 1 and restarted (it resumes
from its checkpoint, the nodes' c_i from their state files), then a SuperNode is killed after round 2 (the server
paused meanwhile, so round 3 cannot finish without it) and the run finishes with the other two; and a `demo` whose
run fails still stops what it started. Every wait is bounded."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from flower_helpers import assert_same_metrics, read_metrics, small_config

from fedhet.experiments.runner import run
from fedhet.flower.ports import free_port_block

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "flower_local.sh"


def wait_for(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {seconds:g} s waiting for {what}")


def rows(out: Path) -> int:
    try:
        return len(read_metrics(out))
    except (FileNotFoundError, ValueError):
        return 0


def serverapp_pids(port: int) -> list[int]:
    listing = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [
        int(line.split()[0])
        for line in listing.splitlines()
        if "flwr-serverapp" in line and f"127.0.0.1:{port}" in line
    ]


def test_deployment_survives_a_restarted_server_and_a_dead_node(tmp_path: Path) -> None:
    config = small_config("scaffold", rounds=3)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    out, port = tmp_path / "run", free_port_block(5)
    env = {**os.environ, "VENV": sys.prefix, "PORT": str(port), "TIMEOUT": "60"}

    def script(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(SCRIPT), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    assert script("start", str(path), str(out), "3").wait(timeout=180) == 0
    try:
        first = script("run", str(out))
        wait_for(lambda: rows(out) >= 1, 400, "round 1")
        for pid in serverapp_pids(port):  # the server dies (round 1 is checkpointed)
            os.kill(pid, signal.SIGKILL)
        first.terminate()
        first.wait(timeout=60)
        second = script("run", str(out))  # a new run of the same app: resumes from the checkpoint
        wait_for(lambda: rows(out) >= 2, 400, "round 2 after the restart")
        # Pause the server while node 2 dies, so that round 3 (a few hundred ms on loopback) cannot finish
        # with node 2 before the kill lands: the server must then lose node 2 in round 3, on any machine.
        paused = serverapp_pids(port)
        assert paused, "the ServerApp of round 3 is not running"
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert script("kill", str(out), "2").wait(timeout=60) == 0
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        assert second.wait(timeout=400) == 0
    finally:
        script("stop", str(out)).wait(timeout=60)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 3 and len(summary["nodes_lost"]) == 1
    native = run(config, tmp_path / "native")
    assert native.status == "finished"
    deployed, reference = read_metrics(out), read_metrics(tmp_path / "native")
    assert_same_metrics(reference[:2], deployed[:2])  # up to the node's death: the single-machine numbers
    assert all(value == value for value in map(float, deployed[2].values()))  # round 3: the others' numbers
    clients = list(csv.DictReader((out / "clients.csv").open()))
    assert {int(float(c["client"])) for c in clients if c["test_accuracy"] == "nan"} == {4, 5}  # node 2's clients
    for name in ("config.yaml", "metrics.csv", "clients.csv", "summary.json"):
        assert (out / name).is_file()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return not (state.is_file() and state.read_text().rsplit(")", 1)[-1].split()[0] == "Z")  # a zombie is gone


def test_a_failed_demo_stops_what_it_started(tmp_path: Path) -> None:
    """`demo` stops the SuperLink and SuperNodes however the run ends; here `flwr run` fails at once (a TIMEOUT
    that is not a number makes the Flower App's pyproject.toml invalid), which exits the script inside a function."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(small_config("fedavg", rounds=1).model_dump(mode="json")))
    out, port = tmp_path / "run", free_port_block(5)
    env = {**os.environ, "VENV": sys.prefix, "PORT": str(port), "TIMEOUT": "oops"}
    demo = subprocess.run([str(SCRIPT), "demo", str(path), str(out), "2"], env=env, capture_output=True, timeout=300)
    assert demo.returncode != 0
    assert b"stopped the SuperLink and SuperNodes" in demo.stdout
    pids = [int(f.read_text()) for f in (out / "deploy").glob("*.pid")]
    assert len(pids) == 3  # the SuperLink and two SuperNodes
    wait_for(lambda: not any(alive(pid) for pid in pids), 60, "the SuperLink and SuperNodes to exit")


def test_the_script_prints_its_whole_header_when_called_wrongly() -> None:
    wrong = subprocess.run([str(SCRIPT), "demo"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2
    assert wrong.stdout.startswith("# fedhet on a local Flower deployment")
    assert "ISOLATION" in wrong.stdout and wrong.stdout.rstrip().endswith("the Flower App are in RUN_FOLDER/deploy/.")


def test_a_nodes_refusal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Issue 43: a node refusing the server's config reached the user as hundreds of "node N failed" lines, a
    ServerApp traceback and Flower's "Exit Code 201". Now: one line naming the node and what it refused, exit 2,
    and the run folder holds nothing of a run."""
    plugin = tmp_path / "plugin.py"
    plugin.write_text("X = 1\n")  # the server's own code; the nodes allow no imports (the default)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(small_config("fedavg", rounds=1, imports=[str(plugin)]).model_dump(mode="json")))
    out, port = tmp_path / "run", free_port_block(5)
    env = {**os.environ, "VENV": sys.prefix, "PORT": str(port)}
    demo = subprocess.run(
        [str(SCRIPT), "demo", str(path), str(out), "2"], env=env, capture_output=True, text=True, timeout=300
    )
    assert demo.returncode == 2, demo.stdout[-2000:]
    errors = [line for line in demo.stdout.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1, errors
    assert re.fullmatch(
        rf"error: node \d+: refused to import '{re.escape(str(plugin))}' \(allowed here: nothing\); .*", errors[0]
    ), errors[0]
    assert "failed" not in demo.stdout and "Exit Code" not in demo.stdout
    assert {p.name for p in out.iterdir()} == {"deploy", ".fedhet.lock"}  # the script's claim, made before the run
