"""`fedhet bench`: the naive reference (benchmarks/comparators), FLOP counts, rows and their ratios, targets, JSON and
Markdown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import comparators
import pytest
import torch
from comparators.naive import naive_round
from typer.testing import CliRunner

from fedhet.bench import run as bench_run
from fedhet.bench.report import markdown_report
from fedhet.bench.run import Row, Settings, bench_workload, round_flops, time_interleaved, workload_flops
from fedhet.bench.systems import System
from fedhet.bench.targets import check_targets
from fedhet.bench.workloads import Workload
from fedhet.catalog import MODELS
from fedhet.cli.main import app
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan

TINY = Workload("tiny", "3 clients, logistic 6→3", {"name": "logistic"}, (6,), 3, clients=3, samples=8, steps=2)


def test_naive_reference_is_fedavg_with_full_batches() -> None:
    """With a batch as large as every client's data the mini-batches are not random: the naive loop (deepcopy,
    DataLoader, torch.optim.SGD, sample-weighted state_dict average) must equal fedhet's FedAvg."""
    w = Workload("w", "", {"name": "logistic"}, (6,), 3, clients=3, samples=8, steps=3, batch=8, lr=0.3)
    data = w.data()
    torch.manual_seed(0)
    module = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    model = FlatModel(module)
    w0 = model.initial_params()
    engine = Engine(model, data, backend="sequential")
    local = engine.train(w0, LocalPlan.uniform(torch.arange(3), w.steps, w.lr, w.batch), 0).params
    expected = local.mean(0)  # equal client sizes: the sample-weighted mean is the plain mean
    torch.manual_seed(0)
    ref = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    naive_round(ref, data, torch.arange(3), w.steps, w.lr, w.batch, torch.arange(3))
    got = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert float((expected - w0).abs().max()) > 1e-3
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_flops_of_logistic_regression_by_hand() -> None:
    w = Workload("w", "", {"name": "logistic"}, (784,), 10, clients=4, samples=8, steps=3, batch=10, eval_only=2)
    module = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    step = 2 * (2 * 10 * 784 * 10)  # forward x·Wᵀ and backward ∂W (no gradient for the inputs)
    per_sample = 2 * 784 * 10
    assert workload_flops(w, module) == (4 * 3 * step, (4 + 2) * (8 + 2) * per_sample)
    assert round_flops(w, module) == 4 * 3 * step + (4 + 2) * (8 + 2) * per_sample


def test_flops_of_the_mlp_are_exact_counts() -> None:
    """MLP 784-200-10, batch 10: forward 2·10·(784·200 + 200·10), backward ∂W₁ (2·10·784·200), ∂W₂ and ∂A₁
    (2 · 2·10·200·10); not 6·B·P (the first layer has no input gradient)."""
    w = Workload("w", "", {"name": "mlp", "hidden": [200]}, (784,), clients=100, samples=50, steps=10)
    module = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    step = 2 * 10 * (784 * 200 + 200 * 10) + 2 * 10 * 784 * 200 + 2 * 2 * 10 * 200 * 10
    train, _ = workload_flops(w, module)
    assert train == 100 * 10 * step and abs(train / 1e9 - 6.39) < 0.01


def test_interleaved_timing_and_budget() -> None:
    calls: list[tuple[str, int]] = []

    def system(name: str, seconds: float) -> System:
        def train(round_: int) -> int:
            calls.append((name, round_))
            time.sleep(seconds)
            return round_

        return System(name, train, lambda _: None)

    a, b = system("a", 0.0), system("b", 0.01)
    timings = time_interleaved([a, b], warmup=1, min_reps=3, max_reps=3, target_s=100.0)
    assert calls == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3), ("a", 4), ("b", 4)]
    assert [len(t.rounds) for t in timings] == [3, 3]
    assert min(timings[1].train) >= 0.01 and timings[1].rounds[0] >= timings[1].train[0]
    calls.clear()
    timings = time_interleaved([a, b], warmup=1, min_reps=2, max_reps=50, target_s=0.001)  # slow: min_reps
    assert [len(t.rounds) for t in timings] == [2, 2]
    timings = time_interleaved([a, b], warmup=1, min_reps=2, max_reps=4, target_s=100.0)  # fast: max_reps
    assert [len(t.rounds) for t in timings] == [4, 4]


