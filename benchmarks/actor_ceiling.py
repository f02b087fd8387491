"""The most two actors can gain on this machine: the `mlp` workload's round (`fedhet.bench.workloads`, MLP
784-200-10, 100 clients × 10 steps of 10) cut in two halves of 50 clients, each half trained by fedhet's engine in
a process of one torch thread, with no Ray: both halves at once in two processes, against one process training
both halves one after the other; taking turns round by round. The ratio is the ceiling of what `--actors 2`
(`benchmarks/actor_scaling.py`) can reach over one actor: the two cores' shared memory bandwidth, caches and
whatever else runs on them, without any of Ray's costs.

Run: python benchmarks/actor_ceiling.py [--rounds 15] [--steps 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection

import torch

from fedhet.bench.workloads import MLP

HALVES = (slice(0, MLP.clients // 2), slice(MLP.clients // 2, MLP.clients))


def worker(conn: Connection, steps: int) -> None:
    """Train the halves asked for (a list of half numbers, one after the other) and answer the seconds."""
    from fedhet.bench.pairs import workload_engine
    from fedhet.engine.plan import LocalSettings
    from fedhet.engine.threads import torch_threads

    torch.set_num_threads(1)
    engine = workload_engine(MLP, "dense")
    engine.local = LocalSettings(steps, MLP.lr, MLP.batch)
    params = engine.initial_params()
    plans = [engine.local.plan(torch.arange(MLP.clients)[half]) for half in HALVES]
    with torch_threads(1):
        while True:
            ask = conn.recv()
            if ask is None:
                return
            round_, halves = ask
            start = time.perf_counter()
            for h in halves:
                engine.train(params, plans[h], round_)
            conn.send(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds of each")
    parser.add_argument("--steps", type=int, default=MLP.steps, help="local steps a client takes in a round")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=worker, args=(child, args.steps), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    ends = [end for end, _ in pipes]
    one: list[float] = []
    two: list[float] = []
    try:
        for r in range(args.rounds + 2):  # two warm-up rounds
            start = time.perf_counter()
            ends[0].send((2 * r, [0, 1]))  # one process, both halves in turn
            ends[0].recv()
            single = time.perf_counter() - start
            start = time.perf_counter()
            for h, end in enumerate(ends):  # two processes, a half each, at once
                end.send((2 * r + 1, [h]))
            for end in ends:
                end.recv()
            double = time.perf_counter() - start
            if r >= 2:
                one.append(single)
                two.append(double)
    finally:
        for end in ends:
            end.send(None)
        for p in procs:
            p.join(10)
    a, b = statistics.median(one), statistics.median(two)
    print(f"one process, both halves: {a:.3f} s a round (median of {args.rounds}; {min(one):.3f}–{max(one):.3f})")
    print(f"two processes, a half each: {b:.3f} s a round ({min(two):.3f}–{max(two):.3f})")
    print(f"mlp, {args.steps} local steps; ceiling of two over one: {a / b:.2f}×")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
