"""One run on two Ray actors against one: the `mlp` workload's round (MLP 784-200-10, 100 clients × 10 steps of 10,
`fedhet.bench.workloads`) trained by `fedhet.experiments.actors.ShardedEngine` on one actor and on two (one torch
thread each), and in this process, taking turns round by round; the medians, the speedup of two actors over one,
and a check that the three give the same models and losses, bit for bit.

Run: python benchmarks/actor_scaling.py [--rounds 15] [--steps 10] [--json runs/actor_scaling.json]

On a quiet machine (the load average is printed before and after: other processes on the cores lower the speedup).
A round here is the engine's `train` (what `fedhet run --actors N` shards): the driver's server step and evaluation
are not sharded and not timed. Starting the actors (a local Ray instance, torch imported in each) is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedhet.bench.workloads import MLP
from fedhet.engine.engine import Engine
from fedhet.engine.threads import torch_threads
from fedhet.experiments.actors import ActorPool, ShardedEngine
from fedhet.experiments.build import build_model, components
from fedhet.experiments.config import parse_config

CONFIG: dict[str, Any] = {
    "model": MLP.model,
    "num_clients": MLP.clients,
    "clients_per_round": MLP.clients,
    "local": {"steps": MLP.steps, "batch_size": MLP.batch, "lr": MLP.lr},
}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds of each system")
    parser.add_argument("--steps", type=int, default=MLP.steps, help="local steps a client takes in a round")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)")
    config = parse_config({**CONFIG, "local": {**CONFIG["local"], "steps": args.steps}})
    data = MLP.data()
    with torch_threads(1), ActorPool(2, threads=1) as pool:
        parts = components(config)
        model = build_model(config, parts, data.input_shape, data.num_classes, data.task)
        engine = pool._engine(config, parts, model, data)
        assert isinstance(engine, ShardedEngine)
        params = engine.initial_params()
        plan = engine.local.plan(torch.arange(MLP.clients))

        def one_process(round_: int) -> object:
            return Engine.train(engine, params, plan, round_)

        def actors(count: int, round_: int) -> object:
            engine.spread = count
            return engine.train(params, plan, round_)

        systems = {"this process": one_process, "1 actor": lambda r: actors(1, r), "2 actors": lambda r: actors(2, r)}
        first = [system(0) for system in systems.values()]  # the warm-up round, and the check
        same = all(
            torch.equal(a.params, first[0].params) and torch.equal(a.train_loss, first[0].train_loss)  # type: ignore[attr-defined]
            for a in first
        )
        times: dict[str, list[float]] = {name: [] for name in systems}
        for i in range(args.rounds):
            for k, (name, system) in enumerate(systems.items()):
                start = time.perf_counter()
                system(1 + len(systems) * i + k)  # a round of its own: nothing of another system's is reused
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    speedup = medians["1 actor"] / medians["2 actors"]
    for name, value in medians.items():
        spread = f"{min(times[name]):.3f}–{max(times[name]):.3f}"
        print(f"{name:>14}: {value:.3f} s a round (median of {args.rounds}; {spread})")
    print(f"{args.steps} local steps; two actors over one: {speedup:.2f}×; the same models and losses: {same}")
    print(f"load average after: {load()}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"steps": args.steps, "medians_s": medians, "speedup": speedup, "identical": same}
        record["load_after"] = os.getloadavg()
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
