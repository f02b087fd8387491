"""Every script in examples/ runs as documented (`python examples/NAME.py` from a folder holding a copy of
examples/), and so do the command lines their docstrings give."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem != "my_nets")


def env() -> dict[str, str]:
    """The scripts' environment: fedhet from this tree; one torch thread unless set (several test processes on
    a shared CI machine otherwise oversubscribe its cores; the numbers do not depend on it)."""
    return {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path


def run_script(workdir: Path, name: str) -> str:
    done = subprocess.run(
        [sys.executable, f"examples/{name}.py"], cwd=workdir, env=env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def cli_command(name: str) -> list[str] | None:
    """The `fedhet run ...` command in the script's docstring (continuation lines joined), if any."""
    text = (EXAMPLES / f"{name}.py").read_text()
    match = re.search(r"^ {4}(fedhet run .*?)(?<!\\)\n", text, flags=re.S | re.M)
    if match is None:
        return None
    return shlex.split(match.group(1).replace("\\\n", " "))


def test_every_example_is_tested() -> None:
    assert set(SCRIPTS) == {"own_csv", "own_images", "own_model", "custom_strategy", "walkthrough", "tutorial"}


EXPECTED = {
    "own_csv": [r"finished after 20 rounds: test accuracy 0\.\d+", r"hospital client 5: accuracy"],
    "own_images": [r"finished: test accuracy \d\.\d+ on 8 clients", r"features\.0\.weight \(4, 1, 3, 3\)"],
    "own_model": [
        r"by import path: test accuracy (\d\.\d+)\nthe class: +test accuracy \1\n",  # the same run both ways
        r"with batch norm: FedAvg 0\.\d+, FedBN's own models 0\.\d+",
        r"averaged statistics: net\.1\.running_mean \[",
    ],
    "custom_strategy": [r"fedavg +q=0 ", r"loss_weighted +q=2\.0", r"loss_weighted +q=5\.0"],
    "tutorial": [
        r"note: table 'patients.csv': left out column 'patient_id'",
        r"note: dataset.user=site: 4 users, so partition natural",
        r"best validation loss at round \d+\ntest at that round: AUC 0\.\d+, F1 0\.\d+",
        r"clients: \['east', 'north', 'south', 'west'\]",
        r"regression: test RMSE \d+\.\d+, R² 0\.\d+",
        r"Best point by the mean of val_loss \(min\) over seeds",
        r"mean\s+±\s+std\s+over\s+3\s+seeds\s+per\s+row",
        r"figure: runs/sweep\.png",
    ],
    "walkthrough": [r"error: invalid value for 'rounds'", r"round 15: test accuracy", r"files: .*'model\.pt'"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_example_runs(workdir: Path, name: str) -> None:
    out = run_script(workdir, name)
    for pattern in EXPECTED[name]:
        assert re.search(pattern, out), (pattern, out)
    command = cli_command(name)
    if command is None:
        return
    assert command[0] == "fedhet"
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", *command[1:], "--quiet"],
        cwd=workdir,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out_folder = Path(command[command.index("--out") + 1]) if "--out" in command else None
    if out_folder is not None:
        assert (workdir / out_folder / "summary.json").is_file()


def test_the_documented_commands_are_found() -> None:
    assert cli_command("own_csv") is not None and "--partition" in cli_command("own_csv")  # type: ignore[operator]
    assert cli_command("own_images") is not None and cli_command("own_model") is not None
