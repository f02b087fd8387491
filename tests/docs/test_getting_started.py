"""docs/getting-started.md works as written: its commands and Python run, in order, in an empty folder.

Blocks: ``shell`` (install; checked, not run: it needs the network), ``bash`` (run with the `fedhet` command
on PATH), ``python``/``yaml`` with a ``title="file"`` (written to that file, as the reader saves it), and
``python`` without a title (run as a script in that folder).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```', flags=re.S | re.M)


def blocks() -> list[tuple[str, str | None, str]]:
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(PAGE.read_text())]


def shell_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a reader who ran `make install` and activated the venv: `fedhet` and `python` on PATH."""
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    (bin_dir / "fedhet").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fedhet "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for tool in ("fedhet", "python"):
        (bin_dir / tool).chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    return {"OMP_NUM_THREADS": "1", **os.environ, "PATH": path, "PYTHONPATH": str(ROOT / "src")}  # see test_examples


def test_the_page_has_the_steps_the_issue_asks_for() -> None:
    kinds = [(kind, title) for kind, title, _ in blocks()]
    assert kinds[0] == ("shell", None)
    assert ("python", "my_model.py") in kinds and ("yaml", "patients.yaml") in kinds
    commands = "\n".join(code for kind, _, code in blocks() if kind == "bash")
    assert "fedhet run patients.yaml" in commands and "model.target=my_model.py:Net" in commands
    python = "\n".join(code for kind, title, code in blocks() if kind == "python" and title is None)
    assert "fedhet.run(" in python


def test_the_install_commands_exist() -> None:
    (_, _, install) = blocks()[0]
    assert "make install" in install
    assert subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True).returncode == 0
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()  # the pin the page tells pip users


@pytest.mark.slow
def test_every_step_runs_as_written(tmp_path: Path) -> None:
    env = shell_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    timings = []
    outputs = []
    for kind, title, code in blocks():
        if kind == "shell":
            continue
        started = time.perf_counter()
        if title is not None:
            (work / title).write_text(code)
            continue
        if kind == "bash":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code], cwd=work, env=env, capture_output=True, text=True
            )
        elif kind == "python":
            done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
        else:
            pytest.fail(f"unexpected {kind} block without a title in {PAGE.name}")
        assert done.returncode == 0, f"{code}\n--- stderr:\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
        timings.append(time.perf_counter() - started)
    assert outputs[0].strip().startswith("fedhet ")  # fedhet --version
    for run in ("first", "patients", "my_model", "from_python"):
        assert (work / "runs" / run / "summary.json").is_file(), run
    resolved = yaml.safe_load((work / "runs" / "my_model" / "config.yaml").read_text())
    target = f"{(work / 'my_model.py').resolve()}:Net"  # config.yaml keeps paths that work from any directory
    assert resolved["model"] == {"name": "torch", "target": target, "kwargs": {"hidden": 64}}
    assert resolved["dataset"]["name"] == "table" and resolved["partition"]["name"] == "natural"
    assert outputs[-1].strip().endswith("True")  # load_run gives back the metrics of the run
    assert "finished" in outputs[-1]
