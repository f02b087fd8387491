"""Run the benchmark: every workload on every backend and comparator, medians of whole rounds."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhet.bench.flower import flower_available, flower_round_time
from fedhet.bench.naive import naive_round
from fedhet.bench.targets import check_targets
from fedhet.bench.workloads import CORE, Workload, cohort_sweep, model_sweep
from fedhet.catalog import MODELS
from fedhet.data.dataset import FederatedData
from fedhet.engine.dense import dense_layers
from fedhet.engine.engine import BackendChoice, Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.engine.threads import torch_threads
from fedhet.experiments.evaluation import evaluate_global
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg

BIG_COHORT = 1000  # from this many clients a workload is timed once, without warm-up


@dataclass
class Row:
    """One measurement: a workload on a backend or comparator."""

    workload: str
    backend: str
    median_s: float  # median seconds per round (local training + aggregation + evaluation)
    repetitions: int
    flops: float  # matrix-multiply and convolution FLOPs of one round
    flop_fraction: float  # achieved FLOP rate / the matmul FLOP rate measured just before the workload
    peak_mem_mb: float  # peak resident memory of the process while this row was timed
    base_mem_mb: float  # resident memory just before (the data and the model are already loaded)
    load_avg: float  # the machine's 1-minute load average when the row was timed (2 means 2 busy cores)
    matmul_gflops: float
    ratio_to_naive: float | None = None  # naive time / this time (> 1: faster than naive)
    ratio_to_flower: float | None = None  # Flower time / this time
    ratio_to_best_backend: float | None = None  # this time / fastest fedhet backend's time (1.0: the best)
    fresh_peak_mb: float | None = None  # peak memory of a fresh process that builds the data and runs 2 rounds
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


def _memory_mb(field_name: str) -> float:
    """VmRSS (current) or VmHWM (peak since the last reset) of this process, in MB (nan where unknown)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return float(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
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


def _time(fn: Callable[[int], None], warmup: int, reps: int) -> float:
    """Median seconds of `reps` calls after `warmup` calls (each call gets its round number)."""
    for r in range(warmup):
        fn(r + 1)
    times = []
    for r in range(reps):
        start = time.perf_counter()
        fn(r + 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fedhet_round(engine: Engine, w: Workload) -> Callable[[int], None]:
    """One whole FedAvg round on the engine: local training, aggregation, evaluation of every client."""
    strategy = FedAvg()
    strategy.setup(ServerContext(engine, LocalSettings(w.steps, w.lr, w.batch), 0, w.clients))
    params = engine.initial_params()
    clients = torch.arange(w.clients)

    def one(round_: int) -> None:
        plan = LocalPlan.uniform(clients, w.steps, w.lr, w.batch)
        result = engine.train(params, plan, round_)
        evaluate_global(engine, strategy.aggregate(round_, params, result))

    return one


def _peak_of_rounds(w: Workload, rounds: int) -> float:
    """In a fresh process: build `w`'s data and run `rounds` rounds on the `auto` backend; the peak memory."""
    torch.manual_seed(0)
    model = FlatModel(MODELS.build(w.model).build(w.input_shape, w.num_classes))
    one = fedhet_round(Engine(model, w.data()), w)
    for r in range(rounds):
        one(r + 1)
    return _memory_mb("VmHWM")


def fresh_peak_mb(w: Workload, rounds: int = 2) -> float:
    """Peak resident memory (MB) of a new Python process that builds `w`'s data and runs `rounds` rounds with
    `backend: auto`: what a run of this size needs, unaffected by what this process held before."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return float(pool.apply(_peak_of_rounds, (w, rounds)))


@dataclass
class Settings:
    """How long to measure: repetitions after warm-up rounds, and Flower's rounds."""

    reps: int = 7
    warmup: int = 2
    flower_rounds: int = 4
    flower: bool = True
    comparators: tuple[str, ...] = ("naive", "flower")
    fresh_memory: bool = True  # the cohort sweep's memory, each size in a fresh process


def bench_workload(w: Workload, data: FederatedData, settings: Settings, say: Callable[[str], None]) -> list[Row]:
    """Every fedhet backend and comparator on one workload, and the machine limit."""
    rate = matmul_flop_rate()
    torch.manual_seed(0)
    module = MODELS.build(w.model).build(w.input_shape, w.num_classes)
    flops = round_flops(w, module)
    model = FlatModel(module)
    big = w.clients >= BIG_COHORT
    warmup, reps = (0, 1) if big else (settings.warmup, settings.reps)
    rows: list[Row] = []

    def measure(name: str, fn: Callable[[int], None], warm: int, n: int, note: str = "") -> Row:
        base = _memory_mb("VmRSS")
        _reset_peak()
        median = _time(fn, warm, n)
        peak = _memory_mb("VmHWM")
        row = Row(w.name, name, median, n, flops, flops / median / rate, peak, base, _load(), rate / 1e9, note=note)
        rows.append(row)
        return row

    backends: list[BackendChoice] = ["sequential", "vectorised"]
    if dense_layers(model) is not None:
        backends.append("dense")
    times: dict[str, float] = {}
    for backend in backends:
        chunk = BIG_COHORT if big and backend == "vectorised" else 0
        engine = Engine(model, data, backend=backend, chunk_size=chunk)
        times[backend] = measure(backend, fedhet_round(engine, w), warmup, reps).median_s
    auto = resolve_backend("auto", model, w.clients)
    chosen = next(r for r in rows if r.backend == auto)
    fresh = fresh_peak_mb(w) if settings.fresh_memory and "clients" in w.tags else None
    rows.append(replace(chosen, backend=f"auto ({auto})", note="the backend `auto` picks", fresh_peak_mb=fresh))
    best = min(times.values())
    if "naive" in w.comparators and "naive" in settings.comparators:
        ref = FlatModel(MODELS.build(w.model).build(w.input_shape, w.num_classes)).module
        everyone = torch.arange(w.clients + w.eval_only)
        fn = lambda r: naive_round(ref, data, torch.arange(w.clients), w.steps, w.lr, w.batch, everyone)  # noqa: E731
        times["naive"] = measure("naive reference", fn, settings.warmup, reps).median_s
    flower = None
    if "flower" in w.comparators and "flower" in settings.comparators and settings.flower:
        base = _memory_mb("VmRSS")
        flower = flower_round_time(w, data, settings.flower_rounds)
        note = f"median of rounds 2-{settings.flower_rounds}, Ray actors of 1 CPU; memory: actors not counted"
        n = settings.flower_rounds - 1
        rows.append(
            Row(
                w.name,
                "flower simulation",
                flower,
                n,
                flops,
                flops / flower / rate,
                float("nan"),
                base,
                _load(),
                rate / 1e9,
                note=note,
            )
        )
    for row in rows:
        if "naive" in times:
            row.ratio_to_naive = times["naive"] / row.median_s
        if flower is not None:
            row.ratio_to_flower = flower / row.median_s
        if not row.backend.startswith(("naive", "flower")):
            row.ratio_to_best_backend = row.median_s / best
    nan = float("nan")
    rows.append(
        Row(w.name, "machine limit", flops / rate, 0, flops, 1.0, nan, nan, _load(), rate / 1e9, note="FLOPs / rate")
    )
    say(
        f"  {w.name}: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in times.items())
        + (f", flower {flower * 1e3:.0f} ms" if flower is not None else "")
        + f", limit {flops / rate * 1e3:.1f} ms (load {_load():.1f})"
    )
    return rows


def workloads(quick: bool) -> list[Workload]:
    """The core workloads, then the cohort and model-size sweeps (smaller in `quick` mode)."""
    out = list(CORE)
    out += cohort_sweep((10, 100, 1000) if quick else (10, 100, 1000, 10_000))
    out += model_sweep((50, 800) if quick else (50, 200, 800, 2000))
    return out


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
    }


def run_bench(
    quick: bool = False,
    json_path: Path | None = None,
    progress: Callable[[str], None] = print,
    only: tuple[str, ...] = (),
    flower: bool = True,
    custom: list[Workload] | None = None,
    threads: int = 0,
) -> list[Row]:
    """All workloads (or `only` these, or `custom` ones); `quick` uses fewer repetitions, smaller sweeps and
    Flower on logistic regression only. `threads` > 0 sets torch's intra-op threads for everything timed
    (fedhet's backends, the naive reference, the matmul limit; Flower's actors keep their own)."""
    settings = Settings(reps=3, warmup=1, flower_rounds=3) if quick else Settings()
    settings.flower = flower and flower_available()
    if flower and not settings.flower:
        progress("Flower is not installed: its comparator is skipped (pip install 'fedhet[flower]' to include it)")
    everything = custom if custom is not None else workloads(quick and not only)
    chosen = [w for w in everything if not only or w.name in only]
    unknown = set(only) - {w.name for w in workloads(False)} - {w.name for w in everything}
    if unknown:
        from fedhet.errors import ConfigError

        names = ", ".join(w.name for w in workloads(False))
        raise ConfigError(f"unknown bench workload(s) {', '.join(sorted(unknown))}; choose from {names}")
    started, load_start = time.time(), _load()
    rows: list[Row] = []
    with torch_threads(threads):
        for w in chosen:
            progress(f"{w.name}: {w.description}")
            run_settings = settings
            if quick and w.name not in ("logreg", *only):
                run_settings = replace(settings, comparators=("naive",))  # Flower on logistic regression only
            rows += bench_workload(w, w.data(), run_settings, progress)
        used_threads = torch.get_num_threads()
    if json_path is not None:
        payload = {
            "command": " ".join(["fedhet", *sys.argv[1:]]) if sys.argv and "fedhet" in sys.argv[0] else "run_bench",
            "quick": quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
            "seconds": time.time() - started,
            "load_avg_start": load_start,
            "load_avg_end": _load(),
            "machine": {**machine(), "torch_threads": used_threads},
            "flower": settings.flower,
            "targets": [asdict(t) for t in check_targets(rows)],
            "rows": [asdict(r) for r in rows],
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
    return rows
