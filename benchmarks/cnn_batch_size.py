"""Where `auto` leaves `conv` for `sequential`: one round's local training of a few clients of a zoo CNN on both
backends, by mini-batch size, with each step's activations per client (`fedhet.engine.conv.step_bytes`, the
quantity `auto` compares with `MAX_STEP_BYTES`); medians of rounds 2..R, the backends interleaved.

Run:  python benchmarks/cnn_batch_size.py --model cnn_femnist --batches 20,100,300,600,1000
Options: --clients 4  --steps 1  --rounds 4  (VGG-16: --model vgg16 --batches 64 --steps 4)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.engine.conv import conv_layers, step_bytes
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan

SHAPES = {"cnn_femnist": (1, 28, 28), "cnn_mnist": (1, 28, 28), "cnn_fmnist": (1, 28, 28)}  # others: 3×32×32
CLASSES = 62


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn_femnist")
    parser.add_argument("--batches", default="20,100,300,600,1000")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    shape = SHAPES.get(args.model, (3, 32, 32))
    print(
        f"{args.model}, {args.clients} clients × {args.steps} steps, {torch.get_num_threads()} threads; "
        f"seconds per round, medians of rounds 2..{args.rounds}"
    )
    print("| batch | a step's activations per client | conv | sequential |")
    print("|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        w = Workload("cnn", "", {"name": args.model}, shape, CLASSES, args.clients, samples=batch)
        model = FlatModel(build_module(w))
        spec = conv_layers(model)
        assert spec is not None, f"{args.model} is not a CNN the conv backend runs"
        data = w.data()
        engines = {name: Engine(model, data, backend=name) for name in ("conv", "sequential")}  # type: ignore[arg-type]
        w0 = model.initial_params()
        plan = LocalPlan.uniform(torch.arange(args.clients), args.steps, 0.01, batch)
        times: dict[str, list[float]] = {name: [] for name in engines}
        for r in range(args.rounds):
            for name, engine in engines.items():
                started = time.perf_counter()
                engine.train(w0, plan, r)
                times[name].append(time.perf_counter() - started)
        conv, seq = (statistics.median(times[name][1:]) for name in engines)
        print(f"| {batch} | {step_bytes(spec, batch) / 1e6:,.0f} MB | {conv:.2f} | {seq:.2f} |")


if __name__ == "__main__":
    main()