@pytest.mark.slow
def test_bench_workload_rows_and_ratios() -> None:
    settings = Settings(warmup=1, min_reps=2, max_reps=2, systems=comparators.SYSTEMS)
    rows = bench_workload(TINY, TINY.data(), settings, lambda _: None)
    names = [r.backend for r in rows]
    assert names == [
        "sequential",
        "vectorised",
        "dense",
        "auto (dense)",
        "plain loop",
        "vmap loop",
        "naive reference",
        "machine limit",
    ]
    by = {r.backend: r for r in rows}
    best = min(by[b].train_s for b in ("sequential", "vectorised", "dense"))
    for b in ("sequential", "vectorised", "dense", "plain loop", "vmap loop"):
        r = by[b]
        assert r.median_s > 0 and r.repetitions == 2 and r.peak_mem_mb > 0
        assert 0 < r.train_s < r.median_s and 0 < r.eval_s < r.median_s
        assert r.train_ratio_to_plain == pytest.approx(by["plain loop"].train_s / r.train_s)
        assert r.train_fastest_s <= r.train_s
        assert r.fastest_train_ratio_to_plain == pytest.approx(by["plain loop"].train_fastest_s / r.train_fastest_s)
        assert r.ratio_to_plain == pytest.approx(by["plain loop"].median_s / r.median_s)
        assert r.ratio_to_naive == pytest.approx(by["naive reference"].median_s / r.median_s)
        assert r.train_flop_fraction == pytest.approx(r.train_flops / r.train_s / (r.matmul_gflops * 1e9))
        assert r.ratio_to_flower is None
    for b in ("sequential", "vectorised", "dense"):
        assert by[b].ratio_to_best_backend == pytest.approx(by[b].train_s / best)
    assert by["plain loop"].ratio_to_best_backend is None
    assert by["auto (dense)"].median_s == by["dense"].median_s
    assert by["machine limit"].train_flop_fraction == pytest.approx(1.0)


@pytest.mark.slow
def test_cnn_workloads_time_the_conv_backend() -> None:
    w = Workload("c", "", {"name": "lenet_cifar"}, (3, 32, 32), clients=2, samples=10, steps=2, batch=5)
    settings = Settings(warmup=0, min_reps=1, max_reps=1, comparators=("plain",))
    rows = bench_workload(w, w.data(), settings, lambda _: None)
    assert [r.backend for r in rows][:3] == ["sequential", "vectorised", "conv"]
    assert "plain loop" in [r.backend for r in rows]


def _row(workload: str, backend: str, **values: float) -> Row:
    base = {"median_s": 1.0, "train_s": 1.0, "eval_s": 0.1, "peak_mem_mb": 500.0, "base_mem_mb": 400.0}
    fixed = {"repetitions": 3, "train_flops": 1.0, "eval_flops": 1.0, "load_avg": 0.0, "matmul_gflops": 1.0}
    return Row(workload, backend, **{**base, **fixed, **values})  # type: ignore[arg-type]


