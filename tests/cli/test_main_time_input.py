"""Hostile input to clients in time, schedules and selection (issues 42 and 43): each gives exit code 2 and exactly
one line on stderr, no traceback, and leaves the folder as it was (nothing is written before the input is checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from helpers.hostile import assert_refused

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]
TRACE = "client,sample_ms,download_mbps,upload_mbps,latency_ms\n"


def _trace(rows: str) -> dict[str, str]:
    return {"t.csv": TRACE + rows}


def _nested(depth: int) -> str:
    spec = "{name: constant}"
    for _ in range(depth):
        spec = "{name: warmup, rounds: 1, then: " + spec + "}"
    return f"schedules:\n  local_lr: {spec}\n"


TRACE_SET = ["--set", "system.name=trace", "--set", "system.path=t.csv"]

# (arguments after `run`, files to write first, a fragment of the one line)
CASES: dict[str, tuple[list[str], dict[str, str], str]] = {
    # ---- issue 42: combinations
    "deadline without a system model": (
        ["--set", "deadline.seconds=2"],
        {},
        "deadline.seconds (2) needs a system model",
    ),
    "deadline with fedasync": (
        ["--algorithm", "fedasync", "--set", "system=constant", "--set", "deadline.seconds=2"],
        {},
        "fedasync is asynchronous",
    ),
    "deadline with fedbuff": (
        ["--algorithm", "fedbuff", "--set", "system=lognormal", "--set", "deadline.seconds=2"],
        {},
        "fedbuff is asynchronous",
    ),
    "deadline policy without seconds": (
        ["--set", "system=lognormal", "--set", "deadline.policy=partial"],
        {},
        "no effect without deadline.seconds",
    ),
    "overselect ratio with drop": (
        ["--set", "system=lognormal", "--set", "deadline.seconds=2", "--set", "deadline.overselect=0.5"],
        {},
        "used by deadline.policy overselect only",
    ),
    # ---- issue 43: traces
    "trace client ids with a gap": (TRACE_SET, _trace("0,10,20,5,0\n2,10,20,5,0\n"), "no row for client 1"),
    "trace client id twice": (TRACE_SET, _trace("0,10,20,5,0\n0,10,20,5,0\n"), "lines 2 and 3: both are client 0"),
    "trace negative client id": (TRACE_SET, _trace("0,10,20,5,0\n-1,10,20,5,0\n"), "line 3: client '-1'"),
    "trace negative latency": (
        [*TRACE_SET, "--set", "system.cycle=true"],
        _trace("0,10,20,5,-3\n"),
        "line 2: latency_ms -3 is out of range",
    ),
    # ---- issue 43: speeds
    "infinite sample_ms": (
        ["--set", "system.name=constant", "--set", "system.sample_ms=.inf"],
        {},
        "system.sample_ms': Input should be a finite number",
    ),
    "compute_sigma 1000": (
        ["--set", "system.name=lognormal", "--set", "system.compute_sigma=1000"],
        {},
        "at most 5: σ = 5 already makes the slowest 5% of clients 3,700× slower",
    ),
    "infinite jitter": (
        ["--set", "system.name=lognormal", "--set", "system.jitter=.inf"],
        {},
        "system.jitter': Input should be a finite number",
    ),
    # ---- issue 43: schedules
    "exponential gamma 1e200": (
        ["--set", "schedules.local_lr={name: exponential, gamma: 1e200}"],
        {},
        "schedules.local_lr.gamma': Input should be less than or equal to 1",
    ),
    "exponential gamma inf": (
        ["--set", "schedules.local_lr={name: exponential, gamma: .inf}"],
        {},
        "schedules.local_lr.gamma': Input should be a finite number",
    ),
    "warm-ups nested 300 deep": (["c.yaml"], {"c.yaml": _nested(300)}, "nested more than 16 deep"),
    "warm-ups nested 2000 deep": (["c.yaml"], {"c.yaml": _nested(2000)}, "nested too deeply"),
    # ---- issue 43: selection
    "val_loss without a validation split": (
        ["--set", "selection.metric=val_loss"],
        {},
        "val_ columns need a validation split",
    ),
    "val_auc on a classification task": (
        ["--set", "selection.metric=val_auc", "--set", "val_fraction=0.2"],
        {},
        "(task classification, algorithm fedavg); its metrics are: round, test_accuracy",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_time_input_is_one_line_exit_2_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, files, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert_refused(["run", *args, *FAST, "--out", "r"], fragment, tmp_path)


def test_a_trace_saved_with_a_byte_order_mark_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE + "".join(f"{k},10,20,5,50\n" for k in range(6)), encoding="utf-8-sig")
    result = runner.invoke(app, ["run", *TRACE_SET, *FAST, "--out", "r"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r/summary.json").read_text())["final"]["time_s"] > 0


def test_a_deadline_nobody_meets_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", "--set", "system=constant", "--set", "deadline.seconds=0.01", *FAST, "--out", "r"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: round 1: no client of the 6 selected can finish"), lines
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["deadline_empty_rounds"] == 2 and summary["final"]["participants"] == 0
