"""Which backend trains a CNN cohort fastest: local training of one round (10 steps of 10 samples per client) on
the sequential, vectorised and conv backends and the plain loop, for the zoo's CNNs, cohort sizes and torch
thread counts; medians of interleaved repetitions. The rule `auto` should follow comes from this table.

Run (about 10 minutes on 2 quiet cores):  python benchmarks/cnn_backends.py
Options: --models lenet_cifar,cnn_mnist  --cohorts 5,10,30  --threads 1,2  --reps 7
On a busy machine, `--cpu-time --threads 1` compares the single-core work instead (the CPU time of this
thread, fastest of the repetitions): what each system costs a core, not what it would take on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from fedhet.bench.plain import PlainLoop
from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.engine.conv import conv_layers, train_conv
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential, train_vectorised
from fedhet.engine.memory import keep_freed_memory
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.engine.step import fresh_cohort

SHAPES = {
    "lenet_cifar": (3, 32, 32),
    "cnn_mnist": (1, 28, 28),
    "cnn_fmnist": (1, 28, 28),
    "cnn_cifar": (3, 32, 32),
    "cnn_cifar_lrn": (3, 32, 32),
}


def trainers(model_name: str, clients: int) -> dict[str, Callable[[int], object]]:
    """One round's local training on each backend and the plain loop, as functions of the round number."""
    w = Workload(model_name, "", {"name": model_name}, SHAPES[model_name], clients=clients)
    data = w.data()
    model = FlatModel(build_module(w))
    spec = conv_layers(model)
    assert spec is not None
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.arange(clients), w.steps, w.lr, w.batch)
    plain = PlainLoop(build_module(w), data, w.clients, w.steps, w.lr, w.batch)
    model.module.train()
    return {
        "sequential": lambda r: train_sequential(
            TrainRequest(model, data.train, w0, plan, fresh_cohort(plan, w0), 0, r)
        ),
        "vectorised": lambda r: train_vectorised(
            TrainRequest(model, data.train, w0, plan, fresh_cohort(plan, w0), 0, r)
        ),
        "conv": lambda r: train_conv(TrainRequest(model, data.train, w0, plan, fresh_cohort(plan, w0), 0, r), spec),
        "plain loop": lambda r: plain.train(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet_cifar,cnn_mnist")
    parser.add_argument("--cohorts", default="5,10,30")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cpu-time", action="store_true", help="CPU time of this thread (with --threads 1)")
    args = parser.parse_args()
    keep_freed_memory()  # as the engine does: freed buffers are reused, not page-faulted again (every system)
    clock, pick = (time.thread_time, min) if args.cpu_time else (time.perf_counter, statistics.median)
    what = "fastest CPU time" if args.cpu_time else "medians"
    print(f"load average {os.getloadavg()[0]:.1f}; {what} of {args.reps} interleaved rounds after one warm-up")
    columns = ("model", "clients", "threads", "sequential ms", "vectorised ms", "conv ms", "plain loop ms")
    print("| " + " | ".join((*columns, "conv × plain", "best")) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for clients in (int(c) for c in args.cohorts.split(",")):
            fns = trainers(name, clients)
            for threads in (int(t) for t in args.threads.split(",")):
                torch.set_num_threads(threads)
                times: dict[str, list[float]] = {k: [] for k in fns}
                for r in range(args.reps + 1):
                    for key, fn in fns.items():
                        start = clock()
                        fn(r)
                        if r:
                            times[key].append(clock() - start)
                med = {k: 1e3 * pick(v) for k, v in times.items()}
                best = min(("sequential", "vectorised", "conv"), key=lambda k: med[k])
                cells = " | ".join(f"{med[k]:.0f}" for k in fns)
                ratio = med["plain loop"] / med["conv"]
                print(f"| {name} | {clients} | {threads} | {cells} | {ratio:.2f} | {best} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
