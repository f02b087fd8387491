"""Where a Ditto round and a whole-model personalised evaluation spend their time (docs/personalization.md "Speed",
docs/performance.md "Why the engine's constants").

Part 1, ms per training, one torch thread, the MLP workload of `fedhet.bench.personal` (100 clients × 10 steps of
10): each round trains the global plan (FedAvg's training), then Ditto's personal plan on the same mini-batches,
then aggregates; medians over the rounds after the first three. Part 2, ms for 64 clients' first-layer products of
the personalised evaluation ((12 × 784) · (784 × 200) each) written several ways, against one shared product of the
same FLOPs, and the time to read 160 MB (the machine's memory bandwidth: the weights must be read at least once).
Run (about a minute on a quiet machine):  OMP_NUM_THREADS=1 python benchmarks/personal_parts.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.bench.pairs import workload_engine
from fedhet.bench.workloads import MLP
from fedhet.engine.objective import Proximal
from fedhet.strategies.base import ServerContext
from fedhet.strategies.ditto import PERSONAL, Ditto


def ditto_parts(rounds: int = 14) -> dict[str, float]:
    """Median ms of a round's FedAvg training, Ditto's personal training after it, and the aggregation."""
    engine = workload_engine(MLP, "dense")
    clients = torch.arange(MLP.clients)
    ditto = Ditto()
    ditto.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    times: dict[str, list[float]] = {"FedAvg training": [], "Ditto's personal training": [], "aggregation": []}
    for r in range(rounds):
        w = engine.initial_params()
        plan = ditto.configure(r, clients, w)
        personal = replace(plan, terms=(Proximal(mu=ditto.lam),), personal=PERSONAL, phase=1)
        marks = [time.perf_counter()]
        result = engine.train(w, plan, r)
        marks.append(time.perf_counter())
        engine.train(w, personal, r)
        marks.append(time.perf_counter())
        ditto.aggregate(r, w, result)
        marks.append(time.perf_counter())
        if r >= 3:
            for key, start, end in zip(times, marks, marks[1:], strict=False):
                times[key].append(end - start)
    return {key: 1e3 * statistics.median(values) for key, values in times.items()}


def _median_ms(fn: Callable[[], object], reps: int = 15) -> float:
    fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return 1e3 * statistics.median(out)


def product_variants() -> dict[str, float]:
    """Median ms of 64 per-client (12 × 784) · (784 × 200) products, several ways, and of the shared product."""
    x, weights = torch.randn(64, 12, 784), torch.randn(64, 200, 784)
    xn, wn = x.numpy(), weights.numpy()
    big = torch.randn(40_000_000)  # 160 MB
    return {
        "torch.bmm": _median_ms(lambda: torch.bmm(x, weights.mT)),
        "a loop of torch.mm": _median_ms(lambda: [x[i] @ weights[i].T for i in range(64)]),
        "torch.einsum": _median_ms(lambda: torch.einsum("bik,bjk->bij", x, weights)),
        "a loop of F.linear": _median_ms(lambda: [F.linear(x[i], weights[i]) for i in range(64)]),
        "numpy.matmul (OpenBLAS)": _median_ms(lambda: np.matmul(xn, wn.transpose(0, 2, 1))),
        "one shared product (torch)": _median_ms(lambda: x.reshape(-1, 784) @ weights[0].T),
        "one shared product (numpy)": _median_ms(lambda: xn.reshape(-1, 784) @ wn[0].T),
        "reading 160 MB (torch.sum)": _median_ms(lambda: big.sum(), reps=5),
    }


def main() -> None:
    torch.set_num_threads(1)
    print("Part 1: a Ditto round's parts (ms, medians)")
    for key, ms in ditto_parts().items():
        print(f"  {key}: {ms:.1f}")
    print("Part 2: 64 clients' first-layer products (ms, medians)")
    for key, ms in product_variants().items():
        print(f"  {key}: {ms:.2f}")


if __name__ == "__main__":
    main()
