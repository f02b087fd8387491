"""What sub-models cost: a HeteroFL round with the five levels {1, 1/2, 1/4, 1/8, 1/16} spread evenly over the
clients against the FLOP-weighted share of a full-width FedAvg round (the FedAvg round's time times the mean share
of the model's weights the clients train), on one engine and backend, timed in turns (the ratio measured in one
run; `python -m fedhet.bench.submodels`, one torch thread). Goal: at most 1.3×, which needs the sub-models trained
as the smaller networks (`fedhet.engine.sliced`), not as masked full ones (each costing the full model). Beside it,
the machine's limit: the share of the FedAvg round's training FLOPs at the rate of a 2048² float32 product."""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.run import matmul_flop_rate, workload_flops
from fedhet.bench.workloads import MLP, Workload
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan
from fedhet.engine.threads import torch_threads
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.heterofl import HeteroFL

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]


def heterofl_round(reps: int = 15, backend: str = "dense", workload: Workload = MLP) -> tuple[CostRow, float]:
    """A HeteroFL round (the scaler on, levels in equal shares) against a FedAvg round scaled by the FLOP share:
    the MLP workload, 100 clients × 10 steps of 10. Returns the row (its reference: the FedAvg round's seconds
    times the share) and the share."""
    engine = workload_engine(workload, backend)
    clients = torch.arange(workload.clients)
    heterofl = HeteroFL(levels=LEVELS)
    strategies: list[Strategy] = [FedAvg(), heterofl]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, workload.clients))
    share = float(heterofl.masks(0, clients).double().mean())  # training FLOPs ∝ the weights each client trains
    avg, hetero = round_runners(strategies, engine, clients)
    hetero_s, avg_s = in_turns(hetero, avg, reps)
    name = f"HeteroFL round, 5 levels ({backend})"
    return CostRow(name, f"{share:.3f} × FedAvg round ({1e3 * avg_s:.0f} ms)", hetero_s, avg_s * share, 1.3), share


def matmul_limit_s(share: float, workload: Workload = MLP) -> float:
    """The machine's limit for the HeteroFL round's training: `share` of the FedAvg round's training FLOPs (exact,
    `fedhet.bench.run.workload_flops`) at the rate of a 2048² float32 matrix product (this thread count)."""
    model = workload_engine(workload).model.module
    return share * workload_flops(workload, model)[0] / matmul_flop_rate()


def level_floors(reps: int = 11, workload: Workload = MLP) -> tuple[dict[int, float], dict[int, float], float]:
    """What each level costs at least, timed in turns with a FedAvg round of the whole cohort (dense backend):
    (width → a FedAvg round of the level's clients alone on the 784-width-10 MLP, the dense backend's fastest path
    for that width), (width → only the products of its steps with torch's batched products: forward X·W₁, Z·W₂,
    backward G·W₂ᵀ, Zᵀ·G, Xᵀ·G_Z), and the FedAvg round's seconds. The levels' clients are the cohort split evenly."""
    full = workload_engine(workload)
    hidden = int(workload.model["hidden"][0])
    group = workload.clients // len(LEVELS)
    widths = [math.ceil(level * hidden) for level in LEVELS]
    alone = {}
    for h in widths:
        narrow = replace(workload, model={**workload.model, "hidden": [h]})
        alone[h] = (
            workload_engine(narrow),
            LocalPlan.uniform(torch.arange(group), workload.steps, workload.lr, workload.batch),
        )
    plan = LocalPlan.uniform(torch.arange(workload.clients), workload.steps, workload.lr, workload.batch)
    gen = torch.Generator().manual_seed(0)
    d, k = math.prod(workload.input_shape), workload.num_classes
    x = torch.randn(workload.steps, group, workload.batch, d, generator=gen)

    def products(h: int) -> None:
        w1, w2, g = torch.randn(group, d, h), torch.randn(group, h, k), torch.randn(group, workload.batch, k)
        for t in range(workload.steps):
            z = torch.bmm(x[t], w1)
            torch.bmm(z, w2), torch.bmm(g, w2.mT), torch.bmm(z.mT, g)
            torch.bmm(x[t].mT, torch.bmm(g, w2.mT))

    count = itertools.count(1)

    def round_of(engine: Engine, part: LocalPlan) -> Callable[[], object]:
        return lambda: engine.train(engine.initial_params(), part, next(count))

    jobs: dict[str, Callable[[], object]] = {"fedavg": round_of(full, plan)}
    for h, (engine, part) in alone.items():
        jobs[f"alone{h}"] = round_of(engine, part)
        jobs[f"products{h}"] = functools.partial(products, h)
    times: dict[str, list[float]] = {}
    for rep in range(reps + 1):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            if rep:
                times.setdefault(name, []).append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {h: med[f"alone{h}"] for h in widths}, {h: med[f"products{h}"] for h in widths}, med["fedavg"]


def main() -> None:  # pragma: no cover - a measurement, run by hand
    with torch_threads(1):
        row, share = heterofl_round()
        limit = matmul_limit_s(share)
        alone, products, fedavg_s = level_floors()
    print_rows([row], "no goal")
    hetero, avg = row.method_s / limit, row.reference_s / limit  # the FedAvg round against its own limit
    print(
        f"the machine's limit: {1e3 * limit:.0f} ms ({share:.3f} of FedAvg's training FLOPs at a 2048² product's "
        f"rate); the HeteroFL round is {hetero:.2f}x it, the FedAvg round {avg:.2f}x its own"
    )
    budget = 1.3 * share * fedavg_s
    print(f"each level's clients alone (a FedAvg round of the {MLP.clients // len(LEVELS)} clients at that width):")
    for h in alone:
        print(f"  {h:>4} units: {1e3 * alone[h]:6.1f} ms; its step products alone {1e3 * products[h]:6.1f} ms")
    wide, narrow = list(alone)[:2], list(alone)[2:]
    floor = sum(share_of * fedavg_s for share_of in (1 / len(LEVELS), 0.5 / len(LEVELS))) + sum(
        min(alone[h], products[h]) for h in narrow
    )
    print(
        f"FedAvg round {1e3 * fedavg_s:.1f} ms: the goal's budget, 1.3 × {share:.3f} of it, is {1e3 * budget:.1f} ms; "
        f"the levels alone sum to {1e3 * sum(alone.values()):.1f} ms ({sum(alone.values()) / (share * fedavg_s):.2f}x "
        f"the share); the HeteroFL round is {row.method_s / sum(alone.values()):.2f}x that sum. A floor: the "
        f"{wide[0]}- and {wide[1]}-unit levels at exactly their share of the FedAvg round and the narrower ones at "
        f"their products alone: {1e3 * floor:.1f} ms, {floor / (share * fedavg_s):.2f}x the share"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
