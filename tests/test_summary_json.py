"""summary.json is strict JSON (NaN written as null) and reads back with NaN in its metric rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedhet.errors import ConfigError
from fedhet.experiments.runfolder import RunFolder
from fedhet.report.runs import read_run
from fedhet.summary_json import read_summary, summary_text


def refuse(constant: str) -> float:
    raise ValueError(f"not strict JSON: {constant}")


SUMMARY = {
    "status": "finished",
    "final": {"round": 3.0, "test_auc": float("nan"), "test_loss": 0.5},
    "selected": {"round": 2.0, "time_s": float("nan")},
    "privacy": {"client": {"epsilon": float("inf")}},
    "ranks": [1.0, float("-inf")],
}


def test_non_finite_numbers_are_written_as_null() -> None:
    text = summary_text(SUMMARY)
    data = json.loads(text, parse_constant=refuse)  # a strict parser takes it
    assert data["final"] == {"round": 3.0, "test_auc": None, "test_loss": 0.5}
    assert data["privacy"]["client"]["epsilon"] is None and data["ranks"] == [1.0, None]


def test_null_metrics_read_back_as_nan(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(summary_text(SUMMARY))
    data = read_summary(path)
    assert math.isnan(data["final"]["test_auc"]) and data["final"]["test_loss"] == 0.5
    assert math.isnan(data["selected"]["time_s"])
    assert data["privacy"]["client"]["epsilon"] is None  # outside the metric rows null stays None


def test_an_older_summary_with_bare_nan_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"final": {"test_auc": NaN}}')
    assert math.isnan(read_summary(path)["final"]["test_auc"])


def test_a_run_folder_writes_strict_json_that_fedhet_reads_as_nan(tmp_path: Path) -> None:
    RunFolder(tmp_path).write_summary(SUMMARY)
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    (tmp_path / "metrics.csv").write_text("round,test_auc\n3,\n")
    record = read_run(tmp_path)
    assert math.isnan(record.summary["final"]["test_auc"])


@pytest.mark.parametrize("bad", ["[", '{"final": {"a": "x"}}'])
def test_a_damaged_summary_is_still_refused(tmp_path: Path, bad: str) -> None:
    (tmp_path / "summary.json").write_text(bad)
    (tmp_path / "metrics.csv").write_text("round\n1\n")
    with pytest.raises(ConfigError, match="summary"):
        read_run(tmp_path)
