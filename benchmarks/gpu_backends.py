"""Which backend trains a cohort fastest on a CUDA GPU: one round's local training (10 steps of 10 samples per
client) through `Engine.train` on `device: cuda`, for the zoo's CNNs (conv and vectorised) and the MLP (dense and
vectorised), at two cohort sizes; medians of interleaved repetitions. `auto` on a GPU should follow this table.

Run (a few minutes on a GPU):  python benchmarks/gpu_backends.py [--reps 7] [--out gpu_backends.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from fedhet.atomic import write_text
from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan

MODELS: dict[str, tuple[dict[str, object], tuple[int, ...], tuple[str, ...]]] = {
    "mlp 784-200-10": ({"name": "mlp", "hidden": [200]}, (784,), ("dense", "vectorised")),
    "lenet_cifar": ({"name": "lenet_cifar"}, (3, 32, 32), ("conv", "vectorised")),
    "cnn_mnist": ({"name": "cnn_mnist"}, (1, 28, 28), ("conv", "vectorised")),
    "cnn_fmnist": ({"name": "cnn_fmnist"}, (1, 28, 28), ("conv", "vectorised")),
    "cnn_cifar": ({"name": "cnn_cifar"}, (3, 32, 32), ("conv", "vectorised")),
    "cnn_cifar_lrn": ({"name": "cnn_cifar_lrn"}, (3, 32, 32), ("conv", "vectorised")),
    "vgg16": ({"name": "vgg16"}, (3, 32, 32), ("conv", "vectorised")),
}


def round_times(name: str, clients: int, reps: int, device: str = "cuda") -> dict[str, float]:
    """Median seconds of one round's `Engine.train` on each backend of `name` (interleaved), and what auto picks."""
    config, shape, backends = MODELS[name]
    work = Workload(name, name, config, shape, clients=clients, samples=100)
    data = work.data()
    engines = {b: Engine(FlatModel(build_module(work)), data, backend=b, device=device) for b in backends}  # type: ignore[arg-type]
    w0 = next(iter(engines.values())).initial_params()
    plan = LocalPlan.uniform(torch.arange(clients), work.steps, work.lr, work.batch)
    times: dict[str, list[float]] = {b: [] for b in backends}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for rep in range(reps + 1):
        for b, engine in engines.items():
            sync()
            start = time.perf_counter()
            engine.train(w0, plan, rep)  # the models come back to the CPU: the round's transfer is timed too
            sync()
            if rep:  # the first round of each warms up (cuDNN's choice, allocations)
                times[b].append(time.perf_counter() - start)
    auto = Engine(FlatModel(build_module(work)), data, backend="auto", device=device).backend_for(clients)
    return {**{b: statistics.median(t) for b, t in times.items()}, "auto": auto}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cohorts", default="30,100")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script without a GPU")
    args = parser.parse_args()
    where = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    lines = [
        f"{where}, torch {torch.__version__}; one round of 10 steps of 10 per client",
        "",
        "| model | clients | backend A | s/round | backend B | s/round | B/A | auto picks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in args.models.split(","):
        for clients in (int(c) for c in args.cohorts.split(",")):
            t = round_times(name, clients, args.reps, args.device)
            a, b = MODELS[name][2]
            line = f"| {name} | {clients} | {a} | {t[a]:.4f} | {b} | {t[b]:.4f} | {t[b] / t[a]:.2f} | {t['auto']} |"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
