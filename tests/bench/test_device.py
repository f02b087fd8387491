"""``fedhet bench --device``: achieved FLOP/s against the device's peak (what runs without a GPU)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from fedhet.bench import device
from fedhet.bench.device import device_report, known_peak, measured_peak
from fedhet.bench.workloads import LOGREG, Workload
from fedhet.cli.main import app


def test_the_data_sheet_peak_of_known_gpus() -> None:
    assert known_peak("NVIDIA H200", "float32") == 67e12 and known_peak("NVIDIA H200", "bfloat16") == 989e12
    assert known_peak("NVIDIA H100 PCIe", "float32") == 51.2e12  # the longest matching name wins
    assert known_peak("NVIDIA L40S", "float16") == 362e12 and known_peak("NVIDIA L4", "float16") == 121e12
    assert known_peak("CPU", "float32") is None


def test_the_report_divides_exact_flops_by_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = Workload("logreg", "", LOGREG.model, (16,), clients=4, samples=12, steps=2, batch=4)
    monkeypatch.setattr(device, "workloads", lambda quick: [tiny])
    lines: list[str] = []
    (row,) = device_report("cpu", "float32", True, lines.append)
    assert row.flops == 4 * 2 * 2 * (2 * 4 * 16 * 10)  # 4 clients × 2 steps × (forward + weight gradient)
    assert row.rate == row.flops / row.seconds > 0 and row.backend == "dense"
    assert lines[-1].startswith("| logreg | 4 | dense |") and lines[-1].endswith("| – |")  # no data sheet for a CPU
    assert measured_peak(torch.device("cpu"), "bfloat16", n=64, reps=1) > 0


def test_bench_on_a_device_torch_does_not_see_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["bench", "--device", "cuda"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: device 'cuda' asked for, but torch sees no CUDA GPU here; use device: cpu"
    ]
    result = CliRunner().invoke(app, ["bench", "--device", "cpu", "--precision", "float8"])
    assert result.exit_code == 2 and "--precision float8" in result.stderr
