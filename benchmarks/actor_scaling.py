"""One run on two Ray actors against one: the `mlp` workload's round (MLP 784-200-10, 100 clients × 10 steps of 10,
`fedhet.bench.workloads`) trained by `fedhet.experiments.actors.ShardedEngine` on one actor and on two (one torch
thread each), and in this process, taking turns round by round; the medians, the speedup of two actors over one,
and a check that the three give the same models and losses, bit for bit.

Run: python benchmarks/actor_scaling.py [--rounds 15] [--steps 10] [--workload mlp] [--chunk 0] [--json FILE]

`--workload` takes any of `fedhet bench`'s core workloads (`lenet`: a CNN, whose rounds are long next to what
its models weigh; its 30 clients are one chunk of the conv backend: give `--chunk 5` to cut them).

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

from fedhet.bench.workloads import CORE, MLP, Workload
from fedhet.engine.engine import Engine
from fedhet.engine.threads import torch_threads
from fedhet.experiments.actors import ActorPool, ShardedEngine
from fedhet.experiments.build import build_model, components
from fedhet.experiments.config import parse_config


def config_of(workload: Workload, steps: int, chunk: int) -> dict[str, Any]:
    """A run config of `workload`'s model, cohort (everyone) and local training, with `steps` local steps and chunks
    of `chunk` clients (0: the backend's)."""
    local = {"steps": steps, "batch_size": workload.batch, "lr": workload.lr}
    return {
        "model": workload.model,
        "num_clients": workload.clients,
        "clients_per_round": workload.clients,
        "local": local,
        "chunk_size": chunk,
    }


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds of each system")
    parser.add_argument("--steps", type=int, default=MLP.steps, help="local steps a client takes in a round")
    parser.add_argument("--workload", choices=[w.name for w in CORE], default=MLP.name, help="fedhet bench's workload")
    parser.add_argument("--chunk", type=int, default=0, help="chunk_size: where the cohort may be cut (0: default)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)")
    workload = next(w for w in CORE if w.name == args.workload)
    config = parse_config(config_of(workload, args.steps, args.chunk))
    data = workload.data()
    with torch_threads(1), ActorPool(2, threads=1) as pool:
        parts = components(config)
        model = build_model(config, parts, data.input_shape, data.num_classes, data.task)
        engine = pool._engine(config, parts, model, data)
        assert isinstance(engine, ShardedEngine)
        params = engine.initial_params()
        plan = engine.local.plan(torch.arange(workload.clients))

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
    what = f"{workload.name}, {args.steps} local steps"
    print(f"{what}; two actors over one: {speedup:.2f}×; the same models and losses: {same}")
    print(f"load average after: {load()}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "workload": workload.name,
            "steps": args.steps,
            "medians_s": medians,
            "speedup": speedup,
            "identical": same,
        }
        record["load_after"] = os.getloadavg()
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
