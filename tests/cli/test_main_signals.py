"""Real processes: SIGTERM ends a run like Ctrl-C, a second writer is refused while a run holds its folder, and a
process killed outright (os._exit) in the middle of any write leaves a folder that resumes to the same files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedhet
from fedhet.cli.main import app
from fedhet.experiments.runner import resume

ARGS = [
    "--dataset",
    "digits",
    "--model",
    "logistic",
    "--set",
    "num_clients=4",
    "--set",
    "local.steps=1",
    "--set",
    "eval_every=3",
    "--seed",
    "5",
    "--quiet",
]
# The child runs the real CLI; `_persist` sleeps a little so that a signal lands in the middle of the run, and
# FEDHET_KILL_AT=n makes the n-th write primitive end the process at once (what kill -9 or a power cut does).
CHILD = """
import os, sys, time
from fedhet import atomic
from fedhet.experiments import runner
from fedhet.cli.main import main

persist = runner._persist
def slow(state, metrics):
    time.sleep(float(os.environ.get("FEDHET_SLOW", "0")))
    persist(state, metrics)
runner._persist = slow

kill_at, calls = int(os.environ.get("FEDHET_KILL_AT", "0")), [0]
def deadly(real, halve):
    def call(path, data):
        calls[0] += 1
        if calls[0] == kill_at:
            if halve:
                real(path, bytes(data)[: len(data) // 2])
            os._exit(9)
        real(path, data)
    return call
atomic._write_file = deadly(atomic._write_file, True)
atomic._replace = deadly(atomic._replace, False)
atomic._append = deadly(atomic._append, True)
sys.argv = ["fedhet", *sys.argv[1:]]
main()
"""


def _child(args: list[str], **env: str) -> subprocess.Popen[str]:
    src = str(Path(fedhet.__file__).resolve().parents[1])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _rows(path: Path) -> int:
    try:
        return max(0, len(path.read_bytes().split(b"\r\n")) - 2)
    except FileNotFoundError:
        return 0


def _same_outputs(a: Path, b: Path) -> None:
    for name in ("metrics.csv", "clients.csv", "config.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    sa.pop("wall_time_s"), sb.pop("wall_time_s")
    assert sa == sb


def _reference(tmp_path: Path, rounds: int) -> Path:
    result = CliRunner().invoke(app, ["run", *ARGS, "--rounds", str(rounds), "--out", str(tmp_path / "ref")])
    assert result.exit_code == 0, result.output
    return tmp_path / "ref"


@pytest.mark.slow
def test_sigterm_stops_cleanly_a_second_writer_is_refused_and_the_run_resumes(tmp_path: Path) -> None:
    rounds, out = 60, tmp_path / "run"
    child = _child(["run", *ARGS, "--rounds", str(rounds), "--out", str(out)], FEDHET_SLOW="1")
    try:
        deadline = time.monotonic() + 300
        while _rows(out / "metrics.csv") < 2 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert child.poll() is None, child.communicate()
        second = CliRunner().invoke(app, ["run", "--resume", str(out), "--quiet"])
        assert second.exit_code == 2 and f"in use by another fedhet process (pid {child.pid})" in second.stderr
        second = CliRunner().invoke(app, ["run", *ARGS, "--out", str(out), "--overwrite"])
        assert second.exit_code == 2 and "in use" in second.stderr
        assert child.poll() is None  # (the refusals were not just the child having ended)
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 143, stderr
    assert stderr.strip().splitlines() == [f"interrupted; continue with: fedhet run --resume {out}"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["rounds"] < rounds
    resumed = resume(out)
    assert resumed.status == "finished" and resumed.round == rounds
    _same_outputs(out, _reference(tmp_path, rounds))


@pytest.mark.slow
def test_a_process_killed_in_the_middle_of_a_write_resumes_to_the_same_files(tmp_path: Path) -> None:
    rounds = 4
    reference = _reference(tmp_path, rounds)
    # the write primitives of this run, in order: config.yaml (1 write, 2 rename), metrics.csv (3, 4), round 1's
    # checkpoint (5, 6), round 2's (7, 8), round 3's first row (9, 10: a new header rewrites the file) and checkpoint
    # (11, 12), round 4's row (13, an append) and checkpoint (14, 15), clients.csv (16, 17), summary.json (18, 19)
    for n in (2, 9, 13, 17):  # all of them: tests/experiments/test_runner.py (in-process)
        out = tmp_path / f"kill{n}"
        child = _child(["run", *ARGS, "--rounds", str(rounds), "--out", str(out)], FEDHET_KILL_AT=str(n))
        _, stderr = child.communicate(timeout=300)
        assert child.returncode == 9, (n, stderr)
        if (out / "config.yaml").is_file():
            resume(out)
        else:  # killed before the run existed: the same command starts it in the folder it left
            assert n <= 2
            again = CliRunner().invoke(app, ["run", *ARGS, "--rounds", str(rounds), "--out", str(out)])
            assert again.exit_code == 0, again.output
        _same_outputs(out, reference)
        assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")], n