def test_targets_met_missed_and_not_measured() -> None:
    def cohort(n: int, mb: float) -> Row:
        return _row(f"cohort-{n}", "auto (dense)", fresh_peak_mb=mb)

    rows = [
        _row(
            "logreg",
            "auto (dense)",
            train_ratio_to_plain=9.0,
            fastest_train_ratio_to_plain=7.5,
            ratio_to_best_backend=1.0,
        ),
        _row(
            "mlp", "auto (dense)", train_s=1.0, train_flops=0.3e9, train_ratio_to_plain=3.0, ratio_to_best_backend=1.05
        ),
        _row("lenet", "conv", train_s=0.9, train_ratio_to_plain=3.3, ratio_to_best_backend=1.0),
        _row("lenet", "auto (vectorised)", train_s=1.2, train_ratio_to_plain=2.5, ratio_to_best_backend=1.33),
        cohort(10, 300.0),
        cohort(100, 301.0),
        cohort(1000, 310.0),
        cohort(10_000, 400.0),  # 10 MB per 1,000 clients from 1,000 on: linear
    ]
    targets = {t.name: t for t in check_targets(rows)}
    met = {name: t.met for name, t in targets.items()}
    assert met["logreg training vs plain loop"] is True and met["logreg round vs Flower"] is None
    assert targets["logreg training vs plain loop"].measured.startswith(
        "9.00× (auto (dense)); 7.50× between the fastest rounds"
    )
    assert met["mlp training FLOP rate"] is False and met["mlp training vs plain loop"] is False  # 30%, 3×
    assert met["LeNet-5 training vs plain loop"] is False  # auto picks the slower backend
    assert "best backend conv: 3.30×" in targets["LeNet-5 training vs plain loop"].measured
    assert met["FedAvg CNN training vs plain loop"] is None
    assert met["auto vs best backend"] is False  # 1.33 on LeNet
    assert met["memory linear in clients"] is True and met["10,000 clients"] is True
    rows[-1] = cohort(10_000, 5000.0)  # 522 MB per 1,000 clients from 1,000 on, against 10 before
    met = {t.name: t.met for t in check_targets(rows)}
    assert met["memory linear in clients"] is False and met["10,000 clients"] is False
    met = {t.name: t.met for t in check_targets(rows[:-1])}  # up to 1,000 clients: too small to judge
    assert met["memory linear in clients"] is None and met["10,000 clients"] is None


def test_targets_say_when_the_plain_loop_changed_speed() -> None:
    def rows(plain_median: float) -> list[Row]:
        return [
            _row(
                "mlp", "auto (dense)", train_s=0.05, train_ratio_to_plain=plain_median / 0.05, ratio_to_best_backend=1
            ),
            _row("mlp", "plain loop", train_s=plain_median, train_fastest_s=0.45),
        ]

    def measured(plain_median: float) -> str:
        return next(t.measured for t in check_targets(rows(plain_median)) if t.name == "mlp training vs plain loop")

    assert "changed speed" not in measured(0.5)  # within the timing noise
    text = measured(0.8)  # most rounds at the slow speed
    assert "the plain loop changed speed in this run (median 800 ms, fastest 450 ms)" in text


@pytest.mark.slow
def test_json_markdown_and_flower_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comparators, "flower_available", lambda: False)
    said: list[str] = []
    out = tmp_path / "bench.json"
    threads = torch.get_num_threads()
    skipped = comparators.frameworks(pfl=False, say=said.append)
    bench_run.run_bench(quick=True, json_path=out, progress=said.append, custom=[TINY], threads=1, frameworks=skipped)
    assert torch.get_num_threads() == threads  # restored
    assert any("Flower is not installed" in line for line in said)
    payload = json.loads(out.read_text())
    assert payload["quick"] is True and payload["flower"] is False and payload["machine"]["cores"] >= 1
    assert payload["machine"]["torch_threads"] == 1
    rows = payload["rows"]
    assert {r["workload"] for r in rows} == {"tiny"}
    keys = ("backend", "median_s", "train_s", "eval_s", "train_ratio_to_plain", "train_flop_fraction", "peak_mem_mb")
    for key in keys:
        assert all(key in r for r in rows), key
    assert {t["name"] for t in payload["targets"]} >= {"logreg training vs plain loop", "auto vs best backend"}
    text = markdown_report(payload)
    assert "| tiny | auto (dense) |" in text and "| target | goal | measured | met |" in text


@pytest.mark.slow
def test_cli_bench_and_unknown_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--workload", "nope"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "unknown bench workload" in result.output
    monkeypatch.setattr(bench_run, "workloads", lambda quick: [TINY])
    result = runner.invoke(app, ["bench", "--quick", "--workload", "tiny"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pip install 'fedhet[flower]'" in result.output  # printed as is, not as rich markup
    assert "auto (dense)" in result.output and "logreg training vs plain loop" in result.output


def test_a_rest_below_the_timing_noise_is_not_reported_as_a_time() -> None:
    """pfl's evaluation is the difference of two timed loops: a negative median is no measurement."""
    assert bench_run._measured_rest([0.3, 0.1, 0.2]) == pytest.approx(0.2)
    assert bench_run._measured_rest([0.0]) == 0.0
    rest = bench_run._measured_rest([0.01, -0.02, -0.01])
    assert rest != rest  # NaN: shown as "-"
