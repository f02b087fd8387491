"""System models: every client's compute and network figures, from a law, a constant or a CSV trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.errors import ConfigError, DataError
from fedhet.systems.base import MAX_MS, MAX_SIGMA, MEGABIT, MIN_MBPS, SYSTEMS, Constant, LogNormal, Trace


def test_constant_figures_in_the_units_of_the_clock() -> None:
    model = Constant(sample_ms=20, download_mbps=8, upload_mbps=2, latency_ms=100)
    model.setup(3, seed=0)
    p = model.profiles(0)
    assert p.sample_s.tolist() == [0.02] * 3
    assert p.down_bps.tolist() == [1e6] * 3 and p.up_bps.tolist() == [2.5e5] * 3  # bytes per second
    assert p.latency_s.tolist() == [0.1] * 3
    down, compute, up = p.durations(torch.tensor([0, 2]), torch.tensor([10, 50]), 2e6, 5e5)
    assert down.tolist() == pytest.approx([2.1, 2.1])  # 0.1 s latency + 2 MB at 1 MB/s
    assert compute.tolist() == pytest.approx([0.2, 1.0])  # samples × 20 ms
    assert up.tolist() == pytest.approx([2.1, 2.1])


def test_lognormal_figures_are_seeded_spread_as_asked_and_jittered_per_round() -> None:
    model = LogNormal(sample_ms=10, compute_sigma=1.0, download_mbps=20, network_sigma=0.5, jitter=0.0)
    model.setup(20_000, seed=3)
    p = model.profiles(0)
    log_compute = torch.log(p.sample_s / 0.01)
    assert abs(float(log_compute.median())) < 0.05 and abs(float(log_compute.std()) - 1.0) < 0.03
    assert abs(float(torch.log(p.down_bps / (20 * MEGABIT)).std()) - 0.5) < 0.02
    again = LogNormal(sample_ms=10, compute_sigma=1.0, download_mbps=20, network_sigma=0.5)
    again.setup(20_000, seed=3)
    torch.testing.assert_close(again.profiles(5).sample_s, p.sample_s)  # fixed per client, same for a seed
    jittery = LogNormal(jitter=0.3)
    jittery.setup(100, seed=3)
    first, second = jittery.profiles(0).sample_s, jittery.profiles(1).sample_s
    assert not torch.equal(first, second)
    torch.testing.assert_close(jittery.profiles(1).sample_s, second)


def test_a_trace_file_gives_each_client_its_row(tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("client,sample_ms,download_mbps,upload_mbps\n1,30,8,4\n0,10,16,8\n")
    trace = SYSTEMS.build({"name": "trace", "path": str(path)})
    with pytest.raises(DataError, match=r"2 rows for 3 clients.*cycle"):
        trace.setup(3, 0)
    cycled = Trace(path=str(path), cycle=True)
    cycled.setup(3, 0)
    p = cycled.profiles(7)
    assert p.sample_s.tolist() == pytest.approx([0.01, 0.03, 0.01])  # rows in client order, reused in turn
    assert p.down_bps.tolist() == pytest.approx([2e6, 1e6, 2e6]) and p.latency_s.tolist() == [0.0] * 3


@pytest.mark.parametrize(
    "text,message",
    [
        ("sample_ms,download_mbps\n1,2\n", "lacks the column"),
        ("sample_ms,download_mbps,upload_mbps\n1,x,2\n", "'x' is not a number"),
        ("sample_ms,download_mbps,upload_mbps\n0,1,2\n", r"line 2: sample_ms 0 is out of range \(above 0"),
        ("sample_ms,download_mbps,upload_mbps\n1,inf,2\n", "line 2: download_mbps 'inf' is not a finite number"),
        ("sample_ms,download_mbps,upload_mbps\n1,2,2\n1e300,2,2\n", "line 3: sample_ms 1e\\+300 is out of range"),
        ("sample_ms,download_mbps,upload_mbps,latency_ms\n1,2,2,-5\n", "line 2: latency_ms -5 is out of range"),
        ("client,sample_ms,download_mbps,upload_mbps\n0,1,2,2\n0,1,2,2\n", "lines 2 and 3: both are client 0"),
        ("client,sample_ms,download_mbps,upload_mbps\n0,1,2,2\n2,1,2,2\n", "no row for client 1 .*line 3"),
        ("client,sample_ms,download_mbps,upload_mbps\n0,1,2,2\n-1,1,2,2\n", "line 3: client '-1' is not a client"),
        ("client,sample_ms,download_mbps,upload_mbps\n0,1,2,2\n1.5,1,2,2\n", "line 3: client '1.5' is not a client"),
    ],
)
def test_a_bad_trace_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        Trace(path=str(path), cycle=True).setup(2, 0)
    with pytest.raises(DataError, match="does not exist"):
        Trace(path=str(tmp_path / "missing.csv")).setup(2, 0)


def test_a_trace_with_a_byte_order_mark_reads_its_first_column(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_text("sample_ms,download_mbps,upload_mbps\n20,8,2\n", encoding="utf-8-sig")  # as Excel saves it
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    trace = Trace(path=str(path), cycle=True)
    trace.setup(2, 0)
    assert trace.profiles(0).sample_s.tolist() == pytest.approx([0.02, 0.02])


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "constant", "sample_ms": float("inf")}, "finite number"),
        ({"name": "lognormal", "download_mbps": float("nan")}, "finite number"),
        ({"name": "lognormal", "compute_sigma": 1000}, "at most 5: .*overflow the simulated clock .got 1000."),
        ({"name": "lognormal", "jitter": float("inf")}, "finite number"),
        ({"name": "lognormal", "jitter": 6}, "jitter': at most 5"),
        ({"name": "constant", "upload_mbps": 1e-300}, "greater than or equal to 0.001"),
        ({"name": "constant", "sample_ms": 1e300}, "less than or equal to 1000000"),
    ],
)
def test_speeds_are_finite_and_bounded(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SYSTEMS.build(spec, where="system")


def test_the_widest_lognormal_spread_keeps_the_clock_finite() -> None:
    model = LogNormal(
        sample_ms=MAX_MS, compute_sigma=MAX_SIGMA, download_mbps=MIN_MBPS, network_sigma=MAX_SIGMA, jitter=MAX_SIGMA
    )
    model.setup(100_000, seed=0)
    p = model.profiles(3)
    down, compute, up = p.durations(torch.arange(100_000), torch.full((100_000,), 10**12), 4e12, 4e12)
    assert float((down + compute + up).max()) < 1e60 / 1e6  # 10⁶ such rounds stay below 10⁶⁰ s
