"""The Shakespeare LSTM (`char_lstm`: embedding 8, two LSTM layers of 256, 80 characters) on the `sequential`
backend with torch's fused LSTM kernel (what `LoopLSTM` runs outside vmap) against the written-out loop (what it
runs under vmap): training time per round and evaluation time, interleaved, and how far the two end apart.

Run: python benchmarks/lstm_kernel.py [--clients 4] [--steps 20] [--rounds 5]

A round is `--clients` clients × `--steps` local steps of 10 sequences (the recipe: 31 clients × 300 steps);
the table gives medians over rounds 2..R of each path, timed in turn.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.models.zoo import CharLSTM

VOCAB, LENGTH, BATCH = 80, 80, 10


def data(clients: int, samples: int) -> FederatedData:
    gen = torch.Generator().manual_seed(0)

    def split(n: int) -> ClientData:
        xs = [torch.randint(0, VOCAB, (n, LENGTH), generator=gen) for _ in range(clients)]
        return ClientData.from_parts(xs, [torch.randint(0, VOCAB, (n,), generator=gen) for _ in range(clients)])

    return FederatedData("tokens", split(samples), split(samples // 4), VOCAB, torch.ones(clients, dtype=torch.bool))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    module = CharLSTM().build((LENGTH,), VOCAB)
    engine = Engine(FlatModel(module), data(args.clients, 200), backend="sequential")
    paths = {"fused kernel": False, "written-out loop": True}
    train: dict[str, list[float]] = {name: [] for name in paths}
    score: dict[str, list[float]] = {name: [] for name in paths}
    ends: dict[str, torch.Tensor] = {}
    w0 = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(args.clients), args.steps, 0.8, BATCH)
    for r in range(args.rounds):
        for name, loop in paths.items():
            with mock.patch("fedhet.models.zoo.inside_vmap", return_value=loop):
                started = time.perf_counter()
                ends[name] = engine.train(w0, plan, r).params
                train[name].append(time.perf_counter() - started)
                started = time.perf_counter()
                engine.scores(w0, "train")
                score[name].append(time.perf_counter() - started)
    print(
        f"char_lstm, {args.clients} clients × {args.steps} steps of {BATCH} × {LENGTH} characters, "
        f"{torch.get_num_threads()} threads; medians of rounds 2..{args.rounds}"
    )
    print("| LSTM path | training s/round | s/step | evaluation s (train data) |")
    print("|---|---|---|---|")
    for name in paths:
        t, e = statistics.median(train[name][1:]), statistics.median(score[name][1:])
        print(f"| {name} | {t:.2f} | {t / args.clients / args.steps * 1e3:.1f} ms | {e:.2f} |")
    gap = float((ends["fused kernel"] - ends["written-out loop"]).abs().max())
    print(f"largest difference between the two paths' client models after a round: {gap:.1e}")


if __name__ == "__main__":
    main()
