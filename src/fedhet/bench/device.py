"""``fedhet bench --device cuda``: the engine's achieved FLOP/s on a device, against the device's peak.

Each workload's local training (one round of `Engine.train`, backend ``auto``, at the chosen ``precision``) is timed
on the device (median of interleaved repetitions after one warm-up; the models' return to the CPU included) and its
exact matrix-product and convolution FLOPs (`fedhet.bench.run.workload_flops`) divided by the time. The peak is the
device's data-sheet figure where `PEAK_TFLOPS` knows the device (dense, no sparsity; float32 without TF32, or the
16-bit tensor-core rate), and a measured large matrix product in the same precision (the rate a kernel can reach).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from fedhet.bench.systems import build_module
from fedhet.bench.workloads import LOGREG, MLP, Workload
from fedhet.engine.engine import Engine, resolve_device
from fedhet.engine.functional import FlatModel
from fedhet.engine.numerics import Precision, exact_float32
from fedhet.engine.plan import LocalPlan

# TFLOP/s (float32, 16-bit tensor cores), dense, from the vendors' data sheets; the longest matching name wins
PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "H200": (67.0, 989.0),
    "H100 PCIe": (51.2, 756.0),
    "H100": (67.0, 989.0),
    "A100": (19.5, 312.0),
    "L40S": (91.6, 362.0),
    "L4": (30.3, 121.0),
    "A10": (31.2, 125.0),
    "V100": (15.7, 125.0),
    "T4": (8.1, 65.0),
    "RTX 4090": (82.6, 165.2),
}
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DeviceRow:
    """One workload's local training on a device."""

    workload: str
    clients: int
    backend: str
    seconds: float
    flops: float  # exact matrix-product and convolution FLOPs of the round's local training

    @property
    def rate(self) -> float:
        return self.flops / self.seconds


def known_peak(name: str, precision: Precision) -> float | None:
    """The data-sheet FLOP/s of a device called `name` (e.g. ``NVIDIA H200``) in `precision`; None if unknown."""
    found = [key for key in PEAK_TFLOPS if key.lower() in name.lower()]
    if not found:
        return None
    fp32, half = PEAK_TFLOPS[max(found, key=len)]
    return 1e12 * (fp32 if precision == "float32" else half)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def measured_peak(device: torch.device, precision: Precision, n: int = 0, reps: int = 5) -> float:
    """FLOP/s of the best of `reps` n×n matrix products in `precision` on `device` (n: 4096 on a GPU, 1024 else;
    float32 products in full float32, without TF32)."""
    n = n or (4096 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    b = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    sync, best = _sync(device), float("inf")
    with exact_float32(device):
        a @ b
        sync()
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            sync()
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def time_workload(w: Workload, device: torch.device, precision: Precision, reps: int) -> DeviceRow:
    """Median seconds of one round's local training of `w` on `device` (after one warm-up round)."""
    from fedhet.bench.run import workload_flops

    module = build_module(w)
    train_flops, _ = workload_flops(w, module)
    engine = Engine(FlatModel(module), w.data(), backend="auto", device=str(device), precision=precision)
    w0 = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(w.clients), w.steps, w.lr, w.batch)
    sync, times = _sync(device), []
    for rep in range(reps + 1):
        sync()
        start = time.perf_counter()
        engine.train(w0, plan, rep)
        sync()
        if rep:
            times.append(time.perf_counter() - start)
    return DeviceRow(w.name, w.clients, str(engine.last_backend), statistics.median(times), train_flops)


def workloads(quick: bool) -> list[Workload]:
    """Logistic regression and the MLP 784-200-10 at 100 clients and (unless `quick`) 1,000."""
    cohorts = (100,) if quick else (100, 1000)
    return [replace(w, clients=c) for w in (LOGREG, MLP) for c in cohorts]


def device_report(device: str, precision: Precision, quick: bool, say: Callable[[str], None]) -> list[DeviceRow]:
    """Time the workloads on `device` and `say` a Markdown table of their FLOP/s against the device's peaks."""
    dev = resolve_device(device)
    name = device_name(dev)
    spec = known_peak(name, precision)
    measured = measured_peak(dev, precision)
    say(f"{name}, torch {torch.__version__}, precision {precision}: a {measured / 1e12:.2f} TFLOP/s matrix product")
    say(f"data-sheet peak: {spec / 1e12:.1f} TFLOP/s" if spec else "data-sheet peak: unknown for this device")
    say("")
    say("| workload | clients | backend | s/round | TFLOP/s | of the matrix product | of the data sheet |")
    say("|---|---|---|---|---|---|---|")
    rows = []
    for w in workloads(quick):
        row = time_workload(w, dev, precision, reps=2 if quick else 5)
        rows.append(row)
        sheet = f"{row.rate / spec:.1%}" if spec else "–"
        say(
            f"| {row.workload} | {row.clients} | {row.backend} | {row.seconds:.4f} | {row.rate / 1e12:.3f} | "
            f"{row.rate / measured:.1%} | {sheet} |"
        )
    return rows
