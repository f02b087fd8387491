"""Run the benchmark: every workload on every fedhet backend and reference, medians of interleaved rounds.

Within a workload the systems take turns (round r of every system, then round r + 1), so that a change of the
machine's speed during the run touches them all alike; each round is timed in two parts, local training and
the rest (aggregation and evaluation of every client).

The installed package times fedhet's backends against the plain and vmap loops and the machine's limit. The other
comparators (a naive reference, pfl, Flower) are not installed: ``python benchmarks/full_bench.py`` in a source
checkout passes them in (`run_bench`'s `systems` and `frameworks`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhet.bench.systems import System, build_module, fedhet_backends, fedhet_system, plain_system, vmap_system
from fedhet.bench.targets import check_targets
from fedhet.bench.workloads import CORE, Workload, cohort_sweep, model_sweep
from fedhet.data.dataset import FederatedData
from fedhet.engine.engine import resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.threads import torch_threads
from fedhet.process_memory import memory_mb, reset_peak

BIG_COHORT = 1000  # from this many clients a workload is timed once, without warm-up
SystemFactory = Callable[[Workload, FederatedData], System]
RoundTimes = tuple[list[float], list[float], list[float]]  # seconds of each round: whole, training, the rest
COMPARATORS: dict[str, SystemFactory] = {"plain": plain_system, "vmap": vmap_system}


@dataclass(frozen=True)
class Framework:
    """Another framework that runs its own loop of rounds (pfl, Flower: benchmarks/comparators), timed after the
    interleaved systems: `round_times(w, data, rounds)` gives the seconds of its rounds after the first."""

    key: str  # the workload's comparator tag, e.g. "flower"
    name: str  # the row's name, e.g. "flower simulation"
    note: str
    round_times: Callable[[Workload, FederatedData, int], RoundTimes]


@dataclass
class Row:
    """One measurement: a workload on a fedhet backend or a reference."""

    workload: str
    backend: str  # a fedhet backend, "auto (…)", or a reference: "plain loop", "vmap loop", "naive reference", …
    median_s: float  # median seconds per round (local training + aggregation + evaluation)
    train_s: float  # median seconds of the round's local training
    eval_s: float  # median seconds of the rest: aggregation and evaluation of every client
    repetitions: int
    train_flops: float  # matrix-multiply and convolution FLOPs of the local training (exact counts)
    eval_flops: float  # those of the evaluation
    peak_mem_mb: float  # peak resident memory of the process while this row was timed
    base_mem_mb: float  # resident memory just before (the data and the model are already loaded)
    load_avg: float  # the machine's 1-minute load average when the row was timed (2 means 2 busy cores)
    matmul_gflops: float  # the machine's 2048² matrix-product rate, measured just before the workload
    spread: float = float("nan")  # (slowest − fastest) / median of the timed rounds
    train_fastest_s: float = float("nan")  # the fastest timed round's local training
    train_ratio_to_plain: float | None = None  # plain loop's training time / this training time
    fastest_train_ratio_to_plain: float | None = None  # the same ratio between the two systems' fastest rounds
    ratio_to_plain: float | None = None  # plain loop's round / this round
    ratio_to_naive: float | None = None  # naive round / this round
    ratio_to_flower: float | None = None  # Flower's round / this round
    ratio_to_best_backend: float | None = None  # this training time / the fastest fedhet backend's
    fresh_peak_mb: float | None = None  # peak memory of a fresh process that builds the data and runs 2 rounds
    note: str = ""

    @property
    def train_flop_fraction(self) -> float:
        """Achieved FLOP rate of the training / the matrix-product rate."""
        return self.train_flops / self.train_s / (self.matmul_gflops * 1e9)

    @property
    def eval_flop_fraction(self) -> float:
        return self.eval_flops / self.eval_s / (self.matmul_gflops * 1e9)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "train_flop_fraction": self.train_flop_fraction,
            "eval_flop_fraction": self.eval_flop_fraction,
        }


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


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def workload_flops(w: Workload, module: nn.Module) -> tuple[float, float]:
    """Exact matrix-multiply and convolution FLOPs (`torch.utils.flop_counter`) of a round's local training
    (one client's step, forward and backward, × steps × clients) and of its evaluation (every client's
    train and test samples, forward only)."""
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
    return float(w.clients * w.steps * step), float(eval_samples * per_sample)


def round_flops(w: Workload, module: nn.Module) -> float:
    """FLOPs of one whole round (training and evaluation)."""
    return sum(workload_flops(w, module))


@dataclass
class Timing:
    """A system's timed rounds."""

    rounds: list[float] = field(default_factory=list)
    train: list[float] = field(default_factory=list)
    rest: list[float] = field(default_factory=list)
    peak_mb: float = 0.0
    base_mb: float = float("nan")
    load: float = float("nan")


