"""Run the benchmark: every workload on every backend and comparator, medians of whole rounds."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhet.bench.naive import naive_round
from fedhet.bench.workloads import CORE, Workload, cohort_sweep, model_sweep
from fedhet.catalog import MODELS
from fedhet.data.dataset import FederatedData
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.experiments.evaluation import evaluate_global
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg


@dataclass
class Row:
    workload: str
    backend: str
    median_s: float
    repetitions: int
    flops: float
    flop_fraction: float  # achieved FLOP rate / measured matmul FLOP rate
    peak_mem_mb: float
    ratio_to_naive: float | None = None  # naive time / this time (> 1: faster than naive)
    ratio_to_flower: float | None = None
    ratio_to_best_backend: float | None = None  # this time / best fedhet backend time
    note: str = ""


def matmul_flop_rate(n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of a large float32 matrix multiply on this machine (the best of `reps`)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def round_flops(w: Workload, module: nn.Module) -> float:
    """Matrix-multiply and convolution FLOPs of one round: training steps (forward + backward) and evaluation."""
    x = torch.randn(w.batch, *w.input_shape)
    y = torch.zeros(w.batch, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(module(x), y).backward()
    step = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(torch.randn(1, *w.input_shape))
    per_sample = counter.get_total_flops()
    eval_samples = (w.clients + w.eval_only) * (w.samples + max(1, w.samples // 4))
    module.zero_grad(set_to_none=True)
    return float(w.clients * w.steps * step + eval_samples * per_sample)


def _time(fn: Callable[[int], None], warmup: int, reps: int) -> tuple[float, int]:
    for r in range(warmup):
        fn(-1 - r)
    times = []
    for r in range(reps):
        start = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times), reps


def fedhet_round(engine: Engine, strategy: FedAvg, w: Workload) -> Callable[[int], None]:
    params = engine.initial_params()
    clients = torch.arange(w.clients)

    def one(round_: int) -> None:
        plan = LocalPlan.uniform(clients, w.steps, w.lr, w.batch)
        result = engine.train(params, plan, abs(round_))
        new = strategy.aggregate(abs(round_), params, result)
        evaluate_global(engine, new)

    return one


def bench_workload(w: Workload, data: FederatedData, rate: float, reps: int, warmup: int) -> list[Row]:
    torch.manual_seed(0)
    module = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    flops = round_flops(w, module)
    model = FlatModel(module)
    rows: list[Row] = []
    times: dict[str, float] = {}
    for backend in ("vectorised", "sequential"):
        chunk = 1000 if w.clients > 1000 else 0
        engine = Engine(model, data, backend=backend, chunk_size=chunk)
        strategy = FedAvg()
        strategy.setup(ServerContext(engine, LocalSettings(w.steps, w.lr, w.batch), 0, w.clients))
        _reset_peak()
        big = w.clients >= 1000
        median, n = _time(fedhet_round(engine, strategy, w), 0 if big else warmup, 1 if big else reps)
        times[backend] = median
        rows.append(Row(w.name, backend, median, n, flops, flops / median / rate, _peak_mb()))
    auto = resolve_backend("auto", model, w.clients)
    rows.append(
        Row(
            w.name,
            f"auto ({auto})",
            times[auto],
            rows[0].repetitions,
            flops,
            flops / times[auto] / rate,
            rows[0 if auto == "vectorised" else 1].peak_mem_mb,
        )
    )
    best = min(times.values())
    if "naive" in w.comparators:
        _reset_peak()
        ref = FlatModel(MODELS.build(w.model).build(w.input_shape, w.num_classes)).module
        everyone = torch.arange(w.clients + w.eval_only)
        median, n = _time(
            lambda r: naive_round(ref, data, torch.arange(w.clients), w.steps, w.lr, w.batch, everyone),
            warmup,
            reps,
        )
        times["naive"] = median
        rows.append(Row(w.name, "naive reference", median, n, flops, flops / median / rate, _peak_mb()))
    flower = None
    if "flower" in w.comparators:
        flower = _flower_time(w, data)
        if flower is not None:
            rows.append(Row(w.name, "flower simulation", flower, 1, flops, flops / flower / rate, float("nan")))
    for row in rows:
        if "naive" in times:
            row.ratio_to_naive = times["naive"] / row.median_s
        if flower is not None:
            row.ratio_to_flower = flower / row.median_s
        if not row.backend.startswith(("naive", "flower")):
            row.ratio_to_best_backend = row.median_s / best
    rows.append(
        Row(
            w.name,
            "machine limit",
            flops / rate,
            0,
            flops,
            1.0,
            float("nan"),
            note="round FLOPs / measured matmul FLOP rate",
        )
    )
    return rows


def _flower_time(w: Workload, data: FederatedData) -> float | None:
    """Flower's simulation on the same work, when the `flower` extra is installed (else None)."""
    try:
        from fedhet.flower.bench import flower_round_time
    except ImportError:
        return None
    return float(flower_round_time(w, data))


def run_bench(
    quick: bool = False,
    json_path: Path | None = None,
    progress: Callable[[str], None] = print,
    only: tuple[str, ...] = (),
) -> list[Row]:
    """All workloads; `quick` uses fewer repetitions and smaller sweeps (under two minutes on 2 cores)."""
    torch.set_num_threads(os.cpu_count() or 1)
    rate = matmul_flop_rate()
    progress(f"matrix multiply: {rate / 1e9:.1f} GFLOP/s")
    reps, warmup = (3, 1) if quick else (7, 2)
    workloads = list(CORE)
    workloads += cohort_sweep((10, 100, 1000) if quick else (10, 100, 1000, 10_000))
    workloads += model_sweep((50, 800) if quick else (50, 200, 800, 2000))
    rows: list[Row] = []
    for w in workloads:
        if only and w.name not in only:
            continue
        progress(f"{w.name}: {w.description}")
        rows += bench_workload(w, w.data(), rate, reps, warmup)
    if json_path is not None:
        import json

        json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "matmul_flop_rate": rate,
            "threads": torch.get_num_threads(),
            "quick": quick,
            "rows": [asdict(r) for r in rows],
        }
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
    return rows
