"""The Gram first layer of the dense backend (`fedhet.engine.dense._GramFirstLayer`) against its per-step updates:
training time per round and how far each backend's clients end from the sequential backend's, over a few FedAvg
rounds of the bench's MLP 784-200-10 workload (100 clients × 10 steps of 10).

Run: python benchmarks/gram_first_layer.py [--rounds 6] [--pixels]

Each round's training (`Engine.train`) is timed; the table gives the median over rounds 2..R (round 1 warms up).

`--pixels` replaces the Gaussian inputs by non-negative, mostly dark "pixels" (uniform⁴), where the Gram matrices'
entries are large and every product adds terms of one sign.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fedhet.engine.dense as dense
from fedhet.bench.systems import build_module
from fedhet.bench.workloads import MLP
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pixels", action="store_true")
    args = parser.parse_args()
    data = MLP.data()
    if args.pixels:
        for split in (data.train, data.test):
            split.x.copy_(torch.rand(split.x.shape, generator=torch.Generator().manual_seed(3)) ** 4)
    choose = dense.use_gram_first_layer
    systems = {
        "sequential": ("sequential", None),
        "dense, per-step first layer": ("dense", False),
        "dense, Gram first layer": ("dense", True),
        "vectorised": ("vectorised", None),
    }
    ends: dict[str, list[torch.Tensor]] = {}
    times: dict[str, list[float]] = {}
    for name, (backend, gram) in systems.items():
        dense.use_gram_first_layer = choose if gram is None else (lambda *_, gram=gram: gram)  # type: ignore[misc]
        torch.manual_seed(0)
        engine = Engine(FlatModel(build_module(MLP)), data, backend=backend)  # type: ignore[arg-type]
        params, ends[name], times[name] = engine.initial_params(), [], []
        for r in range(args.rounds):
            plan = LocalPlan.uniform(torch.arange(MLP.clients), MLP.steps, MLP.lr, MLP.batch)
            started = time.perf_counter()
            result = engine.train(params, plan, r)
            times[name].append(time.perf_counter() - started)
            ends[name].append(result.params.clone())
            params = result.params.mean(0)
    dense.use_gram_first_layer = choose
    for name, rounds in ends.items():
        gaps = [float((a - b).abs().max()) for a, b in zip(rounds, ends["sequential"], strict=True)]
        ms = 1000 * statistics.median(times[name][1:])
        print(
            f"{name:<28} {ms:7.1f} ms per round; max |client params − sequential's| per round: "
            + ", ".join(f"{g:.1e}" for g in gaps)
        )


if __name__ == "__main__":
    main()