def _run(system: System, round_: int, timing: Timing | None) -> float:
    """One round of `system`; its times go to `timing` (None: a warm-up round). Returns the round's seconds."""
    if timing is not None:
        if timing.base_mb != timing.base_mb:
            timing.base_mb = memory_mb("VmRSS")
        reset_peak()
    start = time.perf_counter()
    trained = system.train(round_)
    mid = time.perf_counter()
    system.finish(trained)
    end = time.perf_counter()
    if timing is not None:
        timing.rounds.append(end - start)
        timing.train.append(mid - start)
        timing.rest.append(end - mid)
        timing.peak_mb = max(timing.peak_mb, memory_mb("VmHWM"))
        timing.load = _load()
    return end - start


def time_interleaved(
    systems: Sequence[System], warmup: int, min_reps: int, max_reps: int, target_s: float
) -> list[Timing]:
    """Warm-up rounds of each system, then rounds of every system in turn: as many turns as fit in `target_s`
    (a turn's time from the last warm-up round), but at least `min_reps` and at most `max_reps`. The first
    warm-up round of a slow workload (a turn over 5 s) is the only one."""
    per_turn = [0.0] * len(systems)
    for r in range(warmup):
        for i, s in enumerate(systems):
            per_turn[i] = _run(s, r + 1, None)
        if sum(per_turn) > 5.0:
            break
    turn = sum(per_turn)
    reps = max_reps if not warmup or turn <= 0 else int(target_s // turn)
    reps = max(min_reps, min(max_reps, reps))
    timings = [Timing() for _ in systems]
    for r in range(reps):
        for s, timing in zip(systems, timings, strict=True):
            _run(s, warmup + r + 1, timing)
    return timings


def _peak_of_rounds(w: Workload, rounds: int) -> float:
    """In a fresh process: build `w`'s data and run `rounds` rounds on the `auto` backend; the peak memory."""
    system = fedhet_system(w, w.data(), "auto")
    for r in range(rounds):
        _run(system, r + 1, None)
    return memory_mb("VmHWM")


def fresh_peak_mb(w: Workload, rounds: int = 2) -> float:
    """Peak resident memory (MB) of a new Python process that builds `w`'s data and runs `rounds` rounds with
    `backend: auto`: what a run of this size needs, unaffected by what this process held before."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return float(pool.apply(_peak_of_rounds, (w, rounds)))


@dataclass
class Settings:
    """How long to measure: warm-up rounds, then interleaved rounds (as many as fit in `target_s` per workload,
    between `min_reps` and `max_reps`), and the frameworks' rounds; which comparators: those of a workload's
    that `comparators` names, among the interleaved `systems` and the `frameworks`."""

    warmup: int = 2
    min_reps: int = 9
    max_reps: int = 41
    target_s: float = 40.0
    flower_rounds: int = 5  # rounds of each framework's own loop
    comparators: tuple[str, ...] = ("plain", "vmap", "naive", "pfl", "flower")
    systems: dict[str, SystemFactory] = field(default_factory=lambda: dict(COMPARATORS))
    frameworks: tuple[Framework, ...] = ()
    fresh_memory: bool = True  # the cohort sweep's memory, each size in a fresh process


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _measured_rest(rests: list[float]) -> float:
    """The median of a framework's round minus its training; NaN where that is negative: pfl's rounds are timed in
    two loops (with and without evaluation), and an evaluation cheaper than the loops' difference is not measured."""
    rest = _median(rests)
    return rest if rest >= 0 else float("nan")


def bench_workload(w: Workload, data: FederatedData, settings: Settings, say: Callable[[str], None]) -> list[Row]:
    """Every fedhet backend and reference on one workload, and the machine limit."""
    rate = matmul_flop_rate()
    train_flops, eval_flops = workload_flops(w, build_module(w))
    big = w.clients >= BIG_COHORT
    backends = fedhet_backends(w)
    systems = [fedhet_system(w, data, b, BIG_COHORT if big and b == "vectorised" else 0) for b in backends]
    wanted = [c for c in settings.systems if c in w.comparators and c in settings.comparators]
    systems += [settings.systems[c](w, data) for c in wanted]
    warmup, min_reps, max_reps = (0, 1, 1) if big else (settings.warmup, settings.min_reps, settings.max_reps)
    timings = time_interleaved(systems, warmup, min_reps, max_reps, settings.target_s)
    # the machine's rate, measured again after fedhet's systems: the faster of the two is the less disturbed (a
    # comparator of the previous workload, Flower's Ray processes, can still be winding down at the start)
    rate = max(rate, matmul_flop_rate())
    rows: list[Row] = []
    for s, t in zip(systems, timings, strict=True):
        median = _median(t.rounds)
        spread = (max(t.rounds) - min(t.rounds)) / median if t.rounds else float("nan")
        rows.append(
            Row(
                w.name,
                s.name,
                median,
                _median(t.train),
                _median(t.rest),
                len(t.rounds),
                train_flops,
                eval_flops,
                t.peak_mb,
                t.base_mb,
                t.load,
                rate / 1e9,
                spread,
                min(t.train, default=float("nan")),
                note=s.note,
            )
        )
    auto = resolve_backend("auto", FlatModel(build_module(w)), w.clients, batch_size=w.batch)
    chosen = next(r for r in rows if r.backend == auto)
    fresh = fresh_peak_mb(w) if settings.fresh_memory and "clients" in w.tags else None
    rows.insert(len(backends), replace(chosen, backend=f"auto ({auto})", note="the backend `auto` picks"))
    rows[len(backends)].fresh_peak_mb = fresh
    separate = [  # frameworks that run their own loop of rounds: timed one after the other
        (f.name, f.round_times(w, data, settings.flower_rounds), f.note)
        for f in settings.frameworks
        if f.key in w.comparators and f.key in settings.comparators
    ]
    for name, (rounds, trains, rests), note in separate:
        median = _median(rounds)
        spread = (max(rounds) - min(rounds)) / median
        note = f"rounds 2-{settings.flower_rounds}; {note}"
        rest = _measured_rest(rests)
        if rest != rest:
            note += "; evaluation below the timing noise (rounds with it took less than without)"
        nan = float("nan")
        rows.append(
            Row(
                w.name,
                name,
                median,
                _median(trains),
                rest,
                len(rounds),
                train_flops,
                eval_flops,
                nan,
                memory_mb("VmRSS"),
                _load(),
                rate / 1e9,
                spread,
                min(trains, default=float("nan")),
                note=note,
            )
        )
    _ratios(rows, backends)
    nan = float("nan")
    limit = Row(
        w.name,
        "machine limit",
        (train_flops + eval_flops) / rate,
        train_flops / rate,
        eval_flops / rate,
        0,
        train_flops,
        eval_flops,
        nan,
        nan,
        _load(),
        rate / 1e9,
        note="FLOPs / matmul rate",
    )
    rows.append(limit)
    say(
        f"  {w.name}: training "
        + ", ".join(f"{r.backend} {r.train_s * 1e3:.1f} ms" for r in rows if not r.backend.startswith("auto"))
        + f" (load {_load():.1f})"
    )
    return rows


def _ratios(rows: list[Row], backends: list[str]) -> None:
    by = {r.backend: r for r in rows}
    plain, naive, flower = by.get("plain loop"), by.get("naive reference"), by.get("flower simulation")
    best = min(by[b].train_s for b in backends)
    for row in rows:
        if plain is not None:
            row.train_ratio_to_plain = plain.train_s / row.train_s
            row.fastest_train_ratio_to_plain = plain.train_fastest_s / row.train_fastest_s
            row.ratio_to_plain = plain.median_s / row.median_s
        if naive is not None:
            row.ratio_to_naive = naive.median_s / row.median_s
        if flower is not None:
            row.ratio_to_flower = flower.median_s / row.median_s
        if row.backend in backends or row.backend.startswith("auto"):
            row.ratio_to_best_backend = row.train_s / best


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
    custom: list[Workload] | None = None,
    threads: int = 0,
    systems: dict[str, SystemFactory] | None = None,
    frameworks: tuple[Framework, ...] = (),
) -> list[Row]:
    """All workloads (or `only` these, or `custom` ones); `quick` uses fewer repetitions, smaller sweeps and the
    `frameworks` on logistic regression only. `systems`: the interleaved comparators (default: the plain and vmap
    loops). `threads` > 0 sets torch's intra-op threads for everything timed in this process (fedhet's backends,
    the references, pfl, the matmul limit; Flower's actors keep their own)."""
    settings = Settings(warmup=1, min_reps=3, max_reps=3, flower_rounds=3) if quick else Settings()
    settings.systems = dict(COMPARATORS) if systems is None else systems
    settings.frameworks = frameworks
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
                run_settings = replace(settings, frameworks=())  # frameworks on logreg only
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
            "flower": any(f.key == "flower" for f in frameworks),
            "pfl": any(f.key == "pfl" for f in frameworks),
            "targets": [asdict(t) for t in check_targets(rows)],
            "rows": [r.as_dict() for r in rows],
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = json_path.with_suffix(json_path.suffix + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, json_path)
    return rows
