"""Evaluation at scale: 100,000 clients, 1,000 training per round, evaluated on a sample (``eval_clients``) or on
everyone, with the per-round training and evaluation times and the process's peak memory.

Run: python benchmarks/eval_scale.py [--clients 100000] [--per-round 1000] [--eval-clients 1000] [--rounds 5]
[--samples 20]

Each client holds 20 training and 5 test samples (`--samples`) of a 60-feature task (logistic regression, the
engine's dense backend, 10 local steps of 10). The sampled rounds run first and the peak resident memory is read
after them (VmHWM), then the same rounds evaluate everyone (the peak is read again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.experiments.evaluation import evaluate_global, evaluation_sample
from fedhet.seeding import torch_gen
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg


def peak_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        line = next(line for line in f if line.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--per-round", type=int, default=1000)
    parser.add_argument("--eval-clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20, help="training samples per client (a quarter for test)")
    args = parser.parse_args()
    w = Workload("scale", "", {"name": "logistic"}, (60,), clients=args.clients, samples=args.samples, comparators=())
    data = w.data()
    engine = Engine(FlatModel(build_module(w)), data)
    strategy = FedAvg()
    strategy.setup(ServerContext(engine, LocalSettings(w.steps, w.lr, w.batch), 0, args.per_round))
    print(f"{args.clients:,} clients, {args.per_round:,} per round, backend {engine.backend_for(args.per_round)}")
    params = engine.initial_params()
    for mode in ("sampled", "everyone"):
        train_s, eval_s = [], []
        for r in range(args.rounds):
            clients = torch.randperm(args.clients, generator=torch_gen(0, "bench-cohort", r))[: args.per_round]
            start = time.perf_counter()
            result = engine.train(params, LocalPlan.uniform(clients.sort().values, w.steps, w.lr, w.batch), r)
            params = strategy.aggregate(r, params, result)
            mid = time.perf_counter()
            sample = evaluation_sample(args.clients, args.eval_clients, 0, r) if mode == "sampled" else None
            evaluate_global(engine, params, sample)
            train_s.append(mid - start)
            eval_s.append(time.perf_counter() - mid)
        train, evaluation = statistics.median(train_s), statistics.median(eval_s)
        print(
            f"{mode:>9}: training {1000 * train:8.1f} ms, evaluation {1000 * evaluation:8.1f} ms per round "
            f"(evaluation / training {evaluation / train:.2f}), peak memory so far {peak_mb():,.0f} MB"
        )
    print(f"load average {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")


if __name__ == "__main__":
    main()
